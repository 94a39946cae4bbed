"""Page zeroing: clear every byte of whole pages, a batch per launch.

Every page the allocator hands out reads as zero bytes, token pages and recurrent slots alike (a fresh page
carries no bytes of its previous owner; SGLang's mamba slot allocator does not clear a slot: spec/arena.md
§Diff against SGLang 0.5.23, zeroing). Same addressing as the move kernel: page ``slot`` of a class is words
``[slot * page_words, (slot + 1) * page_words)`` of the arena viewed as int64. Two entry points: ``zero_slots``
(a device list of pages, one launch) and ``zero_run`` (consecutive pages the host knows, e.g. a step's frontier
pages: one memset, no list).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kvarena.gpu.kernels.common import Path, as_index, device_time, use_triton
from kvarena.gpu.kernels.move import default_config
from kvarena.spec.errors import PlanError


@triton.jit
def zero_pages_kernel(
    words_ptr,  # *int64: the arena as 8-byte words
    slots_ptr,  # *int64 [n]: pages to clear (slots on the class's page grid)
    page_words,  # words per page
    chunks,  # programs per page: cdiv(page_words, BLOCK)
    skip,  # a slot left alone (a fixed-width step's padding lanes name it), -1: none
    BLOCK: tl.constexpr,  # words one program clears
):
    pid = tl.program_id(0).to(tl.int64)
    page = tl.load(slots_ptr + pid // chunks)
    offs = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)
    zeros = tl.full([BLOCK], 0, tl.int64)  # a builtin: tl.zeros is a jit helper the interpreter may not wrap
    tl.store(words_ptr + page * page_words + offs, zeros, mask=(offs < page_words) & (page != skip))


def launch(words: torch.Tensor, slots: torch.Tensor, page_words: int, block: int | None = None,
           num_warps: int | None = None, skip: int = -1) -> None:
    """The kernel alone: ``slots`` is an int64 tensor on the arena's device; slot ``skip`` is not cleared."""
    n = slots.numel()
    if n == 0:
        return
    b, w = default_config(page_words, words.is_cuda)
    block, num_warps = block or b, num_warps or w
    chunks = triton.cdiv(page_words, block)
    zero_pages_kernel[(n * chunks,)](words, slots, page_words, chunks, skip, BLOCK=block, num_warps=num_warps)


def zero_pages(words: torch.Tensor, slots: Sequence[int], page_bytes: int, *, path: Path = "auto") -> None:
    """Clear pages ``slots`` of a class whose pages are ``page_bytes`` long, in ``words`` (the arena as int64)."""
    assert words.dtype == torch.int64 and words.dim() == 1
    slots = [int(s) for s in slots]
    if page_bytes <= 0 or page_bytes % 8:
        raise PlanError(f"page of {page_bytes} B is not a positive multiple of 8 B")
    page_words = page_bytes // 8
    n_pages = words.numel() // page_words
    bad = [s for s in slots if not 0 <= s < n_pages]
    if bad:
        raise PlanError(f"pages {sorted(set(bad))[:8]} are outside the grid of {n_pages} pages")
    if not slots:
        return
    zero_slots(words, as_index(slots, words.device), page_bytes, path=path)


def zero_slots(words: torch.Tensor, idx: torch.Tensor, page_bytes: int, *, skip: int = -1,
               path: Path = "auto") -> None:
    """Clear pages ``idx`` (an int64 tensor already on the arena's device, checked by the host planner): no
    host list, no upload, no read; what the allocator calls once per class per step. The kernel leaves slot
    ``skip`` (a dump page) alone; the torch path clears it too (it is no page's)."""
    page_words = page_bytes // 8
    n_pages = words.numel() // page_words
    if use_triton(zero_pages_kernel, words, path):
        launch(words, idx, page_words, skip=skip)
    else:
        words[: n_pages * page_words].view(n_pages, page_words).index_fill_(0, idx, 0)  # not [idx] = 0: 500x slower


def zero_run(words: torch.Tensor, first: int, count: int, page_bytes: int) -> None:
    """Clear pages ``[first, first + count)`` of a class (a run of consecutive slots the host knows: the
    frontier pages a step hands out): one memset of the run's bytes on every path (``cudaMemsetAsync`` on
    CUDA, capturable), no index list. The host checked the run is on the grid."""
    if count > 0:
        pw = page_bytes // 8
        words[first * pw:(first + count) * pw].zero_()


# ---------------------------------------------------------------------------------------------


def check(device: str | torch.device = "cpu", *, path: Path = "auto", page_bytes: int = 40 * 8,
          n_pages: int = 20, n_zero: int = 6, guard_words: int = 64, seed: int | None = None) -> None:
    """Zero random pages of random words; every other word (guards included) must be unchanged."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    pw = page_bytes // 8
    full = torch.randint(-2**63, 2**63 - 1, (guard_words + n_pages * pw + guard_words,), dtype=torch.int64,
                         generator=g)
    full[full == 0] = 1  # a zero already there would hide a skipped word
    slots = torch.randperm(n_pages, generator=g)[:n_zero].tolist()
    want = full.clone()
    for s in slots:
        want[guard_words + s * pw: guard_words + (s + 1) * pw] = 0
    got = full.to(device)
    zero_pages(got[guard_words:guard_words + n_pages * pw], slots, page_bytes, path=path)
    first = int(torch.randint(0, n_pages, (1,), generator=g))
    count = int(torch.randint(0, n_pages - first + 1, (1,), generator=g))
    zero_run(got[guard_words:guard_words + n_pages * pw], first, count, page_bytes)  # a run of pages, too
    want[guard_words + first * pw: guard_words + (first + count) * pw] = 0
    got = got.cpu()
    diff = (got != want).nonzero().flatten()
    assert diff.numel() == 0, f"{diff.numel()} words differ from the torch reference, first {diff[:4].tolist()} " \
                              f"(guards are words < {guard_words} and >= {guard_words + n_pages * pw})"


def bench(device: str | torch.device, sizes: Sequence[int], *, page_bytes: int = 1 << 20,
          reps: int = 20) -> list[dict]:
    """Per size (bytes): the kernel and torch index-fill on scattered pages, in seconds."""
    device = torch.device(device)
    return [_bench_one(device, size, page_bytes, reps) for size in sizes]


def _bench_one(device: torch.device, size: int, page_bytes: int, reps: int) -> dict:
    pw = page_bytes // 8
    n = max(1, size // page_bytes)
    words = torch.randint(1, 2**62, (2 * n * pw,), dtype=torch.int64, device=device)
    slots = torch.randperm(2 * n, device=device)[:n].contiguous()
    pages = words.view(2 * n, pw)
    launch(words, slots, pw)
    assert int(pages[slots].abs().sum()) == 0, "zero kernel left bytes behind"
    t_kernel = device_time(lambda: launch(words, slots, pw), device, reps=reps)
    t_torch = device_time(lambda: pages.index_fill_(0, slots, 0), device, reps=reps)
    return {"bytes": n * page_bytes, "pages": n, "kernel_s": t_kernel, "torch_s": t_torch}
