"""The default ladder's shortfall-sized rung 2 and fewest-moves rung 3, the full-compaction policy, the idle-time
flush, and the placements every shipped policy promises (not only their safety)."""

from __future__ import annotations

import contextlib
import pickle
import random

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.bands import BandView
from kvarena.reference.invariants import check_all
from kvarena.reference.ladder import EndPack
from kvarena.reference.policy import POLICIES
from kvarena.spec.errors import AdmissionRejectedError, InvalidArgumentError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.sizing import least
from kvarena.spec.types import Move, Rung, UserKind


def toy(model: str = "toy-tri", capacity: int = 4096, policy: str | None = None) -> Arena:
    cfg = ArenaConfig(preset(model), capacity, page_size=4, max_context_len=16, recurrent_slots=64)
    return Arena(cfg, POLICIES[policy]() if policy else None)


def slot_of(a: Arena, vid: int) -> int:
    return a.translate(vid)[1]


def _state_with_far_holes(policy: str | None = None) -> tuple[Arena, list[int]]:
    """toy-state, 4096 B: 8 full pages at slots 8..15, 32 state pages fill [0, 2048); the full pages at slots
    15, 14, 12 dropped: holes at the anchor side of the high band, its frontier (slot 8) live."""
    a = toy("toy-state", 4096, policy)
    f = list(a.admit("A", {"full": 8}).pages["full"])
    a.admit("B", {"state": 32})
    a.drop("A", [f[0], f[1], f[3]])
    return a, f


# ---- rung 2 ---------------------------------------------------------------------------------------------------


def test_rung2_moves_only_what_the_shortfall_needs() -> None:
    """One state page (64 B) needs one full page (256 B) off the frontier: one move, not the full flush's three."""
    a, _f = _state_with_far_holes()
    plan = a.plan_admission({"state": 1})
    assert plan.rung is Rung.COMPACT
    assert plan.moves == (Move("full", 8, 15),)  # the frontier page to the hole nearest the anchor
    full, _ = _state_with_far_holes("full-compaction")
    flush = full.plan_admission({"state": 1})
    assert flush.moves == (Move("full", 8, 15), Move("full", 9, 14), Move("full", 10, 12))
    # five state pages need two full pages off the frontier: the first two moves of the same sequence
    assert a.plan_admission({"state": 5}).moves == flush.moves[:2]
    a.admit("C", {"state": 1})
    check_all(a)


def test_rung2_stops_before_a_source_with_readers() -> None:
    """The frontier cannot retract past a page a reader holds: the default does not move it (the full flush does,
    leaving its old slot withheld) and admits nothing it cannot open now."""
    a, f = _state_with_far_holes()
    a.acquire("rd", UserKind.FORWARD_READ, [f[7]])  # slot 8, the frontier page
    with pytest.raises(AdmissionRejectedError):
        a.plan_admission({"state": 1})
    full, ff = _state_with_far_holes("full-compaction")
    full.acquire("rd", UserKind.FORWARD_READ, [ff[7]])
    with pytest.raises(AdmissionRejectedError):  # it moves three pages and still cannot place the page
        full.plan_admission({"state": 1})
    a.release("rd")
    assert a.plan_admission({"state": 1}).moves == (Move("full", 8, 15),)


def test_rung2_respects_the_barrier() -> None:
    """A written page is the barrier: nothing nearer the anchor than it moves, so nothing opens the gap."""
    a, f = _state_with_far_holes()
    a.acquire("w", UserKind.FORWARD_WRITE, [f[7]])
    pack = EndPack(a.bands["full"], a._barrier(a.bands["full"]), a._has_readers("full"), stop_at_readers=True)
    assert pack.extend() == 0
    with pytest.raises(AdmissionRejectedError):
        a.plan_admission({"state": 1})


def test_least_gallops_and_bisects() -> None:
    a, _ = _state_with_far_holes()
    band = a.bands["full"]
    pack = EndPack(band, None, lambda s: False)
    probes: list[int] = []

    def ok(k: int) -> bool:
        probes.append(k)
        return k >= 3

    assert least(ok, pack) == 3 and set(probes) <= {1, 2, 3, 4}
    assert least(lambda k: False, pack) is None and pack.done
    assert least(lambda k: True, pack, first=0) == 0
    assert least(lambda k: k >= 2, pack, cap=1) is None


