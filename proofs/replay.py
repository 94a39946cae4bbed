"""Counterexample -> concrete reference state -> the same step in the reference -> the same verdict.

A witness of the harness is a Z3 model of a pre-state (in the finite witness instance) and of a step's
arguments. ``arena_of`` rebuilds it as a reference ``Arena`` of the toy-tri configuration by setting its fields
(bands, v2p, serials, free ids, owners and reference counts, users and their counts, content), and checks that
the reference's predicates accept it: the model's invariant and ``reference/invariants.py`` agree on the
pre-state. Then the step runs in the reference:

* through the operation itself where the model's step is one (``slide``, ``free``, ``share``, ``acquire``,
  ``release``, ``write``, ``compact(max_moves=1)``, and ``admit`` / ``extend`` with the model's placement as
  the plan, ``Arena._retarget_float`` for the parts of rung 3, ``Band.absorb_boundary_holes``);
* for a mutant, with the same bug planted: a one-snippet edit of ``reference/arena.py`` or
  ``reference/bands.py`` (``EDITS``, the same edits as tests/quality/mutants.py where one exists), or, for a
  planner's bad choice, the model's arguments themselves (the reference applies any plan it is given), or
  a mirrored effect where no code path can express the bug (``share-unbound``, ``acquire-hole``).

A valid step must leave every predicate passing; a mutant step must make ``INVARIANTS[ID]`` raise
``InvariantViolation`` with that ID. Anything else raises ``ReplayMismatch``: the model and the reference
disagree, which is a failure of the proof run.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections import Counter
from collections.abc import Iterator
from functools import cache
from unittest import mock

import z3
from sortedcontainers import SortedList

import kvarena.reference.arena as arena_mod
import kvarena.reference.bands as bands_mod
import kvarena.spec.guards as guards_mod
from kvarena.proofs import model as M
from kvarena.proofs import transitions as T
from kvarena.proofs.witness import NOT_MODELLED, WITNESS_CONFIG, WITNESS_DOMAIN, Witness
from kvarena.reference.arena import Arena, Hold, User
from kvarena.reference.invariants import INVARIANTS, check_all
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Move, Plan, Rung, UserKind


class ReplayMismatch(AssertionError):
    """The symbolic model and the reference disagree about a witness."""


# One-snippet edits of the reference that plant a mutant's bug (module, original, replacement).
EDITS: dict[str, tuple[str, str, str]] = {
    "vacate-ignores-users": ("arena",
                             "        if self._in_use((band.name, slot)):\n            band.withheld.add(slot)",
                             "        if False:\n            band.withheld.add(slot)"),
    "free-while-shared": ("arena", "            if self.refs[v] == 0:\n                del self.refs[v]",
                          "            if True:\n                del self.refs[v]"),
    "free-keeps-rows": ("arena", "        self.content.pop((cls, slot), None)\n", ""),
    "free-loses-slot": ("arena", "        self._vacate(band, slot)", "        pass"),
    "free-leaks": ("arena", "        return self._unref(owner, vids, forget=True)",
                   "        del self.owners[owner]\n        return []"),
    "release-keeps-withheld": ("arena", "            if h.slot in band.withheld and not self._in_use(page):",
                               "            if False:"),
    "release-loses-slot": ("arena",
                           "                band.withheld.discard(h.slot)\n                band.holes.add(h.slot)",
                           "                band.withheld.discard(h.slot)"),
    "write-unchecked-row": ("guards", " and 0 <= entry < n_e and 0 <= row < n_r):  # type: ignore[operator]",
                            "):  # type: ignore[operator]"),
    "stale-v2p": ("arena", "self.v2p[vid] = (m.cls, m.dst)", "pass"),
    "partial-layer-move": ("arena", "data = self.content.pop((m.cls, m.src), None)",
                           "whole = self.content.get((m.cls, m.src))\n"
                           "        data = dict(list(whole.items())[:1]) if whole else None"),
    "move-to-gap": ("arena", "        band.holes.remove(m.dst)", "        band.holes.discard(m.dst)"),
    "move-onto-withheld": ("arena", "        band.holes.remove(m.dst)", "        band.holes.discard(m.dst)"),
    "move-page-with-writer": ("arena",
                              "pinned = [s for (c, s) in self.writers if c == band.name] + list(band.withheld)",
                              "pinned = list(band.withheld)"),
    "compact-loses-source": ("arena", "        else:\n            band.holes.add(slot)",
                             "        else:\n            pass"),
    "relayout-loses-source": ("arena", "        else:\n            band.holes.add(slot)",
                              "        else:\n            pass"),
    "leak": ("arena", "        pages = self._apply(plan)\n        for c, vs in pages.items():",
             "        pages = self._apply(plan)\n        for c, vs in ():"),
    "reuse-withheld": ("arena", "            if band.lo <= slot < band.hi:\n                holes.remove(slot)",
                       "            if band.lo <= slot < band.hi:\n                holes.discard(slot)\n"
                       "                band.withheld.discard(slot)"),
    "keep-hole": ("arena", "            if band.lo <= slot < band.hi:\n                holes.remove(slot)",
                  "            if band.lo <= slot < band.hi:\n                pass"),
    "absorb-withheld": ("bands", "            k = self.hole_run(self.hi - 1, -1)  # holes lie in the span, "
                                 "so these are the k largest\n",
                        "            while self.hi > self.lo and (self.hi - 1) in self.withheld:\n"
                        "                self.hi -= 1\n"
                        "                n += 1\n"
                        "            k = self.hole_run(self.hi - 1, -1)\n"),
    "absorb-low-bottom": ("bands", "        if self.role is not Role.LOW and self.lo < self.hi:\n"
                                   "            k = self.hole_run(self.lo, 1)",
                          "        if self.lo < self.hi:\n            k = self.hole_run(self.lo, 1)"),

    # the guards are spec/guards.py's, one sequence for every implementation: their edits are planted there and the
    # edited functions rebound in the arena module for the step
    "share-state": ("guards", "    check_not_state(got, v.class_of, s.is_state, f\"share({owner!r})\")"
                              "  # type: ignore[arg-type]\n", ""),
    "over-slots": ("guards", "    d = check_demand(s, demand, is_id)\n"
                             "    check_state_slots(owner, held, d, s.is_state, s.recurrent_slots)\n",
                   "    d = check_demand(s, demand, is_id)\n"),
    "copy-over-slots": ("guards", "    check_state_slots(owner, v.pages_of(owner), {cls: 1}, s.is_state, "
                                  "s.recurrent_slots)\n", ""),
    "copy-off-by-one": ("arena", "            self.content[self.v2p[vid]] = dict(rows)",
                        "            self.content[(cls, self.v2p[vid][1] + 1)] = dict(rows)"),
}
# Planner bugs: the bad choice is in the witness's arguments; the reference applies the plan it is given.
PLANNER: dict[str, str] = {
    "cross-band": "the plan's frontier slot reaches past the gap (Arena._apply trusts the plan)",
    "grow-crosses": "the float's target span reaches past the gap (_retarget_float trusts the plan)",
    "trim-drops-withheld": "the target span leaves a withheld slot outside (_retarget_float trusts the plan)",
    "relayout-ignores-users": "the plan moves a float page with a user (_retarget_float trusts the plan)",
    "move-written-page": "the plan moves a page with a writer (Arena._apply trusts the plan)",
    "reuse-bound-id": "the free-id heap hands out an id that is still bound",
}
MIRRORED: dict[str, str] = {
    "share-unbound": "the owner records an unbound id (share's validation skipped)",
    "acquire-hole": "the user holds a slot that is not live (acquire's validation skipped)",
    "init-skips-floor": "Arena construction with _check_floor skipped",
    "init-high-unanchored": "the high band constructed at slot 0",
}
_MODULES = {"arena": arena_mod, "bands": bands_mod, "guards": guards_mod}


@cache
def mutated(name: str) -> types.ModuleType:
    """A fresh copy of the module the mutant edits, with the one edit applied."""
    which, original, replacement = EDITS[name]
    mod = _MODULES[which]
    source = inspect.getsource(mod)
    if source.count(original) != 1:
        raise ReplayMismatch(f"mutant {name}: its snippet occurs {source.count(original)} times in {mod.__name__}; "
                             "update proofs/replay.py EDITS to the new code")
    out = types.ModuleType(f"{mod.__name__}_proof_mutant_{name.replace('-', '_')}")
    out.__file__ = mod.__file__
    sys.modules[out.__name__] = out
    exec(compile(source.replace(original, replacement), mod.__file__ or "<mutant>", "exec"), out.__dict__)
    return out


def witness_config(capacity: int | None = None) -> ArenaConfig:
    w = WITNESS_CONFIG
    return ArenaConfig(preset(w["model"]), capacity=capacity or w["capacity"], page_size=w["page_size"],
                       max_context_len=w["max_context_len"])


# ---------------------------------------------------------------------------------------------
# Reading the model


class _Reader:
    def __init__(self, w: Witness) -> None:
        self.m = w.model
        self.ints = {i: z3.IntVal(i) for i in range(-1, 64)}

    def _idx(self, xs) -> list:
        return [self.ints[x] if isinstance(x, int) and x in self.ints else x for x in xs]

    def int(self, t) -> int:
        return self.m.eval(t, model_completion=True).as_long()

    def bool(self, t) -> bool:
        return z3.is_true(self.m.eval(t, model_completion=True))

    def at(self, arr, *idx) -> z3.ExprRef:
        return self.m.eval(z3.Select(arr, *self._idx(idx)), model_completion=True)

    def bool_at(self, arr, *idx) -> bool:
        return z3.is_true(self.at(arr, *idx))

    def int_at(self, arr, *idx) -> int:
        return self.at(arr, *idx).as_long()


def arena_of(w: Witness, arena_cls: type[Arena] = Arena) -> Arena:
    """The witness's pre-state as a reference arena (fields set directly), checked by every predicate."""
    a = arena_cls(witness_config())
    _load(a, w)
    try:  # the IDs the model states (NOT_MODELLED's probe would run the mutant's code, not judge the state)
        for inv, check in INVARIANTS.items():
            if inv not in NOT_MODELLED:
                check(a)
    except InvariantViolation as e:
        raise ReplayMismatch(f"the model's valid pre-state fails the reference's {e.inv}: {e}") from e
    return a


