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

    def __init__(self, lo: int, hi: int) -> None:
        self.bot = self.mid = lo
        self.top = hi


def place(views: Sequence[View], demand: Mapping[str, int], hints: Mapping[str, int], slots: bool = True) -> Fit:
    """Holes nearest each anchor first; the rest from the gaps in a fixed order: the low end up, the high end
    down, non-empty floats (chain order; the side with more room first), then empty floats as one run at the
    aligned slot nearest their hint. ``slots=False``: only whether it fits (``short``), in O(bands): no decision
    reads a slot list, so a probe of the shortfall search lists no slots."""
    fit = Fit()
    extra: dict[str, int] = {}
    for v in views:
        want = demand.get(v.name, 0)
        from_holes = min(want, v.n_holes)
        fit.slots[v.name] = list(v.take(from_holes)) if slots else []
        extra[v.name] = want - from_holes
        fit.short[v.name] = 0
    present = [v for v in views if v.role is not Role.FLOAT or not v.empty]
    gaps = [_Gap(a.hi_byte, b.lo_byte) for a, b in zip(present, present[1:])]
    gap_above = {v.name: g for v, g in zip(present, gaps)}
    gap_below = {v.name: g for v, g in zip(present[1:], gaps)}

    def room(v: View, g: _Gap) -> int:
        return (g.top - g.bot) // v.page_bytes

    def up(v: View, g: _Gap, n: int) -> int:
        k = min(n, room(v, g))
        if slots:
            first = g.bot // v.page_bytes
            fit.slots[v.name].extend(range(first, first + k))
        g.bot += k * v.page_bytes
        g.mid = max(g.mid, g.bot)
        return n - k

    def down(v: View, g: _Gap, n: int) -> int:
        k = min(n, room(v, g))
        if slots:
            first = g.top // v.page_bytes - 1
            fit.slots[v.name].extend(range(first, first - k, -1))
        g.top -= k * v.page_bytes
        return n - k

    low, high = views[0], views[-1]
    fit.short[low.name] = up(low, gap_above[low.name], extra[low.name])
    fit.short[high.name] = down(high, gap_below[high.name], extra[high.name])
    for v in views[1:-1]:
        n = extra[v.name]
        if v.empty or not n:
            continue
        a, b = gap_above[v.name], gap_below[v.name]
        fit.short[v.name] = down(v, b, up(v, a, n)) if room(v, a) >= room(v, b) else up(v, a, down(v, b, n))
    host = -1  # index of the gap an empty float sits in: above the last present band before it
    for v in views[:-1]:
        if v.role is not Role.FLOAT or not v.empty:
            host += 1
            continue
        n = extra[v.name]
        if not n:
            continue
        g, p = gaps[host], v.page_bytes
        lo, hi = cdiv(max(g.mid, g.bot), p), g.top // p - n
        if lo > hi:
            fit.short[v.name] = n
            continue
        first = clamp(hints.get(v.name, 0) // p, lo, hi)
        if slots:
            fit.slots[v.name].extend(range(first, first + n))
        g.mid = (first + n) * p
    return fit


# ---------------------------------------------------------------------------------------------
# Rung 2: pack an end band toward its anchor.


def _beyond(band: Band, barrier: int | None) -> np.ndarray:
    """The band's live slots on the far side of the barrier (every one, if None), farthest from the anchor
    first: the candidate sources of its compaction, numpy over the band's p->v."""
    arr = band.live.arr  # type: ignore[attr-defined]
    if band.role is Role.LOW:
        lo = band.lo if barrier is None else max(band.lo, barrier + 1)
        return np.flatnonzero(arr[lo:band.hi] >= 0)[::-1] + lo
    hi = band.hi if barrier is None else min(band.hi, barrier)
    return np.flatnonzero(arr[band.lo:hi] >= 0) + band.lo


def _pairs(band: Band, barrier: int | None, budget: int | None,
           src: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The two pointers of ``compact_end`` at once: the i-th farthest live page beyond the barrier fills the
    i-th nearest hole while that hole is nearer the anchor (a condition that holds for a prefix of i, since
    holes get farther and sources nearer): ``(sources, holes)``. ``src``: ``_beyond(band, barrier)`` if the
    caller has it."""
    if not band.holes or budget == 0:  # nothing to fill
        return _NO, _NO
    if src is None:
        src = _beyond(band, barrier)
    if band.role is Role.LOW:
        holes = np.asarray(band.holes[:len(src)], dtype=np.int64)  # nearest first
        m = min(len(src), len(holes))
        ok = holes[:m] < src[:m]
    else:
        holes = np.asarray(band.holes[max(0, len(band.holes) - len(src)):][::-1], dtype=np.int64)
        m = min(len(src), len(holes))
        ok = holes[:m] > src[:m]
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
        beyond = _beyond(band, barrier)  # one scan: the sources, and after the k-th the farthest still live
        src, dst = _pairs(band, barrier, None, beyond)
        if read is not None and len(src):
            hit = [i for i, s in enumerate(src.tolist()) if read(s)]
            if hit:
                src, dst = src[:hit[0]], dst[:hit[0]]
        self.src, self.dst = src, dst
        self._views: dict[int, View] = {}
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

    def _after(self, k: int) -> View:
        band, (nxt, fixed) = self.band, self._edges
        up = band.role is Role.LOW
        far = int(self.dst[k - 1])  # the farthest hole filled
        terms = [far, fixed] if k >= len(nxt) else [far, fixed, int(nxt[k])]
        if up:
            hi = max(terms) + 1  # far >= 0: something is occupied
            lo, gone = band.lo, band.hi - hi
        else:
            lo = min(t for t in terms if t >= 0)
            hi, gone = band.hi, lo - band.lo
        count = len(band.holes) - gone
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

        def fits(vs: Sequence[View]) -> Callable[[int, int], bool]:
            return lambda k_low, k_high: place(at(vs, k_low, k_high), demand, self.hints, slots=False).ok

        k = size_ends(fits(views), low, high)
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
                ok = fits(views3)
                k_high = least(lambda k: ok(n_low, k), high, first=0)
                assert k_high is not None
                k_low = least(lambda k: ok(k, k_high), low, first=0)
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
