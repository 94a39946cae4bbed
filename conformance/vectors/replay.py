"""Conformance vectors: traces with the reference's expected results, as JSON lines (vectors/FORMAT.md).

    write_all(dir)            # regenerate every vector of scenarios.VECTORS from the reference
    check_all(dir)            # [(name, problem)] where a committed file differs from the reference
    load(path)                # parse and validate a file (VectorFormatError names file:line)
    replay(path, factory, level)  # run one file against an implementation -> VectorResult

A vector names pages by logical handle (harness.py), so an implementation with its own virtual ids
replays it at ``safety`` and ``decisions``; at ``exact`` the raw ids in ``vids`` and the snapshots
must match too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvarena.conformance.adapter.protocol import FEATURES, OWN_POLICY, AdapterError, features
from kvarena.conformance.machine.checks import Geometry
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.coverage import Coverage
from kvarena.conformance.machine.harness import (
    ADMISSIONS,
    CONFIG_FIELDS,
    FREEING,
    OPS,
    OPTIONAL_ARGS,
    PLANNING,
    REJECTED,
    Divergence,
    Expect,
    LiveReference,
    Side,
    Snapshot,
    StopReplay,
    build,
    config_from_json,
    config_to_json,
)
from kvarena.spec.errors import ERROR_CODES, ArenaError
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, chain
from kvarena.spec.pools import float_hints

FORMAT = "kvarena-vectors"
VERSION = 1
VECTOR_DIR = Path(__file__).resolve().parent  # the committed *.jsonl beside this module


FEATURE_HELP = {"below": "the placement limit of admit / extend: both must take a `below` parameter"}


class VectorFormatError(ValueError):
    """A vector file that does not follow FORMAT.md; the message names the file and line."""


# ---------------------------------------------------------------------------------------------
# Writing


def header_for(name: str, description: str, config: ArenaConfig, steps: list[dict], snapshot: Snapshot) -> dict:
    geo = Geometry.of(config)
    classes = []
    for c in chain(config.model):
        classes.append({"name": c.name, "kind": c.kind.value, "window": c.window,
                        "rows": [[r.layer, r.part, list(r.shape), r.dtype] for r in c.rows],
                        "entry_bytes": entry_layout(c).entry_bytes, "page_bytes": geo.page_bytes[c.name],
                        "entries_per_page": geo.entries[c.name], "top": geo.top[c.name]})
    needs = requires(steps)
    return {"format": FORMAT, "version": VERSION, "name": name, "description": description,
            **({"requires": needs} if needs else {}),  # absent when empty: older files stay byte-identical
            "config": config_to_json(config), "order": list(geo.order), "classes": classes,
            "float_hints": float_hints(config), "steps": sum(1 for s in steps if "op" in s),
            "covers": coverage(steps), "snapshot": snapshot.to_json()}


def requires(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    """The optional features (adapter.FEATURES) the steps use: each optional argument is its own feature."""
    used = {k for s in steps if "op" in s for k in OPTIONAL_ARGS.get(s["op"], ()) if k in s["args"]}
    return [f for f in FEATURES if f in used]


def coverage(steps: Iterable[Mapping[str, Any]]) -> dict:
    """What a trace exercises: ops, (op, error code) pairs, rungs of admissions / compact / relayout."""
    ops: set[str] = set()
    errors: dict[str, set[str]] = {}
    rungs: set[int] = set()
    for s in steps:
        if "op" not in s:
            continue
        ops.add(s["op"])
        e = s["expect"]
        if "rejects" in e:
            errors.setdefault(s["op"], set()).add(e["rejects"])
        else:
            ret = e["returns"]
            plan = ret.get("plan") if s["op"] in ADMISSIONS else ret if s["op"] in PLANNING else None
            if plan:
                rungs.add(plan["rung"])
    return {"ops": sorted(ops), "errors": {op: sorted(v) for op, v in sorted(errors.items())}, "rungs": sorted(rungs)}


def dumps_line(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False)


def render(name: str, description: str, config: ArenaConfig, script: Callable[[Conductor, random.Random], None],
           seed: int) -> str:
    """Run ``script`` on the reference alone and render the vector file's text."""
    oracle = LiveReference(config)
    initial = oracle.snapshot()
    c = Conductor(Geometry.of(config), oracle, record_snapshots=True, allow_dead=False,
                  config_json=config_to_json(config))
    c._last_snapshot = initial.to_json()
    script(c, random.Random(seed))
    from kvarena.reference.invariants import check_all

    check_all(oracle.arena)
    lines = [dumps_line(header_for(name, description, config, c.steps, initial))]
    lines.extend(dumps_line(s) for s in c.steps)
    return "\n".join(lines) + "\n"


