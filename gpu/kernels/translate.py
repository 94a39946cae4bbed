"""Translation of virtual token ids to physical entry indices: what attention kernels consume.

A virtual token ``t = vid * EPP + i`` (``EPP`` entries per page: ``page_size``, or 1 for a recurrent slot)
lives at physical entry ``v2p[vid] * EPP + i`` of its class's grid (spec/arena.md §Virtual pages,
``translate_token``). ``v2p`` is the class's row of the device table: the slot, or -1 where ``vid`` is not a
page of this class. An unmapped id, a negative one, one past the table or another class's page translates to
``pad``, the arena's padding entry (spec/arena.md §Padding lanes): no page of any class covers it, so a kernel
that writes every lane corrupts nothing, and there is no sink page (SGLang redirects all of those to page 0,
a live page: spec/arena.md §Diff against SGLang 0.5.23). The wrappers' default ``pad`` is -1 (a bare kernel
call without an arena); the allocator always passes its padding entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kvarena.gpu.kernels.common import Path, device_time, next_pow2, use_triton


@triton.jit
def translate_kernel(
    vtok_ptr,  # *int32 or *int64 [n]: virtual token ids
    out_ptr,  # *int64 [n]: out: physical entry index on the class's grid, or pad
    v2p_ptr,  # *int64 [n_vids]: this class's v->p row (slot, or -1: not a page of this class)
    n,  # number of ids
    n_vids,  # length of the v2p row
    n_out,  # lanes of out written: [n, n_out) are padding lanes (a CUDA graph's fixed width)
    pad,  # what a padding lane holds: the arena's padding entry, which no page of any class covers
    EPP: tl.constexpr,  # entries per page (a power of two)
    BLOCK: tl.constexpr,  # ids per program
):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(vtok_ptr + offs, mask=mask, other=-1).to(tl.int64)
    vid = t // EPP  # t >= 0 where it is used, so C division is floor division
    ok = mask & (t >= 0) & (vid < n_vids)
    slot = tl.load(v2p_ptr + vid, mask=ok, other=-1)
    phys = tl.where(slot >= 0, slot * EPP + t % EPP, pad)
    phys = tl.where(mask, phys, pad)
    tl.store(out_ptr + offs, phys, mask=offs < n_out)


def default_config(n: int, on_cuda: bool) -> tuple[int, int]:
    """(BLOCK, num_warps): 4,096 ids (8 per thread) per program on CUDA; one program for small n elsewhere."""
    if not on_cuda:
        return min(next_pow2(n), 1 << 16), 4
    return 4096, 16


def launch(vtokens: torch.Tensor, out: torch.Tensor, v2p_row: torch.Tensor, epp: int,
           block: int | None = None, num_warps: int | None = None, n_out: int | None = None, pad: int = -1) -> None:
    n = vtokens.numel()
    n_out = n if n_out is None else n_out
    if n_out == 0:
        return
    b, w = default_config(n_out, vtokens.is_cuda)
    block, num_warps = block or b, num_warps or w
    translate_kernel[(triton.cdiv(n_out, block),)](vtokens, out, v2p_row, n, v2p_row.numel(), n_out, pad, EPP=epp,
                                                   BLOCK=block, num_warps=num_warps)


def translate_tokens(vtokens: torch.Tensor, v2p_row: torch.Tensor, epp: int, *, out: torch.Tensor | None = None,
                     out_width: int | None = None, pad: int = -1, path: Path = "auto") -> torch.Tensor:
    """Physical entry index of every virtual token id in ``vtokens`` (1-D int tensor), ``pad`` where unmapped.

    With ``out_width`` (a CUDA graph's fixed batch width, >= the number of ids), ``out[:out_width]`` is
    written: the ids' lanes first, then padding lanes holding ``pad``. Returns ``out[:out_width]``."""
    if epp <= 0 or epp & (epp - 1):
        raise ValueError(f"entries per page must be a power of two, got {epp}")
    assert vtokens.dim() == 1 and v2p_row.dtype == torch.int64 and v2p_row.dim() == 1
    n = vtokens.numel()
    width = n if out_width is None else out_width
    assert width >= n, f"out_width {width} is narrower than the {n} ids"
    if out is None:
        out = torch.empty(width, dtype=torch.int64, device=vtokens.device)
    assert out.dim() == 1 and out.numel() >= width and out.dtype == torch.int64
    out = out[:width]
    if use_triton(translate_kernel, vtokens, path):
        launch(vtokens.contiguous(), out, v2p_row, epp, n_out=width, pad=pad)
        return out
    t = vtokens.to(torch.int64)
    vid = torch.div(t, epp, rounding_mode="floor")
    ok = (t >= 0) & (vid < v2p_row.numel())
    slot = torch.where(ok, v2p_row[vid.clamp(0, max(v2p_row.numel() - 1, 0))], -1)
    out[:n].copy_(torch.where(slot >= 0, slot * epp + t % epp, pad))
    out[n:].fill_(pad)
    return out


# ---------------------------------------------------------------------------------------------


def reference(vtokens: Sequence[int], v2p_row: Sequence[int], epp: int, width: int | None = None,
              pad: int = -1) -> list[int]:
    """Plain Python, id by id, then the padding lanes: the definition the kernel must meet."""
    out = []
    for t in vtokens:
        vid, i = divmod(t, epp)
        slot = v2p_row[vid] if t >= 0 and vid < len(v2p_row) else -1
        out.append(slot * epp + i if slot >= 0 else pad)
    return out + [pad] * ((width or len(out)) - len(out))


def check(device: str | torch.device = "cpu", *, path: Path = "auto", n: int = 300, n_vids: int = 50, epp: int = 4,
          guard: int = 32, seed: int | None = None) -> None:
    """Random tables (a third unmapped) and random ids (negative, unmapped and past the table included)."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    v2p = torch.randperm(4 * n_vids, generator=g)[:n_vids].to(torch.int64)
    v2p[torch.rand(n_vids, generator=g) < 0.33] = -1
    vt = torch.randint(-2 * epp, (n_vids + 3) * epp, (n,), dtype=torch.int64, generator=g)
    width = n + 5  # five padding lanes (a graph's fixed width)
    pad = 4 * n_vids * epp + 3  # an entry no page of the table covers
    want = reference(vt.tolist(), v2p.tolist(), epp, width, pad)
    sentinel = -0x5A5A5A5A5A5A5A5A
    buf = torch.full((guard + width + guard,), sentinel, dtype=torch.int64, device=device)
    for dtype in (torch.int64, torch.int32):
        buf.fill_(sentinel)
        translate_tokens(vt.to(device=device, dtype=dtype), v2p.to(device), epp, out=buf[guard:guard + width],
                         out_width=width, pad=pad, path=path)
        got = buf.cpu()
        assert (got[:guard] == sentinel).all() and (got[guard + width:] == sentinel).all(), \
            "translate wrote outside its output (guard words changed)"
        bad = [(i, w, h) for i, (w, h) in enumerate(zip(want, got[guard:guard + width].tolist())) if w != h]
        assert not bad, f"{len(bad)} lanes translate wrong ({dtype}); (lane, want, got): {bad[:4]}"


def bench(device: str | torch.device, sizes: Sequence[int], *, n_pages: int = 1 << 16, epp: int = 64,
          reps: int = 50, graph_launches: int = 20) -> list[dict]:
    """Per number of ids: the kernel and the same computation in torch ops, in seconds.

    ``n_pages`` bound pages of ``epp`` tokens (10% of the table unmapped); ids uniform over the table's tokens.
    """
    device = torch.device(device)
    v2p = torch.randperm(n_pages, device=device).to(torch.int64)
    v2p[torch.rand(n_pages, device=device) < 0.1] = -1
    graphs = graph_launches if device.type == "cuda" else 0
    return [_bench_one(device, n, v2p, epp, reps, graphs) for n in sizes]


def _bench_one(device: torch.device, n: int, v2p: torch.Tensor, epp: int, reps: int, graphs: int) -> dict:
    vt = torch.randint(0, v2p.numel() * epp, (n,), dtype=torch.int64, device=device)
    res = torch.empty_like(vt)
    launch(vt, res, v2p, epp)
    assert torch.equal(res, translate_tokens(vt, v2p, epp, path="torch")), "kernel disagrees with torch"
    t_kernel = device_time(lambda: launch(vt, res, v2p, epp), device, reps=reps, graph_launches=graphs)
    t_torch = device_time(lambda: translate_tokens(vt, v2p, epp, out=res, path="torch"), device, reps=reps,
                          graph_launches=graphs)
    return {"ids": n, "kernel_s": t_kernel, "torch_s": t_torch}
