"""§State: bands of pages on one byte range (spec/arena.md §State, §Bands).

Every state class has its own page grid anchored at byte 0: slot ``s`` of a
class with page bytes ``P`` covers ``[s*P, (s+1)*P)``.  A band is the class's
contiguous span of slots ``[lo, hi)``; each slot in the span is live (bound to a
virtual page), a hole (free), or withheld (logically free, still used by a
ledger user).  Slots outside the span belong to the gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedList

from kvarena.spec.types import Role  # re-exported: the band's users import it from here


class Band:
    """One class's pages.  ``top`` is the number of whole pages that fit in the arena."""

    def __init__(self, name: str, role: Role, page_bytes: int, capacity: int) -> None:
        self.name = name
        self.role = role
        self.page_bytes = page_bytes
        self.top = capacity // page_bytes
        self.lo = self.top if role is Role.HIGH else 0
        self.hi = self.lo
        self.live: dict[int, int] = {}  # slot -> virtual page id (the p->v map)
        self.holes: SortedList = SortedList()
        self.withheld: set[int] = set()

    # -- geometry ---------------------------------------------------------------------------
    @property
    def empty(self) -> bool:
        return self.lo == self.hi

    @property
    def lo_byte(self) -> int:
        return self.lo * self.page_bytes

    @property
    def hi_byte(self) -> int:
        return self.hi * self.page_bytes

    def in_span(self, slot: int) -> bool:
        return self.lo <= slot < self.hi

    # -- holes in anchor order -------------------------------------------------------------
    def holes_in_anchor_order(self) -> Iterator[int]:
        """Holes nearest the band's anchor first: ascending, except the high band (descending)."""
        return reversed(self.holes) if self.role is Role.HIGH else iter(self.holes)

    def first_holes(self, k: int) -> list[int]:
        if k <= 0:
            return []
        if self.role is Role.HIGH:
            return list(self.holes.islice(max(0, len(self.holes) - k), reverse=True))
        return list(self.holes.islice(0, k))

    def holes_toward(self, limit: int, k: int) -> list[int]:
        """The ``k`` holes rung 1 takes under a placement limit (spec/arena.md §Placement limit): the holes on
        the anchor side of slot ``limit`` nearest it first, then the others nearest it. The low band's anchor
        side is ``< limit``, the high band's ``>= limit``. O(k + log n)."""
        if k <= 0:
            return []
        h = self.holes
        j = h.bisect_left(limit)
        if self.role is Role.HIGH:
            out = list(h.islice(j, j + k))  # >= limit, ascending: nearest the limit first
            return out + list(h.islice(max(0, j - (k - len(out))), j, reverse=True))
        out = list(h.islice(max(0, j - k), j, reverse=True))  # < limit, descending: nearest the limit first
        return out + list(h.islice(j, j + k - len(out)))

    @property
    def hole_count(self) -> int:
        return len(self.holes)

    # -- mutation helpers (callers guarantee the preconditions) ----------------------------
    def hole_run(self, slot: int, step: int) -> int:
        """How many consecutive holes start at ``slot`` going ``step`` (+1 up, -1 down); 0 if ``slot`` is not a
        hole.  Galloping over the sorted holes (1, 2, 4, ... positions, then bisection): O(log n + log(run) x
        log n), never a walk over the slots, and one lookup more than the bisection for a run of one."""
        h = self.holes
        i = h.bisect_left(slot)
        if i == len(h) or h[i] != slot:
            return 0
        limit = len(h) - i if step > 0 else i + 1  # positions available in the direction of the run

        def run_at(j: int) -> bool:  # holes[i + step*j] == slot + step*j: the run is at least j + 1 long
            return h[i + step * j] == slot + step * j

        good, j = 0, 1
        while j < limit and run_at(j):
            good, j = j, 2 * j
        bad = min(j, limit)
        while bad - good > 1:
            mid = (good + bad) // 2
            if run_at(mid):
                good = mid
            else:
                bad = mid
        return good + 1

    def absorb_boundary_holes(self) -> int:
        """Give boundary holes back to the gap (zero-copy). Returns slots absorbed: O(log^2 n + absorbed)."""
        n = 0
        if self.role is not Role.HIGH and self.hi > self.lo:
            k = self.hole_run(self.hi - 1, -1)  # holes lie in the span, so these are the k largest
            if k:
                del self.holes[len(self.holes) - k:]
                self.hi -= k
                n += k
        if self.role is not Role.LOW and self.lo < self.hi:
            k = self.hole_run(self.lo, 1)  # the k smallest holes
            if k:
                del self.holes[:k]
                self.lo += k
                n += k
        if self.role is Role.FLOAT and self.empty:
            self.lo = self.hi = 0  # parked: an empty float has no position
        return n

    def extend_to(self, slot: int) -> None:
        """Grow the span by one slot adjacent to it (or start an empty float at ``slot``)."""
        if self.role is Role.FLOAT and self.empty:
            self.lo, self.hi = slot, slot + 1
        elif slot == self.hi and self.role is not Role.HIGH:
            self.hi += 1
        elif slot == self.lo - 1 and self.role is not Role.LOW:
            self.lo -= 1
        else:  # pragma: no cover - planner bug
            raise AssertionError(f"{self.name}: slot {slot} is not adjacent to span [{self.lo}, {self.hi})")

    def state_of(self, slot: int) -> str:
        if not self.in_span(slot):
            return "gap"
        if slot in self.live:
            return "live"
        if slot in self.withheld:
            return "withheld"
        return "hole"


@dataclass
class BandView:
    """A band as the planner sees it after planned moves: span and holes, read-only.

    ``holes`` is a callable giving the first k holes in anchor order and ``hole_count``
    their number, so a view never copies the band's hole list.
    """

    name: str
    role: Role
    page_bytes: int
    top: int
    lo: int
    hi: int
    hole_count: int
    _first: Callable[[int], list[int]]

    @staticmethod
    def of(band: Band, limit: int | None = None) -> BandView:
        """The band as it is; with a placement ``limit`` slot its holes come in ``Band.holes_toward`` order."""
        first = band.first_holes if limit is None else (lambda k: band.holes_toward(limit, k))
        return BandView(band.name, band.role, band.page_bytes, band.top, band.lo, band.hi, band.hole_count, first)

    def first_holes(self, k: int) -> list[int]:
        return self._first(k)

    @property
    def empty(self) -> bool:
        return self.lo == self.hi

    @property
    def lo_byte(self) -> int:
        return self.lo * self.page_bytes

    @property
    def hi_byte(self) -> int:
        return self.hi * self.page_bytes


def explicit_view(band: Band, lo: int, hi: int, holes_anchor_order: list[int]) -> BandView:
    """A view whose holes are a small explicit list (already in anchor order)."""
    return BandView(band.name, band.role, band.page_bytes, band.top, lo, hi, len(holes_anchor_order),
                    lambda k: holes_anchor_order[:max(0, k)])


def merge_anchor_order(role: Role, a: Iterable[int], b: Iterable[int]) -> Iterator[int]:
    """Merge two hole streams that are each in anchor order."""
    import heapq

    if role is Role.HIGH:
        return heapq.merge(a, b, reverse=True)
    return heapq.merge(a, b)
