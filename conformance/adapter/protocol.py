"""The adapter protocol: what an allocator under test must offer the conformance harness.

It is the reference's public API (spec/arena.md §Operations) plus ``observe()``.
Virtual page ids are the implementation's own; the harness maps them to the
trace's logical page handles.  Errors must be the classes of
``kvarena.spec.errors`` (compared by class, i.e. by ``code``).

Levels of agreement with the reference (what the lockstep harness and the vectors compare):

``pool``       for an allocator without bands (a block pool: one block size, one free list, classes
               interleaved): its :class:`PoolObservation` (byte ranges, no spans) satisfies the
               invariants any paged allocator keeps (no two pages share a byte, ledger safety and
               withholding, a bijective id map, bytes conserved in the pool's own terms), rows read
               back and fresh rows read 0, the same pages are freed, refusals other than "does not fit"
               are the same error class and change nothing; admission outcomes may differ both ways
``safety``     the implementation's own observation satisfies the invariants (no overlap, band
               order, a bijective v->p map with no leaked or lost page, ledger safety, byte
               conservation, the feasibility floor), every virtual page reads back what was last
               written to each row, the same pages are freed, and every refusal other than
               "does not fit" is the same error class, with the observable state unchanged
``decisions``  + identical admit / extend / relayout outcomes and shortfall per class
``exact``      + identical placement: returned virtual ids, v->p, spans, holes, withheld (and the
               plans, when the implementation returns them)

Shapes the harness expects (checked; a wrong shape is an :class:`AdapterError` naming the method):

* ``admit`` / ``extend`` return an object with ``.pages`` (class -> new virtual ids, in order) and,
  optionally, ``.plan`` (a :class:`kvarena.spec.types.Plan`); a plain mapping class -> ids is accepted;
* ``drop`` / ``slide`` / ``free`` return the virtual ids freed (a sequence of ints);
* ``compact`` / ``relayout`` return anything; a Plan-like object (``rung``, ``moves``) is compared at
  ``exact`` and its ``moves`` checked against ``max_moves`` at every level;
* ``read`` returns the last tag written (an int), ``0`` for a row never written since the page was handed
  out, in every class (a hand-out zeroes the page: bands of different classes share bytes); compared
  exactly at every level (INV-CONTENT-FOLLOWS-VID);
* ``translate`` returns ``(class, slot)``;
* ``copy_state(owner, src)`` (optional) returns the new virtual id (an int) of a copy of recurrent page ``src``;
* ``observe`` returns an :class:`Observation` (or a mapping with its four fields); at ``pool`` a
  :class:`PoolObservation` (or a mapping with its four fields), or an ``Observation`` (its slots are read
  as byte ranges: any arena can run at ``pool``);
* ``held(owner)`` (optional) returns class -> ids the owner holds, in acquisition order; when present it
  is compared after every step.

Optional features (:func:`features`): ``below``, the placement limit of ``admit`` / ``extend``
(spec/arena.md §Placement limit), offered when both take a parameter named ``below``.  A vector whose
header ``requires`` a feature the implementation lacks is not replayed (reported as stopped, with why);
the lockstep machine passes ``below`` only to implementations that offer it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import Observation, Plan, UserKind

LEVELS = ("pool", "safety", "decisions", "exact")  # each includes the ones before it, except pool's byte view
OWN_POLICY = ("pool", "safety")  # levels where the implementation keeps its own placement (outcomes may differ)

REQUIRED_METHODS = ("admit", "extend", "share", "drop", "slide", "free", "acquire", "release", "compact",
                    "relayout", "write", "read", "translate")
OPTIONAL_METHODS = ("held", "close", "copy_state")  # a trace that copies state stops where copy_state is missing

FEATURES = ("below",)  # optional arguments a vector may require (vectors/FORMAT.md §Features)

DEFAULT_IMPL = "kvarena.gpu.allocator:make"  # kvarena's own Torch + Triton implementation
REFERENCE_ALIAS = "reference"  # ``--impl reference``: the reference itself (a self-test of the harness)

# The protocol's version: bumped by every change an adapter may have to follow (a rule the harness now checks, a
# method, an argument, a module path). An adapter declares the version it was written for as a module- or
# factory-level ``PROTOCOL_VERSION``; ``conform`` names the changes since (:func:`version_notes`). A new change:
# bump PROTOCOL_VERSION, add its entry to PROTOCOL_CHANGES and its section to conformance/CHANGELOG.md
# (tests/fast/test_protocol_version.py holds the three together).
PROTOCOL_VERSION = 12

# version -> (date, what changed, what an adapter written for an older version changes)
PROTOCOL_CHANGES: dict[int, tuple[str, str, str]] = {
    1: ("2026-11-29", "the adapter protocol: the reference's methods plus observe(); levels safety, decisions, exact",
        "write the adapter (conformance/README.md)"),
    2: ("2026-12-01", "a refusal leaves the observable state unchanged (INV-REFUSAL-IS-NOOP, checked after every "
                      "refused step); third-party factories default to --level safety",
        "check the arguments and the fit before changing anything, so observe() after a refusal is as before it"),
    3: ("2026-12-01", "fresh rows read 0 in every class: read() of a row never written since its page was handed "
                      "out returns 0, not None",
        "zero a page when you hand it out (bands of different classes share bytes) and return 0 from read()"),
    4: ("2026-12-01", "recurrent state is one owner's (INV-STATE-PRIVATE): ArenaConfig.recurrent_slots caps the "
                      "recurrent pages an owner holds (default 1); share / admit(shared=) of a state page, ids that "
                      "are not ints (bools, floats) and acquire of no pages are refused with InvalidArgument",
        "refuse those calls as the reference does (PoolAdapter does; spec.guards.check_ids, check_not_state and "
        "check_state_slots are the checks)"),
    5: ("2026-12-01", "copy_state(owner, src), optional: a copy of recurrent page src for owner, returning its new "
                      "virtual id; a trace that copies state stops early where it is missing",
        "add copy_state to run recurrent-copy-state.jsonl and the machine's copy steps"),
    6: ("2026-12-02", "below, the placement limit of admit / extend, an optional feature (spec/arena.md §Placement "
                      "limit); a vector whose header requires it is not replayed without it",
        "take a parameter named below on admit and extend to run rung1-below*.jsonl"),
    7: ("2026-12-05", "module paths: kvarena.conformance.adapter is .adapter.protocol, .base is .adapter.base, "
                      ".example_adapter is .adapter.renumbered, .runner is .runner.conform, .lockstep is "
                      ".machine.lockstep; the engines' drivers live in kvarena.engines (sglang, vllm, and "
                      "transformers' ArenaCache); an adapter declares PROTOCOL_VERSION",
        "update the imports and set PROTOCOL_VERSION = 7 beside the factory"),
    8: ("2026-12-05", "the pool level (conform --level pool) for allocators without bands: observe() may return a "
                      "PoolObservation (live / withheld / free byte ranges and the pool's total bytes); a refusal "
                      "must change nothing even where the reference admitted (now checked at every level)",
        "a block pool: return a PoolObservation from observe() and run --level pool; a two-ended arena: make "
        "sure a refused admit leaves no page behind, then set PROTOCOL_VERSION = 8"),
    9: ("2026-12-05", "flush_idle(budget_bytes) -> Plan, optional as copy_state: the idle-time flush of the end "
                      "bands under a byte budget (spec/arena.md §flush_idle); where the adapter offers it, the "
                      "machine draws it and flush-idle.jsonl replays it (moves' page bytes within the budget; exact: "
                      "the reference's plan)",
        "nothing required; to have the idle flush checked, add flush_idle(budget_bytes) (PoolAdapter: map it to "
        "your pool's compaction), then set PROTOCOL_VERSION = 9"),
    10: ("2026-12-05", "the guards live once, in kvarena.spec.guards (the ordered checks of every operation, and the "
                       "argument checks is_int / check_ids / check_below / ... that were in kvarena.spec.errors and "
                       "kvarena.conformance.adapter.base); new refusals on every implementation: a write tag "
                       "outside [-2**63, 2**63), an owner or user id that is not hashable, acquire of no pages "
                       "(PoolAdapter now refuses it too)",
         "import argument checks from kvarena.spec.guards (guard_admit, guard_drop, ... for a whole operation's "
         "sequence), refuse the new cases with InvalidArgument, then set PROTOCOL_VERSION = 10"),
    11: ("2026-12-06", "the batched machine drives an implementation's batched calls as an engine does: extend_batch "
                       "and free_batch with the int row handles of an earlier result's rows and an int64 demand "
                       "array; free_batch naming every owner of a shared page; refused lanes named again; "
                       "token_locs past what an owner holds, or of no owner, and translate_tokens with an out_width "
                       "narrower than its ids must raise (InvalidArgument / UnknownOwner) and change nothing; event "
                       "users are released by the implementation's own poll() at the call the reference releases "
                       "them, and poll() returns them in acquisition order",
         "nothing for an adapter without batched calls; with them: accept result.rows as owners, refuse the new "
         "cases with typed errors, poll at every call that can change pages or the ledger, then set "
         "PROTOCOL_VERSION = 11"),
    12: ("2026-12-06", "chains with two float bands (toy-two-float: state | long window | short window | full) and a "
                       "window as the low end beside a window float (toy-win-float) in the boundary scenarios, the "
                       "vectors (mixed-toy-two-float, mixed-toy-win-float) and the lockstep machine's chains variant "
                       "(lockstep_for(..., chains=True)); an implementation may refuse, at safety, a model geometry "
                       "it does not serve (ConfigError): those configurations are skipped; kvarena "
                       "explore replays an implementation along every transition of a small arena by copying it "
                       "(copy.deepcopy; pickle with --ray)",
         "keep every present band in chain order whatever sits beside a float (another float, a window end); for "
         "kvarena explore make the allocator copyable with copy.deepcopy (pickle for --ray); then set "
         "PROTOCOL_VERSION = 12"),
}


class AdapterError(AssertionError):
    """The implementation does not speak the adapter protocol: a missing method, a wrong return
    shape, a factory that cannot be imported or raised.  Not a divergence: fix the adapter first."""


POOL_HINT = ("if your allocator has no bands (a block pool: one block size for every class, one free list, "
             "classes interleaved), run it with --level pool (conformance/README.md, Which level fits my allocator)")


class BandlessObservation(AdapterError):
    """``observe()`` returned a :class:`PoolObservation` at a level that decides bands (safety and above):
    the harness reports it as a divergence naming INV-BAND-ORDER and pointing to ``--level pool``."""


@dataclass(frozen=True)
class PoolObservation:
    """What an allocator without bands exposes at level ``pool``: byte ranges of the arena, no spans.

    ``pages``     live virtual page -> ``(class, offset, nbytes)``: the bytes the pool reserved for it (a block
                  pool: its whole block; at least the class's page bytes, else the page spills into a neighbour)
    ``withheld``  ``(offset, nbytes)`` of every freed page a ledger user still holds (not handed out until released)
    ``free``      ``(offset, nbytes)`` of every extent the pool may hand out next (its free list or queue; the
                  order is the pool's policy and is not compared)
    ``total``     the bytes the pool manages (e.g. ``num_blocks * block_bytes``): constant, at most the capacity;
                  live + withheld + free must add up to it (a block in none of them leaked)
    """

    pages: dict[int, tuple[str, int, int]]
    withheld: tuple[tuple[int, int], ...]
    free: tuple[tuple[int, int], ...]
    total: int

    @property
    def v2p(self) -> dict[int, tuple[str, int]]:
        """vid -> (class, byte offset): where the harness records a ledger user's pages."""
        return {v: (c, o) for v, (c, o, _n) in self.pages.items()}


@runtime_checkable
class Allocator(Protocol):
    """An allocator the harness can drive. ``kvarena.reference.arena.Arena`` satisfies it via ``observe``."""

    order: list[str]  # class names in chain order (low end first)

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Any: ...  # below=: optional
    def extend(self, owner: str, demand: Mapping[str, int]) -> Any: ...  # below=: optional (features())
    def share(self, owner: str, vids: Sequence[int]) -> None: ...
    def drop(self, owner: str, vids: Sequence[int]) -> list[int]: ...
    def slide(self, owner: str, cls: str, n: int) -> list[int]: ...
    def free(self, owner: str) -> list[int]: ...
    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None: ...
    def release(self, user: str) -> None: ...
    def compact(self, max_moves: int | None = None) -> Plan: ...
    def relayout(self, demand: Mapping[str, int]) -> Plan: ...
    def write(self, vid: int, entry: int, row: int, tag: int) -> None: ...
    def read(self, vid: int, entry: int, row: int) -> int | None: ...
    def translate(self, vid: int) -> tuple[str, int]: ...
    def observe(self) -> Observation: ...


class Factory(Protocol):
    """``package.module:factory`` for ``kvarena conform --impl``: builds an allocator for a config."""

    def __call__(self, config: ArenaConfig) -> Allocator: ...


def takes(fn: Any, name: str) -> bool:
    """Whether ``fn`` has a parameter called ``name`` (``**kwargs`` does not count: it may drop it)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def features(alloc: Any) -> frozenset[str]:
    """The optional features of :data:`FEATURES` the allocator offers: its ``features`` attribute when it declares
    one, else ``below`` when both ``admit`` and ``extend`` take a ``below`` parameter."""
    declared = getattr(alloc, "features", None)
    if declared is not None and not callable(declared):
        return frozenset(f for f in declared if f in FEATURES)
    below = all(takes(getattr(alloc, m, None), "below") for m in ("admit", "extend"))
    return frozenset({"below"} if below else ())


# ---------------------------------------------------------------------------------------------
# Observations


def observe_reference(arena: Any) -> Observation:
    """The reference's observation (also the shape every adapter's ``observe()`` returns)."""
    return Observation(
        v2p=dict(sorted(arena.v2p.items())),
        spans={n: (b.lo, b.hi) for n, b in arena.bands.items()},
        holes={n: tuple(b.holes) for n, b in arena.bands.items()},
        withheld={n: tuple(sorted(b.withheld)) for n, b in arena.bands.items()},
    )


_ARENA_ATTRS = ("bands", "v2p", "gen", "owners", "refs", "users", "readers", "writers", "content", "config",
                "order", "hints", "classes", "layouts", "_free_vids", "ANCHORED_ENDS")


def arena_like(alloc: Any) -> bool:
    """True for the reference and its variants (mutants): the reference's invariant predicates apply."""
    return all(hasattr(alloc, a) for a in _ARENA_ATTRS)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def observe(alloc: Any, order: Sequence[str]) -> Observation:
    """The implementation's observation, normalized (sorted ints); AdapterError on a wrong shape."""
    if hasattr(alloc, "observe"):
        raw = alloc.observe()
    elif arena_like(alloc):
        raw = observe_reference(alloc)
    else:
        raise AdapterError(f"{type(alloc).__name__} has no observe(); return a "
                           "kvarena.conformance.adapter.protocol.Observation(v2p, spans, holes, withheld)")
    return as_observation(raw, order)


def as_observation(raw: Any, order: Sequence[str]) -> Observation:
    fields = ("v2p", "spans", "holes", "withheld")
    if isinstance(raw, PoolObservation):
        raise BandlessObservation(f"observe() returned a PoolObservation (byte ranges, no bands): the levels safety, "
                                  f"decisions and exact decide band invariants a pool without bands cannot keep "
                                  f"(INV-BAND-ORDER, bands disjoint); {POOL_HINT}")
    if isinstance(raw, Mapping):
        get = raw.get
    else:
        def get(k: str) -> Any:
            return getattr(raw, k, None)
    where = "observe()"
    try:
        v2p_raw, spans_raw, holes_raw, wh_raw = (get(f) for f in fields)
        if not all(isinstance(x, Mapping) for x in (v2p_raw, spans_raw, holes_raw, wh_raw)):
            raise TypeError("every field must be a mapping")
        v2p: dict[int, tuple[str, int]] = {}
        for v, page in v2p_raw.items():
            cls, slot = page
            if not (_int(v) and isinstance(cls, str) and _int(slot)):
                raise TypeError(f"v2p[{v!r}] = {page!r}")
            v2p[int(v)] = (cls, int(slot))
        spans: dict[str, tuple[int, int]] = {}
        holes: dict[str, tuple[int, ...]] = {}
        withheld: dict[str, tuple[int, ...]] = {}
        for c in order:
            lo, hi = spans_raw[c]
            if not (_int(lo) and _int(hi)):
                raise TypeError(f"spans[{c!r}] = {spans_raw[c]!r}")
            spans[c] = (int(lo), int(hi))
            hs = [int(s) for s in holes_raw.get(c, ())]
            ws = [int(s) for s in wh_raw.get(c, ())]
            holes[c] = tuple(sorted(hs))
            withheld[c] = tuple(sorted(ws))
    except (TypeError, ValueError, KeyError) as e:
        raise AdapterError(f"{where} returned {raw!r:.300}: expected Observation(v2p={{vid: (class, slot)}}, "
                           f"spans={{class: (lo, hi)}}, holes={{class: (slot, ...)}}, withheld={{class: (slot, ...)}}) "
                           f"with every class of {list(order)} ({type(e).__name__}: {e})") from None
    return Observation(dict(sorted(v2p.items())), spans, holes, withheld)


def observe_pool(alloc: Any, order: Sequence[str], page_bytes: Mapping[str, int], capacity: int) -> PoolObservation:
    """The implementation's observation at level ``pool``, normalized; an Observation is read as byte ranges."""
    raw = alloc.observe() if hasattr(alloc, "observe") else observe_reference(alloc) if arena_like(alloc) else None
    if raw is None:
        raise AdapterError(f"{type(alloc).__name__} has no observe(); return a "
                           "kvarena.conformance.adapter.protocol.PoolObservation(pages, withheld, free, total)")
    has = (lambda k: k in raw) if isinstance(raw, Mapping) else (lambda k: hasattr(raw, k))
    if has("spans"):
        return pool_view(as_observation(raw, order), page_bytes, capacity)
    get = raw.get if isinstance(raw, Mapping) else (lambda k: getattr(raw, k, None))
    try:
        pages_raw, wh_raw, free_raw, total = (get(f) for f in ("pages", "withheld", "free", "total"))
        pages: dict[int, tuple[str, int, int]] = {}
        for v, page in dict(pages_raw).items():
            cls, off, n = page
            if not (_int(v) and isinstance(cls, str) and _int(off) and _int(n)):
                raise TypeError(f"pages[{v!r}] = {page!r}")
            pages[int(v)] = (cls, int(off), int(n))
        ranges = []
        for part in (wh_raw, free_raw):
            rs = [(int(o), int(n)) for o, n in part if _int(o) and _int(n)]
            if len(rs) != len(part):
                raise TypeError(f"{part!r:.100} is not a list of (offset, nbytes) ints")
            ranges.append(tuple(sorted(rs)))
        if not _int(total):
            raise TypeError(f"total = {total!r}")
    except (TypeError, ValueError) as e:
        raise AdapterError(f"observe() returned {raw!r:.300}: expected PoolObservation(pages={{vid: (class, offset, "
                           f"nbytes)}}, withheld=[(offset, nbytes)], free=[(offset, nbytes)], total=bytes) or an "
                           f"Observation ({type(e).__name__}: {e})") from None
    return PoolObservation(dict(sorted(pages.items())), ranges[0], ranges[1], int(total))


def pool_view(obs: Observation, page_bytes: Mapping[str, int], capacity: int) -> PoolObservation:
    """An arena's observation as byte ranges: slot s of class c is ``[s * P[c], (s + 1) * P[c])``; holes, gaps
    and padding are free; the pool manages the whole capacity."""
    def rng(c: str, s: int) -> tuple[int, int]:
        return s * page_bytes.get(c, 0), page_bytes.get(c, 0)

    pages = {v: (c, *rng(c, s)) for v, (c, s) in obs.v2p.items()}
    withheld = sorted(rng(c, s) for c, ss in obs.withheld.items() for s in ss)
    holes = sorted(rng(c, s) for c, ss in obs.holes.items() for s in ss)
    gaps, at = [], 0  # bytes in no page, hole or withheld slot: free as well
    for o, n in sorted([(o, n) for _c, o, n in pages.values()] + withheld + holes):
        if o > at:
            gaps.append((at, o - at))
        at = max(at, o + n)
    if at < capacity:
        gaps.append((at, capacity - at))
    return PoolObservation(pages, tuple(withheld), tuple(sorted(holes + gaps)), capacity)


# ---------------------------------------------------------------------------------------------
# Return shapes


def pages_of(result: Any, method: str, order: Sequence[str]) -> dict[str, list[int]]:
    """class -> new virtual ids from what admit / extend returned (empty classes omitted)."""
    pages = result.pages if hasattr(result, "pages") else result
    if not isinstance(pages, Mapping):
        raise AdapterError(f"{method}() returned {result!r:.200}: expected an object with .pages "
                           "(class -> new virtual ids), e.g. kvarena.reference.arena.Admission")
    out: dict[str, list[int]] = {}
    for c, vs in pages.items():
        if c not in order:
            raise AdapterError(f"{method}() returned pages for {c!r}: expected a class of {list(order)}")
        try:
            if isinstance(vs, (str, bytes)) or not all(_int(v) or hasattr(v, "item") for v in vs):
                raise TypeError
            ids = [int(v) for v in vs]
        except (TypeError, ValueError):
            raise AdapterError(f"{method}() returned pages[{c!r}] = {vs!r:.200}: expected virtual ids (ints)") \
                from None
        if ids:
            out[c] = ids
    return out


def plan_of(result: Any) -> dict | None:
    """A plan (``kvarena.spec.types.Plan`` or anything with ``rung`` and ``moves``) as plain data, or None."""
    plan = getattr(result, "plan", result)
    if plan is None or not (hasattr(plan, "rung") and hasattr(plan, "moves")):
        return None
    try:
        return {
            "rung": int(plan.rung),
            "moves": [[m.cls, int(m.src), int(m.dst)] for m in plan.moves],
            "placements": {c: [int(s) for s in ss] for c, ss in dict(getattr(plan, "placements", {})).items() if ss},
            "spans": {c: [int(t), int(e)] for c, (t, e) in dict(getattr(plan, "spans", {})).items()},
            "bytes_moved": {str(int(k)): int(v) for k, v in dict(getattr(plan, "bytes_moved", {})).items() if v},
        }
    except (TypeError, ValueError, AttributeError) as e:
        raise AdapterError(f"plan {plan!r:.200} is not a kvarena.spec.types.Plan ({type(e).__name__}: {e})") from None


def ids_of(result: Any, method: str) -> list[int]:
    """The freed virtual ids drop / slide / free returned."""
    try:
        if result is None or isinstance(result, (str, bytes, Mapping)) \
                or not all(_int(v) or hasattr(v, "item") for v in result):
            raise TypeError
        return [int(v) for v in result]
    except (TypeError, ValueError):
        raise AdapterError(f"{method}() returned {result!r:.200}: expected the freed virtual ids (a list of ints)") \
            from None


def tag_of(result: Any) -> int | None:
    if result is None:
        return None
    if hasattr(result, "item") and not isinstance(result, int):  # a 0-d tensor / numpy scalar
        result = result.item()
    if not _int(result):
        raise AdapterError(f"read() returned {result!r:.100}: expected the tag last written (an int) or None")
    return int(result)


def page_of(result: Any) -> tuple[str, int]:
    try:
        cls, slot = result
        if isinstance(cls, str) and _int(slot):
            return cls, int(slot)
    except (TypeError, ValueError):
        pass
    raise AdapterError(f"translate() returned {result!r:.100}: expected (class, slot)")


# ---------------------------------------------------------------------------------------------
# Loading and checking an implementation


def check_adapter(alloc: Any, order: Sequence[str], where: str = "the allocator") -> None:
    """Every required method is there and ``order`` is the chain order, or an AdapterError naming what is not."""
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(alloc, m, None))]
    if not (callable(getattr(alloc, "observe", None)) or arena_like(alloc)):
        missing.append("observe")
    if missing:
        raise AdapterError(f"{where} ({type(alloc).__name__}) lacks {', '.join(m + '()' for m in missing)}; "
                           "see kvarena.conformance.adapter.protocol.Allocator for the protocol")
    got = getattr(alloc, "order", None)
    if got is None:
        raise AdapterError(f"{where} ({type(alloc).__name__}) has no .order; list the class names in chain order "
                           f"(here {list(order)})")
    if list(got) != list(order):
        raise AdapterError(f"{where}.order is {list(got)}; the chain order (low end first) is {list(order)}")


