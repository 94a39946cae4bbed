"""The validator-rule <-> step-guard correspondence is a machine check (proofs/guards.py), and it can fail."""

from __future__ import annotations

import inspect

import pytest

from kvarena.proofs import guards as G
from kvarena.proofs import transitions as T
from kvarena.reference import validate


def test_every_rule_and_every_guard_is_mapped() -> None:
    assert G.problems() == []
    registered, raised = G.validator_rules()
    assert registered == set(validate.RULES) == raised
    assert len(G.RULE_GUARDS) + len(G.NO_GUARD) == len(validate.RULES)


def test_each_mapped_guard_is_a_planted_bug_that_breaks_an_invariant() -> None:
    """A guard is named by the bug that drops it; that bug is in MUTANTS (so Z3 refutes it and the reference
    replays it, tests/fast/test_proofs.py) and names the invariants it breaks."""
    by = {(m.transition, m.name): m for m in T.MUTANTS}
    for rule, gs in G.RULE_GUARDS.items():
        for g in gs:
            assert g in by and by[g].breaks, (rule, g)


def _drop_one(table: dict, key: object) -> dict:
    return {k: v for k, v in table.items() if k != key}


@pytest.mark.parametrize("rule", sorted(G.RULE_GUARDS))
def test_dropping_a_rule_entry_fails_the_check(rule: str) -> None:
    got = G.problems(rule_guards=_drop_one(G.RULE_GUARDS, rule))
    assert any(f"rule {rule} has neither" in p for p in got), got
    assert any("drops a guard no validator rule enforces" in p for p in got), got  # and its guards are orphans


@pytest.mark.parametrize("rule", sorted(G.NO_GUARD))
def test_dropping_a_reason_fails_the_check(rule: str) -> None:
    assert any(f"rule {rule} has neither" in p for p in G.problems(no_guard=_drop_one(G.NO_GUARD, rule)))


@pytest.mark.parametrize("bug", sorted(G.NOT_A_PLAN_RULE))
def test_an_unexplained_guard_bug_fails_the_check(bug: tuple[str, str]) -> None:
    got = G.problems(not_a_rule=_drop_one(G.NOT_A_PLAN_RULE, bug))
    assert any(repr(bug[1]) in p and "no validator rule enforces" in p for p in got), got


def test_a_new_rule_without_a_guard_fails_the_check() -> None:
    src = inspect.getsource(validate).replace('    "PLAN-RUNG": "INV-BAND-ORDER",',
                                              '    "PLAN-RUNG": "INV-BAND-ORDER",\n    "PLAN-NEW": "INV-NO-OVERLAP",')
    src = src.replace('def _absorbed(', 'def _new(a) -> None:\n    _fail("PLAN-NEW", "x")\n\n\ndef _absorbed(')
    got = G.problems(source=src)
    assert got == ["rule PLAN-NEW has neither guards (RULE_GUARDS) nor a reason (NO_GUARD)"], got


def test_a_rule_raised_but_not_registered_fails_the_check() -> None:
    src = inspect.getsource(validate).replace('_fail("PLAN-SPAN",', '_fail("PLAN-SPANS",', 1)
    got = G.problems(source=src)
    assert "validate.py raises PLAN-SPANS, which RULES does not register" in got, got


def test_a_guard_naming_a_missing_bug_fails_the_check() -> None:
    bad = dict(G.RULE_GUARDS, **{"PLAN-MOVE-DEST": (("move", "no-such-bug"),)})
    got = G.problems(rule_guards=bad)
    assert "PLAN-MOVE-DEST: no planted bug 'no-such-bug' of 'move' in transitions.MUTANTS" in got, got


def test_an_unclassified_planted_bug_fails_the_check() -> None:
    """A new planted bug of a plan step must be classified: a guard (mapped or explained) or an effect."""
    got = G.problems(effects=G.EFFECT_BUGS - {("move", "stale-v2p")})
    assert any("'stale-v2p' of 'move' drops a guard" in p for p in got), got