def _load(a: Arena, w: Witness) -> None:
    """Set ``a``'s fields to the witness's pre-state. Only slots inside spans, ids below ``next_vid`` and rows of
    the layout are read: the witness satisfies the invariant on the whole domain, so nothing lies elsewhere."""
    r, st, D = _Reader(w), w.pre, WITNESS_DOMAIN
    order = a.order
    spans = {b: range(r.int(st.lo[b]), r.int(st.hi[b])) for b in M.BANDS}
    for b in M.BANDS:
        band = a.bands[order[b]]
        band.lo, band.hi = spans[b].start, spans[b].stop
        band.live = {s: r.int_at(st.p2v, b, s) for s in spans[b] if r.bool_at(st.live, b, s)}
        band.holes = SortedList(s for s in spans[b] if r.bool_at(st.holes, b, s))
        band.withheld = {s for s in spans[b] if r.bool_at(st.withheld, b, s)}
    ids = range(0, r.int(st.next_vid))
    bound = [v for v in ids if r.bool_at(st.bound, v)]
    a.v2p = {v: (order[r.int_at(st.vband, v)], r.int_at(st.vslot, v)) for v in bound}
    a.gen = {v: r.int_at(st.gen, v) for v in bound}
    a._free_vids = sorted(v for v in ids if r.bool_at(st.free, v))  # a sorted list is a heap
    a._next_vid, a._next_gen = r.int(st.next_vid), r.int(st.next_gen)
    a.owners, a.refs = {}, Counter()
    for o in D["owner"]:
        if r.bool_at(st.owner, o):
            held: dict[str, dict[int, None]] = {c: {} for c in order}
            for v in bound:
                if r.bool_at(st.held, o, v):
                    held[a.v2p[v][0]][v] = None
                    a.refs[v] += 1
            a.owners[f"o{o}"] = held
    a.users, a.readers, a.writers = {}, Counter(), Counter()
    for u in D["user"]:
        if r.bool_at(st.user, u):
            kind = UserKind.FORWARD_WRITE if r.bool_at(st.writes, u) else UserKind.FORWARD_READ
            holds = tuple(Hold(order[b], s, r.int_at(st.hold_vid, u, b, s), r.int_at(st.hold_gen, u, b, s))
                          for b in M.BANDS for s in spans[b] if r.bool_at(st.holds, u, b, s))
            a.users[f"u{u}"] = User(kind, holds)
            for h in holds:
                (a.writers if kind.mode.value == "write" else a.readers)[(h.cls, h.slot)] += 1
    a.content = {}
    ne, nr = WITNESS_CONFIG["NE"], WITNESS_CONFIG["NR"]
    for b in M.BANDS:
        for s in a.bands[order[b]].live:
            rows = {(e, x): 1000 + 10 * e + x for e in range(ne[b]) for x in range(nr[b])
                    if r.bool_at(st.content, b, s, e, x)}
            if rows:
                a.content[(order[b], s)] = rows