def default_level(spec: str | None) -> str:
    """``exact`` for kvarena's own implementations (gpu/, the reference), ``safety`` for anyone else's: a
    third-party allocator keeps its own placement policy and is held to the invariants, not to the
    reference's choices (an allocator without bands asks for ``pool`` explicitly)."""
    return "exact" if (spec or DEFAULT_IMPL) in (DEFAULT_IMPL, REFERENCE_ALIAS) else "safety"


def load_factory(spec: str | None) -> tuple[str, Any]:
    """``package.module:attr`` (or ``reference``) -> (name, factory). AdapterError when it cannot be loaded.
    Modules import from the current directory too (like ``python -m``): the adapter may live in the
    engine's checkout."""
    spec = spec or DEFAULT_IMPL
    if spec == REFERENCE_ALIAS:
        from kvarena.reference.arena import Arena

        return REFERENCE_ALIAS, Arena
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise AdapterError(f"--impl {spec!r}: expected package.module:factory (a callable config -> allocator), "
                           f"or {REFERENCE_ALIAS!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        hint = ""
        if spec == DEFAULT_IMPL:
            hint = (" (kvarena's own gpu/ implementation is not there yet, or its dependencies are missing; "
                    "pass --impl package.module:factory for yours, or --impl reference)")
        raise AdapterError(one_line(f"cannot import {mod_name!r} for --impl {spec!r}: {type(e).__name__}: {e}{hint}")) \
            from None
    except SyntaxError as e:  # str(e) names the file and line
        raise AdapterError(one_line(f"cannot import {mod_name!r} for --impl {spec!r}: SyntaxError: {e}")) from None
    except (Exception, SystemExit) as e:  # the module's own code raised while importing: say where, not a traceback
        raise AdapterError(one_line(f"importing {mod_name!r} for --impl {spec!r} raised {type(e).__name__}: {e} "
                                    f"({raised_at(e)})")) from None
    factory = mod
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise AdapterError(f"--impl {spec!r}: module {mod_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise AdapterError(f"--impl {spec!r}: {attr!r} is not callable; it must build an allocator from an ArenaConfig")
    return spec, factory


def one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line (an exception's message may span many) and at most ``limit`` characters: a CI log
    shows the whole error where it says what failed."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def raised_at(e: BaseException) -> str:
    """Where ``e`` was raised: the innermost frame of its traceback, as ``file:line in function``."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "no traceback"
    f = frames[-1]
    return f"at {f.filename}:{f.lineno} in {f.name}"


def declared_version(factory: Any) -> Any:
    """The ``PROTOCOL_VERSION`` the adapter declares: the factory's own attribute, else its module's; None if
    neither has one."""
    version = getattr(factory, "PROTOCOL_VERSION", None)
    if version is None:
        module = sys.modules.get(getattr(factory, "__module__", None) or "")
        version = getattr(module, "PROTOCOL_VERSION", None)
    return version


def version_notes(factory: Any) -> list[str]:
    """What ``conform`` says about the protocol version the adapter declares: nothing when it is the current one
    (or the adapter is kvarena's own), else the changes since, each with what to change (conformance/CHANGELOG.md)."""
    declared = declared_version(factory)
    if declared is None:
        if (getattr(factory, "__module__", None) or "").startswith("kvarena."):
            return []  # kvarena's own implementations follow the protocol in the same commit
        return [f"note: the adapter declares no PROTOCOL_VERSION; add PROTOCOL_VERSION = {PROTOCOL_VERSION} beside "
                "the factory, so a later kvarena names the contract changes it needs (conformance/CHANGELOG.md)"]
    if not (isinstance(declared, int) and not isinstance(declared, bool)) or declared < 1:
        return [f"warning: the adapter's PROTOCOL_VERSION is {declared!r}: declare the int version it was written "
                f"for (this kvarena speaks {PROTOCOL_VERSION}; conformance/CHANGELOG.md)"]
    if declared > PROTOCOL_VERSION:
        return [f"warning: the adapter was written for protocol version {declared}, newer than this kvarena's "
                f"{PROTOCOL_VERSION}: install the kvarena it was written against"]
    if declared == PROTOCOL_VERSION:
        return []
    out = [f"warning: the adapter was written for protocol version {declared}; this kvarena speaks "
           f"{PROTOCOL_VERSION}. Changes since (conformance/CHANGELOG.md), each with what to change:"]
    for v in range(declared + 1, PROTOCOL_VERSION + 1):
        date, what, change = PROTOCOL_CHANGES[v]
        out.append(f"  version {v} ({date}): {what}. Change: {change}.")
    out.append(f"  then set PROTOCOL_VERSION = {PROTOCOL_VERSION}")
    return out
