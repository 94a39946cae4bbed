"""§Plan validation: the rules a plan must keep before the arena applies it (spec/arena.md §Policies).

A plan — moves in order, float target spans, then placements — can come from the
built-in ladder or from a plug-in policy, which is never trusted.  ``validate_plan``
replays the plan on a small overlay of the slots it touches (O(plan size), never
O(arena)) and raises ``PlanError`` naming the rule and the invariant it protects.
"""

from __future__ import annotations

import bisect
import reprlib
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

from kvarena.reference.bands import Band, Role
from kvarena.reference.view import ArenaView
from kvarena.spec.errors import ArenaError, PlanError
from kvarena.spec.types import Move, Plan, Rung

# rule -> the invariant a plan breaking it would violate
RULES: dict[str, str] = {
    # the plan's fields have the types _apply takes (checked first: a malformed plan crashes half-applied)
    "PLAN-SHAPE": "INV-REFUSAL-IS-NOOP",
    "PLAN-RUNG": "INV-BAND-ORDER",  # NONE places and moves nothing; rung 1 moves nothing; 2 the ends; 3 floats
    "PLAN-MOVE-SOURCE": "INV-VMAP-BIJECTIVE",  # a move's source is a live page of that class
    "PLAN-MOVE-WRITER": "INV-LEDGER-SAFETY",  # a page with a writer never moves
    "PLAN-MOVE-DEST": "INV-NO-OVERLAP",  # a move's destination is free (a hole, or gap inside a float's target)
    "PLAN-DEST-USERS": "INV-LEDGER-SAFETY",  # a destination has no ledger user (never a withheld slot)
    "PLAN-SPAN": "INV-BAND-ORDER",  # a float's target span keeps every page it still has
    "PLAN-PLACE-COUNT": "INV-VMAP-BIJECTIVE",  # placements give every class exactly its demand (0 if none)
    "PLAN-PLACE-FREE": "INV-LEDGER-SAFETY",  # a placement takes a hole or extends a frontier, never a used slot
    "PLAN-EXTENT": "INV-NO-OVERLAP",  # after the plan, spans stay inside the arena, disjoint, in chain order
}


def _error(rule: str, msg: str) -> PlanError:
    return PlanError(f"{rule} ({RULES[rule]}): {msg}; the policy must plan only moves and placements the spec "
                     "allows (spec/arena.md §Policies)", rule, RULES[rule])


def _fail(rule: str, msg: str) -> NoReturn:
    raise _error(rule, msg)


T = TypeVar("T")


def policy_call(hook: str, call: Callable[[], T]) -> T:
    """``call()``, a policy's ``hook`` (``plan`` or ``after_free``).  The policy is never trusted, its code no more
    than its plans: a crash of its own (anything but an ArenaError; ``AdmissionRejectedError`` is how it says no)
    is refused as PLAN-SHAPE, typed, with the crash as the cause and where it raised.  The caller applies nothing
    (``plan``) or undoes the free (``after_free``), as for any refused plan."""
    try:
        return call()
    except ArenaError:
        raise
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}: {tb[-1].line}" if tb else ""
        raise _error("PLAN-SHAPE", f"the policy raised {type(e).__name__}: {e} in {hook}(){where}; {hook}() "
                                   f"returns a Plan{' or None' if hook == 'after_free' else ''}, or raises "
                                   "AdmissionRejectedError when it finds none") from e


def _shape(where: str, got: object, want: str) -> NoReturn:
    _fail("PLAN-SHAPE", f"{where} is {reprlib.repr(got)} ({type(got).__name__}); make it {want}")


def _is_int(x: object) -> bool:
    """The project's ``is_int`` (a bool is never a slot or a count), the common case first: one call per slot."""
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


