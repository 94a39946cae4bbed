"""The lockstep machine (conformance/machine/lockstep.py): the reference against itself, against a renumbering
adapter, and against every planted bug of tests/quality/mutants.py.

Runs use the ``ci`` profile (derandomized) with fewer examples; kills skip shrinking, which is for
humans reading a report.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import Phase, settings

from kvarena.conformance.adapter.protocol import AdapterError, Observation
from kvarena.conformance.adapter.renumbered import renumbered
from kvarena.conformance.machine.checks import Geometry, HeldPage, check_observation
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import Divergence, LiveReference, Side
from kvarena.conformance.machine.lockstep import RULES, lockstep_for, run_lockstep, start
from kvarena.conformance.vectors.scenarios import walk
from kvarena.reference.arena import Arena
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Mode
from tests.quality.mutants import MUTANTS, Mutant, isolated

KILL_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]


def ci(examples: int, **kw: Any) -> settings:
    return settings(settings.get_profile("ci"), max_examples=examples, **kw)


def test_reference_against_itself_exact() -> None:
    run_lockstep(Arena, "exact", ci(40))


@pytest.mark.parametrize("level", ["safety", "decisions"])
def test_renumbered_ids_conform_below_exact(level: str) -> None:
    run_lockstep(renumbered, level, ci(25))


def test_renumbered_ids_fail_exact() -> None:
    with pytest.raises(Divergence, match="virtual ids"):
        run_lockstep(renumbered, "exact", ci(25, phases=KILL_PHASES))


class LowHints(Arena):
    """A valid arena with another placement policy: empty floats start at the bottom."""

    def _float_hints(self) -> dict[str, int]:
        return dict.fromkeys(super()._float_hints(), 0)


class HighHints(Arena):
    """... or at the top."""

    def _float_hints(self) -> dict[str, int]:
        return dict.fromkeys(super()._float_hints(), self.capacity)


def test_another_placement_policy_is_safe_but_decides_differently() -> None:
    run_lockstep(HighHints, "safety", ci(40))
    with pytest.raises(Divergence, match=r"(admit|extend|relayout) .*(AdmissionRejected|shortfall differs)"):
        run_lockstep(HighHints, "decisions", ci(100, phases=KILL_PHASES))


def test_safety_undoes_an_admission_that_fits_on_one_side_only() -> None:
    """Both directions: the side that admitted frees the pages again, and the run goes on in step."""
    config = ArenaConfig(preset("toy-tri"), 3360, page_size=2, max_context_len=16)
    geo = Geometry.of(config)
    c = Conductor(geo, LiveReference(config, arena=LowHints(config)), Side(HighHints(config), geo), level="safety")
    walk(c, random.Random(3), 300)
    notes = " ".join(s["note"] for s in c.steps if "note" in s)
    assert "fits on the reference only" in notes and "fits on the implementation only" in notes


# Every planted bug, withheld-freed-by-first-release included since the alphabet has shared_withheld (two users
# on one freed page); ci examples no longer depend on import order (tests/conftest.py imports everything first).
LOCKSTEP_MUTANTS = MUTANTS


@pytest.mark.parametrize("mutant", LOCKSTEP_MUTANTS, ids=[m.name for m in LOCKSTEP_MUTANTS])
def test_lockstep_kills_mutant_at_safety(mutant: Mutant) -> None:
    with pytest.raises(AssertionError) as info:
        run_lockstep(isolated(mutant), "safety", ci(600, phases=KILL_PHASES), deep=False)  # margin: see test_mutants
    assert isinstance(info.value, Divergence), f"{mutant.name}: the harness itself failed: {info.value!r}"


def test_machine_class_attributes() -> None:
    cls = lockstep_for(renumbered, "decisions")
    assert cls.level == "decisions" and cls.factory is renumbered
    assert set(RULES) <= {n for n in dir(cls)}
    with pytest.raises(ValueError, match="level"):
        lockstep_for(Arena, "strict")


class _NoObserve:
    """An adapter missing methods: the harness names them instead of failing later."""

    def __init__(self, config: ArenaConfig) -> None:
        self.inner = Arena(config)
        self.order = self.inner.order

    def admit(self, *a: Any) -> Any:
        return self.inner.admit(*a)


def test_missing_methods_are_named() -> None:
    with pytest.raises(AdapterError) as info:
        start(_NoObserve, "toy-tri", 3104, 4)
    msg = str(info.value)
    for name in ("extend()", "drop()", "observe()", "translate()"):
        assert name in msg, msg


def _bad_admit_shape(config: ArenaConfig) -> Any:
    a = renumbered(config)
    a.admit = lambda owner, demand, shared=(): 42  # type: ignore[method-assign]
    return a


def test_wrong_return_shape_is_an_adapter_error() -> None:
    with pytest.raises(AdapterError, match=r"admit\(\) returned 42"):
        run_lockstep(_bad_admit_shape, "safety", ci(10, phases=KILL_PHASES))


def test_factory_that_raises_is_named() -> None:
    def broken(config: ArenaConfig) -> Any:
        raise RuntimeError("no device")

    with pytest.raises(AdapterError, match=r"factory .*broken raised RuntimeError: no device"):
        start(broken, "toy-tri", 3104, 4)


# -- the observation-level predicates on their own ---------------------------------------------


def _geo() -> Geometry:
    return Geometry.of(ArenaConfig(preset("toy-state"), 2624, page_size=2, max_context_len=16))


def _obs(v2p: dict, spans: dict, holes: dict | None = None, withheld: dict | None = None) -> Observation:
    return Observation(v2p, spans, {c: tuple((holes or {}).get(c, ())) for c in spans},
                       {c: tuple((withheld or {}).get(c, ())) for c in spans})


@pytest.mark.parametrize(("obs", "live", "holds", "inv"), [
    # two pages on one slot
    (_obs({0: ("state", 0), 1: ("state", 0)}, {"state": (0, 1), "full": (20, 20)}), {0: "state", 1: "state"}, [],
     "INV-NO-OVERLAP"),
    # the bands cross (state up to byte 1344, full from 1280)
    (_obs({0: ("state", 20), 1: ("full", 10)}, {"state": (0, 21), "full": (10, 20)},
          {"state": range(20), "full": range(11, 20)}), {0: "state", 1: "full"}, [], "INV-NO-OVERLAP"),
    # the high band left its anchor
    (_obs({0: ("full", 18)}, {"state": (0, 0), "full": (18, 19)}), {0: "full"}, [], "INV-BAND-ORDER"),
    # a live page nobody holds (leak)
    (_obs({0: ("full", 19), 5: ("full", 18)}, {"state": (0, 0), "full": (18, 20)}), {0: "full"}, [],
     "INV-VMAP-BIJECTIVE"),
    # a reader's freed page handed out as a hole
    (_obs({}, {"state": (0, 2), "full": (20, 20)}, {"state": (0, 1)}), {},
     [HeldPage("u", Mode.READ, "state", 1, None)], "INV-LEDGER-SAFETY"),
    # a page moved under a writer
    (_obs({0: ("state", 0)}, {"state": (0, 2), "full": (20, 20)}, withheld={"state": (1,)}), {0: "state"},
     [HeldPage("w", Mode.WRITE, "state", 1, ("state", 0))], "INV-LEDGER-SAFETY"),
    # withheld with no user
    (_obs({}, {"state": (0, 1), "full": (20, 20)}, withheld={"state": (0,)}), {}, [], "INV-LEDGER-SAFETY"),
])
def test_observation_predicates_detect(obs: Observation, live: dict, holds: list, inv: str) -> None:
    with pytest.raises(InvariantViolation) as info:
        check_observation(obs, _geo(), live, holds)
    assert info.value.inv == inv, str(info.value)


def test_observation_predicates_accept_the_reference() -> None:
    c = start(renumbered, "toy-tri", 3104, 4, level="decisions")
    c.run("admit", owner="r", demand={"state": 1, "window": 2, "full": 2}, shared=[])
    c.run("acquire", user="u", kind="net_send", pages=[1])
    c.run("free", owner="r")
    assert c._obs is not None and c._obs.withheld["window"], "the reader's page should be withheld"
