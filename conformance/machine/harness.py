"""The lockstep harness: one trace, an oracle and an implementation, compared per level after every step.

A **trace** is a list of steps ``{"op": name, "args": {...}}`` in the language of
conformance/vectors/FORMAT.md.  Pages are named by **logical handle**: handle ``n`` is the
``n``-th page any admit / extend of the trace returned (classes in chain order, each class's pages
in the order returned), so an implementation with other virtual ids can follow the same trace.
``{"vid": v}`` names a raw virtual id (only ids that are never bound: negative or huge), and
``{"dead": n}`` the id handle ``n`` had before it was freed (used only while that id is unbound on
both sides: ids are reused).

The **oracle** is the reference run live (:class:`LiveReference`, for the lockstep machine and for
writing vectors) or a recorded vector (``kvarena.conformance.vectors.replay.RecordedOracle``).  For each
step it yields an :class:`Expect` (what the reference returned or raised, in handle terms) and a
:class:`Snapshot` (pages, spans, holes, withheld, owners).  The :class:`Conductor` runs the same step
on the implementation (:class:`Side`) and compares what the level asks for (adapter.py, LEVELS).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kvarena.conformance.adapter.protocol import (
    OWN_POLICY,
    AdapterError,
    Observation,
    as_observation,
    features,
    ids_of,
    observe,
    page_of,
    pages_of,
    plan_of,
    tag_of,
)
from kvarena.conformance.machine.checks import Geometry
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, PlanError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

# op -> its arguments, all required (an optional argument is written out: "shared": [], "max_moves": null)
OPS: dict[str, tuple[str, ...]] = {
    "admit": ("owner", "demand", "shared"),
    "extend": ("owner", "demand"),
    "share": ("owner", "pages"),
    "drop": ("owner", "pages"),
    "slide": ("owner", "cls", "n"),
    "free": ("owner",),
    "acquire": ("user", "kind", "pages"),
    "release": ("user",),
    "compact": ("max_moves",),
    "flush_idle": ("budget_bytes",),  # optional in the adapter protocol (protocol 9), as copy_state
    "relayout": ("demand",),
    "write": ("page", "entry", "row", "tag"),
    "read": ("page", "entry", "row"),
    "translate": ("page",),
    "copy_state": ("owner", "page"),  # returns like an admission: the new page (a new handle) of the page's class
    "construct": ("config",),
}
# op -> optional arguments: written only where a step uses them, each an optional feature (adapter.FEATURES) a
# vector's header lists in "requires"; an implementation without it is not given such a step
OPTIONAL_ARGS: dict[str, tuple[str, ...]] = {"admit": ("below",), "extend": ("below",)}
PAGE_LIST_ARGS = ("shared", "pages")
ADMISSIONS = ("admit", "extend", "copy_state")
FREEING = ("drop", "slide", "free")
PLANNING = ("compact", "flush_idle", "relayout")  # steps that return a plan and place nothing
PLACEMENT_DEPENDENT = ("admit", "extend", "relayout", "copy_state")  # outcomes that may differ below `decisions`
REJECTED = "AdmissionRejected"
CACHE = "cache"  # the prefix cache: an owner like any request


class Divergence(AssertionError):
    """The implementation disagrees with the reference at the chosen level. ``inv`` is the invariant
    ID when an invariant predicate decided it; ``trace`` the steps that led here."""

    def __init__(self, message: str, inv: str | None = None, trace: str = "") -> None:
        super().__init__(message + (f"\n{trace}" if trace else ""))
        self.inv = inv
        self.summary = message
        self.trace = trace


class StopReplay(Exception):
    """A recorded vector cannot be followed further at this level (allowed: e.g. at ``safety`` the
    implementation refused an admission the reference accepted, and later steps use those pages)."""


# ---------------------------------------------------------------------------------------------
# Configurations


CONFIG_FIELDS = ("model", "capacity", "page_size", "max_context_len", "swa_full_tokens_ratio",
                 "mamba_full_memory_ratio")


def config_to_json(config: ArenaConfig) -> dict:
    return {"model": config.model.name, "capacity": config.capacity, "page_size": config.page_size,
            "max_context_len": config.max_context_len, "swa_full_tokens_ratio": config.swa_full_tokens_ratio,
            "mamba_full_memory_ratio": config.mamba_full_memory_ratio,
            **({"recurrent_slots": config.recurrent_slots} if config.recurrent_slots != 1 else {})}


def config_from_json(d: Mapping[str, Any]) -> ArenaConfig:
    missing = [k for k in CONFIG_FIELDS if k not in d]
    if missing:
        raise ValueError(f"config lacks {missing}")
    return ArenaConfig(preset(d["model"]), d["capacity"], page_size=d["page_size"],
                       swa_full_tokens_ratio=d["swa_full_tokens_ratio"],
                       mamba_full_memory_ratio=d["mamba_full_memory_ratio"], max_context_len=d["max_context_len"],
                       recurrent_slots=d.get("recurrent_slots", 1))


# ---------------------------------------------------------------------------------------------
# What the oracle says a step does


@dataclass
class Expect:
    """One step's outcome in handle terms (the ``expect`` of a vector step)."""

    code: str | None = None  # error code (kvarena.spec.errors ``code``), None when it returned
    shortfall: dict[str, int] | None = None  # AdmissionRejected only
    shortfall_bytes: int | None = None
    pages: dict[str, list[int]] | None = None  # admit / extend: new handles per class
    vids: dict[str, list[int]] | None = None  # admit / extend: their raw virtual ids
    freed: list[int] | None = None  # drop / slide / free: handles freed, in order
    value: Any = None  # read: the tag; translate: [class, slot]
    plan: dict | None = None  # admit / extend / compact / relayout

    @property
    def ok(self) -> bool:
        return self.code is None

    def to_json(self, op: str) -> dict:
        if self.code is not None:
            out: dict[str, Any] = {"rejects": self.code}
            if self.code == REJECTED:
                out["shortfall"] = self.shortfall
                out["shortfall_bytes"] = self.shortfall_bytes
            return out
        if op in ADMISSIONS:
            ret: Any = {"pages": self.pages, "vids": self.vids, "plan": self.plan}
        elif op in FREEING:
            ret = self.freed
        elif op in PLANNING:
            ret = self.plan
        else:
            ret = self.value
        return {"returns": ret}

    @classmethod
    def from_json(cls, op: str, d: Mapping[str, Any]) -> Expect:
        if "rejects" in d:
            return cls(code=d["rejects"], shortfall=d.get("shortfall"), shortfall_bytes=d.get("shortfall_bytes"))
        ret = d["returns"]
        if op in ADMISSIONS:
            return cls(pages={c: list(h) for c, h in ret["pages"].items()},
                       vids={c: list(v) for c, v in ret["vids"].items()}, plan=ret.get("plan"))
        if op in FREEING:
            return cls(freed=list(ret))
        if op in PLANNING:
            return cls(plan=ret)
        return cls(value=ret)


