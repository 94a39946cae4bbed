"""The plan validator's rules and the model's step guards they stand for: a table, checked both ways.

A plan a policy returns is applied by ``Arena._apply`` as moves, float retargets and placements: in the model,
the steps ``move`` / ``compact`` / ``relayout_*`` and the placements of ``admit`` / ``extend`` / ``copy_state``.
The proofs assume each step's guard; what makes the guard true for a policy's plan, which is never trusted, is
``reference/validate.py``. So every validator rule names the guards it enforces (each guard named by the planted
bug of ``transitions.MUTANTS`` that drops it, which Z3 refutes and the reference replays), and every planted bug
of those steps that drops a guard names the rule that enforces it, or says why no validator rule does (the id
pool, the recurrent cap: checked by the arena before planning, never part of a plan). ``problems()`` lists every
rule, guard or bug the table leaves out; tests/fast/test_guards.py fails on any, and on a table with an entry
dropped (the check can fail).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping

from kvarena.proofs import transitions as T

# The model's steps that apply (part of) a plan.
PLAN_STEPS = ("admit", "extend", "copy_state", "move", "compact", "relayout_grow", "relayout_move", "relayout_trim")

# validator rule -> the step guards it enforces, each as (transition, the planted bug that drops that guard)
RULE_GUARDS: dict[str, tuple[tuple[str, str], ...]] = {
    # (relayout_move refuses every user, stronger than the rule: a reader-held float page is the move step's)
    "PLAN-MOVE-WRITER": (("move", "move-written-page"), ("compact", "move-page-with-writer"),
                         ("relayout_move", "relayout-ignores-users")),
    "PLAN-MOVE-DEST": (("move", "move-to-gap"),),
    "PLAN-DEST-USERS": (("move", "move-onto-withheld"),),
    "PLAN-SPAN": (("relayout_trim", "trim-drops-withheld"),),
    "PLAN-PLACE-COUNT": (("extend", "leak"),),  # a placed page no owner records: a class placed beyond demand
    "PLAN-PLACE-FREE": (("admit", "reuse-withheld"), ("extend", "reuse-withheld"), ("copy_state", "reuse-withheld")),
    "PLAN-EXTENT": (("admit", "cross-band"), ("extend", "cross-band"), ("copy_state", "cross-band"),
                    ("relayout_grow", "grow-crosses")),
}

# validator rules that stand for no guard of a model step, and why
NO_GUARD: dict[str, str] = {
    "PLAN-SHAPE": "typing: the model's steps take a rung, classes and int slots by construction, so no step has a "
                  "malformed plan to guard against; the rule turns a plan the reference would crash on half-applied "
                  "(a rung outside Rung, a float slot, a hook's own exception) into a PlanError before anything "
                  "is applied, guarding INV-REFUSAL-IS-NOOP, no state of the model",
    "PLAN-RUNG": "structural: which rung may move what (rung 1 nothing, rung 2 the ends, rung 3 floats with a "
                 "target span) is the ladder's shape, not a safety guard; each move the rule lets through is a "
                 "move, compact or relayout_move step, guarded by the rules above",
    "PLAN-MOVE-SOURCE": "the model's move takes a live source by construction (the page moved is p2v of a live "
                        "slot); the reference cannot apply a move from a slot that is not live at all "
                        "(Band.live.pop raises), so the rule turns a crash into a PlanError, guarding no state",
}

# planted bugs of the plan steps that drop a guard the validator does not enforce, and why
NOT_A_PLAN_RULE: dict[tuple[str, str], str] = {
    ("admit", "reuse-bound-id"): "the virtual id comes from the arena's free-id heap after validation, not from "
                                 "the plan",
    ("copy_state", "reuse-bound-id"): "the virtual id comes from the arena's free-id heap, not from the plan",
    ("extend", "over-slots"): "recurrent_slots is checked by extend before planning (spec/guards.py guard_extend)",
    ("copy_state", "copy-over-slots"): "recurrent_slots is checked by copy_state before planning",
}

# planted bugs of the plan steps that bend an effect (the step's code), not a guard: no rule can stand for them
EFFECT_BUGS: frozenset[tuple[str, str]] = frozenset({
    ("admit", "keep-hole"), ("copy_state", "keep-hole"), ("copy_state", "copy-off-by-one"),
    ("move", "stale-v2p"), ("move", "partial-layer-move"),
    ("compact", "stale-v2p"), ("compact", "partial-layer-move"), ("compact", "compact-loses-source"),
    ("relayout_move", "stale-v2p"), ("relayout_move", "partial-layer-move"),
    ("relayout_move", "relayout-loses-source"),
})


def validator_rules(source: str | None = None) -> tuple[set[str], set[str]]:
    """(the rules ``validate.RULES`` registers, the rules its ``_fail`` calls name), from the module's source."""
    from kvarena.reference import validate

    tree = ast.parse(source if source is not None else inspect.getsource(validate))
    registered: set[str] = set()
    raised: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "RULES" and isinstance(node.value, ast.Dict):
                registered |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_fail" \
                and node.args and isinstance(node.args[0], ast.Constant):
            raised.add(node.args[0].value)
    return registered, raised


