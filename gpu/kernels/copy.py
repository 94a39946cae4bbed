"""Page copy: every byte of one page into another page of the same class, the source left as it is.

``copy_state`` (spec/arena.md §INV-STATE-PRIVATE) gives an owner a new recurrent page holding a copy of another
one's state: prefix caching of recurrent state, SGLang's mamba-pool ``fork_from`` / ``copy_from``. Unlike a move
(``kernels.move``) nothing is remapped and the source stays bound: the copy is a second page. Same addressing
as the move and zero kernels: page ``slot`` of a class is words ``[slot * page_words, (slot + 1) * page_words)``
of the arena viewed as int64 (every page is a multiple of 32 B), and the program for ``(pair i, chunk c)``
copies words ``[c * BLOCK, (c + 1) * BLOCK)`` of page ``src[i]`` to page ``dst[i]``.

A batch is correct only if no destination is a source or a second destination (programs run in any order):
``check_pairs`` refuses such a batch on the host. Several sources may be copied at once, and one source into
several destinations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from kvarena.gpu.kernels.common import Path, as_index, device_time, use_triton
from kvarena.gpu.kernels.move import default_config
from kvarena.spec.errors import PlanError


@triton.jit
def copy_pages_kernel(
    words_ptr,  # *int64: the arena as 8-byte words
    src_ptr,  # *int64 [n]: the page each copy reads (slot on the class's page grid)
    dst_ptr,  # *int64 [n]: the page it writes (no destination is a source: checked on the host)
    page_words,  # words per page (page bytes / 8)
    chunks,  # programs per page: cdiv(page_words, BLOCK)
    BLOCK: tl.constexpr,  # words one program copies
):
    pid = tl.program_id(0).to(tl.int64)  # int64: page * page_words overflows int32 past 16 GiB
    pair = pid // chunks
    offs = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < page_words
    src = tl.load(src_ptr + pair)
    dst = tl.load(dst_ptr + pair)
    data = tl.load(words_ptr + src * page_words + offs, mask=mask)
    tl.store(words_ptr + dst * page_words + offs, data, mask=mask)


def check_pairs(src: Sequence[int], dst: Sequence[int], page_bytes: int, n_pages: int) -> None:
    """Refuse a batch one launch cannot run correctly (PlanError): off the grid, a destination written twice,
    or a destination that another copy reads (the interpreter and the GPU have no bounds or order checks)."""
    if page_bytes <= 0 or page_bytes % 8:
        raise PlanError(f"page of {page_bytes} B is not a positive multiple of 8 B (pages are 32 B aligned)")
    if len(src) != len(dst):
        raise PlanError(f"{len(src)} sources but {len(dst)} destinations; pair each source with a destination")
    s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    every = np.concatenate([s, d])
    bad = every[(every < 0) | (every >= n_pages)]
    if len(bad):
        raise PlanError(f"pages {sorted(set(bad.tolist()))[:8]} are outside the grid of {n_pages} pages")
    if len(np.unique(d)) != len(d):
        raise PlanError("a destination page is written by two copies; one copy per destination")
    both = np.intersect1d(s, d)
    if len(both):
        raise PlanError(f"pages {both[:8].tolist()} are both read and written in one batch; split the batch")


def launch(words: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, page_words: int, block: int | None = None,
           num_warps: int | None = None) -> None:
    """The kernel alone: ``src`` / ``dst`` are int64 tensors on the arena's device, already checked."""
    n = src.numel()
    if n == 0:
        return
    b, w = default_config(page_words, words.is_cuda)
    block, num_warps = block or b, num_warps or w
    chunks = triton.cdiv(page_words, block)
    copy_pages_kernel[(n * chunks,)](words, src, dst, page_words, chunks, BLOCK=block, num_warps=num_warps)


def copy_pages(words: torch.Tensor, src: Sequence[int], dst: Sequence[int], page_bytes: int, *,
               path: Path = "auto") -> None:
    """Copy page ``src[i]`` to page ``dst[i]`` of a class whose pages are ``page_bytes`` long, in ``words`` (the
    arena as int64), for every i; the sources are left unchanged."""
    assert words.dtype == torch.int64 and words.dim() == 1
    src, dst = [int(s) for s in src], [int(d) for d in dst]
    page_words = page_bytes // 8
    n_pages = words.numel() // page_words if page_words > 0 else 0
    check_pairs(src, dst, page_bytes, n_pages)
    if not src:
        return
    s, d = as_index(src, words.device), as_index(dst, words.device)
    if use_triton(copy_pages_kernel, words, path):
        launch(words, s, d, page_words)
    else:
        pages = words[: n_pages * page_words].view(n_pages, page_words)
        pages.index_copy_(0, d, pages.index_select(0, s))


# ---------------------------------------------------------------------------------------------


def check(device: str | torch.device = "cpu", *, path: Path = "auto", page_bytes: int = 40 * 8,
          n_pages: int = 20, n_copies: int = 5, guard_words: int = 64, seed: int | None = None) -> None:
    """Copy random pages of random words onto other pages; every word must equal the torch reference (the
    sources, the pages no copy writes and the guards around the arena unchanged)."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    pw = page_bytes // 8
    full = torch.randint(-2**63, 2**63 - 1, (guard_words + n_pages * pw + guard_words,), dtype=torch.int64,
                         generator=g)
    perm = torch.randperm(n_pages, generator=g).tolist()
    dst = perm[:n_copies]
    pool = perm[n_copies:]
    src = [pool[int(torch.randint(len(pool), (1,), generator=g))] for _ in dst]  # a source may be copied twice
    want = full.clone()
    for s, d in zip(src, dst):
        want[guard_words + d * pw: guard_words + (d + 1) * pw] = full[guard_words + s * pw: guard_words + (s + 1) * pw]
    got = full.to(device)
    copy_pages(got[guard_words:guard_words + n_pages * pw], src, dst, page_bytes, path=path)
    got = got.cpu()
    diff = (got != want).nonzero().flatten()
    assert diff.numel() == 0, f"{diff.numel()} words differ from the torch reference, first {diff[:4].tolist()} " \
                              f"(guards are words < {guard_words} and >= {guard_words + n_pages * pw})"


def bench(device: str | torch.device, sizes: Sequence[int], *, page_bytes: int = 1 << 20,
          reps: int = 20) -> list[dict]:
    """Per size (bytes): the kernel and torch's index_copy on scattered pairs of pages, in seconds."""
    device = torch.device(device)
    return [_bench_one(device, size, page_bytes, reps) for size in sizes]


def _bench_one(device: torch.device, size: int, page_bytes: int, reps: int) -> dict:
    pw = page_bytes // 8
    n = max(1, size // page_bytes)
    words = torch.randint(1, 2**62, (2 * n * pw,), dtype=torch.int64, device=device)
    perm = torch.randperm(2 * n, device=device)
    src, dst = perm[:n].contiguous(), perm[n:].contiguous()
    pages = words.view(2 * n, pw)
    t_kernel = device_time(lambda: launch(words, src, dst, pw), device, reps=reps)
    t_torch = device_time(lambda: pages.index_copy_(0, dst, pages.index_select(0, src)), device, reps=reps)
    return {"bytes": n * page_bytes, "pages": n, "kernel_s": t_kernel, "torch_s": t_torch}
