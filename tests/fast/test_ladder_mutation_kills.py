"""reference/ladder.py's planning functions against the spec's own statement of them (docs/mutation.md).

Each function is called directly on small bands and its result compared with an oracle written from the spec
text, not from the code:

* ``place`` with two floats (spec/arena.md §Rung 1: non-empty floats in chain order grow toward the side with
  more room; each empty float is placed in its host gap, after everything claimed before it, at the slot nearest
  its hint, or not at all);
* ``compaction_view`` (§Rung 2: the view after the first k moves of the two-pointer sequence: sources without
  readers become holes, the frontier retracts past the slots that end up empty; holes in anchor order), against
  the moves applied slot by slot;
* ``float_span`` (§Rung 3, full-compaction's span: inside the aligned window, covering the immovable slots,
  nearest the float's position), against every candidate span; ``span_free_slots``' PEP 316 postconditions,
  exactly (§Rung 3: the span's free slots ascending: below the band, its holes inside, above it);
* ``plan_float_relayout`` / ``plan_float_fewest`` (§Rung 3: the sources are the live pages outside the span, each
  to the lowest free slot of the span, ascending; the unused free slots are the view's holes; the default span
  moves the fewest pages: exactly the live pages outside the aligned window), against a brute force.
"""

from __future__ import annotations

import random
from itertools import chain, islice

import pytest
from sortedcontainers import SortedList

from kvarena.reference.bands import Band, BandView
from kvarena.reference.ladder import (
    EndPack,
    _live_in,
    compaction_view,
    float_span,
    place,
    plan_float_fewest,
    plan_float_relayout,
    span_free_slots,
)
from kvarena.spec.guards import ceil_div
from kvarena.spec.types import Role


def _view(name: str, role: Role, lo: int, hi: int, p: int = 1, top: int = 100) -> BandView:
    return BandView(name, role, p, top, lo, hi, 0, lambda k: [])


# =============================================================================================
# Rung 1 with two floats


def test_place_puts_an_empty_float_in_its_own_gap() -> None:
    """low [0,10) | F1 [30,40) | F2 empty | high [90,100): F2's host gap is the one above F1, [40,90)."""
    views = [_view("L", Role.LOW, 0, 10), _view("F1", Role.FLOAT, 30, 40), _view("F2", Role.FLOAT, 0, 0),
             _view("H", Role.HIGH, 90, 100)]
    fit = place(views, {"F2": 5}, {"F1": 30, "F2": 60})
    assert fit.ok and fit.slots["F2"] == [60, 61, 62, 63, 64]
    fit = place(views, {"F2": 5}, {"F1": 30, "F2": 20})  # nearest the hint inside the host gap: its bottom
    assert fit.ok and fit.slots["F2"] == [40, 41, 42, 43, 44]


def test_place_two_empty_floats_share_a_gap_in_chain_order() -> None:
    """Both floats empty, one gap [10,90): each is placed after what was claimed before it; a float with no demand
    or one that does not fit does not stop the next one."""
    views = [_view("L", Role.LOW, 0, 10), _view("F1", Role.FLOAT, 0, 0), _view("F2", Role.FLOAT, 0, 0),
             _view("H", Role.HIGH, 90, 100)]
    hints = {"F1": 20, "F2": 22}
    fit = place(views, {"F1": 5, "F2": 5}, hints)
    assert fit.ok and fit.slots["F1"] == [20, 21, 22, 23, 24] and fit.slots["F2"] == [25, 26, 27, 28, 29]
    fit = place(views, {"F2": 5}, hints)
    assert fit.ok and fit.slots["F2"] == [22, 23, 24, 25, 26]
    fit = place(views, {"F1": 81, "F2": 5}, hints)  # F1 cannot fit in the 80 slots: its shortfall, F2 placed
    assert fit.shortfall == {"L": 0, "F1": 81, "F2": 0, "H": 0} and fit.slots["F2"] == [22, 23, 24, 25, 26]
    assert fit.slots["F1"] == []


def test_place_grows_the_second_non_empty_float_after_a_first_with_no_demand() -> None:
    views = [_view("L", Role.LOW, 0, 10), _view("F1", Role.FLOAT, 20, 30), _view("F2", Role.FLOAT, 50, 60),
             _view("H", Role.HIGH, 90, 100)]
    fit = place(views, {"F2": 3}, {"F1": 20, "F2": 50})
    assert fit.ok and fit.slots["F2"] == [60, 61, 62]  # 30 slots above, 20 below: up
    fit = place(views, {"F1": 2, "F2": 3}, {"F1": 20, "F2": 50})
    assert fit.ok and fit.slots["F1"] == [30, 31] and fit.slots["F2"] == [60, 61, 62]


