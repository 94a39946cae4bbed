"""§Ladder: admission planning, read-only (spec/arena.md §Admission ladder).

Each function here looks at bands (or views of bands after planned moves) and
returns what it would do; nothing mutates the arena.  The arena applies a plan
only after it is complete, so a rejected admission leaves the state untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain, islice

from kvarena.reference.bands import Band, BandView, Role, explicit_view, merge_anchor_order
from kvarena.spec.guards import ceil_div  # the one ceil division (reference, gpu/ and spec share it)


def clamp(value: int, lo: int, hi: int) -> int:
    """pre: lo <= hi
    post: lo <= __return__ <= hi
    post: (lo <= value <= hi) == (__return__ == value)
    """
    return max(lo, min(value, hi))


class _Gap:
    """One gap between present bands and its claim cursors (a slotted class: ``place`` makes one per gap on every
    admission, and a dataclass with ``__post_init__`` cost more than the claims)."""

    __slots__ = ("bot", "hi", "lo", "mid", "top")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo = lo  # byte where the band below ends
        self.hi = hi  # byte where the band above starts
        self.bot = self.mid = lo  # cursors: bytes claimed from the bottom end upward; empty floats placed inside
        self.top = hi  # cursor: bytes claimed from the top end downward


@dataclass
class Placement:
    """Rung-1 result: new slots per class in owner order, or the pages that did not fit."""

    slots: dict[str, list[int]] = field(default_factory=dict)
    shortfall: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.shortfall.values())


def place(views: list[BandView], demand: Mapping[str, int], hints: Mapping[str, int]) -> Placement:
    """Rung 1, reuse in place: holes nearest each anchor, then frontiers into the adjacent gap.

    Claims on the gaps are made in a fixed order so the result is deterministic:
    the low end up, the high end down, non-empty floats (chain order, larger
    adjacent room first), then empty floats at the aligned slot nearest their hint.
    """
    out = Placement()
    ext: dict[str, int] = {}
    for v in views:
        d = demand.get(v.name, 0)
        h = min(d, v.hole_count)
        out.slots[v.name] = v.first_holes(h)
        ext[v.name] = d - h
        out.shortfall[v.name] = 0

    present = [v for v in views if v.role is not Role.FLOAT or not v.empty]
    gaps = [_Gap(b.hi_byte, a.lo_byte) for b, a in zip(present, present[1:])]
    above = {b.name: g for b, g in zip(present, gaps)}  # the gap above a band
    below = {a.name: g for a, g in zip(present[1:], gaps)}  # the gap below a band

    def grow_up(v: BandView, gap: _Gap, pages: int) -> int:
        fit = min(pages, (gap.top - gap.bot) // v.page_bytes)
        start = gap.bot // v.page_bytes
        out.slots[v.name].extend(range(start, start + fit))
        gap.bot += fit * v.page_bytes
        gap.mid = max(gap.mid, gap.bot)
        return pages - fit

    def grow_down(v: BandView, gap: _Gap, pages: int) -> int:
        fit = min(pages, (gap.top - gap.bot) // v.page_bytes)
        start = gap.top // v.page_bytes
        out.slots[v.name].extend(range(start - 1, start - 1 - fit, -1))
        gap.top -= fit * v.page_bytes
        return pages - fit

    low, high = views[0], views[-1]
    out.shortfall[low.name] = grow_up(low, above[low.name], ext[low.name])
    out.shortfall[high.name] = grow_down(high, below[high.name], ext[high.name])

    for v in views[1:-1]:
        e = ext[v.name]
        if v.empty or e == 0:
            continue
        up, down = above[v.name], below[v.name]
        room_up = (up.top - up.bot) // v.page_bytes
        room_down = (down.top - down.bot) // v.page_bytes
        if room_up >= room_down:
            e = grow_down(v, down, grow_up(v, up, e))
        else:
            e = grow_up(v, up, grow_down(v, down, e))
        out.shortfall[v.name] = e

    seen = 0  # present bands at or below the current view: an empty float sits in gaps[seen - 1]
    for v in views[:-1]:
        if v.role is not Role.FLOAT or not v.empty:
            seen += 1
            continue
        e = ext[v.name]
        if e == 0:
            continue
        host = gaps[seen - 1]
        p = v.page_bytes
        s_min = ceil_div(max(host.mid, host.bot), p)
        s_max = host.top // p - e
        if s_min > s_max:
            out.shortfall[v.name] = e
            continue
        s = clamp(hints.get(v.name, 0) // p, s_min, s_max)
        out.slots[v.name].extend(range(s, s + e))
        host.mid = (s + e) * p
    return out


# ---------------------------------------------------------------------------------------------
# Rung 2: compact the ends.


@dataclass
class Compaction:
    moves: list[tuple[int, int]]  # (src, dst) slots, in order
    view: BandView


class EndPack:
    """One end band's two-pointer compaction as a lazily generated move sequence, and its view after any prefix.

    The farthest live page goes to the hole nearest the anchor, while that hole is nearer the anchor than the
    page.  Only pages farther from the anchor than the ``barrier`` (the farthest slot that cannot move:
    withheld, or held by a writer) are sources: moving a page nearer than the barrier cannot retract the
    frontier, so it would copy bytes for nothing.  A moved page with readers leaves its old slot withheld; with
    ``stop_at_readers`` the sequence ends before such a page instead (the frontier could not retract past it
    now, so no later move of the sequence opens room now: what the shortfall-sized rung 2 wants).
    """

    def __init__(self, band: Band, barrier: int | None, has_readers: Callable[[int], bool],
                 stop_at_readers: bool = False) -> None:
        assert band.role is not Role.FLOAT
        self.band, self.barrier, self.has_readers, self.stop_at_readers = band, barrier, has_readers, stop_at_readers
        self.up = band.role is Role.LOW  # the low band's anchor is slot 0; the high band's is `top`
        self.pairs: list[tuple[int, int]] = []
        self.done = False
        self._holes = band.holes_in_anchor_order()
        self._cursor = band.hi - 1 if self.up else band.lo  # scans sources from the far edge toward the anchor
        self._views: dict[int, BandView] = {}

    def extend(self, k: int | None = None) -> int:
        """Generate moves until there are ``k`` (all, if None) or the sequence ends; how many there are.  The
        cursor jumps runs of holes beyond the barrier (``Band.hole_run``); the low band's copy of the loop and
        the high band's mirror are written out, as the hot path of the shortfall-sized rung 2."""
        band, barrier, pairs, holes, live = self.band, self.barrier, self.pairs, self._holes, self.band.live
        readers = self.has_readers if self.stop_at_readers else None
        want = len(pairs) + 10**18 if k is None else k
        cursor = self._cursor
        while not self.done and len(pairs) < want:
            hole, src = next(holes, None), None
            if self.up:  # anchor at slot 0: the source is the highest live slot above the hole and the barrier
                while hole is not None and hole < cursor and (barrier is None or barrier < cursor):
                    if cursor in live:
                        src, cursor = cursor, cursor - 1
                        break
                    cursor -= max(1, band.hole_run(cursor, -1))
            else:
                while hole is not None and hole > cursor and (barrier is None or barrier > cursor):
                    if cursor in live:
                        src, cursor = cursor, cursor + 1
                        break
                    cursor += max(1, band.hole_run(cursor, 1))
            if src is None or (readers is not None and readers(src)):
                self.done = True
                break
            pairs.append((src, hole))
        self._cursor = cursor
        return len(pairs)

    def view(self, k: int) -> BandView:
        """The band as the planner sees it after the first ``k`` moves (already generated)."""
        got = self._views.get(k)
        if got is None:
            got = self._views[k] = (self._retracted(k) if self.stop_at_readers
                                    else compaction_view(self.band, self.pairs[:k], self.has_readers))
        return got

    def _retracted(self, k: int) -> BandView:
        """``compaction_view`` when every source frees its slot (``stop_at_readers``), in O(log^2 n): the sources
        are the k farthest live pages, so the farthest slot still taken is the farther of the last destination and
        the first slot nearer the anchor than the k-th source that is not a hole (a live page, or the barrier
        itself: the barrier needs no term of its own); the span ends past it, and the holes lost to destinations
        come back as freed sources, so the count drops only by the retraction."""
        band, up = self.band, self.up
        step = -1 if up else 1
        s = (self.pairs[k - 1][0] if k else (band.hi if up else band.lo - 1)) + step
        s += step * band.hole_run(s, step) if band.lo <= s < band.hi else 0
        taken = [x for x in (s if band.lo <= s < band.hi else None, self.pairs[k - 1][1] if k else None)
                 if x is not None]
        if up:
            lo, hi = band.lo, (max(taken) + 1 if taken else band.lo)
            retracted = band.hi - hi
        else:
            lo, hi = (min(taken) if taken else band.hi), band.hi
            retracted = lo - band.lo
        pairs, count = self.pairs, band.hole_count - retracted
        def freed() -> Iterator[int]:  # the sources come farthest first: reversed, they are in anchor order
            return (pairs[i][0] for i in range(k - 1, -1, -1))

        return _packed(band, k, freed, lo, hi, count)