def problems(rule_guards: Mapping[str, tuple[tuple[str, str], ...]] = RULE_GUARDS,
             no_guard: Mapping[str, str] = NO_GUARD, not_a_rule: Mapping[tuple[str, str], str] = NOT_A_PLAN_RULE,
             effects: frozenset[tuple[str, str]] = EFFECT_BUGS, source: str | None = None) -> list[str]:
    """Everything the table leaves out or gets wrong; empty when the correspondence is complete."""
    out: list[str] = []
    registered, raised = validator_rules(source)
    out += [f"validate.py raises {r}, which RULES does not register" for r in sorted(raised - registered)]
    out += [f"RULES registers {r}, which no _fail raises" for r in sorted(registered - raised)]
    mapped = set(rule_guards) | set(no_guard)
    out += [f"rule {r} has neither guards (RULE_GUARDS) nor a reason (NO_GUARD)" for r in sorted(registered - mapped)]
    out += [f"RULE_GUARDS / NO_GUARD name {r}, which is not a validator rule" for r in sorted(mapped - registered)]
    out += [f"rule {r} is in both RULE_GUARDS and NO_GUARD" for r in sorted(set(rule_guards) & set(no_guard))]
    bugs = {(m.transition, m.name) for m in T.MUTANTS if m.transition in PLAN_STEPS}
    guarded = {g for gs in rule_guards.values() for g in gs}
    for rule, gs in rule_guards.items():
        if not gs:
            out.append(f"rule {rule} maps to no guard; give one or move it to NO_GUARD with a reason")
        out += [f"{rule}: no planted bug {name!r} of {tr!r} in transitions.MUTANTS" for tr, name in gs
                if (tr, name) not in bugs]
        out += [f"{rule}: {tr!r} is not a plan step {PLAN_STEPS}" for tr, _ in gs if tr not in PLAN_STEPS]
    guards = bugs - set(effects)
    out += [f"planted bug {n!r} of {t!r} drops a guard no validator rule enforces: map it in RULE_GUARDS or say "
            "why in NOT_A_PLAN_RULE" for t, n in sorted(guards - guarded - set(not_a_rule))]
    out += [f"EFFECT_BUGS lists {x}, which is not a planted bug of a plan step" for x in sorted(set(effects) - bugs)]
    out += [f"NOT_A_PLAN_RULE lists {x}, which is not a planted bug of a plan step" for x in sorted(set(not_a_rule)
                                                                                                   - bugs)]
    out += [f"{x} is both a guard a rule enforces and an effect" for x in sorted(guarded & set(effects))]
    return out