# ---------------------------------------------------------------------------------------------
# Steps


def _step(a: Arena, w: Witness, mutant: str | None) -> str:
    r, st, step = _Reader(w), w.pre, w.step
    assert step is not None
    arg = {k: (r.int(v) if z3.is_int(v) else r.bool(v) if z3.is_bool(v) else v) for k, v in step.args.items()}
    order, name = a.order, step.transition
    if name in ("admit", "extend"):
        cls, slot = order[arg["b"]], arg["s"]
        if mutant == "reuse-bound-id":
            a._free_vids = [arg["v"]]
        use_plan(a, Plan(Rung.REUSE, placements={cls: (slot,)}))
        out = getattr(a, name)(f"o{arg['o']}", {cls: 1})
        return f"{name}(o{arg['o']}, {{{cls!r}: 1}}) placed {out.pages} at {cls}:{slot} ({step.case})"
    if name == "copy_state":
        cls, slot, owner = order[arg["b"]], arg["s"], f"o{arg['o']}"
        if mutant == "reuse-bound-id":
            a._free_vids = [arg["v"]]
        use_plan(a, Plan(Rung.REUSE, placements={cls: (slot,)}))
        got = a.copy_state(owner, arg["sv"])
        return f"copy_state({owner}, {arg['sv']}) placed {got} at {cls}:{slot} ({step.case})"
    if name == "share":
        if mutant == "share-unbound":
            held = a.owners.setdefault(f"o{arg['o']}", {c: {} for c in order})
            held[order[0]][arg["v"]] = None
            a.refs[arg["v"]] += 1
            return f"o{arg['o']} records unbound page {arg['v']}"
        a.share(f"o{arg['o']}", [arg["v"]])
        return f"share(o{arg['o']}, [{arg['v']}])"
    if name == "slide":
        owner, v = f"o{arg['o']}", arg["v"]
        cls = a.v2p[v][0]
        a.owners[owner][cls] = {v: None, **{x: None for x in a.owners[owner][cls] if x != v}}  # v is the oldest
        freed = a.slide(owner, cls, 1)
        return f"slide({owner}, {cls!r}, 1) freed {freed}"
    if name == "free":
        freed = a.free(f"o{arg['o']}")
        return f"free(o{arg['o']}) freed {freed}"
    if name == "acquire":
        kind = UserKind.FORWARD_WRITE if arg["writes"] else UserKind.FORWARD_READ
        pages = [(b, s) for b in M.BANDS for s in WITNESS_DOMAIN["slot"] if r.bool(arg["pages"][b, s])]
        user = f"u{arg['u']}"
        if mutant == "acquire-hole":
            holds = tuple(Hold(order[b], s, r.int(st.p2v[b, s]), r.int(st.gen[st.p2v[b, s]])) for b, s in pages)
            a.users[user] = User(kind, holds)
            for h in holds:
                (a.writers if arg["writes"] else a.readers)[(h.cls, h.slot)] += 1
            return f"{user} holds {[(order[b], s) for b, s in pages]} (not all live)"
        vids = [a.bands[order[b]].live[s] for b, s in pages]
        a.acquire(user, kind, vids)
        return f"acquire({user}, {kind.value}, {vids})"
    if name == "release":
        a.release(f"u{arg['u']}")
        return f"release(u{arg['u']})"
    if name == "write":
        a.write(arg["v"], arg["e"], arg["r"], 7)
        return f"write({arg['v']}, {arg['e']}, {arg['r']}, 7)"
    mv = Move(order[arg.get("b", M.FLOAT)], arg.get("src", 0), arg.get("dst", 0))
    if name == "move":
        a._apply(Plan(Rung.COMPACT, (mv,)))
        return f"_apply(Plan(COMPACT, ({mv},)))"
    if name == "compact":
        plan = a.compact(max_moves=1)
        if plan.moves != (mv,):
            raise ReplayMismatch(f"compact(max_moves=1) made {plan.moves}, the model's step is {mv}")
        return f"compact(max_moves=1) made {mv}"
    band = a.bands[order[M.FLOAT]]
    if name == "relayout_grow":
        t, t_end = {"float grows up": (band.lo, band.hi + 1), "float grows down": (band.lo - 1, band.hi),
                    "float starts": (arg["s"], arg["s"] + 1)}[step.case]
        a._retarget_float(band, t, t_end, [])
        return f"_retarget_float({band.name}, {t}, {t_end}, [])"
    if name == "relayout_move":
        a._retarget_float(band, band.lo, band.hi, [mv])
        return f"_retarget_float({band.name}, {band.lo}, {band.hi}, [{mv}])"
    if name == "relayout_trim":
        a._retarget_float(band, arg["t"], arg["t_end"], [])
        return f"_retarget_float({band.name}, {arg['t']}, {arg['t_end']}, [])"
    if name == "absorb":
        b = a.bands[order[arg["b"]]]
        n = b.absorb_boundary_holes()
        return f"{b.name}.absorb_boundary_holes() gave {n} slot(s) back"
    raise KeyError(name)


