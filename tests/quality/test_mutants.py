"""Every planted bug is killed by the conformance machine within the ci profile.

The kill runs always use the ``ci`` profile (derandomized), whatever HYPOTHESIS_PROFILE says,
so a kill is reproducible; the nightly run measures kill rates on random seeds instead.
Each mutant is run twice: with the arena's plan validator (a bad plan is refused with a
``PlanError`` naming the invariant it protects) and with the validator switched off, where
the invariant predicates and the data read-back must catch the bug on their own.
"""

import sys
from unittest import mock

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import kvarena.reference.arena as arena_mod
from kvarena.conformance.machine.arena import machine_for
from kvarena.reference import invariants
from kvarena.reference.invariants import INVARIANTS
from kvarena.spec.errors import PlanError
from tests.quality.mutants import (
    ACCOUNTING_MUTANTS,
    CONTENT_MUTANTS,
    MUTANTS,
    REFUSAL_MUTANTS,
    SHAPE_MUTANTS,
    applied,
    mutate,
)

# Shrinking is for humans reading a report; a kill only needs the first failure.
KILL_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
# The ci profile's derandomized settings, with room for up to 1,000 examples: a kill stops at the first
# failure, so this costs nothing for killed mutants. Observed: which derandomized examples run first varies
# with the process's import history (a relayout-ignores-users kill at 200 examples came and went with the
# modules imported before it), so the budget leaves margin rather than depending on one ordering.
KILL_EXAMPLES = 1000


def _run_killed(mutant, factory) -> BaseException:
    machine = machine_for(factory, "Mutant_" + mutant.name.replace("-", "_"))
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=settings(settings.get_profile("ci"), phases=KILL_PHASES,
                                                                max_examples=KILL_EXAMPLES))
    return info.value


@pytest.mark.quality
@pytest.mark.parametrize("validator", ["on", "off"])
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_machine_kills_mutant(mutant, validator: str) -> None:
    with applied(mutant) as factory:
        home = sys.modules[factory.__module__]  # the mutant's own copy of the arena module, or the real one
        check = home.validate_plan if validator == "on" else (lambda *a: None)
        with mock.patch.object(home, "validate_plan", check), \
                mock.patch.object(invariants, "PLAN_PROBES", validator == "on"):
            err = _run_killed(mutant, factory)
    # The kill must come from a check, not from the mutant crashing the harness itself.
    assert isinstance(err, (AssertionError, PlanError)), f"{mutant.name} crashed instead of failing a check: {err!r}"
    inv = getattr(err, "inv", None)
    if inv is not None:
        assert inv in mutant.violates, f"{mutant.name} was caught by {inv}, expected one of {mutant.violates}"


ALONE = REFUSAL_MUTANTS + ACCOUNTING_MUTANTS + CONTENT_MUTANTS
EVERY = MUTANTS + ALONE + SHAPE_MUTANTS


@pytest.mark.quality
@pytest.mark.parametrize("mutant", ALONE, ids=[m.name for m in ALONE])
def test_machine_kills_refusal_mutant(mutant) -> None:
    """Bugs only one predicate sees: a refusal that changes the state (INV-REFUSAL-IS-NOOP, with the validator on:
    it is part of the refusal), an accounting query that disagrees with sound bands (INV-BYTE-CONSERVATION) and a
    read that does not report the zeroed page (INV-CONTENT-FOLLOWS-VID).
    The unmutated arena passes the same machine (tests/fast/test_machine.py)."""
    with applied(mutant) as factory:
        err = _run_killed(mutant, factory)
    assert isinstance(err, AssertionError), f"{mutant.name} crashed instead of failing a check: {err!r}"
    assert getattr(err, "inv", None) == mutant.violates[0], f"{mutant.name} was caught by {err!r}"


# the cases of tests/fast/test_validate.py that each shape mutant must fail (more may fail too)
SHAPE_KILLS = {
    "shape-check-dropped": {"validate-plan-none", "validate-rung-str", "validate-span-float", "admit-rung-7",
                            "admit-span-float", "admit-plan-dict", "free-returns-int", "free-move-tuple"},
    "rung-check-accepts-plain-ints": {"validate-rung-int", "validate-rung-7", "validate-rung-bool", "admit-rung-7",
                                      "admit-rung-int", "free-rung-7"},
}


@pytest.mark.quality
@pytest.mark.parametrize("mutant", SHAPE_MUTANTS, ids=[m.name for m in SHAPE_MUTANTS])
def test_shape_tests_kill_mutant(mutant) -> None:
    """The PLAN-SHAPE cases (tests/fast/test_validate.py ``shape_checks``), run with the mutated validator in place
    of the real one, in the validator calls and in the arena's: the cases named in SHAPE_KILLS fail. The cases a
    mutant leaves alone pass, so a failure is the mutant's, not a broken case."""
    import tests.fast.test_validate as tv

    mod = mutate(mutant)
    failed = set()
    with mock.patch.object(tv, "validate_plan", mod.validate_plan), \
            mock.patch.object(arena_mod, "validate_plan", mod.validate_plan):
        for name, check in tv.shape_checks():
            try:
                check()
            except (Exception, pytest.fail.Exception):  # a failed assertion, pytest.raises or a crash
                failed.add(name)
    missed = SHAPE_KILLS[mutant.name] - failed
    assert not missed, f"{mutant.name} survives {sorted(missed)} (failed: {sorted(failed)})"
    if mutant.name == "rung-check-accepts-plain-ints":  # the rest of the stage still works
        assert {"validate-rung-str", "validate-plan-none", "admit-span-float"}.isdisjoint(failed), sorted(failed)


def test_mutants_cover_required_bugs() -> None:
    required = {"overlap", "band-crossing", "reuse-withheld", "move-page-with-writer", "partial-layer",
                "stale-v2p", "double-free"}
    names = " ".join(m.name for m in MUTANTS)
    assert all(r in names for r in required), sorted(r for r in required if r not in names)
    for m in EVERY:
        assert set(m.violates) <= set(INVARIANTS) | {"ERROR-CONTRACT"}, m.name


@pytest.mark.parametrize("mutant", EVERY, ids=[m.name for m in EVERY])
def test_mutant_snippet_still_present(mutant) -> None:
    """A refactor that removes a mutant's snippet must update the mutant, not retire it silently."""
    mutate(mutant)
