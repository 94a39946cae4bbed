"""Plug-in policies: every shipped one keeps the invariants; the validator refuses bad plans."""

import pickle

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena.conformance.machine.arena import machine_for
from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.policy import POLICIES, Ladder
from kvarena.reference.validate import RULES, validate_plan
from kvarena.spec.errors import AdmissionRejectedError, PlanError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Move, Plan, Rung, UserKind
from tests.quality.unsafe_policies import FillsWithheldHole, MovesWrittenPage


def toy(model: str = "toy-tri", capacity: int = 4096, policy=None) -> Arena:
    # one owner's state pages are low-band filler here: the policies are the subject, not the recurrent cap
    return Arena(ArenaConfig(preset(model), capacity, page_size=4, max_context_len=16, recurrent_slots=64), policy)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_shipped_policy_passes_the_machine(name: str) -> None:
    factory = POLICIES[name]
    run_state_machine_as_test(machine_for(lambda cfg: Arena(cfg, factory()), f"Policy_{name}"),
                              settings=settings())


def _violation(a: Arena, plan: Plan, demand: dict, rule: str) -> None:
    before = pickle.dumps(a)
    with pytest.raises(PlanError) as info:
        validate_plan(a, plan, demand)
    assert info.value.rule == rule and info.value.inv == RULES[rule]
    assert pickle.dumps(a) == before


def test_validator_rules_each_fire() -> None:
    a = toy()
    r = a.admit("r", {"full": 3, "window": 1, "state": 2})
    f = r.pages["full"]
    a.drop("r", [f[1]])  # a hole in the high band
    hole = a.bands["full"].holes[0]
    src = a.translate(f[2])[1]
    _violation(a, Plan(Rung.REUSE, (Move("full", src, hole),)), {}, "PLAN-RUNG")
    _violation(a, Plan(Rung.COMPACT, (Move("window", 0, 1),)), {}, "PLAN-RUNG")
    _violation(a, Plan(Rung.COMPACT, (Move("full", hole, src),)), {}, "PLAN-MOVE-SOURCE")
    _violation(a, Plan(Rung.COMPACT, (Move("full", src, a.translate(f[0])[1]),)), {}, "PLAN-MOVE-DEST")
    _violation(a, Plan(Rung.REUSE, placements={"full": (hole,)}), {"full": 2}, "PLAN-PLACE-COUNT")
    _violation(a, Plan(Rung.REUSE, placements={"full": (src,)}), {"full": 1}, "PLAN-PLACE-FREE")
    _violation(a, Plan(Rung.REUSE, placements={"state": (7,)}), {"state": 1}, "PLAN-PLACE-FREE")
    a.acquire("w", UserKind.FORWARD_WRITE, [f[2]])
    _violation(a, Plan(Rung.COMPACT, (Move("full", src, hole),)), {}, "PLAN-MOVE-WRITER")
    a.release("w")
    a.acquire("rd", UserKind.FORWARD_READ, [f[0]])
    a.drop("r", [f[0]])  # withheld: freed, still read
    withheld = next(iter(a.bands["full"].withheld))
    _violation(a, Plan(Rung.COMPACT, (Move("full", src, withheld),)), {}, "PLAN-DEST-USERS")
    check_all(a)


def test_validator_extent_and_span_rules() -> None:
    a = toy()
    a.admit("r", {"full": 1, "window": 2, "state": 1})
    top = a.bands["full"].top
    low_hi = a.bands["state"].hi
    # the low band grown across the whole arena overlaps the high band
    _violation(a, Plan(Rung.REUSE, placements={"state": tuple(range(low_hi, a.bands["state"].top))}),
               {"state": a.bands["state"].top - low_hi}, "PLAN-EXTENT")
    w = a.bands["window"]
    _violation(a, Plan(Rung.RELAYOUT, spans={"window": (w.hi + 1, w.hi + 2)}), {}, "PLAN-SPAN")
    _violation(a, Plan(Rung.RELAYOUT, spans={"full": (0, top)}), {}, "PLAN-RUNG")


@pytest.mark.parametrize("unsafe, rule", [(MovesWrittenPage, "PLAN-MOVE-WRITER"),
                                          (FillsWithheldHole, "PLAN-PLACE-FREE")])