def write_all(directory: Path = VECTOR_DIR, only: Iterable[str] | None = None) -> list[tuple[str, int]]:
    """Regenerate the vector set into ``directory``; returns (file name, bytes) per file."""
    from kvarena.conformance.vectors.scenarios import VECTORS

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    keep = set(only) if only else None
    for v in VECTORS:
        if keep is not None and v.name not in keep:
            continue
        text = render(v.name, v.description, v.config(), v.script, v.seed)
        path = directory / f"{v.name}.jsonl"
        path.write_text(text)
        out.append((path.name, len(text.encode())))
    if keep is None:
        names = {f"{v.name}.jsonl" for v in VECTORS}
        for stale in directory.glob("*.jsonl"):
            if stale.name not in names:
                stale.unlink()
    return out


def check_all(directory: Path = VECTOR_DIR) -> list[tuple[str, str]]:
    """[(file, problem)] for every committed vector that differs from what the reference generates now."""
    from kvarena.conformance.vectors.scenarios import VECTORS

    problems = []
    names = set()
    for v in VECTORS:
        path = directory / f"{v.name}.jsonl"
        names.add(path.name)
        want = render(v.name, v.description, v.config(), v.script, v.seed)
        if not path.exists():
            problems.append((path.name, "missing; run `kvarena vectors --write`"))
            continue
        got = path.read_text()
        if got != want:
            g, w = got.splitlines(), want.splitlines()
            line = next((i + 1 for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)) + 1)
            problems.append((path.name, f"differs from the reference at line {line} (committed {len(g)} lines, "
                                        f"generated {len(w)}); run `kvarena vectors --write` and review the diff"))
    for extra in sorted(directory.glob("*.jsonl")):
        if extra.name not in names:
            problems.append((extra.name, "not generated by any scenario (stale); run `kvarena vectors --write`"))
    return problems


# ---------------------------------------------------------------------------------------------
# Reading and validating


@dataclass
class Step:
    line: int
    op: str
    args: dict
    expect: Expect
    snapshot: Snapshot | None


@dataclass
class Vector:
    path: Path
    header: dict
    config: ArenaConfig
    initial: Snapshot
    steps: list[Step] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.header.get("name", self.path.stem)


def _check_page_ref(ref: Any, live: set[int], dead_ok: set[int], err: Callable[[str], None]) -> None:
    if isinstance(ref, bool) or not isinstance(ref, (int, dict)):
        err(f"a page is a handle (int) or {{\"vid\": int}} / {{\"dead\": handle}}, got {ref!r}")
    if isinstance(ref, int):
        if ref not in live:
            err(f"page handle {ref} is not live here")
    elif set(ref) == {"vid"}:
        if not isinstance(ref["vid"], int):
            err(f"raw id {ref!r} is not an int")
    elif set(ref) == {"dead"}:
        if ref["dead"] not in dead_ok:
            err(f"{ref!r}: a dead handle may be named only after it was freed and before any later allocation")
    else:
        err(f"unknown page reference {ref!r}")


def _validate_snapshot(d: Any, order: list[str], err: Callable[[str], None]) -> Snapshot:
    if not isinstance(d, dict) or set(d) != {"pages", "spans", "holes", "withheld", "owners"}:
        err("snapshot needs exactly pages, spans, holes, withheld, owners")
    for f in ("spans", "holes", "withheld"):
        if set(d[f]) != set(order):
            err(f"snapshot.{f} must name every class of {order}")
    try:
        return Snapshot.from_json(d)
    except (TypeError, ValueError, KeyError) as e:
        err(f"malformed snapshot: {type(e).__name__}: {e}")
        raise AssertionError("unreachable") from None


