"""The lockstep harness: one trace, an oracle and an implementation, compared per level after every step.

A **trace** is a list of steps ``{"op": name, "args": {...}}`` in the language of
conformance/vectors/FORMAT.md.  Pages are named by **logical handle**: handle ``n`` is the
``n``-th page any admit / extend of the trace returned (classes in chain order, each class's pages
in the order returned), so an implementation with other virtual ids can follow the same trace.
``{"vid": v}`` names a raw virtual id (only ids that are never bound: negative or huge), and
``{"dead": n}`` the id handle ``n`` had before it was freed (used only while that id is unbound on
both sides: ids are reused).

The **oracle** is the reference run live (:class:`LiveReference`, for the lockstep machine and for
writing vectors) or a recorded vector (``kvarena.conformance.vectors.RecordedOracle``).  For each
step it yields an :class:`Expect` (what the reference returned or raised, in handle terms) and a
:class:`Snapshot` (pages, spans, holes, withheld, owners).  The :class:`Conductor` runs the same step
on the implementation (:class:`Side`) and compares what the level asks for (adapter.py, LEVELS).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvarena.conformance.adapter import (
    AdapterError,
    Observation,
    arena_like,
    as_observation,
    check_adapter,
    ids_of,
    observe,
    page_of,
    pages_of,
    plan_of,
    tag_of,
)
from kvarena.conformance.checks import Geometry, HeldPage, check_observation
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, InvariantViolation, PlanError
from kvarena.spec.layout import Kind
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
    "relayout": ("demand",),
    "write": ("page", "entry", "row", "tag"),
    "read": ("page", "entry", "row"),
    "translate": ("page",),
    "construct": ("config",),
}
PAGE_LIST_ARGS = ("shared", "pages")
ADMISSIONS = ("admit", "extend")
FREEING = ("drop", "slide", "free")
PLACEMENT_DEPENDENT = ("admit", "extend", "relayout")  # outcomes that may differ below `decisions`
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
            "mamba_full_memory_ratio": config.mamba_full_memory_ratio}


def config_from_json(d: Mapping[str, Any]) -> ArenaConfig:
    missing = [k for k in CONFIG_FIELDS if k not in d]
    if missing:
        raise ValueError(f"config lacks {missing}")
    return ArenaConfig(preset(d["model"]), d["capacity"], page_size=d["page_size"],
                       swa_full_tokens_ratio=d["swa_full_tokens_ratio"],
                       mamba_full_memory_ratio=d["mamba_full_memory_ratio"], max_context_len=d["max_context_len"])


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
        elif op in ("compact", "relayout"):
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
        if op in ("compact", "relayout"):
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
        if "demand" in out and isinstance(out["demand"], dict):
            out["demand"] = dict(out["demand"])  # the callee must not alias the trace
        if "kind" in out:
            out["kind"] = _kind(out["kind"])
        return out


def call(alloc: Any, op: str, a: Mapping[str, Any]) -> Any:
    """Call ``op`` on an allocator with resolved arguments (virtual ids, UserKind)."""
    if op == "admit":
        return alloc.admit(a["owner"], a["demand"], a["shared"])
    if op == "extend":
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
        return alloc.acquire(a["user"], a["kind"], a["pages"])
    if op == "release":
        return alloc.release(a["user"])
    if op == "compact":
        return alloc.compact(a["max_moves"])
    if op == "relayout":
        return alloc.relayout(a["demand"])
    if op == "write":
        return alloc.write(a["page"], a["entry"], a["row"], a["tag"])
    if op == "read":
        return alloc.read(a["page"], a["entry"], a["row"])
    if op == "translate":
        return alloc.translate(a["page"])
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

    def apply(self, op: str, args: Mapping[str, Any]) -> Expect:
        a = self.arena
        resolved = self.h.args_for_call(op, args)
        try:
            result = call(a, op, resolved)
        except PlanError as e:  # the reference's validator refused the reference's own plan
            raise AssertionError(f"the reference refused its own plan on {op} {args}: {e}; this is a bug in "
                                 "kvarena.reference (its planner and its plan validator disagree)") from e
        except ArenaError as e:
            return Expect(code=e.code, shortfall=getattr(e, "shortfall", None),
                          shortfall_bytes=getattr(e, "shortfall_bytes", None))
        except Exception as e:  # the reference itself failed: never a valid outcome
            raise AssertionError(f"the reference raised {type(e).__name__}: {e} on {op} {args}; this is a bug in "
                                 "kvarena.reference, not in the implementation") from e
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
        if op in ("compact", "relayout"):
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
        if op == "admit":
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
        if op in ADMISSIONS:
            return Outcome(value=pages_of(result, op, order), plan=plan_of(result))
        if op in FREEING:
            return Outcome(value=ids_of(result, op))
        if op in ("compact", "relayout"):
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
    refuses at ``safety`` (it may be stricter).  Divergence otherwise."""
    try:
        ref: Any = Arena(config)
        ref_code = None
    except ArenaError as e:
        ref, ref_code = None, e.code
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
        raise Divergence(f"INV-FEASIBILITY-FLOOR: the reference refuses {cfg} ({ref_code}) but the implementation "
                         "builds it", inv="INV-FEASIBILITY-FLOOR")
    if ref_code is None and imp_code == "CapacityTooSmall" and level == "safety":
        return ref, None
    raise Divergence(f"construct {cfg}: the reference {'builds it' if ref_code is None else 'raises ' + ref_code}, "
                     f"the implementation {'builds it' if imp_code is None else 'raises ' + imp_code}")