def _check_shape(plan: object) -> None:
    """PLAN-SHAPE: the plan has the types ``_apply`` and the rules below take, so it is refused before anything
    reads it.  A malformed plan could otherwise pass every rule and crash half-applied (a rung 7 after its pages
    are bound, a float span of 1.5 after the float was retargeted), or crash the validator untyped.  Class names are
    only typed here: an unknown class is the rules' to refuse (PLAN-MOVE-SOURCE, PLAN-RUNG, PLAN-PLACE-COUNT)."""
    if not isinstance(plan, Plan):
        _shape("the plan", plan, "a kvarena.spec.types.Plan(rung, moves, placements, ...) (after_free may also "
                                 "return None)")
    if not isinstance(plan.rung, Rung):  # Rung is an int Enum: only its members are instances, not 1 or True
        _shape("plan.rung", plan.rung, "a Rung member (Rung.NONE, Rung.REUSE, Rung.COMPACT or Rung.RELAYOUT), "
                                       "not a plain int, str or bool")
    if not isinstance(plan.moves, (tuple, list)):
        _shape("plan.moves", plan.moves, "a tuple of Move(cls, src, dst), () for none")
    for i, m in enumerate(plan.moves):
        if not isinstance(m, Move):
            _shape(f"plan.moves[{i}]", m, "a Move(cls, src, dst)")
        if not isinstance(m.cls, str):
            _shape(f"plan.moves[{i}].cls", m.cls, "a class name (str)")
        if not _is_int(m.src) or not _is_int(m.dst):
            _shape(f"plan.moves[{i}]", m, "a Move whose src and dst are int slots")
    if type(plan.spans) is not dict and not isinstance(plan.spans, Mapping):  # (dict first: ABC checks cost)
        _shape("plan.spans", plan.spans, "a mapping float class -> (lo, hi) int slots, {} for none")
    for cls, span in plan.spans.items():
        if not isinstance(cls, str) or not isinstance(span, (tuple, list)) or len(span) != 2 \
                or not all(_is_int(t) for t in span):
            _shape(f"plan.spans[{cls!r}]", span, "a class name mapped to a pair (lo, hi) of int slots")
    if type(plan.placements) is not dict and not isinstance(plan.placements, Mapping):
        _shape("plan.placements", plan.placements, "a mapping class -> tuple of int slots, {} for none")
    for cls, slots in plan.placements.items():
        if not isinstance(cls, str) or (type(slots) is not tuple and (not isinstance(slots, Sequence)
                                                                       or isinstance(slots, (str, bytes)))):
            _shape(f"plan.placements[{cls!r}]", slots, "a class name mapped to a tuple of int slots")
        if set(map(type, slots)) <= {int}:  # (the common case, one pass in C)
            continue
        for s in slots:
            if not _is_int(s):
                _shape(f"a slot of plan.placements[{cls!r}]", s, "an int slot on the class's page grid")
    moved = plan.bytes_moved
    if (type(moved) is not dict and not isinstance(moved, Mapping)) or not all(_is_int(k) and _is_int(v)
                                                                               for k, v in moved.items()):
        _shape("plan.bytes_moved", moved, "a mapping rung (int) -> bytes moved (int), {} for none")


class _Overlay:
    """Slot states after the plan's steps so far, over the untouched arena."""

    def __init__(self, a: ArenaView) -> None:
        self.a = a
        self.state: dict[tuple[str, int], str] = {}
        self.spans: dict[str, tuple[int, int]] = {n: (b.lo, b.hi) for n, b in a.bands.items()}

    def get(self, cls: str, slot: int) -> str:
        got = self.state.get((cls, slot))
        if got is not None:
            return got
        band = self.a.bands[cls]
        lo, hi = self.spans[cls]
        if not lo <= slot < hi:
            return "gap"
        return band.state_of(slot) if band.in_span(slot) else "hole"  # slots a float's target span added

    def used(self, cls: str, slot: int) -> bool:
        return self.a.readers[(cls, slot)] > 0 or self.a.writers[(cls, slot)] > 0