def _random_arena(rng: random.Random, policy: str | None) -> Arena:
    a = toy("toy-tri", rng.choice((3584, 4096, 6144)), policy)
    owners = []
    for i in range(rng.randint(3, 14)):
        d = {c: rng.randint(0, 3) for c in ("state", "window", "full")}
        try:
            a.admit(f"o{i}", {c: n for c, n in d.items() if n})
            owners.append(f"o{i}")
        except (AdmissionRejectedError, InvalidArgumentError):
            pass
    for o in rng.sample(owners, len(owners) // 2):
        a.free(o)
    for i, o in enumerate(rng.sample([o for o in owners if o in a.owners], min(2, len(a.owners)))):
        vids = [v for vs in a.held(o).values() for v in vs][:2]
        if vids:
            a.acquire(f"u{i}", rng.choice((UserKind.FORWARD_READ, UserKind.FORWARD_WRITE, UserKind.HOST_SAVE)), vids)
    return a


def test_sized_never_loses_to_the_full_flush_and_never_moves_more() -> None:
    """On random toy-tri states: every demand the full-compaction policy admits the default admits too, with no
    more rung-2 moves, each band's moves a prefix of the full flush's; the plan is Pareto-minimal."""
    rng = random.Random(14)
    checked = 0
    for _ in range(150):
        seed = rng.random()
        default, full = _random_arena(random.Random(seed), None), _random_arena(random.Random(seed), "full-compaction")
        assert default.snapshot() == full.snapshot()
        for _ in range(6):
            d = {c: rng.randint(0, 4) for c in ("state", "window", "full")}
            d = {c: n for c, n in d.items() if n}
            if not d:
                continue
            try:
                pf = full.plan_admission(d)
            except (AdmissionRejectedError, InvalidArgumentError):
                continue
            ps = default.plan_admission(d)  # raises if the default loses a demand the full flush admits
            checked += 1
            ends = (default.order[0], default.order[-1])
            for cls in ends:
                sized = [m for m in ps.moves if m.cls == cls]
                flush = [m for m in pf.moves if m.cls == cls]
                assert len(sized) <= len(flush)
                if ps.rung is Rung.COMPACT or pf.rung is ps.rung:
                    assert sized == flush[:len(sized)] or pf.rung is not Rung.COMPACT
            if ps.rung is Rung.COMPACT:
                _assert_pareto_minimal(default, d, ps)
    assert checked > 150


def _assert_pareto_minimal(a: Arena, demand: dict[str, int], plan) -> None:
    from kvarena.reference.ladder import place

    low, high = a._end_packs()
    k = (sum(m.cls == low.band.name for m in plan.moves), sum(m.cls == high.band.name for m in plan.moves))
    low.extend(), high.extend()
    views = [BandView.of(b) for b in a._chain()]

    def fits(kl: int, kh: int) -> bool:
        return place([low.view(kl), *views[1:-1], high.view(kh)], demand, a.hints).ok

    assert fits(*k)
    assert k[0] == 0 or not fits(k[0] - 1, k[1])
    assert k[1] == 0 or not fits(k[0], k[1] - 1)


# ---- rung 3 ---------------------------------------------------------------------------------------------------


def test_rung3_moves_only_the_float_pages_outside_the_room() -> None:
    """The window float [w, w+3) must give up its top page for the high band: the default moves that one page
    (the nearest-span relayout of full-compaction moves the float wherever the clamp puts it)."""
    a = toy("toy-tri", 4096)
    w = a.admit("w", {"window": 3}).pages["window"]
    lo, hi = a.bands["window"].lo, a.bands["window"].hi
    a.drop("w", [w[1]])  # a hole inside the float
    room = (a.bands["full"].top * 256 - hi * 512) // 256  # full pages that fit above the float now
    plan = a.plan_admission({"full": room + 2})  # two more than fit: the float's top page must go
    assert plan.rung is Rung.RELAYOUT
    moved = [m for m in plan.moves if m.cls == "window"]
    assert [m.src for m in moved] == [hi - 1] and [m.dst for m in moved] == [lo + 1]  # into its own hole
    a.admit("f", {"full": room + 2})
    check_all(a)


def test_rung3_default_admits_whatever_full_compaction_admits_with_no_more_float_moves() -> None:
    rng = random.Random(3)
    checked = 0
    for _ in range(120):
        seed = rng.random()
        default, full = _random_arena(random.Random(seed), None), _random_arena(random.Random(seed), "full-compaction")
        for _ in range(5):
            d = {c: n for c, n in zip(("state", "window", "full"), (rng.randint(0, 6), rng.randint(0, 2),
                                                                      rng.randint(0, 4))) if n}
            if not d:
                continue
            try:
                pf = full.plan_admission(d)
            except (AdmissionRejectedError, InvalidArgumentError):
                continue
            ps = default.plan_admission(d)
            if pf.rung is Rung.RELAYOUT and ps.rung is Rung.RELAYOUT:
                checked += 1
                assert sum(m.cls == "window" for m in ps.moves) <= sum(m.cls == "window" for m in pf.moves)
    assert checked > 5


# ---- the idle-time flush ----------------------------------------------------------------------------------------


def test_flush_idle_moves_at_most_its_budget_in_full_flush_order() -> None:
    a, _ = _state_with_far_holes()
    full_moves = a.plan_compact().moves
    plan = a.flush_idle(2 * 256 + 100)  # two full pages' worth
    assert plan.rung is Rung.COMPACT and plan.moves == full_moves[:2] and plan.total_bytes_moved == 512
    check_all(a)
    assert a.flush_idle(0).rung is Rung.NONE
    rest = a.flush_idle(1 << 20)
    assert len(rest.moves) == len(full_moves) - 2
    assert a.flush_idle(1 << 20).moves == ()  # nothing left
    check_all(a)


@pytest.mark.parametrize("bad", [-1, 1.5, True, None, "1"])
def test_flush_idle_refuses_a_bad_budget_bit_identically(bad) -> None:
    a, _ = _state_with_far_holes()
    before = pickle.dumps(a)
    with pytest.raises(InvalidArgumentError, match="budget_bytes"):
        a.flush_idle(bad)
    assert pickle.dumps(a) == before


def test_the_scheduler_flushes_when_idle() -> None:
    """Between steps, when at most ``idle_flush_running`` requests run, the scheduler calls ``flush_idle`` with its
    per-step budget; with ``idle_flush_bytes=None`` it never does."""
    from dataclasses import replace

    from kvarena.simulator.arrivals import Arrival, TraceSource
    from kvarena.simulator.scheduler import SchedulerModel, run

    cfg = ArenaConfig(preset("gpt-oss-20b"), 2 << 30, max_context_len=4096)
    calls: dict[str, list[int]] = {}
    for name, model in (("on", SchedulerModel(idle_flush_running=2)), ("off", SchedulerModel(idle_flush_bytes=None))):
        a = Arena(cfg)
        calls[name] = []
        real = a.flush_idle
        a.flush_idle = lambda b, real=real, got=calls[name]: (got.append(b), real(b))[1]  # type: ignore[method-assign]
        reqs = [Arrival(float(i), 256, 40) for i in range(6)]
        run(a, TraceSource(reqs), "t", replace(model, check_every=0))
        check_all(a)
    assert calls["on"] and set(calls["on"]) == {SchedulerModel().idle_flush_bytes}
    assert calls["off"] == []


# ---- placements each shipped policy promises ----------------------------------------------------------------


def _high_band_with_runs(policy: str | None) -> Arena:
    """toy-tri: full pages at 15..6; holes (anchor order, descending) in runs: [14], [12, 11], [9, 8, 7]."""
    a = toy("toy-tri", 4096, policy)
    f = a.admit("r", {"full": 10}).pages["full"]
    a.drop("r", [v for v in f if slot_of(a, v) in (14, 12, 11, 9, 8, 7)])
    assert list(a.bands["full"].holes) == [7, 8, 9, 11, 12, 14]
    return a


def test_ladder_takes_the_holes_nearest_the_anchor() -> None:
    a = _high_band_with_runs(None)
    assert a.plan_admission({"full": 2}).placements == {"full": (14, 12)}
    assert a.plan_admission({"full": 3}).placements == {"full": (14, 12, 11)}


def test_best_fit_takes_the_smallest_run_that_holds_the_demand() -> None:
    a = _high_band_with_runs("best-fit")
    assert a.plan_admission({"full": 1}).placements == {"full": (14,)}
    assert a.plan_admission({"full": 2}).placements == {"full": (12, 11)}
    assert a.plan_admission({"full": 3}).placements == {"full": (9, 8, 7)}
    # no run holds 4: the shortest runs first, the longest kept whole as long as possible
    assert a.plan_admission({"full": 4}).placements == {"full": (14, 12, 11, 9)}
    plan = a.plan_admission({"full": 2})
    assert plan.rung is Rung.REUSE and plan.moves == ()


def test_best_fit_falls_back_to_the_ladder() -> None:
    a, _ = _state_with_far_holes("best-fit")
    assert a.plan_admission({"state": 1}).moves == (Move("full", 8, 15),)


def test_no_relayout_stops_at_rung_2() -> None:
    a = toy("toy-tri", 4096, "no-relayout")
    a.admit("w", {"window": 3})
    room = (a.bands["full"].top * 256 - a.bands["window"].hi * 512) // 256
    with pytest.raises(AdmissionRejectedError):
        a.plan_admission({"full": room + 2})
    b = toy("toy-tri", 4096)
    b.admit("w", {"window": 3})
    assert b.plan_admission({"full": room + 2}).rung is Rung.RELAYOUT


def test_relayout_budget_caps_rung_3_bytes() -> None:
    a = toy("toy-tri", 4096)
    a.admit("w", {"window": 3})
    room = (a.bands["full"].top * 256 - a.bands["window"].hi * 512) // 256
    need = a.plan_admission({"full": room + 2}).bytes_moved[3]
    for budget, admits in ((need, True), (need - 1, False)):
        b = toy("toy-tri", 4096)
        b.policy = POLICIES["relayout-budget"](budget)
        b.admit("w", {"window": 3})
        if admits:
            assert b.plan_admission({"full": room + 2}).bytes_moved[3] <= budget
        else:
            with pytest.raises(AdmissionRejectedError):
                b.plan_admission({"full": room + 2})


def test_eager_compaction_packs_at_free_time_and_full_compaction_at_admission() -> None:
    a, _ = _state_with_far_holes("eager-compaction")  # the drops already compacted the high band
    assert list(a.bands["full"].holes) == [] and a.stats.moves[2] == 3
    b, _ = _state_with_far_holes("full-compaction")
    assert list(b.bands["full"].holes) == [12, 14, 15] and b.stats.moves[2] == 0
    b.admit("C", {"state": 1})
    assert b.stats.moves[2] == 3 and not b.bands["full"].holes
    check_all(b)


# ---- plan validation in O(plan) -------------------------------------------------------------------------------


def _slow_absorbed(ov, band) -> tuple[int, int]:
    """The validator's absorption as it was: a walk over the boundary slots, one at a time."""
    lo, hi = ov.spans[band.name]
    if band.role.value == "low":
        while hi > lo and ov.get(band.name, hi - 1) == "hole":
            hi -= 1
    else:
        while lo < hi and ov.get(band.name, lo) == "hole":
            lo += 1
    return lo, hi


def _slow_kept(ov, band, t: int, t_end: int) -> int:
    slots = {*band.live, *band.withheld, *(s for (c, s) in ov.state if c == band.name)}
    return sum(ov.get(band.name, s) in ("live", "withheld") and not t <= s < t_end for s in slots)


def test_validator_fast_paths_equal_the_slot_walks() -> None:
    """The bisection-based absorption and kept-outside count agree with the slot walks they replace, on the
    plans of the default and the full-compaction policy over random states."""
    from kvarena.reference import validate as V

    rng = random.Random(7)
    seen = {"absorb": 0, "span": 0}
    for _ in range(120):
        seed = rng.random()
        for policy in (None, "full-compaction"):
            a = _random_arena(random.Random(seed), policy)
            d = {c: n for c, n in zip(("state", "window", "full"), (rng.randint(0, 6), rng.randint(0, 2),
                                                                      rng.randint(0, 5))) if n}
            plans = [a.plan_compact()]
            with contextlib.suppress(AdmissionRejectedError, InvalidArgumentError):
                plans.append(a.plan_admission(d))
            for plan in plans:
                _check_fast_paths(V, a, plan, seen)
    assert seen["span"] > 10 and seen["absorb"] > 10


def _check_fast_paths(V, a: Arena, plan, seen: dict[str, int]) -> None:
    ov = V._Overlay(a)
    for m in plan.moves:
        ov.state[(m.cls, m.src)] = "withheld" if ov.used(m.cls, m.src) else "hole"
        ov.state[(m.cls, m.dst)] = "live"
    for cls, (t, t_end) in plan.spans.items():
        assert V._kept_outside(ov, a.bands[cls], t, t_end) == _slow_kept(ov, a.bands[cls], t, t_end) == 0
        seen["span"] += 1
    for cls in (a.order[0], a.order[-1]):
        slow = _slow_absorbed(ov, a.bands[cls])
        assert V._absorbed(ov, a.bands[cls]) == slow
        seen["absorb"] += slow != (a.bands[cls].lo, a.bands[cls].hi)


def test_plan_span_refuses_a_float_page_left_outside(monkeypatch) -> None:
    """A rung-3 plan with one float move dropped leaves that page outside its target span: PLAN-SPAN, naming it,
    the state bit-identical; with the check planted away (a mutant) the same plan would pass."""
    from kvarena.reference import validate as V
    from kvarena.spec.errors import PlanError
    from kvarena.spec.types import Plan

    a = toy("toy-tri", 4096)
    a.admit("w", {"window": 3})
    room = (a.bands["full"].top * 256 - a.bands["window"].hi * 512) // 256
    plan = a.plan_admission({"full": room + 2})
    moved = [m for m in plan.moves if m.cls == "window"]
    assert moved
    bad = Plan(Rung.RELAYOUT, tuple(m for m in plan.moves if m != moved[0]), {}, {}, plan.spans)
    before = pickle.dumps(a)
    with pytest.raises(PlanError, match=rf"PLAN-SPAN.*\[{moved[0].src}\]"):
        V.validate_plan(a, bad, {})
    assert pickle.dumps(a) == before
    V.validate_plan(a, Plan(Rung.RELAYOUT, plan.moves, {}, {}, plan.spans), {})  # the whole plan is fine
    monkeypatch.setattr(V, "_kept_outside", lambda *args: 0)  # the planted bug: the check counts nothing
    V.validate_plan(a, bad, {})  # ... and the bad plan slips through, so the test above can fail


def test_the_sweep_catches_a_default_that_loses_to_the_full_flush(monkeypatch) -> None:
    """The exhaustive sweep's new checks can fail: with the default's move sequences planted empty (every source
    taken for a reader's) the sweep's per-state check reports the demand full-compaction admits and the default
    rejects (a state of the CI bound)."""
    from kvarena.proofs import ladder as LD

    def run() -> list[str]:
        state = LD._Builder().build(("L",) * 7 + ("H", "L"), (2, ("L",)), ("L",))
        out = LD.Sweep()
        LD.check_state(state, [{"window": 1}, {"state": 1}, {"full": 2}], out, "the state")
        return out.problems

    assert run() == []
    real = Arena._end_packs

    def readers_everywhere(self):
        return tuple(EndPack(p.band, p.barrier, lambda s: True, stop_at_readers=True) for p in real(self))

    monkeypatch.setattr(Arena, "_end_packs", readers_everywhere)
    problems = run()
    assert problems and all("full-compaction admits but the ladder rejects" in p for p in problems)


def test_hole_run_equals_a_slot_walk() -> None:
    """``Band.hole_run`` (galloping over the sorted holes) against the walk it replaces, both directions."""
    from sortedcontainers import SortedList

    from kvarena.reference.bands import Band, Role

    rng = random.Random(5)
    for _ in range(400):
        b = Band("x", Role.LOW, 64, 64 * 200)
        b.hi = 200
        density = rng.choice((0.2, 0.5, 0.9, 1.0))
        b.holes = SortedList(s for s in range(200) if rng.random() < density)
        for _ in range(8):
            s, step = rng.randrange(200), rng.choice((1, -1))
            want = 0
            while 0 <= s + step * want < 200 and (s + step * want) in b.holes:
                want += 1
            assert b.hole_run(s, step) == want
