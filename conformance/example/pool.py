"""A third-party KV pool, as an engine might have written it before meeting kvarena.

One byte arena shared by page classes: the first class grows up from byte 0, the last grows down from
the top, any class in between gets a fixed region.  Freed pages go to a per-class free list and are
reused lowest-first; a page freed at a frontier pulls the frontier back.  Rows are 8-byte tags stored
at byte offsets of the arena (sparse: only written bytes are kept), and every page handed out is zeroed.

``frontier_slack`` is the planted bug of the worked example: 0 is correct; a positive value lets a
growing end cross into its neighbour's bytes by up to that many bytes (the floor-vs-ceil kind of
frontier check SGLang's grow-down backstop had), which kvarena's conformance run must catch.  buggy.py
plants nine more boundary bugs, most as a subclass overriding one check (_low_can_grow, _give_back, ...).
"""

from __future__ import annotations


class PoolFull(Exception):
    """No room for the request."""


class TwoEndedPool:
    def __init__(self, capacity: int, page_bytes: dict[str, int], order: list[str],
                 fixed: dict[str, tuple[int, int]] | None = None, frontier_slack: int = 0) -> None:
        self.capacity = capacity
        self.pb = dict(page_bytes)
        self.order = list(order)
        self.low, self.high = order[0], order[-1]
        self.fixed = {c: (lo // self.pb[c], hi // self.pb[c]) for c, (lo, hi) in (fixed or {}).items()}
        self.top_high = capacity // self.pb[self.high]
        self.lo_n = 0  # low band: slots [0, lo_n)
        self.hi_n = self.top_high  # high band: slots [hi_n, top_high)
        self.free: dict[str, set[int]] = {c: set() for c in order}
        for c, (lo, hi) in self.fixed.items():
            self.free[c] = set(range(lo, hi))
        self.mem: dict[int, int] = {}  # byte offset -> tag
        self.slack = frontier_slack

    # -- where the ends may grow -------------------------------------------------------------------
    def _ceiling_for_low(self) -> int:
        """The lowest byte above the low band that belongs to someone else."""
        for c in self.order[1:-1]:
            lo, hi = self.fixed[c]
            if hi > lo:
                return lo * self.pb[c]
        return self.hi_n * self.pb[self.high]

    def _floor_for_high(self) -> int:
        for c in reversed(self.order[1:-1]):
            lo, hi = self.fixed[c]
            if hi > lo:
                return hi * self.pb[c]
        return self.lo_n * self.pb[self.low]

    # -- the pool's API --------------------------------------------------------------------------------
    def alloc(self, request: dict[str, int]) -> dict[str, list[int]]:
        """Slots for every class of ``request``, all or nothing (PoolFull)."""
        taken: dict[str, list[int]] = {}
        saved = (self.lo_n, self.hi_n)
        try:
            for c, n in request.items():
                got = taken.setdefault(c, [])
                for _ in range(n):
                    got.append(self._one(c))
        except PoolFull:
            self.lo_n, self.hi_n = saved  # frontier pages go back with the frontiers
            self._give_back(taken)
            raise
        for c, slots in taken.items():
            for s in slots:
                self._zero(c, s)
        return taken

    def _one(self, c: str) -> int:
        if self.free[c]:
            s = min(self.free[c])
            self.free[c].discard(s)
            return s
        if c == self.low and self._low_can_grow():
            self.lo_n += 1
            return self.lo_n - 1
        if c == self.high and self._high_can_grow():
            self.hi_n -= 1
            return self.hi_n
        raise PoolFull(c)

    def _low_can_grow(self) -> bool:
        """The low end's next page, bytes [lo_n·P, (lo_n + 1)·P), ends at or below the ceiling."""
        return (self.lo_n + 1) * self.pb[self.low] <= self._ceiling_for_low() + self.slack

    def _high_can_grow(self) -> bool:
        """The high end's next page, bytes [(hi_n - 1)·P, hi_n·P), starts at or above the floor."""
        return (self.hi_n - 1) * self.pb[self.high] + self.slack >= self._floor_for_high()

    def _give_back(self, taken: dict[str, list[int]]) -> None:
        """A failed alloc: slots it took from the free lists go back; slots past the restored frontiers are gone."""
        spans = self.spans()
        for c, slots in taken.items():
            lo, hi = spans[c]
            self.free[c].update(s for s in slots if lo <= s < hi)
        self._trim()

    def release(self, c: str, slots: list[int]) -> None:
        self.free[c].update(slots)
        self._trim()

    def _trim(self) -> None:
        """Pull the ends back over free pages at their frontiers."""
        while self.lo_n and self.lo_n - 1 in self.free[self.low]:
            self.lo_n -= 1
            self.free[self.low].discard(self.lo_n)
        while self.hi_n < self.top_high and self.hi_n in self.free[self.high]:
            self.free[self.high].discard(self.hi_n)
            self.hi_n += 1

    def spans(self) -> dict[str, tuple[int, int]]:
        out = {c: self.fixed[c] for c in self.order[1:-1]}
        out[self.low] = (0, self.lo_n)
        out[self.high] = (self.hi_n, self.top_high)
        return out

    def page_start(self, c: str, slot: int) -> int:
        return slot * self.pb[c]

    def store(self, offset: int, tag: int) -> None:
        self.mem[offset] = tag

    def load(self, offset: int) -> int:
        return self.mem.get(offset, 0)

    def _zero(self, c: str, slot: int) -> None:
        lo = self.page_start(c, slot)
        hi = lo + self.pb[c]
        for k in [k for k in self.mem if lo <= k < hi]:
            del self.mem[k]