# =============================================================================================
# Rung 2: the view after k moves


def _random_end_band(rng: random.Random, role: Role) -> tuple[Band, set[int]]:
    band = Band("e", role, 1, 60)
    n = rng.randint(3, 30)
    if role is Role.LOW:
        band.lo, band.hi = 0, n
    else:
        band.lo, band.hi = 60 - n, 60
    slots = list(range(band.lo, band.hi))
    far = band.hi - 1 if role is Role.LOW else band.lo  # the frontier slot is live (bands are absorbed)
    for s in slots:
        if s == far or rng.random() < 0.55:
            band.live[s] = s
        else:
            band.holes.add(s)
    readers = {s for s in band.live if rng.random() < 0.2}
    return band, readers


def _view_by_hand(band: Band, moves: list[tuple[int, int]], readers: set[int]) -> tuple[int, int, list[int]]:
    """The moves applied slot by slot: (lo, hi, holes in anchor order) of the band afterwards."""
    state = {s: ("live" if s in band.live else "hole") for s in range(band.lo, band.hi)}
    for src, dst in moves:
        assert state[dst] == "hole" and state[src] == "live"
        state[dst] = "live"
        state[src] = "withheld" if src in readers else "hole"
    lo, hi = band.lo, band.hi
    if band.role is Role.LOW:
        while hi > lo and state[hi - 1] == "hole":
            hi -= 1
    else:
        while lo < hi and state[lo] == "hole":
            lo += 1
    holes = sorted((s for s in range(lo, hi) if state[s] == "hole"), reverse=band.role is Role.HIGH)
    return lo, hi, holes


@pytest.mark.parametrize("role", [Role.LOW, Role.HIGH])
def test_compaction_view_is_the_moves_applied(role: Role) -> None:
    rng = random.Random(7 if role is Role.LOW else 8)
    for _ in range(60):
        band, readers = _random_end_band(rng, role)
        pack = EndPack(band, None, lambda s, r=readers: s in r)  # the full flush: readers move, stay withheld
        n = pack.extend()
        for k in range(n + 1):
            view = compaction_view(band, pack.pairs[:k], lambda s, r=readers: s in r)
            lo, hi, holes = _view_by_hand(band, pack.pairs[:k], readers)
            assert (view.lo, view.hi, view.hole_count) == (lo, hi, len(holes)), (k, pack.pairs[:k])
            assert view.first_holes(len(holes) + 3) == holes and view.first_holes(2) == holes[:2]
            assert view.role is role


@pytest.mark.parametrize("role", [Role.LOW, Role.HIGH])
def test_sized_view_is_the_general_view(role: Role) -> None:
    """The shortfall-sized sequence's O(log^2 n) view (``stop_at_readers``: every source frees its slot) equals
    ``compaction_view`` of the same prefix, with and without a barrier, at every k."""
    rng = random.Random(17 if role is Role.LOW else 18)
    for _ in range(80):
        band, readers = _random_end_band(rng, role)
        barrier = None
        if band.holes and rng.random() < 0.6:  # a withheld slot (not live, not a hole) pins what lies beyond it
            w = rng.choice(list(band.holes))
            band.holes.remove(w)
            band.withheld.add(w)
            barrier = w
        elif rng.random() < 0.5:  # a page a writer holds
            barrier = rng.choice(sorted(band.live))
        pack = EndPack(band, barrier, lambda s, r=readers: s in r, stop_at_readers=True)
        n = pack.extend()
        for k in range(n + 1):
            got, want = pack.view(k), compaction_view(band, pack.pairs[:k], lambda s, r=readers: s in r)
            assert (got.lo, got.hi, got.hole_count) == (want.lo, want.hi, want.hole_count), (k, barrier, pack.pairs)
            assert got.first_holes(want.hole_count + 2) == want.first_holes(want.hole_count + 2)
            assert got.first_holes(1) == want.first_holes(1)


# =============================================================================================
# Rung 3: spans and free slots