@dataclass
class Snapshot:
    """The oracle's observable state in handle terms (the ``snapshot`` of a vector step)."""

    pages: dict[int, tuple[str, int, int]]  # live handle -> (class, slot, raw vid)
    spans: dict[str, tuple[int, int]]
    holes: dict[str, tuple[int, ...]]
    withheld: dict[str, tuple[int, ...]]
    owners: dict[str, dict[str, list[int]]]  # owner -> class -> handles, acquisition order (empty omitted)

    def observation(self) -> Observation:
        return Observation(dict(sorted((v, (c, s)) for c, s, v in self.pages.values())), dict(self.spans),
                           dict(self.holes), dict(self.withheld))

    def to_json(self) -> dict:
        return {"pages": [[h, c, s, v] for h, (c, s, v) in sorted(self.pages.items())],
                "spans": {c: list(x) for c, x in self.spans.items()},
                "holes": {c: list(x) for c, x in self.holes.items()},
                "withheld": {c: list(x) for c, x in self.withheld.items()},
                "owners": self.owners}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Snapshot:
        return cls({int(h): (c, int(s), int(v)) for h, c, s, v in d["pages"]},
                   {c: (int(x[0]), int(x[1])) for c, x in d["spans"].items()},
                   {c: tuple(x) for c, x in d["holes"].items()},
                   {c: tuple(x) for c, x in d["withheld"].items()},
                   {o: {c: list(hs) for c, hs in held.items()} for o, held in d["owners"].items()})


def _kind(kind: Any) -> Any:
    """A UserKind for a valid value; anything else is passed through (the call must refuse it)."""
    try:
        return UserKind(kind)
    except ValueError:
        return kind