def compaction_view(band: Band, moves: list[tuple[int, int]], has_readers: Callable[[int], bool]) -> BandView:
    """An end band after ``moves`` (the first ones of its two-pointer sequence): the sources without readers are
    holes, the frontier retracts past the slots that end up empty.  O(moves log moves + runs of holes x log^2 n):
    the retraction jumps over runs of holes, it never walks them slot by slot."""
    up = band.role is Role.LOW
    freed = sorted((s for s, _ in moves if not has_readers(s)), reverse=not up)  # anchor order
    freed_set = set(freed)
    last_dst = moves[-1][1] if moves else None  # destinations are the holes nearest the anchor up to this one
    lo, hi = band.lo, band.hi
    step = -1 if up else 1
    s = hi - 1 if up else lo
    while lo <= s < hi:
        if s in freed_set:
            s += step
            continue
        run = band.hole_run(s, step)
        if last_dst is not None:  # an original hole at or nearer the anchor than last_dst took a page
            run = min(run, max(0, (s - last_dst) if up else (last_dst - s)))
        if not run:
            break
        s += step * run
    if up:
        retracted, hi = hi - (s + 1), s + 1
    else:
        retracted, lo = s - lo, s

    count = band.hole_count - len(moves) + len(freed) - retracted
    return _packed(band, len(moves), lambda: iter(freed), lo, hi, count)