def test_unsafe_policy_plans_are_refused(unsafe, rule: str) -> None:
    a = toy(policy=unsafe())
    r = a.admit("r", {"full": 4, "window": 1, "state": 1})
    f = r.pages["full"]
    if unsafe is MovesWrittenPage:
        a.drop("r", [f[0]])
        a.acquire("w", UserKind.FORWARD_WRITE, [f[3]])
    else:
        a.acquire("rd", UserKind.FORWARD_READ, [f[1]])
        a.drop("r", [f[1]])
    before = pickle.dumps(a)
    with pytest.raises(PlanError) as info:
        a.admit("s", {"full": 1})
    assert info.value.rule == rule
    assert pickle.dumps(a) == before  # a refused plan changes nothing
    check_all(a)


def test_eager_compaction_compacts_at_free_time() -> None:
    a = toy(policy=POLICIES["eager-compaction"]())
    r = a.admit("r", {"full": 4})
    a.admit("s", {"full": 2})
    a.drop("r", [r.pages["full"][0]])  # a hole near the anchor: eager policy packs it at once
    assert not a.bands["full"].holes
    assert a.stats.moves[2] >= 1
    check_all(a)


def test_no_relayout_policy_never_relayouts() -> None:
    ladder, norelay = toy(capacity=4096), toy(capacity=4096, policy=POLICIES["no-relayout"]())
    for arena in (ladder, norelay):
        arena.admit("a", {"state": 10, "window": 2, "full": 4})  # the window float starts at its hint
    got = ladder.admit("c", {"full": 4})  # only room below the float: it must move down
    assert got.plan.rung == Rung.RELAYOUT and got.plan.bytes_moved.get(3, 0) > 0
    with pytest.raises(AdmissionRejectedError):
        norelay.admit("c", {"full": 4})
    assert norelay.stats.rung_used[3] == 0
    check_all(ladder)
    check_all(norelay)


class _CrashingHook(Ladder):
    """A free-time hook that fails with a bug of its own (not a PlanError)."""

    name = "crashing-hook"

    def after_free(self, arena: Arena) -> Plan | None:
        raise RuntimeError("policy bug")


@pytest.mark.parametrize("free", ["drop", "slide", "free"])
def test_a_free_and_its_free_time_plan_commit_together(free: str) -> None:
    """Whatever stops the free-time plan (the validator, or the policy itself) undoes the free: bit-identical."""
    a = toy(policy=_CrashingHook())
    r = a.admit("r", {"full": 3, "window": 2, "state": 2})
    a.share("cache", [r.pages["full"][0]])
    a.acquire("rd", UserKind.NET_SEND, [r.pages["full"][1]])
    before, snap = pickle.dumps(a), a.snapshot()
    call = {"drop": lambda: a.drop("r", [r.pages["full"][1], r.pages["full"][2]]),
            "slide": lambda: a.slide("r", "window", 2), "free": lambda: a.free("r")}[free]
    with pytest.raises(PlanError, match="policy bug") as info:  # the hook's own crash, typed (PLAN-SHAPE)
        call()
    assert info.value.rule == "PLAN-SHAPE" and isinstance(info.value.__cause__, RuntimeError)
    assert a.snapshot() == snap and pickle.dumps(a) == before
    check_all(a)
    a.policy = Ladder()  # the same call with a hook that plans nothing goes through
    call()
    check_all(a)


def test_the_ladder_hook_costs_no_checkpoint() -> None:
    """The default policy's hook plans nothing, so a free takes no copy of the state (O(pages freed))."""
    a = toy()
    r = a.admit("r", {"full": 3})
    v2p = a.v2p
    a.drop("r", [r.pages["full"][0]])
    assert a.v2p is v2p  # worked in place, not on a checkpoint's copy
    b = toy(policy=POLICIES["eager-compaction"]())
    r = b.admit("r", {"full": 3})
    v2p = b.v2p
    b.drop("r", [r.pages["full"][0]])
    assert b.v2p is not v2p  # a free followed by a hook ran on a copy (kept, as the plan was valid)
    check_all(b)