class Handles:
    """The logical handle <-> virtual id maps of one side."""

    def __init__(self) -> None:
        self.vid_of: dict[int, int] = {}  # live handle -> vid
        self.handle_of: dict[int, int] = {}  # vid -> live handle
        self.dead_vid: dict[int, int] = {}  # freed handle -> the vid it had

    def bind(self, h: int, vid: int) -> None:
        self.vid_of[h] = vid
        self.handle_of[vid] = h

    def unbind(self, h: int) -> None:
        vid = self.vid_of.pop(h)
        del self.handle_of[vid]
        self.dead_vid[h] = vid

    def resolve(self, ref: Any) -> int:
        try:
            if isinstance(ref, dict):
                if "vid" in ref:
                    return ref["vid"]
                return self.dead_vid[ref["dead"]]
            return self.vid_of[ref]
        except (KeyError, TypeError):
            raise ValueError(f"page {ref!r} names no page: a handle must be live (name a freed one as "
                             "{\"dead\": handle}) and a dead handle must have been freed") from None

    def args_for_call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(args)
        for k in PAGE_LIST_ARGS:
            if k in out:
                out[k] = [self.resolve(p) for p in out[k]]
        if "page" in out:
            out["page"] = self.resolve(out["page"])
        for k in ("demand", "below"):
            if k in out and isinstance(out[k], dict):
                out[k] = dict(out[k])  # the callee must not alias the trace
        if "kind" in out:
            out["kind"] = _kind(out["kind"])
        return out


def call(alloc: Any, op: str, a: Mapping[str, Any], event: Any = None) -> Any:
    """Call ``op`` on an allocator with resolved arguments (virtual ids, UserKind); ``event``: an acquire's
    completion event (spec §Ledger, Event users), never part of a trace line."""
    if op == "admit":
        if "below" in a:  # only a step that names it passes it (an adapter without the feature never gets one)
            return alloc.admit(a["owner"], a["demand"], a["shared"], below=a["below"])
        return alloc.admit(a["owner"], a["demand"], a["shared"])
    if op == "extend":
        if "below" in a:
            return alloc.extend(a["owner"], a["demand"], below=a["below"])
        return alloc.extend(a["owner"], a["demand"])
    if op == "share":
        return alloc.share(a["owner"], a["pages"])
    if op == "drop":
        return alloc.drop(a["owner"], a["pages"])
    if op == "slide":
        return alloc.slide(a["owner"], a["cls"], a["n"])
    if op == "free":
        return alloc.free(a["owner"])
    if op == "acquire":
        if event is not None:
            return alloc.acquire(a["user"], a["kind"], a["pages"], event=event)
        return alloc.acquire(a["user"], a["kind"], a["pages"])
    if op == "release":
        return alloc.release(a["user"])
    if op == "compact":
        return alloc.compact(a["max_moves"])
    if op == "flush_idle":
        return alloc.flush_idle(a["budget_bytes"])
    if op == "relayout":
        return alloc.relayout(a["demand"])
    if op == "write":
        return alloc.write(a["page"], a["entry"], a["row"], a["tag"])
    if op == "read":
        return alloc.read(a["page"], a["entry"], a["row"])
    if op == "translate":
        return alloc.translate(a["page"])
    if op == "copy_state":
        return alloc.copy_state(a["owner"], a["page"])
    raise ValueError(f"unknown op {op!r}; the ops are {sorted(OPS)}")


# ---------------------------------------------------------------------------------------------
# The reference, run live


