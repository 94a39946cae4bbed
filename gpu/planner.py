"""Host planner: bands of pages and the admission ladder (spec/arena.md §State, §Admission ladder).

Pure Python on the host: deciding *where* pages go is branchy, sequential and small (pages, not bytes), so it
runs on the CPU and only its result travels to the device. Plans are read-only; ``allocator.py`` applies a
complete plan to the bands here and to the device (bytes and tables) afterwards, so a rejected admission
changes nothing.

Every rule below is the spec's, to the slot: the conformance target is ``exact`` (same placements, moves,
virtual ids, spans, holes and withheld slots as the reference), so there is no freedom in *what* is decided,
only in how it is computed.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain as concat
from itertools import islice
from typing import Any

import numpy as np
from sortedcontainers import SortedList

from kvarena.gpu.moveseq import MoveSeq
from kvarena.spec.errors import AdmissionRejectedError
from kvarena.spec.guards import ceil_div as cdiv  # the spec's one ceil division
from kvarena.spec.sizing import least, size_ends
from kvarena.spec.types import Move, Plan, Role, Rung

_NO = np.zeros(0, dtype=np.int64)


def clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(x, hi))


class Band:
    """One class's span ``[lo, hi)`` of slots on its page grid; every slot in it is live, a hole or withheld."""

    def __init__(self, name: str, role: Role, page_bytes: int, capacity: int) -> None:
        self.name = name
        self.role = role
        self.page_bytes = page_bytes
        self.top = capacity // page_bytes
        self.lo = self.hi = self.top if role is Role.HIGH else 0
        self.live: dict[int, int] = {}  # slot -> virtual page (p->v on the host)
        self.holes = SortedList()
        self.withheld: set[int] = set()

    @property
    def empty(self) -> bool:
        return self.lo == self.hi

    @property
    def lo_byte(self) -> int:
        return self.lo * self.page_bytes

    @property
    def hi_byte(self) -> int:
        return self.hi * self.page_bytes

    def nearest_holes(self, k: int) -> list[int]:
        """The ``k`` holes nearest the anchor (ascending; descending for the high band)."""
        if k <= 0:
            return []
        if self.role is Role.HIGH:
            return list(self.holes.islice(max(0, len(self.holes) - k), None, reverse=True))
        return list(self.holes.islice(0, k))

    def _limit_cut(self, k: int, c: int) -> tuple[int, int, int]:
        """Where the first ``k`` holes in the limited order lie in the sorted holes: ``(i, a, b)``, the limit's
        index ``i`` (the first hole >= c) and the slice ``[a, b)`` they fill. Low band: holes < c descending,
        then >= c ascending; high band: holes >= c ascending, then < c descending. Either way a slice."""
        h, n = self.holes, len(self.holes)
        i = h.bisect_left(c)
        k = max(0, min(k, n))
        if self.role is Role.LOW:
            return i, (i - k if k <= i else 0), (i if k <= i else k)
        return i, (i if k <= n - i else n - k), (i + k if k <= n - i else n)

    def limited_holes(self, k: int, c: int) -> list[int]:
        """The ``k`` holes rung 1 takes under the limit slot ``c``, in the order the new pages bind to them."""
        i, a, b = self._limit_cut(k, c)
        h = self.holes
        if self.role is Role.LOW:
            return list(h.islice(a, min(b, i), reverse=True)) + list(h.islice(i, max(b, i)))
        return list(h.islice(max(a, i), b)) + list(h.islice(a, min(b, i), reverse=True))

    def pop_holes(self, k: int, c: int | None = None) -> np.ndarray:
        """Take (delete) the ``k`` holes rung 1 binds new pages to, in binding order: nearest the anchor, or
        under the limit slot ``c`` (``limited_holes``). One slice of the sorted holes either way, reordered in
        numpy: O(k) numpy, no Python loop over the pages."""
        h = self.holes
        if c is None:
            a, b = (len(h) - k, len(h)) if self.role is Role.HIGH else (0, k)
            part = np.asarray(h[a:b], dtype=np.int64)
            taken = part[::-1] if self.role is Role.HIGH else part
        else:
            i, a, b = self._limit_cut(k, c)
            part = np.asarray(h[a:b], dtype=np.int64)
            m = max(0, min(b, i) - a)  # part[:m] lies below the limit slot, part[m:] at or above it
            lo, hi = part[:m][::-1], part[m:]
            taken = np.concatenate([lo, hi] if self.role is Role.LOW else [hi, lo])
        del h[a:b]
        return taken

    def holes_past(self, n: int) -> Iterator[int]:
        """Holes in anchor order, skipping the ``n`` nearest."""
        if self.role is Role.HIGH:
            return iter(self.holes.islice(0, max(0, len(self.holes) - n), reverse=True))
        return iter(self.holes.islice(n, None))

    def absorb(self) -> None:
        """Give holes on the growing edge(s) back to the gap (no copy); a withheld slot stops it. The run of
        holes at an edge is found on slices of the sorted holes and deleted as one slice (a free of many pages
        costs O(pages) numpy, not a SortedList.remove per page)."""
        h = self.holes
        if self.role is not Role.HIGH and h and h[-1] == self.hi - 1:
            k = _edge_run(h, self.hi - 1, -1)
            del h[len(h) - k:]
            self.hi -= k
        if self.role is not Role.LOW and h and h[0] == self.lo:
            k = _edge_run(h, self.lo, 1)
            del h[:k]
            self.lo += k
        if self.role is Role.FLOAT and self.empty:
            self.lo = self.hi = 0

    def grow_onto(self, slot: int) -> None:
        """Take one gap slot adjacent to the span (an empty float starts anywhere)."""
        if self.role is Role.FLOAT and self.empty:
            self.lo, self.hi = slot, slot + 1
        elif slot == self.hi and self.role is not Role.HIGH:
            self.hi += 1
        elif slot == self.lo - 1 and self.role is not Role.LOW:
            self.lo -= 1
        else:
            raise AssertionError(f"planner bug: {self.name} slot {slot} is not next to [{self.lo}, {self.hi})")


