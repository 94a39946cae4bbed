"""Planted band-boundary bugs in the worked example's pool: one off-by-one per factory, each a mistake a
two-ended pool really makes at its edges (tests/fast/test_conform_boundary.py shows ``kvarena conform``
catches every one at its default budget, and names the invariant).

    kvarena conform --impl kvarena.conformance.example.buggy:make_buggy_low_start    # exit 1: INV-NO-OVERLAP

Each is small on purpose: a random walk rarely drives a band to its last page, so these are what the boundary
scenarios (conformance/machine/boundary.py) are for.  ``make_buggy_stale_rows`` is not a boundary bug: it hands
out a reused page without zeroing it, which only the hand-out sweep of the conductor sees when no later step
reads that page.
"""

from __future__ import annotations

from kvarena.conformance.adapter.base import PoolAdapter
from kvarena.conformance.example.adapter import TwoEndedAdapter
from kvarena.conformance.example.pool import TwoEndedPool
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand
from kvarena.spec.pools import split_regions


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class LowStartPool(TwoEndedPool):
    """The low end checks where its new page STARTS, not where it ends: it may take one whole page of its
    neighbour (64 B of a toy's state band)."""

    def _low_can_grow(self) -> bool:
        return self.lo_n * self.pb[self.low] <= self._ceiling_for_low()


class HighEndPool(TwoEndedPool):
    """The high end checks where its new page ENDS (its current frontier), not where it starts."""

    def _high_can_grow(self) -> bool:
        return self.hi_n * self.pb[self.high] >= self._floor_for_high()


class LowCeilPool(TwoEndedPool):
    """The low end's backstop converted to its own slots rounded UP: a page straddling the ceiling fits
    (a partial-page overlap, only where the neighbour's edge is off the low class's grid)."""

    def _low_can_grow(self) -> bool:
        return self.lo_n < _ceil_div(self._ceiling_for_low(), self.pb[self.low])


class HighFloorPool(TwoEndedPool):
    """The high end's backstop converted to its own slots rounded DOWN (it must round up)."""

    def _high_can_grow(self) -> bool:
        return self.hi_n - 1 >= self._floor_for_high() // self.pb[self.high]


class RollbackPool(TwoEndedPool):
    """A failed alloc gives back slots with ``<=`` for ``<``: the low end's first grown slot, just past the restored
    frontier, lands in the free list (a hole outside the band)."""

    def _give_back(self, taken: dict[str, list[int]]) -> None:
        spans = self.spans()
        for c, slots in taken.items():
            lo, hi = spans[c]
            self.free[c].update(s for s in slots if lo <= s <= hi)
        self._trim()


class FloatLowEdgePool(TwoEndedPool):
    """The float's lower edge, as the low end's backstop, one page too high."""

    def _ceiling_for_low(self) -> int:
        for c in self.order[1:-1]:
            lo, hi = self.fixed[c]
            if hi > lo:
                return (lo + 1) * self.pb[c]
        return self.hi_n * self.pb[self.high]


class FloatHighEdgePool(TwoEndedPool):
    """The float's upper edge, as the high end's backstop, one page too low."""

    def _floor_for_high(self) -> int:
        for c in reversed(self.order[1:-1]):
            lo, hi = self.fixed[c]
            if hi > lo:
                return (hi - 1) * self.pb[c]
        return self.lo_n * self.pb[self.low]


class TopCeilPool(TwoEndedPool):
    """The high end's top rounded up: when the page does not divide the capacity, the page before capacity
    runs past it."""

    def __init__(self, capacity: int, page_bytes: dict[str, int], order: list[str],
                 fixed: dict[str, tuple[int, int]] | None = None, frontier_slack: int = 0) -> None:
        super().__init__(capacity, page_bytes, order, fixed, frontier_slack)
        self.top_high = self.hi_n = _ceil_div(capacity, self.pb[self.high])


class StaleRowsPool(TwoEndedPool):
    """Zeroes only the pages a frontier grows into, not a slot it takes back from its free list: a reused page
    shows the rows its last user wrote."""

    def __init__(self, capacity: int, page_bytes: dict[str, int], order: list[str],
                 fixed: dict[str, tuple[int, int]] | None = None, frontier_slack: int = 0) -> None:
        super().__init__(capacity, page_bytes, order, fixed, frontier_slack)
        self.recycled: set[tuple[str, int]] = set()  # slots taken from the free list, not zeroed

    def _one(self, c: str) -> int:
        reused = bool(self.free[c])
        s = super()._one(c)
        if reused:
            self.recycled.add((c, s))
        return s

    def _zero(self, c: str, slot: int) -> None:
        if (c, slot) in self.recycled:
            self.recycled.discard((c, slot))
            return
        super()._zero(c, slot)


def _adapter(pool: type[TwoEndedPool]) -> type[TwoEndedAdapter]:
    return type(f"{pool.__name__}Adapter", (TwoEndedAdapter,), {"pool_type": pool})


class ByteSumFloorAdapter(TwoEndedAdapter):
    """The feasibility floor from a byte sum: it forgets page-grid rounding (and that an empty float starts at its
    hint), so it builds arenas just below the floor that cannot hold one worst-case request."""

    def __init__(self, config: ArenaConfig) -> None:
        PoolAdapter.__init__(self, config)
        worst = worst_case_demand(config)
        if sum(n * self.page_bytes[c] for c, n in worst.items()) > config.capacity:
            raise CapacityTooSmallError(f"{worst} does not fit {config.capacity} B")
        regions = split_regions(config)
        self.pool = TwoEndedPool(config.capacity, self.page_bytes, self.order,
                                 {c: regions[c] for c in self.order[1:-1]})
        self.layouts = {c.name: entry_layout(c) for c in chain(config.model)}


def make_buggy_low_start(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(LowStartPool)(config)


def make_buggy_high_end(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(HighEndPool)(config)


def make_buggy_low_ceil(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(LowCeilPool)(config)


def make_buggy_high_floor(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(HighFloorPool)(config)


def make_buggy_rollback(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(RollbackPool)(config)


def make_buggy_float_low_edge(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(FloatLowEdgePool)(config)


def make_buggy_float_high_edge(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(FloatHighEdgePool)(config)


def make_buggy_top(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(TopCeilPool)(config)


def make_buggy_floor(config: ArenaConfig) -> TwoEndedAdapter:
    return ByteSumFloorAdapter(config)


def make_buggy_stale_rows(config: ArenaConfig) -> TwoEndedAdapter:
    return _adapter(StaleRowsPool)(config)


# factory name -> the invariant its bug breaks (tests/fast/test_conform_boundary.py)
PLANTED = {
    "make_buggy_low_start": "INV-NO-OVERLAP",
    "make_buggy_high_end": "INV-NO-OVERLAP",
    "make_buggy_low_ceil": "INV-NO-OVERLAP",
    "make_buggy_high_floor": "INV-NO-OVERLAP",
    "make_buggy_rollback": "INV-NO-OVERLAP",
    "make_buggy_float_low_edge": "INV-NO-OVERLAP",
    "make_buggy_float_high_edge": "INV-NO-OVERLAP",
    "make_buggy_top": "INV-NO-OVERLAP",
    "make_buggy_floor": "INV-FEASIBILITY-FLOOR",
}