class LiveReference:
    """The oracle that runs ``kvarena.reference.arena.Arena`` and names its pages by handle."""

    def __init__(self, config: ArenaConfig, arena: Arena | None = None) -> None:
        self.config = config
        self.arena = arena if arena is not None else Arena(config)
        self.h = Handles()
        self.next_handle = 0
        self.new_owner = False  # whether the last copy_state created its owner

    def apply(self, op: str, args: Mapping[str, Any], event: Any = None) -> Expect:
        a = self.arena
        self.new_owner = op == "copy_state" and args.get("owner") not in a.owners  # (undo_admission)
        resolved = self.h.args_for_call(op, args)
        try:
            result = call(a, op, resolved, event)
        except PlanError as e:  # the reference's validator refused the reference's own plan
            raise AssertionError(f"the reference refused its own plan on {op} {args}: {e}; this is a bug in "
                                 "kvarena.reference (its planner and its plan validator disagree)") from e
        except ArenaError as e:
            return Expect(code=e.code, shortfall=getattr(e, "shortfall", None),
                          shortfall_bytes=getattr(e, "shortfall_bytes", None))
        except Exception as e:  # the reference itself failed: never a valid outcome
            raise AssertionError(f"the reference raised {type(e).__name__}: {e} on {op} {args}; this is a bug in "
                                 "kvarena.reference, not in the implementation") from e
        if op == "copy_state":  # the new page, shaped like an admission's
            result = SimpleNamespace(pages={a.v2p[result][0]: (result,)}, plan=None)
        if op in ADMISSIONS:
            pages: dict[str, list[int]] = {}
            vids: dict[str, list[int]] = {}
            for c in a.order:
                for v in result.pages.get(c, ()):
                    self.h.bind(self.next_handle, v)
                    pages.setdefault(c, []).append(self.next_handle)
                    vids.setdefault(c, []).append(v)
                    self.next_handle += 1
            return Expect(pages=pages, vids=vids, plan=plan_of(result))
        if op in FREEING:
            freed = [self.h.handle_of[v] for v in result]
            for h in freed:
                self.h.unbind(h)
            return Expect(freed=freed)
        if op in PLANNING:
            return Expect(plan=plan_of(result))
        if op == "translate":
            return Expect(value=list(result))
        return Expect(value=result)

    def snapshot(self) -> Snapshot:
        a = self.arena
        hof = self.h.handle_of
        return Snapshot(
            pages={h: (*a.v2p[v], v) for h, v in sorted(self.h.vid_of.items())},
            spans={n: (b.lo, b.hi) for n, b in a.bands.items()},
            holes={n: tuple(b.holes) for n, b in a.bands.items()},
            withheld={n: tuple(sorted(b.withheld)) for n, b in a.bands.items()},
            owners={o: {c: [hof[v] for v in vs] for c, vs in held.items() if vs}
                    for o, held in sorted(a.owners.items())},
        )

    def construct(self, args: Mapping[str, Any]) -> Expect:
        try:
            Arena(config_from_json(args["config"]))
        except ArenaError as e:
            return Expect(code=e.code)
        return Expect()

    def undo_admission(self, op: str, args: Mapping[str, Any], exp: Expect) -> None:
        """Safety only: the implementation refused what the reference admitted; take it back here."""
        if op == "admit" or (op == "copy_state" and self.new_owner):  # the owner is the step's: forget it
            freed = self.arena.free(args["owner"])
        else:
            freed = self.arena.drop(args["owner"], [self.h.vid_of[h] for hs in (exp.pages or {}).values() for h in hs])
        for v in freed:
            self.h.unbind(self.h.handle_of[v])

    def live_pages(self) -> dict[int, str]:
        v2p = self.arena.v2p
        return {h: v2p[v][0] for h, v in self.h.vid_of.items()}

    # -- views the rules draw from -------------------------------------------------------------
    def owners(self) -> list[str]:
        return list(self.arena.owners)

    def held(self, owner: str) -> dict[str, list[int]]:
        hof = self.h.handle_of
        return {c: [hof[v] for v in vs] for c, vs in self.arena.owners[owner].items()}

    def live(self) -> list[int]:
        return sorted(self.h.vid_of)

    def cls_of(self, h: int) -> str:
        return self.arena.v2p[self.h.vid_of[h]][0]


# ---------------------------------------------------------------------------------------------
# The implementation side


@dataclass
class Outcome:
    """What the implementation did for one step: returned (``code`` None) or raised."""

    code: str | None = None
    error: BaseException | None = None
    foreign: bool = False  # raised something that is not a kvarena.spec.errors class
    value: Any = None  # admit/extend: {cls: [vid]}; drop/slide/free: [vid]; read: tag; translate: (cls, slot)
    plan: dict | None = None
    shortfall: dict | None = None
    shortfall_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.code is None

    def describe(self) -> str:
        if self.ok:
            return f"returned {json.dumps(self.value, default=str)}" + (f" plan {self.plan}" if self.plan else "")
        extra = f" shortfall {self.shortfall} ({self.shortfall_bytes} B)" if self.code == REJECTED else ""
        return f"raised {type(self.error).__name__}{extra}: {self.error}"