def load(path: Path | str) -> Vector:
    """Parse and validate a vector file; VectorFormatError names the file, line and problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise VectorFormatError(f"{path}: cannot read: {e}") from None
    lines = text.splitlines()
    lineno = 0

    def err(msg: str) -> None:
        raise VectorFormatError(f"{path}:{lineno}: {msg}")

    def parse(raw: str) -> Any:
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            err(f"not JSON ({e.msg} at column {e.colno})")

    if not lines:
        lineno = 1
        err("empty file: the first line must be the header (see conformance/vectors/FORMAT.md)")
    lineno = 1
    header = parse(lines[0])
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        err(f"the first line must be a header object with \"format\": \"{FORMAT}\"")
    if header.get("version") != VERSION:
        err(f"format version {header.get('version')!r} is not supported (this harness reads version {VERSION})")
    needs = header.get("requires", [])
    if not isinstance(needs, list) or any(f not in FEATURES for f in needs):
        err(f"header.requires {needs!r}: a list of the optional features {list(FEATURES)} (this harness knows no "
            "other; a newer kvarena may)")
    cfg = header.get("config")
    if not isinstance(cfg, dict) or any(k not in cfg for k in CONFIG_FIELDS):
        err(f"header.config must have {list(CONFIG_FIELDS)}")
    try:
        config = config_from_json(cfg)
        order = list(Geometry.of(config).order)
    except (ArenaError, ValueError, TypeError) as e:
        err(f"header.config does not describe a configuration: {e}")
    if header.get("order") != order:
        err(f"header.order {header.get('order')} is not the chain order {order} of {cfg['model']}")
    if "float_hints" in header and header["float_hints"] != float_hints(config):
        err(f"header.float_hints {header['float_hints']} != {float_hints(config)}, the exact-rational sizing of "
            "spec/arena.md §Split-pool baseline for this config")
    initial = _validate_snapshot(header.get("snapshot"), order, err)
    vec = Vector(path, header, config, initial)
    live: set[int] = set(initial.pages)
    next_handle = max(live, default=-1) + 1
    dead_ok: set[int] = set()
    for lineno, raw in enumerate(lines[1:], start=2):  # err() reads lineno
        if not raw.strip():
            err("blank line (every line is one JSON object)")
        d = parse(raw)
        if not isinstance(d, dict):
            err("every line must be a JSON object")
        if "note" in d and "op" not in d:
            continue
        op = d.get("op")
        if op not in OPS:
            err(f"unknown op {op!r}; the ops are {sorted(OPS)}")
        args = d.get("args")
        optional = OPTIONAL_ARGS.get(op, ())
        if not isinstance(args, dict) or not set(OPS[op]) <= set(args) <= set(OPS[op]) | set(optional):
            got = sorted(args) if isinstance(args, dict) else args
            more = f" (optionally {list(optional)})" if optional else ""
            err(f"{op} takes exactly the args {list(OPS[op])}{more}, got {got!r}")
        for k in optional:
            if k in args and k not in needs:
                err(f"args.{k} is an optional feature: the header must list it in \"requires\" (FORMAT.md §Features)")
        if d.get("step") != len(vec.steps) + 1:
            err(f"step number {d.get('step')!r}, expected {len(vec.steps) + 1}")
        for k in ("shared", "pages"):
            if k in args:
                if not isinstance(args[k], list):
                    err(f"args.{k} must be a list of pages")
                for ref in args[k]:
                    _check_page_ref(ref, live, dead_ok, err)
        if "page" in args:
            _check_page_ref(args["page"], live, dead_ok, err)
        e = d.get("expect")
        if not isinstance(e, dict) or (("returns" in e) == ("rejects" in e)):
            err("expect must have exactly one of \"returns\" and \"rejects\"")
        if "rejects" in e:
            if e["rejects"] not in ERROR_CODES:
                err(f"unknown error code {e['rejects']!r}; codes are {sorted(ERROR_CODES)}")
            if e["rejects"] == REJECTED and not (isinstance(e.get("shortfall"), dict)
                                                 and isinstance(e.get("shortfall_bytes"), int)):
                err("an AdmissionRejected expectation needs shortfall (class -> pages) and shortfall_bytes")
        elif op in ADMISSIONS:
            ret = e["returns"]
            if not isinstance(ret, dict) or not isinstance(ret.get("pages"), dict) or not isinstance(ret.get("vids"),
                                                                                                     dict):
                err(f"{op} returns {{\"pages\": {{class: [handles]}}, \"vids\": {{class: [ids]}}, \"plan\": ...}}")
            if {c: len(v) for c, v in ret["pages"].items()} != {c: len(v) for c, v in ret["vids"].items()}:
                err("returns.pages and returns.vids must list as many pages per class")
            for c in order:
                for h in ret["pages"].get(c, ()):
                    if h != next_handle:
                        err(f"new page handle {h}; handles are numbered in order (expected {next_handle})")
                    live.add(h)
                    next_handle += 1
            if any(c not in order for c in ret["pages"]):
                err(f"returns.pages names a class outside {order}")
            dead_ok.clear()
        elif op in FREEING:
            ret = e["returns"]
            if not isinstance(ret, list) or any(h not in live for h in ret):
                err(f"{op} returns the freed page handles, each live before the step; got {ret!r}")
            live.difference_update(ret)
            dead_ok.update(ret)
        snap = None
        if "snapshot" in d:
            snap = _validate_snapshot(d["snapshot"], order, err)
            if set(snap.pages) != live:
                err(f"snapshot.pages lists handles {sorted(set(snap.pages) ^ live)[:8]} inconsistently with the "
                    "steps (every live handle, no other)")
        try:
            expect = Expect.from_json(op, e)
        except (KeyError, TypeError, AttributeError) as x:
            err(f"malformed expect for {op}: {type(x).__name__}: {x}")
        vec.steps.append(Step(lineno, op, args, expect, snap))
    declared = header.get("steps")
    if declared is not None and declared != len(vec.steps):
        lineno = 1
        err(f"header says {declared} steps, the file has {len(vec.steps)}")
    return vec


def discover(directory: Path | str) -> list[Path]:
    d = Path(directory)
    if d.is_file():
        return [d]
    if not d.is_dir():
        raise VectorFormatError(f"{d}: no such vector file or directory")
    files = sorted(d.glob("*.jsonl"))
    if not files:
        raise VectorFormatError(f"{d}: no *.jsonl vector files here")
    return files


# ---------------------------------------------------------------------------------------------
# Replaying against an implementation


class RecordedOracle:
    """The oracle of a recorded vector: each step's expectation and the snapshot in force."""

    def __init__(self, initial: Snapshot) -> None:
        self.snap = initial
        self.fresh = True  # whether the current step gave the snapshot in force
        self.live = {h: c for h, (c, _s, _v) in initial.pages.items()}  # from the steps' results
        self.current: Step | None = None

    def apply(self, op: str, args: Mapping[str, Any]) -> Expect:
        st = self.current
        assert st is not None
        self.fresh = st.snapshot is not None
        if st.snapshot is not None:
            self.snap = st.snapshot
        e = st.expect
        if e.ok and op in ADMISSIONS:
            for c, hs in (e.pages or {}).items():
                self.live.update(dict.fromkeys(hs, c))
        elif e.ok and op in FREEING:
            for h in e.freed or ():
                self.live.pop(h, None)
        return e

    def live_pages(self) -> dict[int, str]:
        return dict(self.live)

    def construct(self, args: Mapping[str, Any]) -> Expect:
        assert self.current is not None
        return self.current.expect

    def snapshot(self) -> Snapshot:
        return self.snap