class _FixedPlan:
    """A policy that returns the model's plan (the arena still validates it, except under a mutant)."""

    name = "proof-replay"

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        return self._plan

    def after_free(self, arena: Arena) -> Plan | None:
        return None


def use_plan(a: Arena, plan: Plan) -> None:
    """Make ``a``'s next admit / extend use ``plan``."""
    if hasattr(a, "policy"):
        a.policy = _FixedPlan(plan)
    else:  # pragma: no cover - a reference without policies
        a._plan_admission = lambda d: plan  # type: ignore[method-assign]


@contextlib.contextmanager
def _validator_off(a: Arena) -> Iterator[None]:
    """Mutants run with the arena's plan validator off (as in tests/quality/test_mutants.py): the invariant
    predicates must catch the bug on their own."""
    home = sys.modules[type(a).__module__]
    if hasattr(home, "validate_plan"):
        with mock.patch.object(home, "validate_plan", lambda *args, **kw: None):
            yield
    else:  # pragma: no cover
        yield


def replay_valid(w: Witness) -> str:
    """A non-vacuity witness: valid pre-state, the real step, valid post-state."""
    a = arena_of(w)
    did = _step(a, w, None)
    try:
        check_all(a)
    except InvariantViolation as e:
        raise ReplayMismatch(f"the model's step {did} breaks the reference's {e.inv}: {e}") from e
    return did


