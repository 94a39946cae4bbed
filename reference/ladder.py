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


def ceil_div(a: int, b: int) -> int:
    """pre: b > 0
    post: __return__ * b >= a
    post: (__return__ - 1) * b < a
    """
    return -(-a // b)


def clamp(value: int, lo: int, hi: int) -> int:
    """pre: lo <= hi
    post: lo <= __return__ <= hi
    post: (lo <= value <= hi) == (__return__ == value)
    """
    return max(lo, min(value, hi))


@dataclass
class _Gap:
    lo: int  # byte where the band below ends
    hi: int  # byte where the band above starts
    bot: int = 0  # cursor: bytes claimed from the bottom end upward
    top: int = 0  # cursor: bytes claimed from the top end downward
    mid: int = 0  # cursor for empty floats placed inside

    def __post_init__(self) -> None:
        self.bot = self.mid = self.lo
        self.top = self.hi


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


def plan_compaction(band: Band, barrier: int | None, has_readers: Callable[[int], bool],
                    budget: int | None = None) -> Compaction:
    """Two-pointer pack of an end band toward its anchor.

    The farthest live page goes to the hole nearest the anchor, while that hole is
    nearer the anchor than the page.  Only pages farther from the anchor than the
    ``barrier`` (the farthest slot that cannot move: withheld, or held by a writer)
    are sources: moving a page nearer than the barrier cannot retract the frontier,
    so it would copy bytes for nothing.  A moved page with readers leaves its old
    slot withheld; the frontier retracts past it once the readers release.
    """
    assert band.role is not Role.FLOAT
    up = band.role is Role.LOW  # the low band's anchor is slot 0; the high band's is `top`

    def nearer(a: int, b: int) -> bool:
        return a < b if up else a > b

    cursor = band.hi - 1 if up else band.lo  # scans sources from the far edge toward the anchor
    step = -1 if up else 1
    moves: list[tuple[int, int]] = []
    for hole in band.holes_in_anchor_order():
        if budget is not None and len(moves) >= budget:
            break
        src = None
        while nearer(hole, cursor) and (barrier is None or nearer(barrier, cursor)):
            s = cursor
            cursor += step
            if s in band.live:
                src = s
                break
        if src is None:
            break
        moves.append((src, hole))

    used = {dst for _, dst in moves}
    freed = sorted((s for s, _ in moves if not has_readers(s)), reverse=not up)  # anchor order
    freed_set = set(freed)

    def empty_after(s: int) -> bool:
        return (s in freed_set) or (s not in used and s in band.holes)

    lo, hi = band.lo, band.hi
    retracted = 0
    if up:
        while hi > lo and empty_after(hi - 1):
            hi -= 1
            retracted += 1
    else:
        while lo < hi and empty_after(lo):
            lo += 1
            retracted += 1

    count = band.hole_count - len(moves) + len(freed) - retracted
    n_used = len(moves)

    def unused_holes() -> Iterator[int]:  # the original holes after the first n_used, anchor order
        if band.role is Role.HIGH:
            return band.holes.islice(0, len(band.holes) - n_used, reverse=True)
        return band.holes.islice(n_used, None)

    def first(k: int) -> list[int]:
        stream = merge_anchor_order(band.role, unused_holes(), iter(freed))
        return list(islice((s for s in stream if lo <= s < hi), max(0, min(k, count))))

    return Compaction(moves, BandView(band.name, band.role, band.page_bytes, band.top, lo, hi, count, first))


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