def test_float_span_is_the_nearest_valid_span() -> None:
    """Every span ``[t, t + need')`` inside the aligned window that covers ``omin..omax`` (need' = max(need,
    omax - omin + 1)): the one nearest ``current``; None when there is none."""
    for p in (1, 2, 3):
        for win_lo in (0, 1, 4):
            for win_hi in (9, 20, 25):
                for need in (1, 2, 5, 8):
                    for obst in (None, (6, 6), (5, 7), (3, 9), (8, 14)):
                        for current in (0, 3, 6, 12):
                            got = float_span(p, win_lo, win_hi, need, current, *(obst or (None, None)))
                            n = need if obst is None else max(need, obst[1] - obst[0] + 1)
                            ok = [t for t in range(ceil_div(win_lo, p), win_hi // p - n + 1)
                                  if obst is None or (t <= obst[0] and obst[1] < t + n)]
                            want = min(ok, key=lambda t: abs(t - current)) if ok else None
                            assert got == (None if want is None else (want, want + n)), \
                                (p, win_lo, win_hi, need, obst, current)


def test_span_free_slots_postconditions_exactly() -> None:
    rng = random.Random(3)
    for _ in range(400):
        t = rng.randint(0, 10)
        t_end = t + rng.randint(0, 10)
        lo = rng.randint(0, 15)
        hi = lo if rng.random() < 0.3 else lo + rng.randint(1, 10)
        inside = [s for s in range(max(lo, t), min(hi, t_end)) if rng.random() < 0.5]
        got = span_free_slots(t, t_end, lo, hi, inside)
        if lo == hi:  # an empty float: every slot of the span is free
            want = list(range(t, t_end))
        else:
            want = sorted([s for s in range(t, t_end) if not lo <= s < hi] + inside)
        assert got == want, (t, t_end, lo, hi, inside)


def _random_float(rng: random.Random) -> tuple[Band, list[int]]:
    band = Band("f", Role.FLOAT, 1, 80)
    band.lo = rng.randint(5, 40)
    band.hi = band.lo + rng.randint(1, 25)
    for s in range(band.lo, band.hi):
        r = rng.random()
        if s in (band.lo, band.hi - 1) or r < 0.45:
            band.live[s] = 1000 + s
        elif r < 0.55:
            band.withheld.add(s)
        else:
            band.holes.add(s)
    used = [s for s in band.live if rng.random() < 0.1]
    return band, sorted(band.withheld | set(used))


def _check_relayout(band: Band, r, pages: int) -> None:
    """The moves and view of a rung-3 plan, from the spec: sources are the live pages outside the span,
    ascending, each to the lowest free slot of the span (below the band, its holes inside, above it); the view
    is the span with the free slots left as holes."""
    t, t_end = r.span
    need = len(band.live) + len(band.withheld) + pages
    assert t_end - t >= need and all(type(x) is int for x in r.span)
    sources = [s for s in sorted(band.live) if not t <= s < t_end]
    free = [s for s in range(t, t_end) if not band.lo <= s < band.hi or s in band.holes]
    assert r.moves == list(zip(sources, free)), (band.lo, band.hi, r.span)
    rest = free[len(sources):]
    assert (r.view.lo, r.view.hi, r.view.hole_count) == (t, t_end, len(rest))
    assert r.view.first_holes(len(rest) + 2) == rest and r.view.first_holes(1) == rest[:1]
    assert r.view.role is Role.FLOAT


def test_plan_float_relayout_nearest_span_and_its_moves() -> None:
    rng = random.Random(11)
    seen = 0
    for _ in range(300):
        band, obst = _random_float(rng)
        win_lo, win_hi = rng.randint(0, 30), rng.randint(40, 80)
        pages = rng.randint(0, 6)
        hint = rng.randint(0, 79)
        r = plan_float_relayout(band, win_lo, win_hi, pages, hint, obst)
        need = len(band.live) + len(band.withheld) + pages
        span = float_span(1, win_lo, win_hi, need, band.lo, min(obst) if obst else None,
                          max(obst) if obst else None)
        assert (r is None) == (span is None)
        if r is not None:
            assert r.span == span  # nearest the float's current lo (§Rung 3)
            _check_relayout(band, r, pages)
            seen += 1
    assert seen > 100


def _fewest_by_hand(band: Band, win_lo: int, win_hi: int, need: int, obst: list[int]) -> int | None:
    """The fewest live pages outside any span of at least ``need`` slots in the window covering ``obst``."""
    spans = [(t, u) for t in range(win_lo, win_hi) for u in range(t + need, win_hi + 1)
             if not obst or (t <= min(obst) and max(obst) < u)]
    if not spans:
        return None
    return min(sum(1 for s in band.live if not t <= s < u) for t, u in spans)


def test_plan_float_fewest_moves_the_fewest_pages() -> None:
    rng = random.Random(12)
    seen = 0
    for _ in range(300):
        band, obst = _random_float(rng)
        win_lo, win_hi = rng.randint(0, 30), rng.randint(40, 80)
        pages = rng.randint(0, 6)
        r = plan_float_fewest(band, win_lo, win_hi, pages, rng.randint(0, 79), obst)
        need = len(band.live) + len(band.withheld) + pages
        fewest = _fewest_by_hand(band, win_lo, win_hi, need, obst)
        assert (r is None) == (fewest is None)
        if r is not None:
            assert len(r.moves) == fewest
            assert [s for s, _ in r.moves] == [s for s in sorted(band.live) if not win_lo <= s < win_hi]
            _check_relayout(band, r, pages)
            seen += 1
    assert seen > 100


@pytest.mark.parametrize("plan", [plan_float_fewest, plan_float_relayout])
def test_an_empty_float_opens_at_its_hint(plan) -> None:
    """An empty float (parked at slot 0) with demand: its span starts at its hint's slot, clipped to the window."""
    band = Band("f", Role.FLOAT, 4, 400)
    for hint, win_lo, win_hi, want in ((160, 0, 400, 40), (162, 0, 400, 40), (160, 200, 400, 50),
                                       (398, 0, 300, 72)):
        r = plan(band, win_lo, win_hi, 3, hint, [])
        assert r is not None and r.span == (want, want + 3) and r.moves == []
        assert r.view.first_holes(5) == [want, want + 1, want + 2]


def test_live_in_is_the_live_slots() -> None:
    rng = random.Random(5)
    for _ in range(300):
        band, _ = _random_float(rng)
        a = rng.randint(band.lo - 3, band.hi)
        b = rng.randint(a, band.hi + 3)
        assert list(_live_in(band, a, b)) == [s for s in range(a, b) if s in band.live]
    band = Band("f", Role.FLOAT, 1, 80)  # a run of holes at the end of the hole list
    band.lo, band.hi = 10, 20
    band.live.update({s: s for s in range(10, 20) if s not in (17, 18)})
    band.holes = SortedList([17, 18])
    assert list(_live_in(band, 10, 20)) == [10, 11, 12, 13, 14, 15, 16, 19]
    assert list(islice(chain(_live_in(band, 17, 20)), 5)) == [19]


@pytest.mark.parametrize("plan", [plan_float_fewest, plan_float_relayout])
def test_a_float_that_needs_nothing_plans_nothing(plan) -> None:
    """No live, withheld or new page: no moves, the empty span (0, 0), an empty view of the same band (the arena
    never asks this, a float with lo < hi keeps a live or withheld page at each edge; a policy may)."""
    band = Band("f", Role.FLOAT, 4, 400)
    for win_lo, win_hi, hint in ((0, 400, 160), (8, 12, 0), (0, 0, 0)):
        r = plan(band, win_lo, win_hi, 0, hint, [])
        assert r is not None and r.moves == [] and r.span == (0, 0)
        v = r.view
        assert (v.name, v.role, v.page_bytes, v.top, v.lo, v.hi, v.hole_count) == ("f", Role.FLOAT, 4, 100, 0, 0, 0)
        assert v.first_holes(3) == []


def test_place_grows_a_float_first_toward_the_room_counted_in_whole_pages() -> None:
    """§Rung 1: a non-empty float grows first toward the side with more room, room counted in its own whole pages:
    4 B above and 5 B below are 2 pages each for 2 B pages, a tie, which goes up."""
    views = [_view("L", Role.LOW, 0, 5), _view("F", Role.FLOAT, 5, 6, p=2), _view("H", Role.HIGH, 16, 20, top=20)]
    fit = place(views, {"F": 1}, {"F": 10})
    assert fit.ok and fit.slots["F"] == [6]  # bytes [12, 14): up; down would have been slot 4


def test_place_puts_an_empty_float_without_a_hint_at_the_bottom_of_its_gap() -> None:
    """A float the hints do not name is placed as if its hint were byte 0: the lowest slot of its host gap."""
    views = [_view("L", Role.LOW, 0, 0), _view("F", Role.FLOAT, 0, 0), _view("H", Role.HIGH, 90, 100)]
    fit = place(views, {"F": 3}, {})
    assert fit.ok and fit.slots["F"] == [0, 1, 2]
