"""Device-resident v->p and p->v tables (spec/arena.md §Virtual pages).

``v2p[c, vid]`` is the slot on class ``c``'s page grid that virtual page ``vid`` is bound to, or -1 (unbound,
or a page of another class); ``p2v[c, slot]`` is the virtual page bound to that slot, or -1. One row per
class, so an attention kernel translates with its own class's row alone (``kernels.translate``) and no
lookup ever lands on another class's page.

Virtual ids are one global space, and the planner always takes the lowest unbound id, so no id ever exceeds
the number of pages bound at once, which is at most ``sum(top_c)``: that is the row length of ``v2p``.

The host planner decides every change; these tables follow it on the device: binds through the batched
allocation kernel (``kernels.alloc``), moves and frees through indexed stores. ``host_v2p`` reads them back
(the ``observe()`` of the conformance adapter), so a table that drifted from the plan is seen.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvarena.gpu.kernels import as_index
from kvarena.gpu.kernels.alloc import alloc_tokens


class Tables:
    def __init__(self, order: Sequence[str], tops: dict[str, int], device: torch.device) -> None:
        self.order = list(order)
        self.index = {c: i for i, c in enumerate(self.order)}
        self.device = device
        self.n_vids = sum(tops.values())
        self.v2p = torch.full((len(self.order), self.n_vids), -1, dtype=torch.int64, device=device)
        self.p2v = torch.full((len(self.order), max(tops.values())), -1, dtype=torch.int64, device=device)
        self._zero = torch.zeros(1, dtype=torch.int64, device=device)
        self._none = torch.full((1,), -1, dtype=torch.int64, device=device)

    def row(self, cls: str) -> torch.Tensor:
        """Class ``cls``'s v->p row (what ``kernels.translate`` takes)."""
        return self.v2p[self.index[cls]]

    def bind(self, cls: str, vids: Sequence[int], slots: Sequence[int]) -> None:
        """New pages of one class: one launch of the batched allocation kernel (one request of n one-entry
        tokens, no token output)."""
        if not vids:
            return
        c = self.index[cls]
        n = torch.tensor([len(vids)], dtype=torch.int64, device=self.device)
        alloc_tokens(self._zero, n, self._none, as_index(vids, self.device), as_index(slots, self.device),
                     self.v2p[c], self.p2v[c], 1, write_out=False, max_extend=len(vids))

    def unbind(self, pages: Sequence[tuple[str, int, int]]) -> None:
        """Freed pages ``(cls, vid, slot)``: both entries back to -1."""
        if not pages:
            return
        c = as_index([self.index[p[0]] for p in pages], self.device)
        self.v2p[c, as_index([p[1] for p in pages], self.device)] = -1
        self.p2v[c, as_index([p[2] for p in pages], self.device)] = -1

    def remap(self, cls: str, vids: Sequence[int], src: Sequence[int], dst: Sequence[int]) -> None:
        """Moved pages of one batch (no slot is both a source and a destination)."""
        if not vids:
            return
        c = self.index[cls]
        v, d = as_index(vids, self.device), as_index(dst, self.device)
        self.p2v[c, as_index(src, self.device)] = -1
        self.p2v[c, d] = v
        self.v2p[c, v] = d

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