@dataclass
class VectorResult:
    path: Path
    status: str  # "passed" | "failed" | "stopped" (allowed at safety and pool; the reason is in message)
    steps_run: int
    steps: int
    message: str = ""
    inv: str | None = None
    summary: str = ""  # the failing step's one-line description (message adds the trace)
    coverage: Coverage = field(default_factory=Coverage)  # what the implementation was made to do


def replay(vec: Vector | Path | str, factory: Callable[[ArenaConfig], Any], level: str,
           deep: bool = True, trace_lines: int | None = None) -> VectorResult:
    """Run one vector against ``factory``'s allocator at ``level``."""
    if not isinstance(vec, Vector):
        vec = load(vec)
    geo = Geometry.of(vec.config)
    try:
        alloc = build(factory, vec.config)
    except ArenaError as e:
        if level in OWN_POLICY and e.code == "CapacityTooSmall":
            return VectorResult(vec.path, "stopped", 0, len(vec.steps),
                                f"the implementation refuses the configuration ({e.code}; allowed at {level})")
        return VectorResult(vec.path, "failed", 0, len(vec.steps),
                            f"{vec.path}:1: the implementation refuses the configuration {vec.header['config']}: "
                            f"{e.code}: {e}")
    missing = [f for f in vec.header.get("requires", ()) if f not in features(alloc)]
    if missing:  # refused, never replayed with the argument dropped
        close = getattr(alloc, "close", None)
        if callable(close):
            close()
        return VectorResult(vec.path, "stopped", 0, len(vec.steps),
                            f"not replayed: the vector requires {', '.join(missing)} (optional; "
                            f"{FEATURE_HELP[missing[0]]}), which the implementation does not offer")
    oracle = RecordedOracle(vec.initial)
    current = [1]
    side = Side(alloc, geo)
    cov = Coverage()
    extra = {} if trace_lines is None else {"trace_lines": trace_lines}
    c: Conductor | None = None
    try:
        c = Conductor(geo, oracle, side, level=level, deep=deep, factory=factory, config_json=vec.header["config"],
                      where=lambda: f"{vec.path.name}:{current[0]}", cov=cov, **extra)
        for st in vec.steps:
            current[0] = st.line
            oracle.current = st
            c.run(st.op, **st.args)
    except StopReplay as e:
        return VectorResult(vec.path, "stopped", c.nstep if c else 0, len(vec.steps), str(e), coverage=cov)
    except Divergence as e:
        return VectorResult(vec.path, "failed", current[0], len(vec.steps), str(e), e.inv, e.summary, coverage=cov)
    except AdapterError:
        raise
    finally:
        side.close()
    return VectorResult(vec.path, "passed", len(vec.steps), len(vec.steps), coverage=cov)
