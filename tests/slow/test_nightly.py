"""Nightly exploration (`make slow`): random seeds, longer runs, the example database.

Not part of CI (`-m "not slow"`); CI's derandomized runs live in tests/fast and tests/quality.
"""

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena.conformance.machine.arena import ArenaMachine, machine_for
from kvarena.reference.split import SplitPools
from kvarena.spec.errors import PlanError
from tests.quality.mutants import MUTANTS, applied


@pytest.mark.slow
def test_reference_machine_nightly() -> None:
    run_state_machine_as_test(ArenaMachine, settings=settings())


@pytest.mark.slow
def test_split_machine_nightly() -> None:
    run_state_machine_as_test(machine_for(SplitPools, "SplitMachine"), settings=settings())


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
@pytest.mark.parametrize("attempt", range(3))
def test_mutant_killed_on_random_seeds(mutant, attempt: int) -> None:
    """The kill must not depend on the ci profile's one fixed seed."""
    with applied(mutant) as factory:
        machine = machine_for(factory, f"Nightly_{attempt}")
        with pytest.raises((AssertionError, PlanError)):  # an invariant, or the plan validator
            run_state_machine_as_test(machine, settings=settings(
                settings(), derandomize=False, database=None, max_examples=1000,
                phases=[Phase.generate]))
