"""Planted bugs: each is one textual change to the reference that a check must catch.

A mutant names its module, the exact original snippet (which must occur once, so a
refactor that removes it fails loudly instead of silently retiring the mutant), the
replacement, and the invariant IDs it is meant to violate.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import kvarena.reference.arena as arena_mod
import kvarena.reference.ladder as ladder_mod
import kvarena.reference.validate as validate_mod
import kvarena.spec.guards as guards_mod


@dataclass(frozen=True)
class Mutant:
    name: str
    module: types.ModuleType
    original: str
    replacement: str
    violates: tuple[str, ...]  # invariant IDs (or "ERROR-CONTRACT" for a missing typed error)
    why: str
    also: tuple[tuple[str, str], ...] = ()  # further (original, replacement) edits of the same bug


MUTANTS: tuple[Mutant, ...] = (
    Mutant("overlap-off-by-one-frontier", ladder_mod,
           "fit = min(pages, (gap.top - gap.bot) // v.page_bytes)\n        start = gap.top // v.page_bytes",
           "fit = min(pages, (gap.top - gap.bot) // v.page_bytes + 1)\n        start = gap.top // v.page_bytes",
           ("INV-NO-OVERLAP", "INV-BAND-ORDER", "INV-FEASIBILITY-FLOOR"),
           "the high band may grow one page past the gap into its neighbour (and the constructor's floor check, "
           "which places with the same ladder, accepts an arena the true floor refuses)"),
    Mutant("band-crossing-float-at-hint", ladder_mod,
           "s = clamp(hints.get(v.name, 0) // p, s_min, s_max)",
           "s = hints.get(v.name, 0) // p",
           ("INV-NO-OVERLAP", "INV-BAND-ORDER"),
           "an empty float starts at its ratio hint even where a neighbour already is"),
    Mutant("reuse-withheld-page", arena_mod,
           "        if self._in_use((band.name, slot)):\n            band.withheld.add(slot)",
           "        if False:\n            band.withheld.add(slot)",
           ("INV-LEDGER-SAFETY",),
           "a freed page still used by a forward pass or copy becomes a reusable hole"),
    Mutant("move-page-with-writer", arena_mod,
           "pinned = [s for (c, s) in self.writers if c == band.name] + list(band.withheld)",
           "pinned = list(band.withheld)",
           ("INV-LEDGER-SAFETY",),
           "compaction moves a page a forward pass or host load is writing"),
    Mutant("partial-layer-move", arena_mod,
           "data = self.content.pop((m.cls, m.src), None)",
           "whole = self.content.get((m.cls, m.src))\n"
           "        data = dict(list(whole.items())[:1]) if whole else None",
           ("INV-PAGE-ATOMIC",),
           "a move copies only the first written row; the other layers stay at the old slot"),
    Mutant("hand-out-keeps-freed-content", arena_mod,
           "        self.content.pop((cls, slot), None)",
           "        pass",
           ("INV-CONTENT-FOLLOWS-VID", "INV-PAGE-ATOMIC"),
           "a free leaves the page's rows in place: the next page handed out on that slot reads them, not 0"),
    Mutant("stale-v2p-after-move", arena_mod,
           "self.v2p[vid] = (m.cls, m.dst)",
           "pass",
           ("INV-VMAP-BIJECTIVE",),
           "a move does not remap the virtual page, readers follow a stale address"),
    Mutant("double-free-accepted", guards_mod,
           "    if missing:\n        raise DoubleFreeError",
           "    if False:\n        raise DoubleFreeError",
           ("ERROR-CONTRACT", "INV-VMAP-BIJECTIVE", "INV-REFUSAL-IS-NOOP"),
           "drop's guard (spec/guards.py guard_drop) lets a page the owner does not hold through: the drop then "
           "unbinds another owner's page or fails untyped"),
    Mutant("withheld-freed-by-first-release", arena_mod,
           "            if h.slot in band.withheld and not self._in_use(page):",
           "            if h.slot in band.withheld:",
           ("INV-LEDGER-SAFETY",),
           "the first of two users to release turns a withheld slot into a hole the second still reads"),
    Mutant("relayout-ignores-users", arena_mod,
           "obstacles = sorted(band.withheld | self._used_live(band))",
           "obstacles = sorted(band.withheld)",
           ("INV-LEDGER-SAFETY", "INV-NO-OVERLAP", "INV-BAND-ORDER"),
           "relayout moves float pages that a ledger user holds (a reader's withheld slot ends up outside "
           "the float's span)"),
    Mutant("below-accepts-bool", guards_mod,
           "        if not is_byte(b) or not 0 <= b <= capacity:",
           "        if not isinstance(b, int) or not 0 <= b <= capacity:",
           ("ERROR-CONTRACT",),
           "a placement limit of True / False is taken as byte 1 / 0 instead of refused (bool is an int in Python)"),
)


# Bugs only a chain with two non-empty float bands exposes: with one float (or none) the mutated code computes the
# same thing. Killed by `kvarena explore` on toy-two-float and proven harmless on toy-tri's chain
# (tests/fast/test_explore.py); refuted for chains of any length by proofs/chain.py (CHAIN-MUTANT-LOW-GAP).
CHAIN_MUTANTS: tuple[Mutant, ...] = (
    Mutant("float-grows-down-into-the-low-gap", ladder_mod,
           "        up, down = above[v.name], below[v.name]",
           "        up, down = above[v.name], above[low.name]",
           ("INV-BAND-ORDER", "INV-NO-OVERLAP"),
           "a non-empty float grows down into the gap above the low end band, not the gap below itself: the same gap "
           "while it is the only present float, the gap below the other float when two are present"),
)


# Bugs in the order of an operation's checks and writes: a refusal that changes the state. Only a refusal
# catches them (the machine's INV-REFUSAL-IS-NOOP probes, which also plant a policy whose plans are refused),
# so they are not run through the lockstep and the vectors, which drive the default policy's successes.
REFUSAL_MUTANTS: tuple[Mutant, ...] = (
    Mutant("free-time-plan-not-undone", arena_mod,
           "                self._rollback(undo)\n                raise",
           "                raise",
           ("INV-REFUSAL-IS-NOOP",),
           "a refused free-time plan raises PlanError with the free already applied (the page is gone)"),
    Mutant("free-time-plan-unvalidated", arena_mod,
           "                    validate_plan(self, after, {})  # a free-time plan places nothing",
           "                    pass",
           ("INV-REFUSAL-IS-NOOP",),
           "the policy's free-time plan is applied without the validator"),
    Mutant("share-registers-before-checking", arena_mod,
           "        vids = guard_share(self.shape, self, owner, vids)\n",
           "        self.owners.setdefault(owner, {c: {} for c in self.order})\n"
           "        vids = guard_share(self.shape, self, owner, vids)\n",
           ("INV-REFUSAL-IS-NOOP",),
           "share creates the new owner, then refuses an unbound id: an empty owner is left behind"),
)


# Bugs in the byte accounting a scheduler reads: the bands stay sound, so only INV-BYTE-CONSERVATION sees them
# (and neither the lockstep nor the vectors, which compare placements).
ACCOUNTING_MUTANTS: tuple[Mutant, ...] = (
    Mutant("used-bytes-ignores-withheld", arena_mod,
           "return sum((len(b.live) + len(b.withheld)) * b.page_bytes for b in self.bands.values())",
           "return sum(len(b.live) * b.page_bytes for b in self.bands.values())",
           ("INV-BYTE-CONSERVATION",),
           "used_bytes counts live pages only: bytes a transfer still holds look free to the scheduler"),
    Mutant("gap-bytes-skips-float", arena_mod,
           "present = [b for b in self._chain() if b.role is not Role.FLOAT or not b.empty]",
           "present = [b for b in self._chain() if b.role is not Role.FLOAT]",
           ("INV-BYTE-CONSERVATION",),
           "gap_bytes measures from the low end to the high end, counting a float's pages as gap"),
)


# A read that does not report the zeroed page: the state is sound, so only INV-CONTENT-FOLLOWS-VID sees it (its
# predicate reads every page's corner rows; the conductor reads every unwritten row and compares reads exactly).
CONTENT_MUTANTS: tuple[Mutant, ...] = (
    Mutant("unwritten-row-reads-none", arena_mod,
           "return self.content.get(page, {}).get((entry, row), 0)",
           "return self.content.get(page, {}).get((entry, row))",
           ("INV-CONTENT-FOLLOWS-VID",),
           "an unwritten row reads None (the pre-issue-12 contract for token pages) instead of the zeroed page's 0"),
)


# Bugs in the plan validator's PLAN-SHAPE stage: the policies the machine drives return well-formed plans, so only
# the malformed plans of tests/fast/test_validate.py (``shape_checks``) reach it; tests/quality/test_mutants.py
# runs those with the mutated validator in place of the real one.
SHAPE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("shape-check-dropped", validate_mod,
           "    _check_shape(plan)  # first: every rule below reads these fields",
           "    pass",
           ("INV-REFUSAL-IS-NOOP", "ERROR-CONTRACT"),
           "a malformed plan reaches the rules and _apply: an untyped crash, or a rung 7 applied up to its stats "
           "(a bound page no owner holds), or a rung \"1\" accepted"),
    Mutant("rung-check-accepts-plain-ints", validate_mod,
           "    if not isinstance(plan.rung, Rung):",
           "    if not isinstance(plan.rung, int):",
           ("INV-REFUSAL-IS-NOOP", "ERROR-CONTRACT"),
           "Rung is an int Enum: a plain int (7, or 1 standing for REUSE) or a bool passes as a rung"),
)


def mutate(m: Mutant) -> types.ModuleType:
    """A fresh copy of the mutant's module with the one change applied."""
    source = inspect.getsource(m.module)
    for original, replacement in ((m.original, m.replacement), *m.also):
        count = source.count(original)
        if count != 1:
            raise AssertionError(f"mutant {m.name}: snippet {original.strip()!r} occurs {count} times in "
                                 f"{m.module.__name__}; update tests/quality/mutants.py to the new code")
        source = source.replace(original, replacement)
    mod = types.ModuleType(m.module.__name__ + "_mutant_" + m.name.replace("-", "_"))
    mod.__file__ = m.module.__file__
    sys.modules[mod.__name__] = mod  # dataclasses resolve string annotations through sys.modules
    exec(compile(source, mod.__file__ or "<mutant>", "exec"), mod.__dict__)
    return mod