def _packed(band: Band, n_used: int, freed: Callable[[], Iterator[int]], lo: int, hi: int, count: int) -> BandView:
    """An end band's view after its first ``n_used`` moves: span ``[lo, hi)``, ``count`` holes, listed lazily as
    the original holes past the first ``n_used`` (the destinations) merged with the freed sources (``freed()``,
    anchor order), both cut to the span."""
    def first(k: int) -> list[int]:
        if band.role is Role.HIGH:
            unused = band.holes.islice(0, len(band.holes) - n_used, reverse=True)
        else:
            unused = band.holes.islice(n_used, None)
        stream = merge_anchor_order(band.role, unused, freed())
        return list(islice((s for s in stream if lo <= s < hi), max(0, min(k, count))))

    return BandView(band.name, band.role, band.page_bytes, band.top, lo, hi, count, first)


def plan_compaction(band: Band, barrier: int | None, has_readers: Callable[[int], bool],
                    budget: int | None = None) -> Compaction:
    """The full pack of an end band toward its anchor (SGLang's urgent flush), at most ``budget`` moves:
    every move of its two-pointer sequence (``EndPack``), readers or not."""
    pack = EndPack(band, barrier, has_readers)
    n = pack.extend(budget)
    return Compaction(pack.pairs[:n], pack.view(n))


# ---------------------------------------------------------------------------------------------
# Rung 3: relayout of a float band.


