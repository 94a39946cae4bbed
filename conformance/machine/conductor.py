"""The :class:`Conductor`: one step on the oracle and on the implementation, compared at a level.

The oracle (the live reference or a recorded vector, harness.py) says what a step does; the
implementation runs the same step (:class:`~kvarena.conformance.machine.harness.Side`); the conductor
reconciles the two answers, then checks the implementation's own state against every invariant
(conformance/machine/checks.py) and counts what the step exercised (conformance/machine/coverage.py).  At ``safety``
a state is checked before anything is undone: an admission that fits on the implementation only is
checked as placed, then taken back.  At ``pool`` the implementation's observation is a
:class:`~kvarena.conformance.adapter.protocol.PoolObservation` (byte ranges) checked by ``check_pool_observation``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvarena.conformance.adapter.protocol import (
    OWN_POLICY,
    POOL_HINT,
    AdapterError,
    BandlessObservation,
    Observation,
    PoolObservation,
    arena_like,
    check_adapter,
    ids_of,
    observe_pool,
    tag_of,
)
from kvarena.conformance.machine.checks import (
    Geometry,
    HeldPage,
    check_observation,
    check_pool_observation,
    obs_diff,
    withheld_set,
)
from kvarena.conformance.machine.coverage import Coverage
from kvarena.conformance.machine.harness import (
    ADMISSIONS,
    FREEING,
    PLACEMENT_DEPENDENT,
    PLANNING,
    REJECTED,
    Divergence,
    Expect,
    Outcome,
    Side,
    Snapshot,
    StopReplay,
    build,
    config_from_json,
)
from kvarena.spec.errors import ArenaError, InvariantViolation
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import UserKind

TRACE_LINES = 30  # a divergence prints the last steps that led there; --trace-lines 0 prints all
SWEEP_ROWS = 2048  # rows of one handed-out page the sweep reads in full (Conductor._fresh_rows)


@dataclass
class UserRecord:
    kind: str
    pages: list[tuple[int, str, int]]  # (handle, class, slot on the implementation at acquire time; pool: offset)
    nbytes: list[int] = field(default_factory=list)  # pool: each page's bytes at acquire time


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
    trace_lines: int = TRACE_LINES  # trace lines a divergence prints (0: all)
    cov: Coverage = field(default_factory=Coverage)
    _obs: Observation | PoolObservation | None = None
    _total: int | None = None  # pool: the bytes the pool manages, from its first observation
    _last_snapshot: dict | None = None
    _out: Outcome | None = None  # the implementation's outcome of the step in progress
    _moved: set[int] = field(default_factory=set)  # handles whose page moved after rows were written
    _sweep: set[int] = field(default_factory=set)  # handles whose unwritten rows are read after this step
    # the hand-out sweep: every page an admit / extend / copy_state returns has every unwritten row read (0) at that
    # step, whatever later steps do with it (False only to show what it catches: tests/fast/test_conform_boundary.py)
    sweep_handouts = True

    def __post_init__(self) -> None:
        if self.impl is not None:
            check_adapter(self.impl.alloc, self.geo.order)
            self._obs = self._observe()
            self.cov.constructions += 1
            self.cov.exposure["INV-FEASIBILITY-FLOOR"] += 1
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
        polls = self.completed_events()
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
        self._out = out
        self._account_outcome(op, out)
        result = self._reconcile(op, args, exp, out)
        # a refusal changes nothing, whatever the reference did, beyond its poll (spec §Ledger, Event users): with
        # completed events pending the state after the poll alone is not observable; ``exact`` still compares it
        unchanged = (not out.ok and not polls) or op in ("read", "translate")
        self.check_after(op, unchanged=unchanged, out=out if out.ok and exp.ok else None, args=args)
        return result

    # -- what the step exercised -------------------------------------------------------------------
    def _account_outcome(self, op: str, out: Outcome) -> None:
        cov = self.cov
        cov.ops[op] += 1
        if not out.ok:
            cov.refusals[out.code if not out.foreign else "foreign exception"] += 1
        if out.ok and (op == "share" or (op in ADMISSIONS and any(
                self.geo.kind[c] is Kind.RECURRENT for c, vs in (out.value or {}).items() if vs))):
            cov.exposure["INV-STATE-PRIVATE"] += 1
        if op == "copy_state":
            return  # an admission of one page, counted as the op (cov.ops) and the exposure above
        if op in ADMISSIONS:
            if out.ok:
                cov.admissions[f"rung {out.plan['rung']}" if out.plan else "rung not reported"] += 1
            elif out.code == REJECTED:
                cov.admissions["refused"] += 1

    def _account_change(self, before: Observation | PoolObservation | None, obs: Observation | PoolObservation) -> None:
        """Counters and invariant exposure of one change of the implementation's observation."""
        if before is None:
            return
        cov = self.cov
        placed = [v for v in obs.v2p if v not in before.v2p]
        freed = [v for v in before.v2p if v not in obs.v2p]
        moved = [v for v, p in obs.v2p.items() if v in before.v2p and before.v2p[v] != p]
        spans = getattr(obs, "spans", None) != getattr(before, "spans", None)  # pool: no spans
        cov.pages_placed += len(placed)
        cov.pages_moved += len(moved)
        imp = self.impl
        assert imp is not None
        for v in moved:  # a move must not land on stale bytes (hand-outs: swept from the step's results)
            h = imp.h.handle_of.get(v)
            if h is not None:
                self._sweep.add(h)
        if moved:
            read_held = {h for rec in self.users.values() if UserKind(rec.kind).mode.name == "READ"
                         for h, _c, _s in rec.pages}
            for v in moved:
                h = imp.h.handle_of.get(v)
                if h in read_held:
                    cov.moved_under_reader += 1
                if h in self.expected:
                    self._moved.add(h)
        b, a = withheld_set(before), withheld_set(obs)
        cov.frees_deferred += len(a - b)
        cov.withheld_released += len(b - a)
        changed = obs != before
        exp = cov.exposure
        if placed or moved or spans:
            exp["INV-NO-OVERLAP"] += 1
        if spans:
            exp["INV-BAND-ORDER"] += 1
        if changed and (self.users or before.withheld != obs.withheld):
            exp["INV-LEDGER-SAFETY"] += 1
        if (placed or moved or freed) and self.expected:
            exp["INV-PAGE-ATOMIC"] += 1
        if placed or moved:  # a hand-out must read zeroed, a move must carry every row
            exp["INV-CONTENT-FOLLOWS-VID"] += 1
        if obs.v2p != before.v2p:
            exp["INV-VMAP-BIJECTIVE"] += 1
        if changed:
            exp["INV-BYTE-CONSERVATION"] += 1

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
        self.cov.constructions += 1
        self.cov.exposure["INV-FEASIBILITY-FLOOR"] += 1
        stricter = self.level in OWN_POLICY and exp.ok and code == "CapacityTooSmall"
        if code != exp.code and not stricter:
            floor = code is None and exp.code == "CapacityTooSmall"
            kind = "" if floor or exp.ok else "config divergence: "
            self.fail(f"{kind}construct {json.dumps(args['config'])}: the reference "
                      f"{'builds it' if exp.ok else 'raises ' + str(exp.code)}, the implementation "
                      f"{'builds it' if code is None else 'raises ' + code}",
                      inv="INV-FEASIBILITY-FLOOR" if floor else None)
        return exp

    def fail(self, message: str, inv: str | None = None) -> None:
        where = self.where()
        head = f"{where}: " if where else ""
        if self.level != "pool" and (inv == "INV-BAND-ORDER" or (inv and "band" in message)) \
                and POOL_HINT not in message:
            message += f" ({POOL_HINT})"
        raise Divergence(f"{head}step {self.nstep} at level {self.level}: {message}", inv=inv,
                         trace=self.format_trace())

    def format_trace(self, limit: int | None = None) -> str:
        limit = self.trace_lines if limit is None else limit
        lines = self.steps[-limit:] if limit else self.steps
        skipped = len(self.steps) - len(lines)
        out = [f"config: {json.dumps(self.config_json)}",
               "trace (JSON lines; pages are logical handles, see conformance/vectors/FORMAT.md):"]
        if skipped:
            out.append(f"  ... {skipped} earlier lines (--trace-lines 0 prints them all)")
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
        elif op == "copy_state" and args["page"] in self.expected:  # the copy reads back the source's rows
            for h in (x for hs in (exp.pages or {}).values() for x in hs):
                self.expected[h] = dict(self.expected[args["page"]])
        elif op == "acquire":
            pages, nbytes = [], []
            if self.impl is not None:
                assert self._obs is not None
                sizes = getattr(self._obs, "pages", {})  # pool: the bytes each page has
                for p in args["pages"]:
                    vid = self.impl.h.resolve(p)
                    pages.append((p, *self._obs.v2p.get(vid, ("?", -1))))
                    nbytes.append(sizes[vid][2] if vid in sizes else 0)
            self.users[args["user"]] = UserRecord(args["kind"], pages, nbytes)
        elif op == "release":
            self.users.pop(args["user"], None)

    def completed_events(self) -> bool:
        """Whether the reference has an event user whose event completed: the next call that polls releases it."""
        users = getattr(getattr(self.oracle, "arena", None), "users", None) or {}
        return any(getattr(x, "event", None) is not None and x.event.query() for x in users.values())

    def _sync_users(self) -> None:
        """Forget the users the reference no longer has: event users its ``poll()`` released (spec §Ledger, Event
        users), which the implementation must have released at the same call."""
        live = getattr(getattr(self.oracle, "arena", None), "users", None)
        if live is not None:
            for u in [u for u in self.users if u not in live]:
                del self.users[u]

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
            if exp.code == REJECTED and level not in OWN_POLICY and (
                    dict(exp.shortfall or {}) != dict(out.shortfall or {})
                    or exp.shortfall_bytes != out.shortfall_bytes):
                self.fail(f"{op} {json.dumps(args)}: both reject, but the shortfall differs: reference "
                          f"{exp.shortfall} ({exp.shortfall_bytes} B), implementation {out.shortfall} "
                          f"({out.shortfall_bytes} B)")
            return exp
        refused = exp.code if not exp.ok else out.code  # one side refused, the other did not
        if level in OWN_POLICY and op in PLACEMENT_DEPENDENT and refused == REJECTED:
            return self._diverged_admission(op, args, exp, out)
        message = (f"{op} {json.dumps(args)}: the reference {self._describe(op, exp)}, the implementation "
                   f"{out.describe()}")
        broken = self._unsafe(out if out.ok and op in ADMISSIONS else None)
        if broken is not None:
            self.fail(f"{message}; and the implementation's state now breaks {broken.inv}: {broken}", inv=broken.inv)
        self.fail(message)
        raise AssertionError("unreachable")

    def _unsafe(self, placed: Outcome | None = None) -> InvariantViolation | None:
        """The invariant the implementation's current state breaks, if any (``placed``: an admission it
        made that the reference has no handles for: its pages count as live)."""
        imp = self.impl
        assert imp is not None
        try:
            obs = self._impl_observation()
        except Exception:  # the caller reports the step itself
            return None
        extra = {v: c for c, vs in placed.value.items() for v in vs} if placed is not None else {}
        try:
            self._invariants(obs, extra)
        except InvariantViolation as e:
            return e
        except Divergence:
            return None
        return None

    @staticmethod
    def _describe(op: str, exp: Expect) -> str:
        if exp.ok:
            return f"returns {json.dumps(exp.to_json(op)['returns'])}"
        extra = f" shortfall {exp.shortfall} ({exp.shortfall_bytes} B)" if exp.code == REJECTED else ""
        return f"raises {exp.code}{extra}"

    def _diverged_admission(self, op: str, args: Mapping[str, Any], exp: Expect, out: Outcome) -> Expect:
        """At ``safety`` and ``pool`` an admission may fit on one side only: undo it there and carry on."""
        imp = self.impl
        assert imp is not None
        if op == "relayout":
            return Expect(code=REJECTED)
        if exp.ok:  # the reference placed it, the implementation refused: undo on the reference
            undo = getattr(self.oracle, "undo_admission", None)
            if undo is None:
                raise StopReplay(f"step {self.nstep}: the implementation refused {op} {json.dumps(args)}, which the "
                                 f"reference admitted (allowed at {self.level}); later steps use its pages")
            undo(op, args, exp)
            side = "reference"
            self.cov.diverged["the reference only"] += 1
        else:  # the implementation placed it: check the state it reached, then undo there
            new = [v for vs in out.value.values() for v in vs]
            obs = self._observe()
            self._account_change(self._obs, obs)
            try:
                self._invariants(obs, {v: c for c, vs in out.value.items() for v in vs})
            except InvariantViolation as e:
                self.fail(f"{op} {json.dumps(args)} fits on the implementation only (the reference rejects it: "
                          f"allowed at {self.level}), but the state it placed breaks {e.inv}: {e}", inv=e.inv)
            self._check_data(self.oracle.live_pages())
            for c, vs in out.value.items() if self.sweep_handouts else ():  # handed out, if only for this step
                for v in vs:
                    self._fresh_rows(v, c, {}, f"{c} page (vid {v}, placed on the implementation only)")
            self._obs = obs
            try:
                if op == "admit" or (op == "copy_state" and args["owner"] not in self.oracle.owners()):
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
            self.cov.diverged["the implementation only"] += 1
        self.steps.append({"note": f"{self.level}: step {self.nstep} fits on the {side} only; undone there"})
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
                    if self.sweep_handouts:
                        self._sweep.add(h)
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
            if sorted(freed) != sorted(want_freed) or (self.level not in OWN_POLICY and freed != want_freed):
                self.fail(f"{op} {json.dumps(args)}: freed logical pages {freed}, the reference {want_freed}")
            for h in freed:
                imp.h.unbind(h)
        elif op == "read":  # exact at every level: the last tag written, 0 for a row never written
            if out.value != exp.value:
                self.fail(f"read {json.dumps(args)}: got {out.value}, the reference {exp.value}",
                          inv="INV-CONTENT-FOLLOWS-VID")
        elif op == "translate":
            want_t = tuple(exp.value)
            if out.value[0] != want_t[0] or (exact and tuple(out.value) != want_t):
                self.fail(f"translate {json.dumps(args)}: got {out.value}, the reference {list(want_t)}")
        elif op in PLANNING:
            if out.plan is not None and op == "compact" and args["max_moves"] is not None \
                    and len(out.plan["moves"]) > args["max_moves"]:
                self.fail(f"compact({args['max_moves']}) moved {len(out.plan['moves'])} pages")
            if out.plan is not None and op == "flush_idle":  # each move costs its page's bytes
                paid = sum(self.geo.page_bytes[m[0]] for m in out.plan["moves"])
                if paid > args["budget_bytes"]:
                    self.fail(f"flush_idle({args['budget_bytes']}) moved {paid} B of pages")
            if exact and out.plan is not None and exp.plan is not None and out.plan != exp.plan:
                self.fail(f"{op} {json.dumps(args)}: plan {out.plan}, the reference's {exp.plan}")

    # -- after every step ------------------------------------------------------------------------
    def check_after(self, op: str, unchanged: bool, out: Outcome | None = None,
                    args: Mapping[str, Any] | None = None) -> None:
        """The level's checks on the implementation's state after a step."""
        imp = self.impl
        assert imp is not None
        self._sync_users()
        before = self._obs
        obs = self._observe()
        self._account_change(before, obs)
        if unchanged:
            refused = op not in ("read", "translate")
            if refused:
                self.cov.exposure["INV-REFUSAL-IS-NOOP"] += 1
            if obs != before:
                what = "was refused" if refused else "was a query"
                message = f"{op} {what} but changed the observable state: {obs_diff(before, obs)}"
                try:
                    self._invariants(obs)
                except InvariantViolation as e:
                    self.fail(f"{message}; the state it left breaks {e.inv}: {e}", inv=e.inv)
                self.fail(message, inv="INV-REFUSAL-IS-NOOP" if refused else None)
        snap = self.oracle.snapshot()  # the snapshot in force
        pages = self.oracle.live_pages()  # live handle -> class
        try:
            self._invariants(obs)
        except InvariantViolation as e:
            self.fail(str(e), inv=e.inv)
        if op == "translate" and out is not None and args is not None:
            vid = imp.h.resolve(args["page"])
            at = obs.v2p.get(vid)  # pool: (class, offset); translate's slot is the pool's own index
            if (tuple(out.value) != at) if self.level != "pool" else (at is None or out.value[0] != at[0]):
                self.fail(f"translate({vid}) = {out.value} but observe() maps it to {obs.v2p.get(vid)}",
                          inv="INV-VMAP-BIJECTIVE")
        if op in ("read", "write") and args is not None:  # the page a row was read from or written to
            try:
                h = imp.h.handle_of.get(imp.h.resolve(args["page"]))
            except (KeyError, ValueError):
                h = None
            if h is not None:
                self._sweep.add(h)
        self._check_data(pages)
        if getattr(self.oracle, "fresh", True):  # owners are asserted where a snapshot is given
            self._check_held(snap)
        if self.level == "exact":
            want = snap.observation()
            if obs != want:
                self.fail("placement differs from the reference: "
                          + obs_diff(want, obs, "reference", "implementation"))
        self._obs = obs

    def _impl_observation(self) -> Observation | PoolObservation:
        imp = self.impl
        assert imp is not None
        if self.level == "pool":
            return observe_pool(imp.alloc, self.geo.order, self.geo.page_bytes, self.geo.capacity)
        return imp.observe()

    def _observe(self) -> Observation | PoolObservation:
        try:
            return self._impl_observation()
        except BandlessObservation as e:
            self.fail(str(e), inv="INV-BAND-ORDER")
            raise AssertionError("unreachable") from e
        except AdapterError:
            raise
        except Exception as e:
            self.fail(f"observe() raised {type(e).__name__}: {e}")
            raise AssertionError("unreachable") from e

    def _invariants(self, obs: Observation | PoolObservation, extra_live: Mapping[int, str] | None = None) -> None:
        """Every invariant on the implementation's state; raises InvariantViolation. ``extra_live``: pages
        the implementation holds that the reference has no handle for (an admission undone at safety)."""
        imp = self.impl
        assert imp is not None
        if self.deep and arena_like(imp.alloc) and self.level != "pool":
            from kvarena.reference.invariants import check_all

            check_all(imp.alloc)
        live = {}
        for h, c in self.oracle.live_pages().items():
            if h not in imp.h.vid_of:
                self.fail(f"logical page {h} is live in the reference but not on the implementation's side")
            live[imp.h.vid_of[h]] = c
        live.update(extra_live or {})
        holds = []
        for u, rec in self.users.items():
            mode = UserKind(rec.kind).mode
            for i, (h, c, s) in enumerate(rec.pages):
                vid = imp.h.vid_of.get(h)
                holds.append(HeldPage(u, mode, c, s, obs.v2p.get(vid) if vid is not None else None,
                                      rec.nbytes[i] if i < len(rec.nbytes) else 0))
        if isinstance(obs, PoolObservation):
            self._total = obs.total if self._total is None else self._total
            check_pool_observation(obs, self.geo, live, holds, self._total)
        else:
            check_observation(obs, self.geo, live, holds)

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
        """INV-CONTENT-FOLLOWS-VID: every written row of a live page reads back its last tag, whatever moved;
        every unwritten row reads 0 (a hand-out zeroes the page, every class) on the pages this step handed out
        (its results, at any level) or moved and the page a read or write named. Bounded: sweeping every live page
        every step tripled `kvarena conform --examples 30` against gpu/ (3.5 s -> 10.0 s); a stale byte shows where
        pages are handed out or moved, and stays until the page is read, moved or freed."""
        imp = self.impl
        assert imp is not None
        inv = "INV-CONTENT-FOLLOWS-VID"
        for h, rows in self.expected.items():
            vid = imp.h.vid_of[h]
            moved = h in self._moved
            for (entry, row), tag in rows.items():
                got = self._read(vid, entry, row)
                self.cov.rows_after_move += moved
                if got != tag:
                    self.fail(f"logical page {h} (vid {vid}) entry {entry} row {row} reads {got}, last written {tag} "
                              "(a move or free lost or mixed rows)", inv=inv)
        sweep, self._sweep = self._sweep, set()
        for h, cls in pages.items():
            if h in sweep:
                vid = imp.h.vid_of[h]
                self._fresh_rows(vid, cls, self.expected.get(h, {}), f"{cls} page {h} (vid {vid})")

    def _fresh_rows(self, vid: int, cls: str, written: Mapping[tuple[int, int], int], name: str) -> None:
        """Every unwritten row of a page reads 0: every row of every entry up to SWEEP_ROWS rows a page (every preset
        page and every vector's: hymba's window page has 1,792); above it, deterministically, every row of the first
        and last entries (the page's byte edges) and of every k-th entry between, offset by the virtual id."""
        entries, rows = self.geo.entries[cls], self.geo.rows[cls]
        k = -(-entries * rows // SWEEP_ROWS)
        for entry in range(entries):
            if k > 1 and entry not in (0, entries - 1) and (entry - vid) % k:
                continue
            for row in range(rows):
                if (entry, row) not in written:
                    got = self._read(vid, entry, row)
                    if got != 0:
                        self.fail(f"{name} entry {entry} row {row} was never written but reads {got}, not 0 (a "
                                  "handed-out page must read zeroed: no bytes of a freed page, of any class, may "
                                  "show through)", inv="INV-CONTENT-FOLLOWS-VID")

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


__all__ = ["Conductor", "UserRecord"]