def validate_plan(a: ArenaView, plan: Plan, demand: Mapping[str, int]) -> None:
    """Raise PlanError if applying ``plan`` for ``demand`` would break a rule of the spec."""
    _check_shape(plan)  # first: every rule below reads these fields
    ends = {a.order[0], a.order[-1]}
    if plan.rung is Rung.NONE and any(plan.placements.values()):
        _fail("PLAN-RUNG", f"a plan of rung NONE places {sum(len(s) for s in plan.placements.values())} pages; "
                           "NONE places nothing, so give the rung that placed them (REUSE without moves)")
    if plan.rung is Rung.REUSE and plan.moves:
        _fail("PLAN-RUNG", f"a rung-1 plan moves {len(plan.moves)} pages; reuse in place moves nothing")
    if plan.moves and plan.rung not in (Rung.COMPACT, Rung.RELAYOUT):
        _fail("PLAN-RUNG", f"a plan of rung {plan.rung.name} carries moves")
    ov = _Overlay(a)
    for cls, (t, t_end) in plan.spans.items():
        if cls not in a.bands or cls in ends:
            _fail("PLAN-RUNG", f"target span for {cls!r}, which is not a float band")
        if plan.rung is not Rung.RELAYOUT:  # a NONE plan moves nothing, so it retargets nothing either
            _fail("PLAN-RUNG", f"a float target span in a rung-{int(plan.rung)} plan")
        if not 0 <= t <= t_end <= a.bands[cls].top:
            _fail("PLAN-EXTENT", f"target span [{t}, {t_end}) of {cls!r} leaves its grid [0, {a.bands[cls].top})")

    bands, state, readers, writers = a.bands, ov.state, a.readers, a.writers
    for m in plan.moves:  # (the slot lookups inlined: _Overlay.get of an untouched slot is the band's state here)
        cls, src, dst = m.cls, m.src, m.dst
        band = bands.get(cls)
        if band is None:
            _fail("PLAN-MOVE-SOURCE", f"move of unknown class {cls!r}")
        if plan.rung is Rung.COMPACT and cls not in ends:
            _fail("PLAN-RUNG", f"rung 2 moves {cls}:{src}, a float page; compaction packs the end bands only")
        if plan.rung is Rung.RELAYOUT and cls not in ends and cls not in plan.spans:
            _fail("PLAN-RUNG", f"rung 3 moves float {cls!r} without a target span")
        if src == dst:
            _fail("PLAN-MOVE-DEST", f"move {cls}:{src} onto itself")
        ks, kd = (cls, src), (cls, dst)
        got = state.get(ks)
        if got is None:
            got = "live" if src in band.live and band.lo <= src < band.hi else ov.get(cls, src)
        if got != "live":
            _fail("PLAN-MOVE-SOURCE", f"moves {cls}:{src}, which is {got} at that step")
        if writers.get(ks, 0) > 0:
            _fail("PLAN-MOVE-WRITER", f"moves {cls}:{src} while a ledger user writes it")
        dst_state = state.get(kd)
        if dst_state is None:
            dst_state = ov.get(cls, dst)
        if readers.get(kd, 0) > 0 or writers.get(kd, 0) > 0 or dst_state == "withheld":
            _fail("PLAN-DEST-USERS", f"moves onto {cls}:{dst}, which a ledger user still holds")
        inside = cls in plan.spans and plan.spans[cls][0] <= dst < plan.spans[cls][1]
        if not (dst_state == "hole" or (dst_state == "gap" and inside)):
            _fail("PLAN-MOVE-DEST", f"moves onto {cls}:{dst}, which is {dst_state}")
        state[ks] = "withheld" if readers.get(ks, 0) > 0 or writers.get(ks, 0) > 0 else "hole"
        state[kd] = "live"

    for cls, (t, t_end) in plan.spans.items():
        band = a.bands[cls]
        if _kept_outside(ov, band, t, t_end):
            kept = [s for s in _occupied_outside(ov, band, t, t_end)]
            _fail("PLAN-SPAN", f"float {cls!r} keeps pages {kept} outside its target span [{t}, {t_end})")
        ov.spans[cls] = (t, t_end)
    for cls in ends if plan.moves else ():  # the ends give back the boundary slots their moves emptied
        lo, hi = _absorbed(ov, a.bands[cls])
        ov.spans[cls] = (lo, hi)

    for cls in plan.placements:
        if cls not in a.bands:
            _fail("PLAN-PLACE-COUNT", f"placements for unknown class {cls!r}")
    for cls in (*demand, *(c for c in plan.placements if c not in demand)):  # every class, demanded or not
        got, want = len(plan.placements.get(cls, ())), demand.get(cls, 0)
        if got != want:
            _fail("PLAN-PLACE-COUNT", f"places {got} {cls!r} pages for a demand of {want}")
    for cls, slots in plan.placements.items():
        if len(set(slots)) != len(slots):
            _fail("PLAN-PLACE-FREE", f"places {cls!r} twice on one slot")
        _check_placements(a, ov, a.bands[cls], slots)
    _check_extents(a, ov)


def _check_placements(a: ArenaView, ov: _Overlay, band: Band, slots: Sequence[int]) -> None:
    """Each placed slot (distinct, so none is read again) is a hole without a ledger user, or extends the band's
    frontier by one.  The common case is inlined (``_Overlay.get`` and ``_extend`` once per slot cost more than
    the placement itself): an untouched slot inside the span is free iff it is not live and has no user (a
    withheld slot always has one); an untouched slot just past the frontier extends the span (``_extend``'s rule,
    an empty float's included).  Everything else takes the general path, with its verdicts and messages."""
    cls, state, live, readers, writers = band.name, ov.state, band.live, a.readers, a.writers
    lo, hi = ov.spans[cls]
    up, down = band.role is not Role.HIGH, band.role is not Role.LOW
    for s in slots:
        key = (cls, s)
        if key not in state:
            if lo <= s < hi:  # (Counter.get: no __missing__ call for the common absent key)
                if s not in live and not readers.get(key) and not writers.get(key):
                    continue
            elif up and s == hi:
                hi += 1
                continue
            elif down and s == lo - 1:
                lo -= 1
                continue
        ov.spans[cls] = (lo, hi)
        got = ov.get(cls, s)
        if got == "gap":
            _extend(ov, band, s)
        elif got != "hole" or ov.used(cls, s):
            _fail("PLAN-PLACE-FREE", f"places a new {cls!r} page on slot {s}, which is {got}")
        lo, hi = ov.spans[cls]
    ov.spans[cls] = (lo, hi)


