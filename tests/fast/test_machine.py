"""The conformance state machine over the reference: every invariant after every step."""

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena.conformance.machine.arena import ArenaMachine, machine_for
from kvarena.reference.split import SplitPools


def test_reference_machine() -> None:
    """INV-NO-OVERLAP, INV-BAND-ORDER, INV-LEDGER-SAFETY, INV-PAGE-ATOMIC, INV-VMAP-BIJECTIVE,
    INV-BYTE-CONSERVATION, INV-FEASIBILITY-FLOOR hold after every step, and data reads back."""
    run_state_machine_as_test(ArenaMachine, settings=settings())


def test_split_baseline_machine() -> None:
    """The split-pool baseline keeps the same invariants (it never moves)."""
    run_state_machine_as_test(machine_for(SplitPools, "SplitMachine"), settings=settings())
