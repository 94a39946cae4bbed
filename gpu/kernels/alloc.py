"""Batched allocation for extend and decode in one launch (SGLang's ``alloc_extend`` / ``alloc_decode``).

The host planner (spec/arena.md §Admission ladder) has already chosen the new pages: ``page_vids[k]`` bound
to ``page_slots[k]``, request after request, in token order. One launch then, for a batch of requests that
grow from ``pre_lens[r]`` to ``seq_lens[r]`` tokens,

1. writes the virtual token id of every new token to ``out`` (request after request): a token that still
   fits the request's last, partly used page continues after ``last_loc[r]``; the others go to the new pages,
   ``vid * EPP + position in page``;
2. binds the new pages in the device tables: ``v2p[vid] = slot`` and ``p2v[slot] = vid``.

Program ``(rb, tc)`` handles requests ``[rb * BLOCK_R, (rb + 1) * BLOCK_R)`` and, of each, new tokens
``[tc * BLOCK_T, (tc + 1) * BLOCK_T)``. Where its requests' tokens and pages start in ``out`` and the page
list is the sum over earlier requests, which each program adds up itself (``SCAN`` requests per step), so
there is no second launch for a prefix sum. A new page is bound by the program holding the token that opens
it, so each page is bound exactly once. The allocator's own binds (``admit``/``extend`` by pages) are one
request of ``n`` one-entry tokens with ``write_out=False``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kvarena.gpu.kernels.common import Path, as_index, device_time, next_pow2, use_triton


@triton.jit
def alloc_tokens_kernel(
    pre_ptr,  # *int [bs]: tokens each request held before (not read when DECODE: seq - 1)
    seq_ptr,  # *int [bs]: tokens each request holds after
    last_ptr,  # *int64 [bs]: virtual token id of each request's last held token (read where its page has room)
    vids_ptr,  # *int64 [pages]: the planner's new virtual pages, request after request, in token order
    slots_ptr,  # *int64 [pages]: the slot on the class's grid the planner chose for each
    out_ptr,  # *int64 [tokens]: out: virtual token id of every new token, request after request
    v2p_ptr,  # *int64: this class's v->p row, updated for the new pages
    p2v_ptr,  # *int64: this class's p->v row, updated for the new pages
    bs,  # number of requests
    n_pages,  # length of vids / slots: a batch whose counts disagree with the planner never reads past them
    EPP: tl.constexpr,  # entries per page: page_size tokens, or 1 (a recurrent slot; or pages bound one by one)
    DECODE: tl.constexpr,  # one new token per request
    WRITE_OUT: tl.constexpr,  # False: bind the pages only
    BLOCK_R: tl.constexpr,  # requests per program
    BLOCK_T: tl.constexpr,  # new tokens per request per program
    SCAN: tl.constexpr,  # earlier requests summed per step of the prefix
):
    rb = tl.program_id(0)
    tc = tl.program_id(1)
    # 1. tokens and pages of the requests before this block (vector accumulators: no scalar loop carry)
    tok_acc = tl.zeros([SCAN], dtype=tl.int64)
    page_acc = tl.zeros([SCAN], dtype=tl.int64)
    lim = rb * BLOCK_R
    for s in range(0, lim, SCAN):
        r = s + tl.arange(0, SCAN)
        m = r < lim
        seq = tl.load(seq_ptr + r, mask=m, other=0).to(tl.int64)
        if DECODE:
            pre = tl.where(m, seq - 1, 0)
        else:
            pre = tl.load(pre_ptr + r, mask=m, other=0).to(tl.int64)
        tok_acc += seq - pre
        page_acc += (seq + EPP - 1) // EPP - (pre + EPP - 1) // EPP
    tok_base = tl.sum(tok_acc, 0)
    page_base = tl.sum(page_acc, 0)

    # 2. this block's requests: where each one's tokens and pages start
    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < bs
    seq = tl.load(seq_ptr + r, mask=rm, other=0).to(tl.int64)
    if DECODE:
        pre = tl.where(rm, seq - 1, 0)
    else:
        pre = tl.load(pre_ptr + r, mask=rm, other=0).to(tl.int64)
    last = tl.load(last_ptr + r, mask=rm, other=0).to(tl.int64)
    ext = seq - pre
    first_new = (pre + EPP - 1) // EPP  # the request's first page that is new
    n_new = (seq + EPP - 1) // EPP - first_new
    tok_start = tok_base + tl.cumsum(ext, 0) - ext
    page_start = page_base + tl.cumsum(n_new, 0) - n_new

    # 3. the tile of new tokens: position q in its request, index k of its page in the page list
    j = tc * BLOCK_T + tl.arange(0, BLOCK_T)
    q = pre[:, None] + j[None, :]
    valid = rm[:, None] & (j[None, :] < ext[:, None])
    in_old = q < (first_new * EPP)[:, None]  # still fits the last, partly used page
    k = page_start[:, None] + q // EPP - first_new[:, None]
    fresh = valid & (q >= (first_new * EPP)[:, None]) & (k < n_pages)
    vid = tl.load(vids_ptr + k, mask=fresh, other=0)
    if WRITE_OUT:
        loc = tl.where(in_old, last[:, None] + 1 + j[None, :], vid * EPP + q % EPP)
        tl.store(out_ptr + tok_start[:, None] + j[None, :], loc, mask=valid)
    opens = fresh & (q % EPP == 0)  # the token that opens a new page binds it
    slot = tl.load(slots_ptr + k, mask=opens, other=0)
    tl.store(v2p_ptr + vid, slot, mask=opens)
    tl.store(p2v_ptr + slot, vid, mask=opens)


def tile(bs: int, max_ext: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_T): up to 1,024 new tokens of one request, up to 4,096 tokens per program."""
    block_t = min(next_pow2(max(max_ext, 1)), 1024)
    block_r = max(1, min(next_pow2(bs), 4096 // block_t, 1024))
    return block_r, block_t


def launch(pre: torch.Tensor | None, seq: torch.Tensor, last: torch.Tensor, vids: torch.Tensor,
           slots: torch.Tensor, out: torch.Tensor | None, v2p_row: torch.Tensor, p2v_row: torch.Tensor,
           epp: int, max_ext: int, *, decode: bool = False, num_warps: int = 4) -> None:
    """The kernel alone: every tensor on one device; ``max_ext`` (host int) sizes the grid."""
    bs = seq.numel()
    if bs == 0 or max_ext <= 0:
        return
    block_r, block_t = tile(bs, 1 if decode else max_ext)
    grid = (triton.cdiv(bs, block_r), triton.cdiv(1 if decode else max_ext, block_t))
    alloc_tokens_kernel[grid](seq if pre is None else pre, seq, last, vids, slots, vids if out is None else out,
                              v2p_row, p2v_row, bs, vids.numel(), EPP=epp, DECODE=decode, WRITE_OUT=out is not None,
                              BLOCK_R=block_r, BLOCK_T=block_t, SCAN=1024, num_warps=num_warps)


def alloc_tokens(pre_lens: torch.Tensor | None, seq_lens: torch.Tensor, last_loc: torch.Tensor,
                 page_vids: torch.Tensor, page_slots: torch.Tensor, v2p_row: torch.Tensor, p2v_row: torch.Tensor,
                 epp: int, *, out: torch.Tensor | None = None, num_tokens: int | None = None,
                 max_extend: int | None = None, write_out: bool = True, path: Path = "auto") -> torch.Tensor | None:
    """Extend (``pre_lens`` given) or decode (``pre_lens=None``: one token each) a batch in one launch.

    ``num_tokens`` (the sum of new tokens) and ``max_extend`` are what the scheduler knows on the host;
    passing them avoids a device sync. Returns ``out`` (the virtual token ids), or None with ``write_out=False``.
    """
    if epp <= 0 or epp & (epp - 1):
        raise ValueError(f"entries per page must be a power of two, got {epp}")
    decode = pre_lens is None
    if write_out and out is None:
        if num_tokens is None:
            num_tokens = seq_lens.numel() if decode else int((seq_lens - pre_lens).sum())
        out = torch.empty(num_tokens, dtype=torch.int64, device=seq_lens.device)
    if not write_out:
        out = None
    if use_triton(alloc_tokens_kernel, seq_lens, path):
        if max_extend is None:
            max_extend = 1 if decode else int((seq_lens - pre_lens).max()) if seq_lens.numel() else 0
        launch(pre_lens, seq_lens, last_loc, page_vids, page_slots, out, v2p_row, p2v_row, epp, max_extend,
               decode=decode)
        return out
    _alloc_torch(pre_lens, seq_lens, last_loc, page_vids, page_slots, out, v2p_row, p2v_row, epp)
    return out


def _alloc_torch(pre: torch.Tensor | None, seq: torch.Tensor, last: torch.Tensor, vids: torch.Tensor,
                 slots: torch.Tensor, out: torch.Tensor | None, v2p_row: torch.Tensor, p2v_row: torch.Tensor,
                 epp: int) -> None:
    """The same computation in torch ops (CPU path): token by token, vectorised."""
    seq = seq.to(torch.int64)
    pre = seq - 1 if pre is None else pre.to(torch.int64)
    v2p_row[vids] = slots
    p2v_row[slots] = vids
    if out is None:
        return
    ext = seq - pre
    first_new = (pre + epp - 1) // epp
    n_new = (seq + epp - 1) // epp - first_new
    req = torch.repeat_interleave(torch.arange(seq.numel(), device=seq.device), ext)
    j = torch.arange(req.numel(), device=seq.device) - (torch.cumsum(ext, 0) - ext)[req]
    q = pre[req] + j
    in_old = q < first_new[req] * epp
    k = ((torch.cumsum(n_new, 0) - n_new)[req] + q // epp - first_new[req]).clamp(0, max(vids.numel() - 1, 0))
    vid = vids[k] if vids.numel() else torch.zeros_like(k)
    out.copy_(torch.where(in_old, last.to(torch.int64)[req] + 1 + j, vid * epp + q % epp))


# ---------------------------------------------------------------------------------------------


def reference(pre: Sequence[int], seq: Sequence[int], last: Sequence[int], vids: Sequence[int],
              epp: int) -> list[int]:
    """Plain Python, request by request and token by token: the definition the kernel must meet."""
    out: list[int] = []
    k = 0
    for p, s, lst in zip(pre, seq, last):
        for q in range(p, s):
            if q < -(-p // epp) * epp:  # the last, partly used page still has room
                out.append(lst + 1 + (q - p))
            else:
                if q % epp == 0:
                    k += 1
                out.append(vids[k - 1] * epp + q % epp)
    assert k == len(vids), "the page list does not match the lens"
    return out


def random_batch(g: torch.Generator, bs: int, epp: int, max_ext: int, decode: bool, n_vids: int = 1 << 12
                 ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """pre, seq, last, vids, slots of a random batch (zero-token extends included when not decoding)."""
    pre = torch.randint(0, 4 * epp + 1, (bs,), generator=g).tolist()
    ext = [1] * bs if decode else torch.randint(0, max_ext + 1, (bs,), generator=g).tolist()
    seq = [p + e for p, e in zip(pre, ext)]
    n_pages = sum(-(-s // epp) - -(-p // epp) for p, s in zip(pre, seq))
    vids = torch.randperm(max(n_vids, n_pages), generator=g)[:n_pages].tolist()
    slots = torch.randperm(max(n_vids, n_pages), generator=g)[:n_pages].tolist()
    last = [int(torch.randint(0, n_vids, (1,), generator=g)) * epp + (p - 1) % epp if p else -1 for p in pre]
    return pre, seq, last, vids, slots


def check(device: str | torch.device = "cpu", *, path: Path = "auto", bs: int = 9, epp: int = 4, max_ext: int = 11,
          decode: bool = False, guard: int = 16, seed: int | None = None) -> None:
    """A random batch against ``reference``: token ids, both table rows, and sentinel guards around all three."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    pre, seq, last, vids, slots = random_batch(g, bs, epp, max_ext, decode, n_vids=64)
    want = reference(pre, seq, last, vids, epp)
    n_tab = 64 + max(len(vids), 1)
    v2p0 = torch.randint(0, 1 << 40, (guard + n_tab + guard,), dtype=torch.int64, generator=g)
    p2v0 = torch.randint(0, 1 << 40, (guard + n_tab + guard,), dtype=torch.int64, generator=g)
    v2p_want, p2v_want = v2p0.clone(), p2v0.clone()
    for v, s in zip(vids, slots):
        v2p_want[guard + v] = s
        p2v_want[guard + s] = v
    sentinel = -0x3C3C3C3C3C3C3C3C
    buf = torch.full((guard + len(want) + guard,), sentinel, dtype=torch.int64, device=device)
    v2p, p2v = v2p0.to(device), p2v0.to(device)

    def t(xs: list[int]) -> torch.Tensor:
        return as_index(xs, torch.device(device))

    alloc_tokens(None if decode else t(pre), t(seq), t(last), t(vids), t(slots), v2p[guard:guard + n_tab],
                 p2v[guard:guard + n_tab], epp, out=buf[guard:guard + len(want)], max_extend=max_ext, path=path)
    got = buf.cpu().tolist()
    assert got[:guard] == [sentinel] * guard and got[guard + len(want):] == [sentinel] * guard, \
        "alloc wrote outside its output (guard words changed)"
    bad = [(i, w, h) for i, (w, h) in enumerate(zip(want, got[guard:guard + len(want)])) if w != h]
    assert not bad, f"{len(bad)} of {len(want)} token ids wrong (index, want, got): {bad[:4]}"
    assert torch.equal(v2p.cpu(), v2p_want), "v2p row differs from the reference (binds or guards)"
    assert torch.equal(p2v.cpu(), p2v_want), "p2v row differs from the reference (binds or guards)"


def bench(device: str | torch.device, batch_sizes: Sequence[int], *, epp: int = 64, decode: bool = True,
          max_ext: int = 256, reps: int = 50, graph_launches: int = 20) -> list[dict]:
    """Per batch size: one launch (inputs already on the device, as the scheduler keeps them), in seconds."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(1)
    out = []
    for bs in batch_sizes:
        pre, seq, last, vids, slots = random_batch(g, bs, epp, max_ext, decode, n_vids=1 << 16)
        want = reference(pre, seq, last, vids, epp)
        pre_t, seq_t, last_t = (as_index(x, device) for x in (pre, seq, last))
        vids_t, slots_t = as_index(vids, device), as_index(slots, device)
        v2p = torch.full((1 << 16,), -1, dtype=torch.int64, device=device)
        p2v = torch.full((1 << 16,), -1, dtype=torch.int64, device=device)
        res = torch.empty(len(want), dtype=torch.int64, device=device)
        ext = 1 if decode else max(s - p for p, s in zip(pre, seq))

        def run() -> None:
            launch(None if decode else pre_t, seq_t, last_t, vids_t, slots_t, res, v2p, p2v, epp, ext,  # noqa: B023
                   decode=decode)

        run()
        assert res.tolist() == want, "alloc kernel disagrees with the reference before timing"
        graphs = graph_launches if device.type == "cuda" else 0
        t_kernel = device_time(run, device, reps=reps, graph_launches=graphs)
        out.append({"requests": bs, "tokens": len(want), "pages": len(vids), "kernel_s": t_kernel})
    return out