# ---------------------------------------------------------------------------------------------
# The conductor


@dataclass
class UserRecord:
    kind: str
    pages: list[tuple[int, str, int]]  # (handle, class, slot on the implementation at acquire time)


@dataclass
class Conductor:
    """Runs each step on the oracle and (if any) the implementation, and compares them at ``level``."""

    geo: Geometry
    oracle: Any  # LiveReference or a RecordedOracle
    impl: Side | None = None
    level: str = "exact"
    deep: bool = True  # also run kvarena.reference.invariants on an Arena-like implementation
    factory: Callable[[ArenaConfig], Any] | None = None  # for `construct` steps
    record_snapshots: bool = False
    allow_dead: bool = True  # rules may name freed handles' old ids (not in vectors: ids are reused)
    config_json: dict = field(default_factory=dict)
    where: Callable[[], str] = lambda: ""  # e.g. "file.jsonl:17" for a vector
    steps: list[dict] = field(default_factory=list)  # the trace so far (op lines and notes)
    users: dict[str, UserRecord] = field(default_factory=dict)
    expected: dict[int, dict[tuple[int, int], int]] = field(default_factory=dict)  # handle -> rows -> tag
    serial: int = 0
    nstep: int = 0
    _obs: Observation | None = None
    _last_snapshot: dict | None = None

    def __post_init__(self) -> None:
        if self.impl is not None:
            check_adapter(self.impl.alloc, self.geo.order)
            self._obs = self.impl.observe()
            self.check_after("construct", unchanged=False)

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    @property
    def order(self) -> tuple[str, ...]:
        return self.geo.order

    # -- one step --------------------------------------------------------------------------------
    def run(self, op: str, **args: Any) -> Expect:
        """One step on both sides; returns the reconciled outcome (ok only if the step took effect)."""
        self.nstep += 1
        if op == "construct":
            return self._construct(args)
        exp = self.oracle.apply(op, args)
        line: dict[str, Any] = {"step": self.nstep, "op": op, "args": args, "expect": exp.to_json(op)}
        self.steps.append(line)
        if self.record_snapshots:
            snap = self.oracle.snapshot().to_json()
            if snap != self._last_snapshot:
                line["snapshot"] = snap
                self._last_snapshot = snap
        if self.impl is None:
            self._bookkeep(op, args, exp)
            return exp
        out = self.impl.apply(op, args)
        result = self._reconcile(op, args, exp, out)
        unchanged = (not exp.ok and not out.ok) or (op in ("read", "translate"))
        self.check_after(op, unchanged=unchanged, out=out if out.ok and exp.ok else None, args=args)
        return result

    def _construct(self, args: Mapping[str, Any]) -> Expect:
        exp = self.oracle.construct(args)
        self.steps.append({"step": self.nstep, "op": "construct", "args": dict(args),
                           "expect": exp.to_json("construct")})
        if self.impl is None or self.factory is None:
            return exp
        config = config_from_json(args["config"])
        try:
            imp = build(self.factory, config)
            code = None
        except ArenaError as e:
            imp, code = None, e.code
        closer = getattr(imp, "close", None)
        if callable(closer):
            closer()
        stricter = self.level == "safety" and exp.ok and code == "CapacityTooSmall"
        if code != exp.code and not stricter:
            self.fail(f"construct {json.dumps(args['config'])}: the reference "
                      f"{'builds it' if exp.ok else 'raises ' + str(exp.code)}, the implementation "
                      f"{'builds it' if code is None else 'raises ' + code}",
                      inv="INV-FEASIBILITY-FLOOR" if code is None else None)
        return exp

    def fail(self, message: str, inv: str | None = None) -> None:
        where = self.where()
        head = f"{where}: " if where else ""
        raise Divergence(f"{head}step {self.nstep} at level {self.level}: {message}", inv=inv,
                         trace=self.format_trace())

    def format_trace(self, limit: int = 400) -> str:
        lines = self.steps[-limit:]
        skipped = len(self.steps) - len(lines)
        out = [f"config: {json.dumps(self.config_json)}",
               "trace (JSON lines; pages are logical handles, see conformance/vectors/FORMAT.md):"]
        if skipped:
            out.append(f"  ... {skipped} earlier lines")
        out.extend("  " + json.dumps({k: v for k, v in s.items() if k != "snapshot"}) for s in lines)
        return "\n".join(out)

    # -- bookkeeping shared by both sides ------------------------------------------------------
    def _bookkeep(self, op: str, args: Mapping[str, Any], exp: Expect) -> None:
        if not exp.ok:
            return
        if op in FREEING:
            for h in exp.freed or ():
                self.expected.pop(h, None)
        elif op == "write":
            self.expected.setdefault(args["page"], {})[(args["entry"], args["row"])] = args["tag"]
        elif op == "acquire":
            pages = []
            if self.impl is not None:
                assert self._obs is not None
                for p in args["pages"]:
                    vid = self.impl.h.resolve(p)
                    pages.append((p, *self._obs.v2p.get(vid, ("?", -1))))
            self.users[args["user"]] = UserRecord(args["kind"], pages)
        elif op == "release":
            self.users.pop(args["user"], None)

    def _reconcile(self, op: str, args: Mapping[str, Any], exp: Expect, out: Outcome) -> Expect:
        level = self.level
        if out.foreign:
            self.fail(f"{op} {json.dumps(args)}: the implementation raised {type(out.error).__name__}: {out.error}; "
                      f"the reference {self._describe(op, exp)}. Raise kvarena.spec.errors classes only")
        if exp.ok and out.ok:
            self._compare_returns(op, args, exp, out)
            self._bookkeep(op, args, exp)
            return exp
        if not exp.ok and not out.ok:
            if exp.code != out.code:
                self.fail(f"{op} {json.dumps(args)}: the reference raises {exp.code}, the implementation "
                          f"{out.describe()}")
            if exp.code == REJECTED and level != "safety" and (
                    dict(exp.shortfall or {}) != dict(out.shortfall or {})
                    or exp.shortfall_bytes != out.shortfall_bytes):
                self.fail(f"{op} {json.dumps(args)}: both reject, but the shortfall differs: reference "
                          f"{exp.shortfall} ({exp.shortfall_bytes} B), implementation {out.shortfall} "
                          f"({out.shortfall_bytes} B)")
            return exp
        refused = exp.code if not exp.ok else out.code  # one side refused, the other did not
        if level == "safety" and op in PLACEMENT_DEPENDENT and refused == REJECTED:
            return self._diverged_admission(op, args, exp, out)
        self.fail(f"{op} {json.dumps(args)}: the reference {self._describe(op, exp)}, the implementation "
                  f"{out.describe()}")
        raise AssertionError("unreachable")

    @staticmethod
    def _describe(op: str, exp: Expect) -> str:
        if exp.ok:
            return f"returns {json.dumps(exp.to_json(op)['returns'])}"
        extra = f" shortfall {exp.shortfall} ({exp.shortfall_bytes} B)" if exp.code == REJECTED else ""
        return f"raises {exp.code}{extra}"

    def _diverged_admission(self, op: str, args: Mapping[str, Any], exp: Expect, out: Outcome) -> Expect:
        """At ``safety`` an admission may fit on one side only: undo it there and carry on."""
        imp = self.impl
        assert imp is not None
        if op == "relayout":
            return Expect(code=REJECTED)
        if exp.ok:  # the reference placed it, the implementation refused: undo on the reference
            undo = getattr(self.oracle, "undo_admission", None)
            if undo is None:
                raise StopReplay(f"step {self.nstep}: the implementation refused {op} {json.dumps(args)}, which the "
                                 "reference admitted (allowed at safety); later steps use its pages")
            undo(op, args, exp)
            side = "reference"
        else:  # the implementation placed it: undo there
            new = [v for vs in out.value.values() for v in vs]
            try:
                if op == "admit":
                    freed = ids_of(imp.alloc.free(args["owner"]), "free")
                else:
                    freed = ids_of(imp.alloc.drop(args["owner"], new), "drop")
            except ArenaError as e:
                self.fail(f"undoing {op} {json.dumps(args)} on the implementation (it admitted, the reference "
                          f"rejected) raised {type(e).__name__}: {e}")
            if sorted(freed) != sorted(new):
                self.fail(f"undoing {op} {json.dumps(args)} on the implementation freed {sorted(freed)}, not the "
                          f"{sorted(new)} it had just placed")
            side = "implementation"
        self.steps.append({"note": f"safety: step {self.nstep} fits on the {side} only; undone there"})
        return Expect(code=REJECTED, shortfall=exp.shortfall, shortfall_bytes=exp.shortfall_bytes)

    def _compare_returns(self, op: str, args: Mapping[str, Any], exp: Expect, out: Outcome) -> None:
        imp = self.impl
        assert imp is not None
        exact = self.level == "exact"
        if op in ADMISSIONS:
            got: dict[str, list[int]] = out.value
            want = exp.pages or {}
            counts_got = {c: len(v) for c, v in got.items()}
            counts_want = {c: len(v) for c, v in want.items()}
            if counts_got != counts_want:
                self.fail(f"{op} {json.dumps(args)}: the implementation returned {counts_got} new pages per class, "
                          f"the demand is {counts_want}")
            for c in self.order:
                for h, v in zip(want.get(c, ()), got.get(c, ())):
                    if v in imp.h.handle_of:
                        self.fail(f"{op} {json.dumps(args)}: returned virtual id {v}, which is already live "
                                  f"(logical page {imp.h.handle_of[v]})", inv="INV-VMAP-BIJECTIVE")
                    imp.h.bind(h, v)
            if exact and got != (exp.vids or {}):
                self.fail(f"{op} {json.dumps(args)}: returned virtual ids {got}, the reference {exp.vids}")
            if exact and out.plan is not None and exp.plan is not None and out.plan != exp.plan:
                self.fail(f"{op} {json.dumps(args)}: plan {out.plan}, the reference's {exp.plan}")
        elif op in FREEING:
            unknown = [v for v in out.value if v not in imp.h.handle_of]
            if unknown:
                self.fail(f"{op} {json.dumps(args)}: reports freeing {unknown}, which are not live pages",
                          inv="INV-VMAP-BIJECTIVE")
            freed = [imp.h.handle_of[v] for v in out.value]
            want_freed = exp.freed or []
            if sorted(freed) != sorted(want_freed) or (self.level != "safety" and freed != want_freed):
                self.fail(f"{op} {json.dumps(args)}: freed logical pages {freed}, the reference {want_freed}")
            for h in freed:
                imp.h.unbind(h)
        elif op == "read":  # an unwritten token row (the reference reads None) may read anything
            if exp.value is not None and out.value != exp.value:
                self.fail(f"read {json.dumps(args)}: got {out.value}, the reference {exp.value}",
                          inv="INV-PAGE-ATOMIC")
        elif op == "translate":
            want_t = tuple(exp.value)
            if out.value[0] != want_t[0] or (exact and tuple(out.value) != want_t):
                self.fail(f"translate {json.dumps(args)}: got {out.value}, the reference {list(want_t)}")
        elif op in ("compact", "relayout"):
            if out.plan is not None and op == "compact" and args["max_moves"] is not None \
                    and len(out.plan["moves"]) > args["max_moves"]:
                self.fail(f"compact({args['max_moves']}) moved {len(out.plan['moves'])} pages")
            if exact and out.plan is not None and exp.plan is not None and out.plan != exp.plan:
                self.fail(f"{op} {json.dumps(args)}: plan {out.plan}, the reference's {exp.plan}")

    # -- after every step ------------------------------------------------------------------------
    def check_after(self, op: str, unchanged: bool, out: Outcome | None = None,
                    args: Mapping[str, Any] | None = None) -> None:
        """The level's checks on the implementation's state after a step."""
        imp = self.impl
        assert imp is not None
        before = self._obs
        try:
            obs = imp.observe()
        except AdapterError:
            raise
        except Exception as e:
            self.fail(f"observe() raised {type(e).__name__}: {e}")
        if unchanged and obs != before:
            self.fail(f"{op} {'was a query' if op in ('read', 'translate') else 'was refused'} but changed the "
                      f"observable state: {_obs_diff(before, obs)}")
        snap = self.oracle.snapshot()  # the snapshot in force
        pages = self.oracle.live_pages()  # live handle -> class
        try:
            if self.deep and arena_like(imp.alloc):
                from kvarena.reference.invariants import check_all

                check_all(imp.alloc)
            live = {}
            for h, c in pages.items():
                if h not in imp.h.vid_of:
                    self.fail(f"logical page {h} is live in the reference but not on the implementation's side")
                live[imp.h.vid_of[h]] = c
            holds = []
            for u, rec in self.users.items():
                mode = UserKind(rec.kind).mode
                for h, c, s in rec.pages:
                    vid = imp.h.vid_of.get(h)
                    holds.append(HeldPage(u, mode, c, s, obs.v2p.get(vid) if vid is not None else None))
            check_observation(obs, self.geo, live, holds)
        except InvariantViolation as e:
            self.fail(str(e), inv=e.inv)
        if op == "translate" and out is not None and args is not None:
            vid = imp.h.resolve(args["page"])
            if tuple(out.value) != obs.v2p.get(vid):
                self.fail(f"translate({vid}) = {out.value} but observe() maps it to {obs.v2p.get(vid)}",
                          inv="INV-VMAP-BIJECTIVE")
        self._check_data(pages)
        if getattr(self.oracle, "fresh", True):  # owners are asserted where a snapshot is given
            self._check_held(snap)
        if self.level == "exact":
            want = snap.observation()
            if obs != want:
                self.fail("placement differs from the reference: "
                          + _obs_diff(want, obs, "reference", "implementation"))
        self._obs = obs

    def _read(self, vid: int, entry: int, row: int) -> Any:
        imp = self.impl
        assert imp is not None
        try:
            return tag_of(imp.alloc.read(vid, entry, row))
        except AdapterError:
            raise
        except Exception as e:
            self.fail(f"read({vid}, {entry}, {row}) of a live page raised {type(e).__name__}: {e}")

    def _check_data(self, pages: Mapping[int, str]) -> None:
        """INV-PAGE-ATOMIC as data integrity: every written row reads back its last tag; fresh recurrent
        rows read 0."""
        imp = self.impl
        assert imp is not None
        for h, rows in self.expected.items():
            vid = imp.h.vid_of[h]
            for (entry, row), tag in rows.items():
                got = self._read(vid, entry, row)
                if got != tag:
                    self.fail(f"logical page {h} (vid {vid}) entry {entry} row {row} reads {got}, last written {tag} "
                              "(a move or free lost or mixed rows)", inv="INV-PAGE-ATOMIC")
        for h, cls in pages.items():
            if self.geo.kind[cls] is not Kind.RECURRENT:
                continue
            vid = imp.h.vid_of[h]
            written = self.expected.get(h, {})
            for entry in range(self.geo.entries[cls]):
                for row in range(self.geo.rows[cls]):
                    if (entry, row) not in written:
                        got = self._read(vid, entry, row)
                        if got != 0:
                            self.fail(f"recurrent page {h} (vid {vid}) entry {entry} row {row} was never written "
                                      f"but reads {got}, not 0 (a fresh slot must read as zeroed state)",
                                      inv="INV-PAGE-ATOMIC")

    def _check_held(self, snap: Snapshot) -> None:
        imp = self.impl
        assert imp is not None
        held = getattr(imp.alloc, "held", None)
        if not callable(held):
            return
        for owner, want in snap.owners.items():
            try:
                got_raw = held(owner)
            except Exception as e:
                self.fail(f"held({owner!r}) raised {type(e).__name__}: {e}")
            try:
                got = {c: [imp.h.handle_of[int(v)] for v in vs] for c, vs in dict(got_raw).items() if len(vs)}
            except (KeyError, TypeError, ValueError) as e:
                self.fail(f"held({owner!r}) = {got_raw!r:.200} names {e}, which is not a live page")
            if got != want:
                self.fail(f"owner {owner!r} holds {got} (logical pages), the reference {want}",
                          inv="INV-VMAP-BIJECTIVE")


def _obs_diff(a: Observation | None, b: Observation, an: str = "before", bn: str = "after") -> str:
    if a is None:
        return "no earlier observation"
    parts = []
    for f in ("v2p", "spans", "holes", "withheld"):
        x, y = getattr(a, f), getattr(b, f)
        if x != y:
            keys = sorted(set(x) | set(y), key=str)
            d = {k: (x.get(k), y.get(k)) for k in keys if x.get(k) != y.get(k)}
            parts.append(f"{f} ({an}, {bn}): {dict(list(d.items())[:8])}")
    return "; ".join(parts)


__all__ = ["CACHE", "OPS", "Conductor", "Divergence", "Expect", "LiveReference", "Side", "Snapshot",
           "as_observation", "config_from_json", "config_to_json", "construct_pair"]