def replay_mutant(w: Witness, m: T.Mutant, inv: str) -> str:
    """The mutant's counterexample: valid pre-state, the step with the bug, and ``INVARIANTS[inv]`` fails."""
    if m.transition == "init":
        a = _init_arena(w, m)
    else:
        arena_cls = mutated(m.name).Arena if m.name in EDITS and EDITS[m.name][0] == "arena" else Arena
        a = arena_of(w, arena_cls)
        if m.name in EDITS and EDITS[m.name][0] == "bands":
            band_cls = mutated(m.name).Band
            for b in a.bands.values():
                b.__class__ = band_cls
        with _validator_off(a), _guards_edited(m.name):
            did = _step(a, w, m.name)
    try:
        INVARIANTS[inv](a)
    except InvariantViolation as e:
        if e.inv != inv:
            raise ReplayMismatch(f"{m.name}: the reference reports {e.inv}, not {inv}: {e}") from e
        how = (EDITS.get(m.name) and "edited reference") or PLANNER.get(m.name) or MIRRORED.get(m.name, "")
        return f"{e} [{how}]" if m.transition == "init" else f"{did} -> {e} [{how}]"
    raise ReplayMismatch(f"{m.name}: Z3 found a state where {inv} fails, but the reference's predicate accepts "
                         "the replayed state")


@contextlib.contextmanager
def _guards_edited(name: str) -> Iterator[None]:
    """For an edit of spec/guards.py: the arena module's guard functions rebound to the edited copy's."""
    if name not in EDITS or EDITS[name][0] != "guards":
        yield
        return
    mod = mutated(name)
    with contextlib.ExitStack() as stack:
        for n, obj in vars(arena_mod).items():
            if n.startswith("guard_") and vars(guards_mod).get(n) is obj:
                stack.enter_context(mock.patch.object(arena_mod, n, getattr(mod, n)))
        yield


def _init_arena(w: Witness, m: T.Mutant) -> Arena:
    r = _Reader(w)
    if m.name == "init-skips-floor":
        capacity = r.int(w.config.C)

        class NoFloor(Arena):
            def _check_floor(self) -> None:  # the planted bug
                pass

        try:
            Arena(witness_config(capacity))
        except Exception as e:  # the real constructor must refuse it
            if type(e).__name__ != "CapacityTooSmallError":
                raise
        else:
            raise ReplayMismatch(f"the reference constructs an arena of {capacity} B that the model's floor refuses")
        return NoFloor(witness_config(capacity))
    if m.name == "init-high-unanchored":
        a = Arena(witness_config())
        high = a.bands[a.order[-1]]
        high.lo = high.hi = 0
        return a
    raise KeyError(m.name)
