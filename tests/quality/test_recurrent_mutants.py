"""Planted bugs in the recurrent-state rules and the argument checks of issue 12 (§3, §1): each is killed by the
conformance machine within the ci profile (its rules copy_state / state_refusals / non_int_vid / acquire_nothing,
the INV-STATE-PRIVATE predicate and the data read-back), and the unmutated arena passes the same machine
(tests/fast/test_machine.py)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import kvarena.reference.arena as arena_mod
import kvarena.spec.guards as guards_mod
from kvarena.conformance.machine.arena import machine_for
from kvarena.spec.errors import ArenaError
from tests.quality.mutants import Mutant, applied, mutate
from tests.quality.test_mutants import KILL_EXAMPLES, KILL_PHASES

RECURRENT_MUTANTS: tuple[Mutant, ...] = (
    Mutant("recurrent-share-accepted", guards_mod,
           '    check_not_state(got, v.class_of, s.is_state, f"share({owner!r})")  # type: ignore[arg-type]\n', "",
           ("ERROR-CONTRACT", "INV-STATE-PRIVATE", "INV-REFUSAL-IS-NOOP"),
           "share lets a second owner hold a request's state"),
    Mutant("recurrent-cap-unchecked", guards_mod,
           "        if have + n > cap:\n"
           "            raise state_slots_error(owner, have + n, cls, cap)",
           "        pass", ("ERROR-CONTRACT", "INV-STATE-PRIVATE", "INV-REFUSAL-IS-NOOP"),
           "admit / extend / copy_state give an owner more than recurrent_slots states"),
    Mutant("copy-state-copies-nothing", arena_mod,
           "        if rows:\n            self.content[self.v2p[vid]] = dict(rows)",
           "        if False:\n            self.content[self.v2p[vid]] = dict(rows)", ("INV-CONTENT-FOLLOWS-VID",),
           "the copy is a fresh (zeroed) page, not the source's state"),
    Mutant("bool-id-accepted", guards_mod, "    got = check_ids(vids, what, is_id)\n",
           "    got = check_ids(vids, what, lambda v: isinstance(v, (int, float)))\n", ("ERROR-CONTRACT",),
           "True / 1.0 are read as page 1 (share, admit(shared=), acquire: every bound-id check)"),
    Mutant("acquire-of-nothing-accepted", guards_mod, "    if not got:\n        raise InvalidArgumentError("
           "f\"acquire({user!r}): no pages;", "    if False:\n        raise InvalidArgumentError("
           "f\"acquire({user!r}): no pages;", ("ERROR-CONTRACT",), "a ledger user that holds nothing"),
    Mutant("relayout-none-plan-with-spans", arena_mod,
           "        if not moves:  # nothing moves: the float keeps its span (a NONE plan carries no spans)\n"
           "            return Plan(Rung.NONE)\n"
           "        plan = self._plan(Rung.RELAYOUT, [], Placement(), moves, spans)",
           "        plan = self._plan(Rung.RELAYOUT if moves else Rung.NONE, [], Placement(), moves, spans)",
           ("ERROR-CONTRACT",), "the old relayout: a NONE plan carrying the float's spans (the validator refuses it)"),
)


@pytest.mark.parametrize("mutant", RECURRENT_MUTANTS, ids=[m.name for m in RECURRENT_MUTANTS])
def test_snippet_still_present(mutant: Mutant) -> None:
    mutate(mutant)


@pytest.mark.quality
@pytest.mark.parametrize("mutant", RECURRENT_MUTANTS, ids=[m.name for m in RECURRENT_MUTANTS])
def test_machine_kills_recurrent_mutant(mutant: Mutant) -> None:
    with applied(mutant) as factory:
        machine = machine_for(factory, "Mutant_" + mutant.name.replace("-", "_"))
        with pytest.raises(Exception) as info:
            run_state_machine_as_test(machine, settings=settings(settings.get_profile("ci"), phases=KILL_PHASES,
                                                                    max_examples=KILL_EXAMPLES))
    err = info.value
    # a check failed (AssertionError, InvariantViolation) or a typed refusal of the wrong class escaped a rule that
    # expects another (the error contract broken), never a crash of the harness
    assert isinstance(err, (AssertionError, ArenaError)), f"{mutant.name} crashed instead of failing a check: {err!r}"
    inv = getattr(err, "inv", None)
    if inv is not None and not isinstance(err, ArenaError):
        assert inv in mutant.violates, f"{mutant.name} was caught by {inv}, expected one of {mutant.violates}"
