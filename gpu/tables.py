"""Device-resident v->p and p->v tables (spec/arena.md §Virtual pages), written, never read, on the hot path.

``v2p[c, vid]`` is the slot on class ``c``'s page grid that virtual page ``vid`` is bound to, or -1 (unbound,
or a page of another class); ``p2v[c, slot]`` is the virtual page bound to that slot, or -1. One row per
class, so an attention kernel translates with its own class's row alone (``kernels.translate``) and no
lookup ever lands on another class's page.

Virtual ids are one global space, and the planner always takes the lowest unbound id, so no id ever exceeds
the number of pages bound at once, which is at most ``sum(top_c)``: that is the row length of ``v2p``.

Both tables are views of one flat device tensor (``flat``: v->p rows first, then p->v rows), so the
changes of a call are one upload through the pinned staging ring (``staging.py``) of flat indices and values
and **one** ``index_copy_`` into ``flat``, whatever the batch or the number of classes (the index ranges of
the two tables are disjoint, so the one scatter has no duplicate index). A decode step's frontier run of
consecutive ids and slots needs no index at all: its v->p and p->v slices are one strided ``(2, n)`` view of
``flat`` and one staged copy (``bind_run``). Moves remap inside the move kernel
itself (``kernels.move``, ``remap=``). ``host_v2p`` reads the tables
back (the ``observe()`` of the conformance adapter, never on the hot path), so a table that drifted from
the plan is seen.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvarena.gpu.staging import Staging


class Tables:
    def __init__(self, order: Sequence[str], tops: dict[str, int], device: torch.device,
                 staging: Staging) -> None:
        self.order = list(order)
        self.index = {c: i for i, c in enumerate(self.order)}
        self.device = device
        self.staging = staging
        self.n_vids = sum(tops.values())
        self.width = max(tops.values())
        k = len(self.order)
        # one spare column each: the lanes of a fixed-width step that carry no page write -1 there
        self.cols_v, self.cols_p = self.n_vids + 1, self.width + 1
        self.p_base = k * self.cols_v  # where p->v starts in ``flat``
        self.flat = torch.full((k * (self.cols_v + self.cols_p),), -1, dtype=torch.int64, device=device)
        self.v2p = self.flat[:self.p_base].view(k, self.cols_v)
        self.p2v = self.flat[self.p_base:].view(k, self.cols_p)
        self.v_rows, self.p_rows = list(self.v2p.unbind(0)), list(self.p2v.unbind(0))  # row views, made once
        self.launches = 0

    def row(self, cls: str) -> torch.Tensor:
        """Class ``cls``'s v->p row (what ``kernels.translate`` takes)."""
        return self.v2p[self.index[cls]]

    def scatter(self, n: int, parts: list[np.ndarray], adds: list[int] | None = None) -> torch.Tensor:
        """One upload of ``parts`` (their concatenation, ``adds`` as in ``Staging.upload_parts``: ``n`` flat
        indices into ``flat``, then their ``n`` values, then anything riding along) and one scatter; returns
        the uploaded device slice."""
        dev = self.staging.upload_parts(parts, adds)
        self.flat.index_copy_(0, dev[:n], dev[n:2 * n])
        self.launches += 1
        return dev

    def bind(self, classes: np.ndarray | int, vids: np.ndarray, slots: np.ndarray,
             extra: np.ndarray | None = None) -> torch.Tensor | None:
        """New pages ``(class index, vid, slot)`` (``classes`` an array, or one int for a one-class step): both
        tables, one upload and one scatter; ``extra`` rides in the same upload (the allocator's zeroing list)
        and comes back as a device slice (without it: the uploaded slots, which a one-class step zeroes as they
        are)."""
        n = len(vids)
        if not n:
            return None
        if isinstance(classes, int):  # one class: [vids | slots] and one scatter per row, no index arithmetic
            dev = self.staging.upload_parts([vids, slots])
            v, s = dev[:n], dev[n:]
            self.v_rows[classes].index_copy_(0, v, s)
            self.p_rows[classes].index_copy_(0, s, v)
            self.launches += 2
            return s
        parts = [classes * self.cols_v + vids, (self.p_base + classes * self.cols_p) + slots, slots, vids]
        if extra is not None:
            parts.append(extra)
        dev = self.scatter(2 * n, parts)
        return dev[2 * n:3 * n] if extra is None else dev[4 * n:]

    def bind_run(self, c: int, vids: np.ndarray, slots: np.ndarray, first: int, by_slot: np.ndarray,
                 v_run: bool) -> None:
        """One class's new pages whose slots are the run ``[first, first + n)`` (frontier pages; ``by_slot``: the
        ids in slot order) and whose ``vids`` ascend. When the ids are a run too (``v_run``: the pool's lowest
        ids usually are), both entries are contiguous: ``flat``'s v->p slice and p->v slice as one strided
        ``(2, n)`` view, one staged copy, no scatter. Else one upload and a scatter per row."""
        n = len(vids)
        if v_run:  # the ids v0 .. v0 + n - 1
            a, b = c * self.cols_v + int(vids[0]), self.p_base + c * self.cols_p + first  # b - a >= n: disjoint rows
            self.staging.copy_rows(self.flat.as_strided((2, n), (b - a, 1), a), [slots, by_slot])
            return
        dev = self.staging.upload_parts([vids, slots])
        self.v_rows[c].index_copy_(0, dev[:n], dev[n:])
        self.p_rows[c].index_copy_(0, dev[n:], dev[:n])
        self.launches += 2

    def unbind(self, classes: np.ndarray, vids: np.ndarray, slots: np.ndarray) -> None:
        """Freed pages: both entries back to -1."""
        n = len(vids)
        if n:
            none = np.full(2 * n, -1, dtype=np.int64)
            self.scatter(2 * n, [classes * self.cols_v + vids, self.p_base + classes * self.cols_p + slots, none])

    def host_v2p(self) -> dict[int, tuple[str, int]]:
        """``{vid: (cls, slot)}`` read back from the device."""
        v2p = self.v2p.cpu()
        out: dict[int, tuple[str, int]] = {}
        for c, name in enumerate(self.order):
            for vid in (v2p[c] >= 0).nonzero().flatten().tolist():
                assert vid not in out, f"virtual page {vid} is bound in two classes' rows"
                out[vid] = (name, int(v2p[c, vid]))
        return dict(sorted(out.items()))

    def host_p2v(self) -> dict[tuple[str, int], int]:
        p2v = self.p2v.cpu()
        return {(name, s): int(p2v[c, s]) for c, name in enumerate(self.order)
                for s in (p2v[c] >= 0).nonzero().flatten().tolist()}