class Side:
    """The implementation under test, with its own handle maps."""

    def __init__(self, alloc: Any, geo: Geometry) -> None:
        self.alloc = alloc
        self.geo = geo
        self.h = Handles()

    def apply(self, op: str, args: Mapping[str, Any]) -> Outcome:
        resolved = self.h.args_for_call(op, args)
        if "below" in args and "below" not in features(self.alloc):
            raise StopReplay(f"the implementation's admit / extend take no `below` (the optional placement limit, "
                             f"spec/arena.md §Placement limit): the trace passes one here ({json.dumps(dict(args))})")
        if op == "copy_state" and not callable(getattr(self.alloc, "copy_state", None)):
            raise StopReplay(f"the implementation has no copy_state (optional in the adapter protocol): the trace "
                             f"copies recurrent state here ({json.dumps(dict(args))})")
        if op == "flush_idle" and not callable(getattr(self.alloc, "flush_idle", None)):
            raise StopReplay(f"the implementation has no flush_idle (optional in the adapter protocol): the trace "
                             f"flushes between steps here ({json.dumps(dict(args))})")
        try:
            result = call(self.alloc, op, resolved)
        except ArenaError as e:
            return Outcome(code=e.code, error=e, shortfall=getattr(e, "shortfall", None),
                           shortfall_bytes=getattr(e, "shortfall_bytes", None))
        except AdapterError:
            raise
        except Exception as e:  # any other exception is a divergence, reported as such
            return Outcome(code=f"{type(e).__name__} (not a kvarena error)", error=e, foreign=True)
        order = self.geo.order
        if op == "copy_state":  # the new page's class, from the implementation's own translation
            (v,) = ids_of([result], op)
            return Outcome(value={page_of(self.alloc.translate(v))[0]: [v]})
        if op in ADMISSIONS:
            return Outcome(value=pages_of(result, op, order), plan=plan_of(result))
        if op in FREEING:
            return Outcome(value=ids_of(result, op))
        if op in PLANNING:
            return Outcome(plan=plan_of(result))
        if op == "read":
            return Outcome(value=tag_of(result))
        if op == "translate":
            return Outcome(value=page_of(result))
        return Outcome()

    def observe(self) -> Observation:
        return observe(self.alloc, self.geo.order)

    def close(self) -> None:
        close = getattr(self.alloc, "close", None)
        if callable(close):
            close()


def build(factory: Callable[[ArenaConfig], Any], config: ArenaConfig) -> Any:
    """factory(config), with anything but a kvarena error reported as an adapter problem."""
    try:
        return factory(config)
    except ArenaError:
        raise
    except Exception as e:
        name = getattr(factory, "__qualname__", repr(factory))
        raise AdapterError(f"the factory {name} raised {type(e).__name__}: {e} for {config_to_json(config)}; "
                           "a factory must build an allocator or raise a kvarena.spec.errors class") from e


def construct_pair(factory: Callable[[ArenaConfig], Any], config: ArenaConfig, level: str) -> tuple[Any, Any]:
    """Build the reference and the implementation for ``config`` and compare the outcome (the feasibility
    floor): (arena, alloc), (None, None) when both refuse, or (arena, None) when only the implementation
    refuses at ``safety`` or ``pool`` (it may be stricter: a bigger feasibility floor, ``CapacityTooSmall``, or a
    model geometry it cannot serve, ``ConfigError``, as SGLang's adapter refuses toy-two-float's page grids).
    Divergence otherwise."""
    ref_error = ""
    try:
        ref: Any = Arena(config)
        ref_code = None
    except ArenaError as e:
        ref, ref_code, ref_error = None, e.code, str(e)
    try:
        imp = build(factory, config)
        imp_code = None
    except ArenaError as e:
        imp, imp_code = None, e.code
    if ref_code == imp_code:
        return ref, imp
    cfg = json.dumps(config_to_json(config))
    if ref_code is not None and imp_code is None:
        closer = getattr(imp, "close", None)
        if callable(closer):
            closer()
        if ref_code != "CapacityTooSmall":  # an invalid configuration, not a floor question
            raise Divergence(f"config divergence: the reference refuses the configuration {cfg} with {ref_code} "
                             f"({ref_error}) but the implementation builds it; refuse the same configurations "
                             "(kvarena.spec.models.ArenaConfig.validate states the rules)")
        raise Divergence(f"INV-FEASIBILITY-FLOOR: the reference refuses {cfg} ({ref_code}: {ref_error}) but the "
                         "implementation builds it", inv="INV-FEASIBILITY-FLOOR")
    if ref_code is None and imp_code in ("CapacityTooSmall", "ConfigError") and level in OWN_POLICY:
        return ref, None  # stricter: a bigger floor, or a model geometry it does not serve (both skipped)
    raise Divergence(f"construct {cfg}: the reference {'builds it' if ref_code is None else 'raises ' + ref_code}, "
                     f"the implementation {'builds it' if imp_code is None else 'raises ' + imp_code}")


__all__ = ["CACHE", "OPS", "OPTIONAL_ARGS", "PLANNING", "Divergence", "Expect", "LiveReference", "Side", "Snapshot",
           "as_observation", "config_from_json", "config_to_json", "construct_pair"]
