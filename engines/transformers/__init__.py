"""A transformers model's KV and recurrent state on kvarena's arena.

* :func:`model_layout` (``layout.py``): kvarena's model layout from a transformers config.
* :class:`ArenaCache` (``cache.py``): a ``transformers.Cache`` whose layers keep K/V and conv/SSM state in one
  ``GpuArena``; ``model.generate(..., past_key_values=ArenaCache(model.config, capacity=...))``.
* :func:`generate_batch` (``batching.py``): transformers' continuous-batching engine on the arena.
* ``paged_machine.py``: transformers' own paged-cache allocator under the contract (a Hypothesis machine).

Needs the ``transformers`` extra (``pip install 'kvarena[transformers]'``).
"""

from __future__ import annotations

from typing import Any

from kvarena.engines.transformers.layout import model_layout

__all__ = ["ArenaCache", "generate_batch", "model_layout"]


def __getattr__(name: str) -> Any:  # the cache and the batching engine import torch: only when asked for
    if name == "ArenaCache":
        from kvarena.engines.transformers.cache import ArenaCache

        return ArenaCache
    if name == "generate_batch":
        from kvarena.engines.transformers.batching import generate_batch

        return generate_batch
    raise AttributeError(name)
