"""What the allocator's calls return: one admission, and one result per owner of a batched call.

A batch result keeps the batch's pages as flat arrays (request after request, classes in chain order, pages
in binding order) and materializes an owner's :class:`Admission` only when it is looked at, so a decode step
for thousands of requests builds no Python object per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvarena.spec.errors import ArenaError
from kvarena.spec.types import Admission, Plan, Rung


@dataclass
class BatchResult(Sequence):
    """``result[k]`` is what the sequential call for owner ``k`` returned (an :class:`Admission`) or raised
    (the error object, not raised). ``counts[k, c]`` new pages of class ``c``; ``vids`` / ``slots`` flat."""

    order: list[str]
    counts: np.ndarray  # (requests, classes)
    vids: np.ndarray
    slots: np.ndarray
    errors: dict[int, ArenaError] = field(default_factory=dict)
    plans: dict[int, Plan] = field(default_factory=dict)  # requests placed by the ladder (not rung 1 in batch)
    rows: np.ndarray | None = None  # the owners' rows (-1: not admitted): handles for the next calls
    _starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.counts)

    def starts(self) -> np.ndarray:
        if self._starts is None:
            self._starts = np.concatenate([[0], np.cumsum(self.counts.ravel())])
        return self._starts

    def pages_of(self, k: int) -> dict[str, tuple[int, ...]]:
        st, kk = self.starts(), len(self.order)
        out = {}
        for c, name in enumerate(self.order):
            a, b = st[k * kk + c], st[k * kk + c + 1]
            if b > a:
                out[name] = tuple(self.vids[a:b].tolist())
        return out

    def __getitem__(self, k: int) -> Any:  # type: ignore[override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        if k in self.errors:
            return self.errors[k]
        pages = self.pages_of(k)
        if k in self.plans:
            return Admission(pages, self.plans[k])
        if not pages:
            return Admission({}, Plan(Rung.NONE))
        st, kk = self.starts(), len(self.order)
        placements = {name: tuple(self.slots[st[k * kk + c]:st[k * kk + c + 1]].tolist())
                      for c, name in enumerate(self.order) if st[k * kk + c + 1] > st[k * kk + c]}
        return Admission(pages, Plan(Rung.REUSE, (), placements))

    @property
    def ok(self) -> np.ndarray:
        m = np.ones(len(self), dtype=bool)
        m[list(self.errors)] = False
        return m


@dataclass
class FreeResult(Sequence):
    """``result[k]``: the pages ``free(owners[k])`` freed (a list, in the order free returns them) or the error."""

    n: int
    freed: np.ndarray  # every freed page, owner after owner
    cuts: np.ndarray  # owner j's pages are freed[cuts[j]:cuts[j + 1]]
    slot_of: dict[int, int]  # batch position -> j
    errors: dict[int, ArenaError] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> Any:  # type: ignore[override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.n))]
        if k < 0:
            k += self.n
        if not 0 <= k < self.n:
            raise IndexError(k)
        if k in self.errors:
            return self.errors[k]
        j = self.slot_of[k]
        return self.freed[self.cuts[j]:self.cuts[j + 1]].tolist()