def _edge_run(holes: SortedList, edge: int, step: int) -> int:
    """How many consecutive slots ``edge, edge + step, ...`` are holes (step -1: from the end of the list)."""
    n, m = len(holes), 16
    while True:
        m = min(m, n)
        part = np.asarray(holes[n - m:][::-1] if step < 0 else holes[:m], dtype=np.int64)
        bad = np.flatnonzero(part != edge + step * np.arange(m))
        if len(bad):
            return int(bad[0])
        if m == n:
            return m
        m *= 4


@dataclass(frozen=True)
class View:
    """A band as a plan sees it (after the moves planned so far): span, hole count, the nearest holes."""

    name: str
    role: Role
    page_bytes: int
    lo: int
    hi: int
    n_holes: int
    take: Callable[[int], list[int]]  # the k holes nearest the anchor

    @classmethod
    def of(cls, band: Band, limit: int | None = None) -> View:
        """The band as it is; with a limit slot (``below``, rung 1 only) its holes in the limited order."""
        take = band.nearest_holes if limit is None else (lambda k: band.limited_holes(k, limit))
        return cls(band.name, band.role, band.page_bytes, band.lo, band.hi, len(band.holes), take)

    @classmethod
    def fixed(cls, band: Band, lo: int, hi: int, holes: list[int] | np.ndarray) -> View:
        if isinstance(holes, np.ndarray):
            return cls(band.name, band.role, band.page_bytes, lo, hi, len(holes),
                       lambda k: holes[:max(0, k)].tolist())
        return cls(band.name, band.role, band.page_bytes, lo, hi, len(holes), lambda k: holes[:max(0, k)])

    @property
    def empty(self) -> bool:
        return self.lo == self.hi

    @property
    def lo_byte(self) -> int:
        return self.lo * self.page_bytes

    @property
    def hi_byte(self) -> int:
        return self.hi * self.page_bytes


class Ledger:
    """Reader / writer counts per physical page ``(cls, slot)``; a count that drops to 0 is deleted."""

    def __init__(self) -> None:
        self.readers: Counter[tuple[str, int]] = Counter()
        self.writers: Counter[tuple[str, int]] = Counter()

    def in_use(self, cls: str, slot: int) -> bool:
        return self.readers[(cls, slot)] > 0 or self.writers[(cls, slot)] > 0

    def used_slots(self, cls: str) -> set[int]:
        return {s for c, s in concat(self.readers, self.writers) if c == cls}


# ---------------------------------------------------------------------------------------------
# Rung 1: holes, then frontiers into the adjacent gaps.


@dataclass
class Fit:
    slots: dict[str, list[int]] = field(default_factory=dict)  # new slots per class, in binding order
    short: dict[str, int] = field(default_factory=dict)  # pages that found no room

    @property
    def ok(self) -> bool:
        return not any(self.short.values())


class _Gap:
    """Bytes between two present bands: claimed upward from ``bot``, downward from ``top``; ``mid`` is where
    the next empty float may start."""

    __slots__ = ("bot", "mid", "top")

    def __init__(self, lo: Any, hi: Any) -> None:
        self.bot = self.mid = lo
        self.top = hi


class _One:
    """The arithmetic of one placement: Python ints."""

    lanes = False
    mn, mx = min, max

    @staticmethod
    def where(c: bool, a: int, b: int) -> int:
        return a if c else b


