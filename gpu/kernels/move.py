"""Page move: copy every row of every entry of whole pages inside the arena, a batch per launch.

A move is how rung 2 (compact the ends) and rung 3 (relayout a float) carry a page's bytes to a new slot
(spec/arena.md §Applying a plan). All pages of one launch belong to one class, so they have one size, and a
page is addressed by its slot on the class's grid: bytes ``[slot * P, (slot + 1) * P)``. The program for
``(move i, chunk c)`` copies words ``[c * BLOCK, (c + 1) * BLOCK)`` of page ``src[i]`` to page ``dst[i]``.

Every page is a multiple of 32 B (ENTRY_ALIGN), so the arena is copied as int64 words: the widest type that
divides every page, which lets the compiler issue 16-byte vector accesses (SGLang's ``copy_pages`` does the
same when the page allows it).

Programs of one launch run in any order, so a launch is only correct if no destination is also a source
(or another move's destination): ``check_moves`` refuses such a batch on the host, before anything runs. The
allocator splits a plan's moves into such batches and launches them in plan order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from kvarena.gpu.kernels.common import Path, as_index, device_time, next_pow2, use_triton
from kvarena.spec.errors import PlanError


@triton.jit
def move_pages_kernel(
    words_ptr,  # *int64: the arena as 8-byte words
    src_ptr,  # *int64 [n]: source page of each move (slot on the class's page grid)
    dst_ptr,  # *int64 [n]: destination page of each move (no destination is a source: checked on the host)
    page_words,  # words per page (page bytes / 8)
    chunks,  # programs per page: cdiv(page_words, BLOCK)
    vids_ptr,  # *int64 [n]: the virtual page each move carries (read when REMAP)
    v2p_ptr,  # *int64: the class's v->p row: v2p[vid] = dst (when REMAP)
    p2v_ptr,  # *int64: the class's p->v row: p2v[src] = -1, p2v[dst] = vid (when REMAP)
    BLOCK: tl.constexpr,  # words one program copies
    REMAP: tl.constexpr,  # the first chunk's program also remaps the tables: no second launch per batch
):
    pid = tl.program_id(0).to(tl.int64)  # int64: page * page_words overflows int32 past 16 GiB
    move = pid // chunks
    chunk = pid % chunks
    src = tl.load(src_ptr + move)
    dst = tl.load(dst_ptr + move)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < page_words
    data = tl.load(words_ptr + src * page_words + offs, mask=mask)
    tl.store(words_ptr + dst * page_words + offs, data, mask=mask)
    if REMAP:  # noqa: SIM102 - a constexpr branch (compiled out), then a runtime one
        if chunk == 0:  # no destination of a batch is a source, so these stores never collide
            vid = tl.load(vids_ptr + move)
            tl.store(p2v_ptr + src, -1)
            tl.store(p2v_ptr + dst, vid)
            tl.store(v2p_ptr + vid, dst)


def default_config(page_words: int, on_cuda: bool) -> tuple[int, int]:
    """(BLOCK, num_warps). Interpreter: one program per page (it costs ~0.7 ms per program, not per byte).
    CUDA: 32 KiB per program and 8 warps, 16 words (128 B) per thread in flight; bench/gpu.py sweeps these."""
    if not on_cuda:
        return min(next_pow2(page_words), 1 << 16), 4
    return min(next_pow2(page_words), 4096), 8


def check_moves(src: Sequence[int], dst: Sequence[int], page_bytes: int, n_pages: int) -> None:
    """Refuse a batch that one launch cannot run correctly (PlanError): the interpreter and the GPU have no
    bounds checks, and a destination that is also a source races with the program reading it."""
    if page_bytes <= 0 or page_bytes % 8:
        raise PlanError(f"page of {page_bytes} B is not a positive multiple of 8 B (pages are 32 B aligned)")
    if len(src) != len(dst):
        raise PlanError(f"{len(src)} sources but {len(dst)} destinations; pair each source with a destination")
    s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)  # vectorized: O(moves) numpy
    every = np.concatenate([s, d])
    if not len(every):
        return
    if every.min() < 0 or every.max() >= n_pages:
        bad = every[(every < 0) | (every >= n_pages)]
        raise PlanError(f"pages {sorted(set(bad.tolist()))[:8]} are outside the grid of {n_pages} pages")
    srt = np.sort(every)
    if (srt[1:] != srt[:-1]).all():
        return  # every slot once: no destination twice, none a source (the common case, one sort)
    if len(np.unique(d)) != len(d):
        raise PlanError(f"a destination appears twice in {d[:16].tolist()}; each move needs its own page")
    both = np.intersect1d(s, d)
    if len(both):
        raise PlanError(f"pages {both[:8].tolist()} are both a source and a destination of one batch; "
                        "split the moves into batches launched in order")


def launch(words: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, page_words: int,
           block: int | None = None, num_warps: int | None = None,
           remap: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """The kernel alone (no checks): ``src``/``dst`` are int64 tensors on the arena's device; ``remap`` is
    ``(vids, v2p_row, p2v_row)`` for the fused table remap."""
    n = src.numel()
    if n == 0:
        return
    b, w = default_config(page_words, words.is_cuda)
    block, num_warps = block or b, num_warps or w
    chunks = triton.cdiv(page_words, block)
    vids, v2p, p2v = remap if remap is not None else (src, src, src)
    move_pages_kernel[(n * chunks,)](words, src, dst, page_words, chunks, vids, v2p, p2v, BLOCK=block,
                                     REMAP=remap is not None, num_warps=num_warps)


def move_pages(words: torch.Tensor, src: Sequence[int], dst: Sequence[int], page_bytes: int, *,
               path: Path = "auto") -> None:
    """Copy page ``src[i]`` to page ``dst[i]`` for every i, in place in ``words`` (the arena as int64 words)."""
    assert words.dtype == torch.int64 and words.dim() == 1
    src, dst = [int(s) for s in src], [int(d) for d in dst]
    page_words = page_bytes // 8
    check_moves(src, dst, page_bytes, words.numel() // max(page_words, 1))
    if not src:
        return
    move_slots(words, as_index(src, words.device), as_index(dst, words.device), page_bytes, path=path)


def move_slots(words: torch.Tensor, s: torch.Tensor, d: torch.Tensor, page_bytes: int, *,
               remap: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, path: Path = "auto") -> None:
    """The copy of a batch ``check_moves`` accepted, with ``s``/``d`` already on the device (staged uploads);
    with ``remap = (vids, v2p_row, p2v_row)`` the same launch moves the pages in the class's tables."""
    page_words = page_bytes // 8
    if use_triton(move_pages_kernel, words, path):
        launch(words, s, d, page_words, remap=remap)
        return
    pages = words[: words.numel() // page_words * page_words].view(-1, page_words)
    pages.index_copy_(0, d, pages.index_select(0, s))  # plain torch: gather, then scatter (no dst is a src)
    if remap is not None:
        vids, v2p, p2v = remap
        p2v.index_fill_(0, s, -1)
        p2v.index_copy_(0, d, vids)
        v2p.index_copy_(0, vids, d)


# ---------------------------------------------------------------------------------------------


def check(device: str | torch.device = "cpu", *, path: Path = "auto", page_bytes: int = 96 * 8,
          n_pages: int = 24, n_moves: int = 7, guard_words: int = 64, seed: int | None = None) -> None:
    """Move random pages of random words and compare every word, guards included, with a per-page torch copy."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    pw = page_bytes // 8
    full = torch.randint(-2**63, 2**63 - 1, (guard_words + n_pages * pw + guard_words,), dtype=torch.int64,
                         generator=g)
    perm = torch.randperm(n_pages, generator=g).tolist()
    src, dst = perm[:n_moves], perm[n_moves:2 * n_moves]
    want = full.clone()
    for s, d in zip(src, dst):
        lo = guard_words + d * pw
        want[lo:lo + pw] = full[guard_words + s * pw: guard_words + (s + 1) * pw]
    got = full.to(device)
    move_pages(got[guard_words:guard_words + n_pages * pw], src, dst, page_bytes, path=path)
    _check_remap(device, path, page_bytes, n_pages, src, dst, guard_words, g)
    got = got.cpu()
    assert torch.equal(got[:guard_words], want[:guard_words]) and torch.equal(got[-guard_words:],
                                                                              want[-guard_words:]), \
        "move wrote outside the arena (guard words changed)"
    diff = (got != want).nonzero().flatten()
    assert diff.numel() == 0, f"{diff.numel()} words differ from the torch copy, first at word {diff[:4].tolist()}"


def _check_remap(device: str | torch.device, path: Path, page_bytes: int, n_pages: int, src: list[int],
                 dst: list[int], guard: int, g: torch.Generator) -> None:
    """The fused remap: v2p[vid] = dst, p2v[src] = -1, p2v[dst] = vid for every move, nothing else changed."""
    pw = page_bytes // 8
    n_vids = 2 * n_pages
    vids = torch.randperm(n_vids, generator=g)[:len(src)].tolist()
    v2p0 = torch.randint(0, 1 << 40, (guard + n_vids + guard,), dtype=torch.int64, generator=g)
    p2v0 = torch.randint(0, 1 << 40, (guard + n_pages + guard,), dtype=torch.int64, generator=g)
    v2p_want, p2v_want = v2p0.clone(), p2v0.clone()
    for s in src:
        p2v_want[guard + s] = -1
    for v, d in zip(vids, dst):
        p2v_want[guard + d] = v
        v2p_want[guard + v] = d
    words = torch.zeros(n_pages * pw, dtype=torch.int64, device=device)
    v2p, p2v = v2p0.to(device), p2v0.to(device)
    dev = torch.device(device)
    move_slots(words, as_index(src, dev), as_index(dst, dev), page_bytes, path=path,
               remap=(as_index(vids, dev), v2p[guard:guard + n_vids], p2v[guard:guard + n_pages]))
    assert torch.equal(v2p.cpu(), v2p_want), "the fused move left v2p wrong (or wrote past the row)"
    assert torch.equal(p2v.cpu(), p2v_want), "the fused move left p2v wrong (or wrote past the row)"


def bench(device: str | torch.device, sizes: Sequence[int], *, page_bytes: int = 1 << 20,
          block: int | None = None, num_warps: int | None = None, reps: int = 20, baselines: bool = True
          ) -> list[dict]:
    """Per move size (bytes): the kernel, torch index-copy and a plain ``copy_`` of as many bytes, in seconds.

    Sources are a random half of an arena twice the size, destinations the other half, shuffled: pages
    are scattered as after compaction, not one contiguous run.
    """
    device = torch.device(device)
    return [_bench_one(device, size, page_bytes, block, num_warps, reps, baselines) for size in sizes]


def _bench_one(device: torch.device, size: int, page_bytes: int, block: int | None, num_warps: int | None,
               reps: int, baselines: bool) -> dict:
    pw = page_bytes // 8
    n = max(1, size // page_bytes)
    words = torch.randint(-2**62, 2**62, (2 * n * pw,), dtype=torch.int64, device=device)
    perm = torch.randperm(2 * n, device=device)
    src, dst = perm[:n].contiguous(), perm[n:].contiguous()
    check_moves(src.tolist(), dst.tolist(), page_bytes, 2 * n)
    pages = words.view(2 * n, pw)
    want = pages[src].clone()
    launch(words, src, dst, pw, block, num_warps)
    assert torch.equal(pages[dst], want), "move kernel disagrees with torch before timing"
    del want
    t_kernel = device_time(lambda: launch(words, src, dst, pw, block, num_warps), device, reps=reps)
    t_torch = t_copy = float("nan")
    if baselines:
        t_torch = device_time(lambda: pages.index_copy_(0, dst, pages.index_select(0, src)), device, reps=reps)
        t_copy = device_time(lambda: words[n * pw:].copy_(words[:n * pw]), device, reps=reps)
    return {"bytes": n * page_bytes, "pages": n, "kernel_s": t_kernel, "torch_s": t_torch, "copy_s": t_copy}