def imported(home: types.ModuleType, mod: types.ModuleType) -> list[str]:
    """The names the arena module imported from ``home`` (the ladder, the guards) that ``mod``, a mutated copy of
    ``home``, defines again: rebinding these plants the mutant in the arena."""
    return [n for n, obj in vars(arena_mod).items()
            if not n.startswith("__") and n in vars(home) and vars(home)[n] is obj and n in vars(mod)]


@contextlib.contextmanager
def applied(m: Mutant) -> Iterator[Callable]:
    """Yield an arena constructor with the mutant in place (ladder and guard mutants patch the arena's imports)."""
    mod = mutate(m)
    if m.module is arena_mod:
        yield mod.Arena
        return
    patches = [mock.patch.object(arena_mod, name, getattr(mod, name)) for name in imported(m.module, mod)]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield arena_mod.Arena


def isolated(m: Mutant, validator: bool = False) -> Callable:
    """An arena constructor with the mutant in a private copy of the arena module, so the real reference
    (the other side of a lockstep comparison) stays correct; ladder mutants get a copy of the arena module
    bound to the mutated ladder.  With ``validator=False`` the copy's plan validator (if any) is switched
    off, so a harness's own checks must catch the bug."""
    mod = mutate(m)
    if m.module is not arena_mod:
        copy = types.ModuleType(f"{arena_mod.__name__}_for_{m.name.replace('-', '_')}")
        copy.__file__ = arena_mod.__file__
        sys.modules[copy.__name__] = copy  # dataclasses resolve string annotations through sys.modules
        exec(compile(inspect.getsource(arena_mod), arena_mod.__file__ or "<arena>", "exec"), copy.__dict__)
        for name in imported(m.module, mod):
            setattr(copy, name, getattr(mod, name))
        mod = copy
    if not validator and hasattr(mod, "validate_plan"):
        mod.validate_plan = lambda *a, **k: None
    return mod.Arena