@dataclass
class Relayout:
    moves: list[tuple[int, int]]
    span: tuple[int, int]  # the float's target span [t, t + need)
    view: BandView


def plan_float_relayout(band: Band, win_lo: int, win_hi: int, pages: int, hint: int,
                        obstacles: list[int]) -> Relayout | None:
    """Choose a target span inside the byte window [win_lo, win_hi) and the moves that fill it.

    The span holds every live and withheld page of the float plus ``pages`` new
    ones; it must cover the float's immovable pages (withheld, or with a ledger
    user) and sits as close to the float's current position as the window allows,
    so the fewest pages move.  Sources are the live pages outside the span; each
    goes to the lowest free slot inside it.  None if no span fits.
    """
    p = band.page_bytes
    need = len(band.live) + len(band.withheld) + pages
    if need == 0:
        return Relayout([], (0, 0), explicit_view(band, 0, 0, []))
    span = float_span(p, win_lo, win_hi, need, band.lo if not band.empty else hint // p,
                      min(obstacles) if obstacles else None, max(obstacles) if obstacles else None)
    if span is None:
        return None
    t, t_end = span

    outside = chain(range(band.lo, min(band.hi, t)), range(max(band.lo, t_end), band.hi))
    sources = [s for s in outside if s in band.live]
    free = span_free_slots(t, t_end, band.lo, band.hi, list(band.holes.irange(t, t_end - 1)))
    assert len(free) >= len(sources)
    moves = list(zip(sources, free))
    rest = free[len(sources):]
    return Relayout(moves, (t, t_end), explicit_view(band, t, t_end, rest))