def _outside(band: Band, t: int, t_end: int) -> tuple[tuple[int, int], ...]:
    """The parts of a float's current span outside its target span ``[t, t_end)``."""
    if band.empty:
        return ()
    return tuple((a, b) for a, b in ((band.lo, min(band.hi, t)), (max(band.lo, t_end), band.hi)) if a < b)


def _kept_outside(ov: _Overlay, band: Band, t: int, t_end: int) -> int:
    """How many live or withheld slots of ``band`` lie outside ``[t, t_end)`` after the plan's moves: the band's
    occupied slots there (its span minus its holes, two bisections) corrected by the slots the plan touched, so
    O(plan + log n), never a walk over the float band."""
    held = ("live", "withheld")
    parts = _outside(band, t, t_end)
    n = sum((b - a) - (band.holes.bisect_left(b) - band.holes.bisect_left(a)) for a, b in parts)
    for (c, s), now in ov.state.items():
        if c != band.name or t <= s < t_end:
            continue
        before = band.state_of(s) in held
        n += (now in held) - before
    return n


def _occupied_outside(ov: _Overlay, band: Band, t: int, t_end: int, limit: int = 6) -> list[int]:
    """The first ``limit`` slots ``_kept_outside`` counts (for the refusal's message), jumping runs of holes."""
    out: list[int] = []
    extra = sorted(s for (c, s) in ov.state if c == band.name and not t <= s < t_end and not band.in_span(s))
    for a, b in (*_outside(band, t, t_end), *((s, s + 1) for s in extra)):
        s = a
        while s < b and len(out) < limit:
            if ov.get(band.name, s) in ("live", "withheld"):
                out.append(s)
            s += 1 if (band.name, s) in ov.state else max(1, band.hole_run(s, 1))
    return out


def _absorbed(ov: _Overlay, band: Band) -> tuple[int, int]:
    """An end band's span once the holes its moves left at the boundary go back to the gap.  Runs of untouched
    holes are jumped (``Band.hole_run``), so this is O(plan x log^2 n), not O(holes absorbed)."""
    lo, hi = ov.spans[band.name]
    up = band.role is Role.LOW
    step = -1 if up else 1
    touched = sorted(s for (c, s) in ov.state if c == band.name)
    s = hi - 1 if up else lo
    while lo <= s < hi:
        got = ov.state.get((band.name, s))
        if got is not None:
            if got != "hole":
                break
            ov.state.pop((band.name, s))
            s += step
            continue
        run = band.hole_run(s, step)  # untouched: a hole of the band, or not one
        i = bisect.bisect_left(touched, s)
        if up and i > 0:
            run = min(run, s - touched[i - 1])
        elif not up and i < len(touched):
            run = min(run, touched[i] - s)
        if not run:
            break
        s += step * run
    return (lo, s + 1) if up else (s, hi)


def _extend(ov: _Overlay, band: Band, slot: int) -> None:
    lo, hi = ov.spans[band.name]
    if band.role is Role.FLOAT and lo == hi:
        ov.spans[band.name] = (slot, slot + 1)
    elif slot == hi and band.role is not Role.HIGH:
        ov.spans[band.name] = (lo, hi + 1)
    elif slot == lo - 1 and band.role is not Role.LOW:
        ov.spans[band.name] = (lo - 1, hi)
    else:
        _fail("PLAN-PLACE-FREE", f"places {band.name}:{slot} in the gap but not next to the band's frontier "
                                 f"[{lo}, {hi})")


def _check_extents(a: ArenaView, ov: _Overlay) -> None:
    prev = None
    for name in a.order:
        band = a.bands[name]
        lo, hi = ov.spans[name]
        if lo == hi and band.role is Role.FLOAT:
            continue
        lo_b, hi_b = lo * band.page_bytes, hi * band.page_bytes
        if lo_b < 0 or hi_b > a.capacity:
            _fail("PLAN-EXTENT", f"{name} would span bytes [{lo_b}, {hi_b}) outside the arena")
        if prev is not None and prev[1] > lo_b:
            _fail("PLAN-EXTENT", f"{prev[0]} would end at byte {prev[1]} above the start of {name} at {lo_b}")
        prev = (name, hi_b)