class _Lanes:
    """The arithmetic of a line of placements (one lane per move count of an end band): numpy arrays."""

    lanes = True
    mn, mx, where = np.minimum, np.maximum, np.where


Claim = tuple[str, Any, Any, int]  # (class, first slot, pages, step +1 / -1): a run taken from a gap


def _claims(views: Sequence[View], demand: Mapping[str, int], hints: Mapping[str, int], ops: type
            ) -> tuple[dict[str, Any], list[Claim]]:
    """The counting half of ``place``: per class the pages that found no room, and the runs each class takes
    from the gaps, in order. Written once for both arithmetics: ``_One`` (ints: a placement) and ``_Lanes``
    (an end band's span and hole count as arrays, one lane per move count: rung 2's whole line at once), so
    what a probe decides and what a plan places cannot drift apart."""
    short: dict[str, Any] = {v.name: 0 for v in views}  # chain order: a rejection names them so
    claims: list[Claim] = []
    extra = {v.name: ops.mx(0, demand.get(v.name, 0) - v.n_holes) for v in views}  # after the holes
    present = [v for v in views if v.role is not Role.FLOAT or not v.empty]
    gaps = [_Gap(a.hi_byte, b.lo_byte) for a, b in zip(present, present[1:])]
    gap_above = {v.name: g for v, g in zip(present, gaps)}
    gap_below = {v.name: g for v, g in zip(present[1:], gaps)}

    def room(v: View, g: _Gap) -> Any:
        return (g.top - g.bot) // v.page_bytes

    def up(v: View, g: _Gap, k: Any) -> Claim:
        claim = (v.name, g.bot // v.page_bytes, k, 1)
        g.bot = g.bot + k * v.page_bytes
        g.mid = ops.mx(g.mid, g.bot)
        return claim

    def down(v: View, g: _Gap, k: Any) -> Claim:
        claim = (v.name, g.top // v.page_bytes - 1, k, -1)
        g.top = g.top - k * v.page_bytes
        return claim

    low, high = views[0], views[-1]
    for v, side, g in ((low, up, gap_above[low.name]), (high, down, gap_below[high.name])):
        k = ops.mn(extra[v.name], room(v, g))
        claims.append(side(v, g, k))
        short[v.name] = extra[v.name] - k
    for v in views[1:-1]:
        n = extra[v.name]
        if v.empty or not n:  # a float's count is one number: only the ends vary along a line
            continue
        a, b = gap_above[v.name], gap_below[v.name]
        ra, rb = room(v, a), room(v, b)
        first_up = ra >= rb  # the side with more room first
        ka = ops.where(first_up, ops.mn(n, ra), ops.mn(n - ops.mn(n, rb), ra))
        kb = ops.where(first_up, ops.mn(n - ka, rb), ops.mn(n, rb))
        pair = [up(v, a, ka), down(v, b, kb)]
        claims += pair if ops.lanes or first_up else pair[::-1]
        short[v.name] = n - ka - kb
    host = -1  # index of the gap an empty float sits in: above the last present band before it
    for v in views[:-1]:
        if v.role is not Role.FLOAT or not v.empty:
            host += 1
            continue
        n = extra[v.name]
        if not n:
            continue
        g, p = gaps[host], v.page_bytes
        lo, hi = cdiv(ops.mx(g.mid, g.bot), p), g.top // p - n
        fail = lo > hi  # no aligned run of n slots in the gap
        first = ops.mx(lo, ops.mn(hints.get(v.name, 0) // p, hi))
        short[v.name] = ops.where(fail, n, 0)
        claims.append((v.name, first, ops.where(fail, 0, n), 1))
        g.mid = ops.where(fail, g.mid, (first + n) * p)
    return short, claims


def place(views: Sequence[View], demand: Mapping[str, int], hints: Mapping[str, int], slots: bool = True) -> Fit:
    """Holes nearest each anchor first; the rest from the gaps in a fixed order: the low end up, the high end
    down, non-empty floats (chain order; the side with more room first), then empty floats as one run at the
    aligned slot nearest their hint (``_claims``). ``slots=False``: only whether it fits (``short``)."""
    short, claims = _claims(views, demand, hints, _One)
    fit = Fit(short=short)
    if slots:
        fit.slots = {v.name: list(v.take(min(demand.get(v.name, 0), v.n_holes))) for v in views}
        for c, first, k, step in claims:
            fit.slots[c].extend(range(first, first + step * k, step))
    return fit


def fits_along(views: Sequence[View], demand: Mapping[str, int], hints: Mapping[str, int]) -> np.ndarray:
    """``place(...).ok`` for every lane at once: ``views`` with one end band's ``lo`` / ``hi`` / ``n_holes`` as
    arrays (one lane per move count, ``EndSeq.line``), the others as they are."""
    short, _ = _claims(views, demand, hints, _Lanes)
    ok = np.ones(max(np.size(x) for v in views for x in (v.lo, v.hi, v.n_holes)), dtype=bool)
    for n in short.values():
        ok &= np.asarray(n) == 0
    return ok


# ---------------------------------------------------------------------------------------------
# Rung 2: pack an end band toward its anchor.


def _beyond(band: Band, barrier: int | None, need: int | None = None) -> np.ndarray:
    """The band's live slots on the far side of the barrier (every one, if None), farthest from the anchor
    first: the candidate sources of its compaction, numpy over the band's p->v. ``need``: at most that many,
    scanned from the far edge in growing chunks, so a band with few holes (few pairs) is not read whole."""
    arr = band.live.arr  # type: ignore[attr-defined]
    up = band.role is Role.LOW
    if up:
        stop, edge = (band.lo if barrier is None else max(band.lo, barrier + 1)), band.hi
    else:
        stop, edge = (band.hi if barrier is None else min(band.hi, barrier)), band.lo
    if need is None:
        need = abs(edge - stop)
    parts, got, step = [], 0, max(64, 2 * need)
    while got < need and edge != stop:
        if up:
            start = max(stop, edge - step)
            part = np.flatnonzero(arr[start:edge] >= 0)[::-1] + start
        else:
            start = min(stop, edge + step)
            part = np.flatnonzero(arr[edge:start] >= 0) + edge
        parts.append(part)
        got, edge, step = got + len(part), start, 4 * step
    if len(parts) == 1:
        return parts[0][:need]
    return np.concatenate(parts)[:need] if parts else _NO


def _anchor_holes(band: Band, m: int) -> np.ndarray:
    """The ``m`` holes nearest the anchor, nearest first, as an array. Read from the p->v map (every slot of
    the span is live, a hole or withheld) where the slots up to the m-th hole are few per hole; else from the
    sorted holes (a Python list to numpy costs ~20 ns per element, a mask ~1 ns per slot)."""
    h = band.holes
    m = min(m, len(h))
    if m == 0:
        return _NO
    up = band.role is Role.LOW
    a, b = (band.lo, h[m - 1] + 1) if up else (h[len(h) - m], band.hi)
    if b - a > 16 * m:
        part = np.asarray(h[:m] if up else h[len(h) - m:], dtype=np.int64)
        return part if up else part[::-1]
    free = band.live.arr[a:b] < 0  # type: ignore[attr-defined]
    for w in band.withheld:
        if a <= w < b:
            free[w - a] = False
    got = np.flatnonzero(free) + a
    return got if up else got[::-1]


def _pairs(band: Band, barrier: int | None, budget: int | None,
           src: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The two pointers of ``compact_end`` at once: the i-th farthest live page beyond the barrier fills the
    i-th nearest hole while that hole is nearer the anchor (a condition that holds for a prefix of i, since
    holes get farther and sources nearer): ``(sources, holes)``. ``src``: ``_beyond(band, barrier)`` (at
    least one more than the holes, or all) if the caller has it."""
    if not band.holes or budget == 0:  # nothing to fill
        return _NO, _NO
    if src is None:
        src = _beyond(band, barrier, len(band.holes))
    m = min(len(src), len(band.holes))
    holes = _anchor_holes(band, m)
    ok = holes < src[:m] if band.role is Role.LOW else holes > src[:m]
    k = m if ok.all() else int(np.argmin(ok))
    if budget is not None:
        k = min(k, budget)
    return src[:k].astype(np.int64), holes[:k]


def compact_end(band: Band, barrier: int | None, read: Callable[[int], bool] | None,
                budget: int | None) -> tuple[list[tuple[int, int]], View]:
    """Two pointers: the farthest live page fills the hole nearest the anchor, while that hole is nearer the
    anchor than the page. Sources lie beyond the ``barrier`` (the farthest slot that cannot move: withheld or
    written), since moving a page nearer than that cannot retract the frontier. A source with readers stays
    withheld. Returns the moves and the band as it will be after them (frontier retracted past the slots left
    empty)."""
    srcs, dsts = _pairs(band, barrier, budget)
    return list(zip(srcs.tolist(), dsts.tolist())), _packed_view(band, srcs, dsts, read)


def _fixed_edge(band: Band, barrier: int | None) -> int:
    """For ``EndSeq``: the slot farthest from the anchor that no move frees (a live page on the anchor side of
    the barrier, or a withheld slot); -1 for none."""
    arr, lo, hi = band.live.arr, band.lo, band.hi  # type: ignore[attr-defined]
    wh = [w for w in band.withheld if lo <= w < hi]
    if band.role is Role.LOW:
        cut = lo if barrier is None else max(lo, barrier + 1)
        below = np.flatnonzero(arr[lo:cut] >= 0)
        far = [*wh, *([int(below[-1]) + lo] if len(below) else [])]
        return max(far) if far else -1
    cut = hi if barrier is None else min(hi, barrier)
    above = np.flatnonzero(arr[cut:hi] >= 0)
    near = [*wh, *([int(above[0]) + cut] if len(above) else [])]
    return min(near) if near else -1


def _packed_view(band: Band, srcs: np.ndarray, dsts: np.ndarray, read: Callable[[int], bool] | None) -> View:
    """An end band after the moves ``srcs -> dsts`` (a prefix of its two-pointer sequence)."""
    if not len(srcs):
        return View.of(band)  # no move: the band as it is (settled: no hole on its growing edge)
    up = band.role is Role.LOW
    src_l = srcs.tolist()
    kept = [s for s in src_l if read(s)] if read is not None else []  # sources with readers stay withheld
    freed = sorted(set(src_l) - set(kept), reverse=not up)  # anchor order

    # the frontier retracts past the slots left vacant: neither live after the moves, nor withheld, nor kept
    lo, hi = band.lo, band.hi
    occupied = band.live.arr[lo:hi] >= 0  # type: ignore[attr-defined]
    occupied[srcs - lo] = False
    occupied[dsts - lo] = True
    for w in (*band.withheld, *kept):
        if lo <= w < hi:
            occupied[w - lo] = True
    nz = np.flatnonzero(occupied)
    if up:
        hi = lo + (int(nz[-1]) + 1 if len(nz) else 0)
    else:
        lo = lo + (int(nz[0]) if len(nz) else hi - lo)
    n_used = len(src_l)
    count = len(band.holes) - n_used + len(freed) - (band.hi - hi) - (lo - band.lo)

    def take(k: int) -> list[int]:
        stream = heapq.merge(band.holes_past(n_used), freed, reverse=not up)
        return list(islice((s for s in stream if lo <= s < hi), max(0, min(k, count))))

    return View(band.name, band.role, band.page_bytes, lo, hi, count, take)


class EndSeq:
    """One end band's moves for the shortfall-sized rung 2 (spec/arena.md §Rung 2): the two-pointer sequence of
    ``compact_end`` (numpy, at once), cut before its first source a reader holds (the frontier could not
    retract past that page now, so no later move opens room now). ``view(k)``: the band after the first k.

    A probe of the shortfall search costs O(1), not a walk of the band: after k moves the slots still occupied
    are the sources not yet moved (the farthest of them is source k: sources come farthest first), the first k
    holes filled (the farthest is destination k - 1: holes come nearest first), and what no move touches (live
    pages on the anchor side of the barrier, withheld slots). So the retracted frontier is one max (low band)
    or min (high band) of three numbers, and the hole count drops by the slots the frontier gave back."""

    def __init__(self, band: Band, barrier: int | None, read: Callable[[int], bool] | None) -> None:
        self.band = band
        # one scan: the sources, and after the k-th the farthest still live (no more than the holes can take, + 1)
        beyond = _beyond(band, barrier, len(band.holes) + 1)
        src, dst = _pairs(band, barrier, None, beyond)
        if read is not None and len(src):
            hit = [i for i, s in enumerate(src.tolist()) if read(s)]
            if hit:
                src, dst = src[:hit[0]], dst[:hit[0]]
        self.src, self.dst = src, dst
        self._views: dict[int, View] = {}
        self._line: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._edges = beyond[:len(src) + 1], _fixed_edge(band, barrier)

    def __len__(self) -> int:
        return len(self.src)

    def extend(self, k: int | None = None) -> int:
        """How many of the first ``k`` moves exist (all of them, if None): numpy built the whole sequence."""
        return len(self.src) if k is None else min(k, len(self.src))

    def view(self, k: int) -> View:
        v = self._views.get(k)
        if v is None:
            v = self._views[k] = View.of(self.band) if k == 0 else self._after(k)
        return v

    def line(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``view(k)``'s ``lo``, ``hi`` and ``n_holes`` for every k in ``0..len(self)`` at once: ``_after``'s
        three-number frontier over the whole sequence, as arrays (rung 2's oracle reads a line, not probes)."""
        if self._line is None:
            band, (nxt, fixed), n = self.band, self._edges, len(self.src)
            up = band.role is Role.LOW
            none = -1 if up else band.top  # a term that never wins the max (low band) / min (high band)
            nx = np.full(n, none, dtype=np.int64)
            m = min(n, len(nxt) - 1)
            nx[:m] = nxt[1:m + 1]  # after k moves the farthest unmoved source is source k, if any
            far = self.dst  # after k moves the farthest filled hole is destination k - 1
            if up:
                hi = np.maximum(np.maximum(far, nx), fixed) + 1
                lo, gone = np.full(n, band.lo, dtype=np.int64), band.hi - hi
            else:
                lo = np.minimum(np.minimum(far, nx), fixed if fixed >= 0 else none)
                hi, gone = np.full(n, band.hi, dtype=np.int64), lo - band.lo
            count = len(band.holes) - gone
            self._line = tuple(np.concatenate([[x0], x]) for x0, x in  # k = 0: the band as it is
                               ((band.lo, lo), (band.hi, hi), (len(band.holes), count)))
        return self._line  # type: ignore[return-value]

    def _after(self, k: int) -> View:
        band = self.band
        up = band.role is Role.LOW
        lo, hi, count = (int(x[k]) for x in self.line())  # the frontier after k moves: one lane of the line
        freed = self.src[:k][::-1]  # the moved sources, in anchor order

        def take(n: int) -> list[int]:
            stream = heapq.merge(band.holes_past(k), freed.tolist(), reverse=not up)
            return list(islice((s for s in stream if lo <= s < hi), max(0, min(n, count))))

        return View(band.name, band.role, band.page_bytes, lo, hi, count, take)

    def moves(self, k: int) -> MoveSeq:
        return MoveSeq([(self.band.name, self.src[:k], self.dst[:k])])


# ---------------------------------------------------------------------------------------------
# Rung 3: move a float band within a byte window.


def relayout_float(band: Band, win_lo: int, win_hi: int, pages: int, hint: int, obstacles: list[int]
                   ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[int, int], View] | None:
    """A span ``[t, t + need)`` inside the window for the float's live and withheld pages plus ``pages`` new
    ones, covering its immovable slots (``obstacles``, sorted), as near its current start (or its hint) as
    the window allows; its live pages outside the span fill the lowest free slots of the span."""
    p = band.page_bytes
    need = len(band.live) + len(band.withheld) + pages
    if need == 0:
        return (_NO, _NO), (0, 0), View.fixed(band, 0, 0, [])
    t_min, t_max = cdiv(win_lo, p), win_hi // p - need
    if obstacles:
        need = max(need, obstacles[-1] - obstacles[0] + 1)
        t_min = max(t_min, obstacles[-1] + 1 - need)
        t_max = min(win_hi // p - need, obstacles[0])
    if t_min > t_max:
        return None
    t = clamp(hint // p if band.empty else band.lo, t_min, t_max)
    return _retarget_plan(band, t, t + need)


def _retarget_plan(band: Band, t: int, end: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[int, int], View]:
    """The float moved onto ``[t, end)``: its live pages outside the span (ascending) to the span's free slots
    (ascending: gap slots below the band, its holes, gap slots above it), and its view after that. Numpy over
    the band's p->v and one slice of the sorted holes: no walk over the slots in Python."""
    arr = band.live.arr  # type: ignore[attr-defined]
    parts = [np.flatnonzero(arr[a:b] >= 0) + a for a, b in ((band.lo, min(band.hi, t)), (max(band.lo, end), band.hi))
             if b > a]
    src = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    b_lo, b_hi = (band.lo, band.hi) if not band.empty else (end, end)
    h = band.holes
    inner = h[h.bisect_left(max(t, b_lo)):h.bisect_left(min(end, b_hi))] if min(end, b_hi) > max(t, b_lo) else []
    free = np.concatenate([np.arange(t, min(end, b_lo), dtype=np.int64), np.asarray(inner, dtype=np.int64),
                           np.arange(max(t, b_hi), end, dtype=np.int64)])
    assert len(free) >= len(src), "planner bug: the span has no room for the float's own pages"
    return (src.astype(np.int64), free[:len(src)]), (t, end), View.fixed(band, t, end, free[len(src):])


def relayout_fewest(band: Band, win_lo: int, win_hi: int, pages: int, hint: int, obstacles: list[int]
                    ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[int, int], View] | None:
    """The default rung 3 for one float: move the fewest pages. Every arrangement of the float lies inside the
    aligned window ``[ceil(win_lo/p), win_hi // p)``, so its live pages outside the window move in all of them;
    only those move. Target span: the float's span (its hint slot when empty) clipped to the window, widened by
    the slots it lacks, up first, then down; the sources, ascending, fill its lowest free slots."""
    p = band.page_bytes
    need = len(band.live) + len(band.withheld) + pages
    if need == 0:
        return (_NO, _NO), (0, 0), View.fixed(band, 0, 0, [])
    lo, hi = (band.lo, band.hi) if not band.empty else (hint // p, hint // p)
    w_lo, w_hi = cdiv(win_lo, p), win_hi // p
    if w_hi - w_lo < need or (obstacles and not w_lo <= obstacles[0] <= obstacles[-1] < w_hi):
        return None
    c_lo, c_hi = clamp(lo, w_lo, w_hi), clamp(hi, w_lo, w_hi)
    lack = max(0, need - (c_hi - c_lo))
    up = min(lack, w_hi - c_hi)
    return _retarget_plan(band, c_lo - (lack - up), c_hi + up)


# ---------------------------------------------------------------------------------------------
# The ladder over the arena's bands.


def _no_take(k: int) -> list[int]:
    raise AssertionError("planner bug: a line of views is for counting, it lists no slots")


class Lines:
    """Rung 2's oracle, "does the demand fit after ``k_low`` and ``k_high`` moves?", a line at a time
    (``spec.sizing.along``): one end band's every move count as one lane each (``EndSeq.line``), the other at
    its fixed count, counted by ``fits_along`` in one pass of numpy. The shortfall search then reads
    O(log k) booleans: it decides over arrays, and probes the same counts as the spec's search."""

    def __init__(self, views: Sequence[View], low: EndSeq, high: EndSeq, demand: Mapping[str, int],
                 hints: Mapping[str, int]) -> None:
        self.views, self.ends, self.demand, self.hints = views, (low, high), demand, hints
        self._ok: dict[tuple[int, int], np.ndarray] = {}

    def along(self, end: int, other: int) -> Callable[[int], bool]:
        ok = self._ok.get((end, other))
        if ok is None:
            seq, fixed = self.ends[end], self.ends[1 - end].view(other)
            band = seq.band
            lane = View(band.name, band.role, band.page_bytes, *seq.line(), _no_take)  # type: ignore[arg-type]
            ends = (lane, fixed) if end == 0 else (fixed, lane)
            ok = self._ok[(end, other)] = fits_along([ends[0], *self.views[1:-1], ends[1]], self.demand, self.hints)
        return lambda k: bool(ok[k])

    def __call__(self, k_low: int, k_high: int) -> bool:
        return self.along(0, k_high)(k_low)


class Ladder:
    def __init__(self, bands: Sequence[Band], hints: Mapping[str, int], ledger: Ledger) -> None:
        self.bands = list(bands)  # chain order
        self.by_name = {b.name: b for b in bands}
        self.hints = dict(hints)
        self.ledger = ledger

    def views(self, limits: Mapping[str, int] | None = None) -> list[View]:
        """The bands as they are; ``limits``: class -> limit slot (``below``), the holes rung 1 takes."""
        if not limits:
            return [View.of(b) for b in self.bands]
        return [View.of(b, limits.get(b.name)) for b in self.bands]

    def admission(self, demand: Mapping[str, int], limits: Mapping[str, int] | None = None) -> Plan:
        """Rung 1 (its holes in the limited order for the classes in ``limits``: class -> limit slot); else
        rung 2 sized to the shortfall (``size_ends``); else rung 3 on the ends' whole sequences, fewest float
        moves, then the fewest end moves the relaid floats still need; AdmissionRejectedError otherwise
        (spec/arena.md §Admission ladder). Rungs 2 and 3 plan on the normal nearest-the-anchor order."""
        demand = {c: n for c, n in demand.items() if n}
        if not demand:
            return Plan(Rung.NONE)
        views = self.views()
        fit = place(self.views(limits) if limits else views, demand, self.hints)
        if fit.ok:
            return self.plan(Rung.REUSE, [], fit)
        low, high = (EndSeq(b, self.barrier(b), self._reader(b.name)) for b in (self.bands[0], self.bands[-1]))

        def at(vs: Sequence[View], k_low: int, k_high: int) -> list[View]:
            return [low.view(k_low), *vs[1:-1], high.view(k_high)]

        k = size_ends(Lines(views, low, high, demand, self.hints), low, high)
        if k is not None:
            return self.plan(Rung.COMPACT, MoveSeq.concat(low.moves(k[0]), high.moves(k[1])),
                             place(at(views, *k), demand, self.hints))
        n_low, n_high = len(low), len(high)
        views = at(views, n_low, n_high)
        fit = place(views, demand, self.hints)
        relaid = self.relayout(views, demand, fewest=True)
        if relaid is not None:
            moves3, views3, spans = relaid
            fit = place(views3, demand, self.hints)
            if fit.ok:  # the ends move only what the relaid floats still need of them
                lines = Lines(views3, low, high, demand, self.hints)
                k_high = least(lines.along(1, n_low), high, first=0)
                assert k_high is not None
                k_low = least(lines.along(0, k_high), low, first=0)
                assert k_low is not None
                return self.plan(Rung.RELAYOUT, MoveSeq.concat(low.moves(k_low), high.moves(k_high)),
                                 place(at(views3, k_low, k_high), demand, self.hints), moves3, spans)
        raise self.rejection(demand, fit.short)

    def _reader(self, c: str) -> Callable[[int], bool] | None:
        return (lambda s: self.ledger.readers[(c, s)] > 0) if self.ledger.readers else None

    def compact_ends(self, views: Sequence[View], budget: int | None,
                     budget_bytes: int | None = None) -> tuple[MoveSeq, list[View]]:
        """Rung 2: the low band, then the high band, sharing one move budget (the moves as arrays): ``budget``
        moves, or ``budget_bytes`` bytes with each move costing its page's bytes (``flush_idle``)."""
        runs: list[tuple[str, np.ndarray, np.ndarray]] = []
        n = 0
        left = budget_bytes
        views = list(views)
        for i in (0, len(views) - 1):
            band = self.by_name[views[i].name]
            c = band.name
            cap = None if budget is None else budget - n
            if left is not None:
                cap = left // band.page_bytes if cap is None else min(cap, left // band.page_bytes)
            src, dst = _pairs(band, self.barrier(band), cap)
            views[i] = _packed_view(band, src, dst, self._reader(c))
            runs.append((c, src, dst))
            n += len(src)
            if left is not None:
                left -= len(src) * band.page_bytes
        return MoveSeq(runs), views

    def barrier(self, band: Band) -> int | None:
        """The slot farthest from an end band's anchor that cannot move: withheld, or held by a writer."""
        pinned = band.withheld | {s for c, s in self.ledger.writers if c == band.name}
        if not pinned:
            return None
        return max(pinned) if band.role is Role.LOW else min(pinned)

    def relayout(self, views: Sequence[View], demand: Mapping[str, int], fewest: bool = False
                 ) -> tuple[MoveSeq, list[View], dict[str, tuple[int, int]]] | None:
        """Rung 3: each float that is non-empty or demanded, in chain order, gets the byte window between the
        previous float's new span (or the low end plus what it still needs) and the next non-empty float (or
        the high end minus what it still needs); ``fewest``: the admission ladder's span (``relayout_fewest``),
        else the nearest span (``relayout_float``: stand-alone ``relayout``)."""
        floats = [i for i in range(1, len(views) - 1) if not views[i].empty or demand.get(views[i].name, 0)]
        if not floats:
            return None
        low, high = views[0], views[-1]
        win_lo = low.hi_byte + max(0, demand.get(low.name, 0) - low.n_holes) * low.page_bytes
        high_need = max(0, demand.get(high.name, 0) - high.n_holes) * high.page_bytes
        views = list(views)
        runs: list[tuple[str, np.ndarray, np.ndarray]] = []
        spans: dict[str, tuple[int, int]] = {}
        for k, i in enumerate(floats):
            band = self.by_name[views[i].name]
            nxt = next((views[j] for j in floats[k + 1:] if not views[j].empty), None)
            win_hi = nxt.lo_byte if nxt is not None else high.lo_byte - high_need
            if win_hi < win_lo:
                return None
            used = {s for s in self.ledger.used_slots(band.name) if s in band.live}
            r = (relayout_fewest if fewest else relayout_float)(
                band, win_lo, win_hi, demand.get(band.name, 0), self.hints.get(band.name, 0),
                sorted(band.withheld | used))
            if r is None:
                return None
            (src, dst), span, views[i] = r
            runs.append((band.name, src, dst))
            spans[band.name] = span
            if span[1] > span[0]:
                win_lo = span[1] * band.page_bytes
        return MoveSeq(runs), views, spans

    def plan(self, rung: Rung, moves2: Sequence[Move], fit: Fit | None = None, moves3: Sequence[Move] = (),
             spans: Mapping[str, tuple[int, int]] | None = None) -> Plan:
        m2, m3 = MoveSeq.of(moves2), MoveSeq.of(moves3)
        pb = {b.name: b.page_bytes for b in self.bands}
        moved = {r: ms.bytes(pb) for r, ms in ((2, m2), (3, m3)) if len(ms)}
        placements = {c: tuple(s) for c, s in fit.slots.items() if s} if fit is not None else {}
        return Plan(rung, MoveSeq.concat(m2, m3), placements, moved, dict(spans or {}))  # type: ignore[arg-type]

    def rejection(self, demand: Mapping[str, int], short: Mapping[str, int]) -> AdmissionRejectedError:
        short = {c: n for c, n in short.items() if n}
        nbytes = sum(n * self.by_name[c].page_bytes for c, n in short.items())
        return AdmissionRejectedError(
            f"no rung of the ladder fits {dict(demand)}: short {short} pages ({nbytes} B) after compaction and "
            "relayout; evict cache-only pages (drop) or retract a request, then retry", short, nbytes)