def plan_float_fewest(band: Band, win_lo: int, win_hi: int, pages: int, hint: int,
                      obstacles: list[int]) -> Relayout | None:
    """The default rung 3 for one float: move the fewest pages that open the room.

    Every arrangement of the float lies inside the aligned window, so its live pages outside the window must
    move in every one; this plan moves exactly those (``float_target`` keeps every page inside the window where
    it is).  Each source, ascending, goes to the lowest free slot of the target span.  O(sources + runs of
    holes outside the window x log^2 n + log n): never a walk over the float band.  None if no span fits.
    """
    p = band.page_bytes
    need = len(band.live) + len(band.withheld) + pages
    if need == 0:
        return Relayout([], (0, 0), explicit_view(band, 0, 0, []))
    lo, hi = (band.lo, band.hi) if not band.empty else (hint // p, hint // p)
    span = float_target(p, win_lo, win_hi, need, lo, hi, min(obstacles) if obstacles else None,
                        max(obstacles) if obstacles else None)
    if span is None:
        return None
    t, t_end = span
    sources = [s for a, b in ((band.lo, min(band.hi, t)), (max(band.lo, t_end), band.hi))
               for s in _live_in(band, a, b)]

    def free() -> Iterator[int]:  # ascending: the span's slots below the band, its holes, its slots above
        b_lo, b_hi = (band.lo, band.hi) if not band.empty else (t_end, t_end)
        return chain(range(t, min(t_end, b_lo)), band.holes.irange(max(t, b_lo), min(t_end, b_hi) - 1),
                     range(max(t, b_hi), t_end))

    moves = list(zip(sources, free()))
    assert len(moves) == len(sources)
    count = (t_end - t) - len(band.live) - len(band.withheld)

    def first(k: int) -> list[int]:
        return list(islice(free(), len(sources), len(sources) + max(0, min(k, count))))

    return Relayout(moves, (t, t_end), BandView(band.name, band.role, p, band.top, t, t_end, count, first))


def _live_in(band: Band, a: int, b: int) -> Iterator[int]:
    """The live slots of ``band`` in ``[a, b)``, ascending, jumping over runs of holes (no withheld slot is there:
    withheld slots are obstacles, inside every target span)."""
    s = a
    while s < b:
        if s in band.live:
            yield s
            s += 1
        else:
            s += max(1, band.hole_run(s, 1))


def float_target(p: int, win_lo: int, win_hi: int, need: int, lo: int, hi: int, omin: int | None,
                 omax: int | None) -> tuple[int, int] | None:
    """The default rung 3's target span ``[t, t_end)``: the float's span ``[lo, hi)`` (its hint slot, twice, when
    empty) clipped to the aligned window ``[ceil(win_lo/p), win_hi // p)``, widened by the slots it lacks of
    ``need``, up first, then down.  It exists iff the window holds ``need`` slots and the immovable slots
    ``omin..omax`` (inside ``[lo, hi)``); then it keeps every slot of the band inside the window.

    pre: p > 0
    pre: need > 0
    pre: lo <= hi
    pre: (omin is None) == (omax is None)
    pre: omin is None or lo <= omin <= omax < hi
    post: __return__ is None or win_lo <= __return__[0] * p
    post: __return__ is None or __return__[1] * p <= win_hi
    post: __return__ is None or __return__[1] - __return__[0] >= need
    post: __return__ is None or omin is None or __return__[0] <= omin <= omax < __return__[1]
    post: __return__ is None or all(__return__[0] <= x < __return__[1] for x in range(lo, hi) if win_lo<=x*p<=win_hi-p)
    """
    w_lo, w_hi = ceil_div(win_lo, p), win_hi // p
    if w_hi - w_lo < need or (omin is not None and omax is not None and not w_lo <= omin <= omax < w_hi):
        return None
    c_lo, c_hi = clamp(lo, w_lo, w_hi), clamp(hi, w_lo, w_hi)
    lack = max(0, need - (c_hi - c_lo))
    up = min(lack, w_hi - c_hi)
    return c_lo - (lack - up), c_hi + up


def float_span(p: int, win_lo: int, win_hi: int, need: int, current: int, omin: int | None,
               omax: int | None) -> tuple[int, int] | None:
    """Rung 3's target span ``[t, t_end)`` for a float of page bytes ``p`` that needs ``need`` slots, inside the
    byte window ``[win_lo, win_hi)``, covering its immovable slots ``omin..omax`` (if any), nearest ``current``.

    pre: p > 0
    pre: need > 0
    pre: (omin is None) == (omax is None)
    pre: omin is None or omin <= omax
    post: __return__ is None or win_lo <= __return__[0] * p
    post: __return__ is None or __return__[1] * p <= win_hi
    post: __return__ is None or __return__[1] - __return__[0] >= need
    post: __return__ is None or omin is None or __return__[0] <= omin <= omax < __return__[1]
    """
    t_min, t_max = ceil_div(win_lo, p), win_hi // p - need
    if omin is not None and omax is not None:
        need = max(need, omax - omin + 1)
        t_min = max(t_min, omax + 1 - need)
        t_max = min(win_hi // p - need, omin)
    if t_min > t_max:
        return None
    t = clamp(current, t_min, t_max)
    return t, t + need


def span_free_slots(t: int, t_end: int, lo: int, hi: int, holes_inside: list[int]) -> list[int]:
    """The free slots of a float's target span ``[t, t_end)`` in ascending order: slots below its current span
    ``[lo, hi)``, its holes inside the target (``holes_inside``, ascending), slots above its current span.

    pre: t <= t_end
    pre: lo <= hi
    pre: all(a < b for a, b in zip(holes_inside, holes_inside[1:]))
    pre: all(lo <= s < hi and t <= s < t_end for s in holes_inside)
    post: all(a < b for a, b in zip(__return__, __return__[1:]))
    post: all(t <= s < t_end for s in __return__)
    post: all(s in __return__ for s in range(t, t_end) if lo == hi or not lo <= s < hi)
    post: all(s in holes_inside for s in __return__ if lo < hi and lo <= s < hi)
    """
    below_span = range(t, min(t_end, lo)) if lo < hi else range(t, t_end)
    above_span = range(max(t, hi), t_end) if lo < hi else range(0)
    # ascending: slots below the current span, holes inside it, slots above it
    return list(chain(below_span, holes_inside, above_span))
