"""Device-resident v->p and p->v tables (spec/arena.md §Virtual pages), written, never read, on the hot path.

``v2p[c, vid]`` is the slot on class ``c``'s page grid that virtual page ``vid`` is bound to, or -1 (unbound,
or a page of another class); ``p2v[c, slot]`` is the virtual page bound to that slot, or -1. One row per
class, so an attention kernel translates with its own class's row alone (``kernels.translate``) and no
lookup ever lands on another class's page.

Virtual ids are one global space, and the planner always takes the lowest unbound id, so no id ever exceeds
the number of pages bound at once, which is at most ``sum(top_c)``: that is the row length of ``v2p``.

The host (numpy mirrors in ``hoststate.py``) decides every change; each change of a call is one upload
through the pinned staging ring (``staging.py``) of flat table indices and values, then one scatter per
table: two launches per call, whatever the batch or the number of classes. Moves remap inside the move kernel
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
        # one spare column each: the lanes of a fixed-width step that carry no page write -1 there
        self.v2p = torch.full((len(self.order), self.n_vids + 1), -1, dtype=torch.int64, device=device)
        self.p2v = torch.full((len(self.order), self.width + 1), -1, dtype=torch.int64, device=device)
        self.launches = 0

    def row(self, cls: str) -> torch.Tensor:
        """Class ``cls``'s v->p row (what ``kernels.translate`` takes)."""
        return self.v2p[self.index[cls]]

    def _scatter(self, v_idx: np.ndarray, v_val: np.ndarray, p_idx: np.ndarray, p_val: np.ndarray,
                 extra: np.ndarray | None = None) -> torch.Tensor | None:
        """One upload of both tables' (index, value) pairs (and ``extra``, whose device slice is returned)."""
        n, m = len(v_idx), len(p_idx)
        parts = [v_idx, v_val, p_idx, p_val] if extra is None else [v_idx, v_val, p_idx, p_val, extra]
        dev = self.staging.upload(np.concatenate(parts))
        if m:
            self.p2v.view(-1).index_copy_(0, dev[2 * n:2 * n + m], dev[2 * n + m:2 * (n + m)])
        if n:
            self.v2p.view(-1).index_copy_(0, dev[:n], dev[n:2 * n])
        self.launches += 2
        return dev[n:2 * n] if extra is None else dev[2 * (n + m):]

    def bind(self, classes: np.ndarray, vids: np.ndarray, slots: np.ndarray,
             extra: np.ndarray | None = None) -> torch.Tensor | None:
        """New pages ``(class index, vid, slot)``: both tables, one upload and two scatters; ``extra`` rides in
        the same upload (the allocator's zeroing list) and comes back as a device slice (without it: the
        uploaded slots, which a one-class step zeroes as they are)."""
        if len(vids):
            return self._scatter(classes * (self.n_vids + 1) + vids, slots, classes * (self.width + 1) + slots,
                                 vids, extra)
        return None

    def unbind(self, classes: np.ndarray, vids: np.ndarray, slots: np.ndarray) -> None:
        """Freed pages: both entries back to -1."""
        if len(vids):
            none = np.full(len(vids), -1, dtype=np.int64)
            self._scatter(classes * (self.n_vids + 1) + vids, none, classes * (self.width + 1) + slots, none)

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
