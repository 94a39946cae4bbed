"""Triton kernels of the arena, one concept per file (move, zero, translate, alloc), plus what they share.

Each kernel file is shaped like a Triton tutorial: the ``@triton.jit`` kernel with commented arguments, a thin
host wrapper that picks the path, ``check()`` against plain torch on fresh random data and ``bench()``.

Which path runs (``use_triton``):

* a CUDA tensor: the compiled kernel;
* a CPU tensor with ``TRITON_INTERPRET=1`` set *before* the kernel module was imported: the same kernel
  under Triton's interpreter (how CI runs it; the variable is read when ``@triton.jit`` decorates);
* a CPU tensor otherwise: a plain-torch path.

``path="torch"`` / ``path="triton"`` force one (tests use that to cover both in one process).
"""

from __future__ import annotations

from kvarena.gpu.kernels.common import Path, as_index, device_time, interpreted, next_pow2, use_triton

__all__ = ["Path", "as_index", "device_time", "interpreted", "next_pow2", "use_interpreter", "use_triton"]


def use_interpreter() -> None:
    """Make every kernel run under Triton's interpreter from now on (tests, ``bench/gpu.py --dry-run``).

    Sets ``TRITON_INTERPRET=1`` and re-imports a kernel module that was decorated before it was set (by
    whoever imported ``kvarena.gpu`` first): the module object is reused, so wrappers already imported
    elsewhere see the re-decorated kernel.
    """
    import importlib
    import os

    from kvarena.gpu.kernels import alloc, copy, move, translate, zero

    os.environ["TRITON_INTERPRET"] = "1"
    for mod, kernel in ((move, "move_pages_kernel"), (zero, "zero_pages_kernel"),
                        (translate, "translate_kernel"), (alloc, "alloc_tokens_kernel"), (copy, "copy_pages_kernel")):
        if not interpreted(getattr(mod, kernel)):
            importlib.reload(mod)
