"""The placement limit ``below`` (spec §Placement limit): the hole order it promises, that it is rung 1's alone,
that it never changes whether a demand fits, and which policies ignore it. Its error paths are in
test_errors.py (``_below_cases``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Band, Role
from kvarena.reference.policy import BestFit, FullCompaction, Ladder
from kvarena.spec.errors import AdmissionRejectedError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Rung

PS = 4


def swa(capacity: int = 1 << 16) -> Arena:
    """toy-swa: the window class is the low end band, full attention the high one."""
    return Arena(ArenaConfig(preset("toy-swa"), capacity, page_size=PS, max_context_len=16))


def with_holes(a: Arena, cls: str, n: int, freed: set[int]) -> list[int]:
    """``n`` one-page owners of ``cls``; the ones in ``freed`` freed again: their slots are holes."""
    slots = []
    for i in range(n):
        a.admit(f"{cls}{i}", {cls: 1})
        slots.append(a.v2p[a.held(f"{cls}{i}")[cls][0]][1])
    for i in sorted(freed):
        a.free(f"{cls}{i}")
    return slots


def test_low_band_takes_the_holes_below_the_limit_nearest_it_first() -> None:
    a = swa()
    low = a.order[0]
    with_holes(a, low, 10, {1, 3, 5, 7})
    assert list(a.bands[low].holes) == [1, 3, 5, 7]
    p = a.bands[low].page_bytes
    at = lambda b, k: a.plan_admission({low: k}, below={low: b}).placements[low]  # noqa: E731
    assert at(6 * p, 2) == (5, 3)  # slots < 6, descending
    assert at(6 * p, 4) == (5, 3, 1, 7)  # then the others, nearest the limit first (ascending)
    assert at(6 * p - 1, 1) == (3,)  # a page must lie wholly below the byte: slot 5 ends past it
    assert at(0, 2) == (1, 3)  # nothing below: nearest the limit = nearest the anchor
    assert a.plan_admission({low: 2}).placements[low] == (1, 3)  # no limit: nearest the anchor


def test_high_band_takes_the_holes_at_or_above_the_limit_nearest_it_first() -> None:
    a = swa()
    high = a.order[-1]
    slots = with_holes(a, high, 10, {1, 3, 5, 7})
    band = a.bands[high]
    holes = sorted(slots[i] for i in (1, 3, 5, 7))
    assert list(band.holes) == holes
    p = band.page_bytes
    mid = holes[1] + 1  # the limit slot: holes[2], holes[3] are at or above it
    got = a.plan_admission({high: 3}, below={high: mid * p - p // 2}).placements[high]  # ceil() lands on mid
    assert got == (holes[2], holes[3], holes[1])
    assert a.plan_admission({high: 3}).placements[high] == tuple(reversed(holes))[:3]


def test_the_limit_is_rung_1s_alone() -> None:
    """When rung 1 cannot fit, rungs 2-3 plan as without the limit (the same plan, moves and placements)."""
    a = Arena(ArenaConfig(preset("toy-swa"), 1 << 12, page_size=PS, max_context_len=16))
    low, high = a.order[0], a.order[-1]
    n = 0
    while True:  # fill the arena with single window pages, then free every other one
        try:
            a.admit(f"w{n}", {low: 1})
        except AdmissionRejectedError:
            break
        n += 1
    for i in range(0, n, 2):
        a.free(f"w{i}")
    demand = {high: len(a.bands[low].holes) // 2}
    plain = a.plan_admission(demand)
    assert plain.rung is Rung.COMPACT and plain.moves
    limited = a.plan_admission(demand, below={low: a.bands[low].page_bytes * 3, high: a.capacity // 2})
    assert limited == plain


@given(st.sets(st.integers(0, 23), max_size=20), st.integers(0, 12), st.integers(1, 30), st.integers(0, 1 << 14))
def test_a_limit_never_changes_whether_a_demand_fits(freed: set[int], k: int, full: int, b: int) -> None:
    a = Arena(ArenaConfig(preset("toy-swa"), 1 << 14, page_size=PS, max_context_len=16))  # 24 + 40 pages: tight
    low, high = a.order[0], a.order[-1]
    with_holes(a, low, 24, freed)
    demand = {low: k, high: full}
    outcome = []
    for below in (None, {low: b}, {high: b}, {low: b, high: a.capacity - b}):
        try:
            plan = a.plan_admission(demand, below=below)
            outcome.append((plan.rung, {c: len(s) for c, s in plan.placements.items()}, len(plan.moves)))
        except AdmissionRejectedError as e:
            outcome.append(("rejected", e.shortfall, 0))
    # the same rung, pages per class and moves for every limit: only which holes rung 1 reuses may differ
    assert all(o == outcome[0] for o in outcome), outcome


def test_full_compaction_and_best_fit_ignore_it() -> None:
    for policy in (FullCompaction(), BestFit()):
        a = Arena(ArenaConfig(preset("toy-swa"), 1 << 16, page_size=PS, max_context_len=16), policy=policy)
        low = a.order[0]
        with_holes(a, low, 10, {1, 3, 5, 7})
        p = a.bands[low].page_bytes
        assert a.plan_admission({low: 2}, below={low: 8 * p}) == a.plan_admission({low: 2}), policy.name


def test_extend_binds_the_owners_pages_in_that_order_and_forgets_the_limit() -> None:
    a = swa()
    low = a.order[0]
    with_holes(a, low, 10, {1, 3, 5, 7})
    a.admit("r", {low: 1}, below={low: 6 * a.bands[low].page_bytes})
    assert a.v2p[a.held("r")[low][0]][1] == 5
    assert not hasattr(a, "_limits")  # no hidden state: the limit is an argument of the policy and the ladder
    a.extend("r", {low: 1})
    assert a.v2p[a.held("r")[low][1]][1] == 1  # no limit: nearest the anchor again


def _ascending_below(self: Band, limit: int, k: int) -> list[int]:
    """A planted bug: the holes below the limit taken farthest from it first."""
    below = [h for h in self.holes if h < limit][:k] if self.role is Role.LOW else []
    return below + [h for h in self.holes if h >= limit][:k - len(below)]


def test_the_order_test_fails_on_a_planted_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Band, "holes_toward", _ascending_below)
    with pytest.raises(AssertionError):
        test_low_band_takes_the_holes_below_the_limit_nearest_it_first()


def test_the_policy_gets_below_as_an_argument_and_an_older_policy_is_called_without_it() -> None:
    """``Policy.plan(arena, demand, below)``: the limit slots reach the policy explicitly; a policy written with
    ``plan(arena, demand)`` still runs (and ignores the limit)."""
    seen: list[object] = []

    class Sees(Ladder):
        def plan(self, arena: Arena, demand: dict[str, int], below: Any = None) -> Any:
            seen.append(dict(below or {}))
            return arena.ladder(demand, below)

    class Older(Ladder):
        def plan(self, arena: Arena, demand: dict[str, int]) -> Any:  # the protocol before below was an argument
            seen.append("older")
            return arena.ladder(demand)

    cfg = ArenaConfig(preset("toy-swa"), 1 << 16, page_size=PS, max_context_len=16)
    a, b = Arena(cfg, policy=Sees()), Arena(cfg, policy=Older())
    low = a.order[0]
    p = a.bands[low].page_bytes
    for x in (a, b):
        with_holes(x, low, 10, {1, 3, 5, 7})
    seen.clear()
    got = a.admit("r", {low: 1}, below={low: 6 * p})
    assert seen == [{low: 6}] and a.v2p[got.pages[low][0]][1] == 5
    got = b.admit("r", {low: 1}, below={low: 6 * p})
    assert seen[-1] == "older" and b.v2p[got.pages[low][0]][1] == 1  # the limit ignored: nearest the anchor
