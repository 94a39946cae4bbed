"""Breadth-first exploration: every state reachable from the empty arena within the bounds, each checked.

One level at a time: every state of the frontier is checked (the reference's invariants, every written row
reading back its tag; with ``--impl``, the conductor's checks at the level, step by step), then every step of
the alphabet (alphabet.py) is applied to a copy of it. A refused step (or a query) must leave the state as it
was (``INV-REFUSAL-IS-NOOP``: the reference's snapshot, and the implementation's observation, compared) and
then the same copy serves the next step; a step that changed the state yields a successor, kept if its
canonical key (canon.py) is new. Because the search is breadth-first, the first violation found is reached by
a shortest trace, which is written in the vector format (conformance/vectors/FORMAT.md) so it can be
committed as a vector and replayed by ``kvarena conform --vectors``.

A state travels as the pickled conductor (conformance/machine/conductor.py): the reference, the
implementation, their handles and the trace that reached it. Expanding a level is the unit of work a backend
runs: in this process, or sharded by state hash across Ray workers (shard.py), with the same result.

    result = explore(Bounds(model="toy-tri"), progress=print)
"""

from __future__ import annotations

import copy
import io
import pickle
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from kvarena.conformance.explore.alphabet import QUERIES, alphabet, run_step
from kvarena.conformance.explore.canon import digest, state_key
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import CACHE, Divergence, LiveReference, config_from_json
from kvarena.conformance.machine.lockstep import start
from kvarena.reference.invariants import INVARIANTS, InvariantViolation
from kvarena.spec.errors import ArenaError

PROGRESS_EVERY = 10.0  # seconds between progress lines within a level
MAX_VIOLATIONS = 10  # kept of the level that found the first (each with its trace)


@dataclass(frozen=True)
class Bounds:
    """What is explored: a small arena of ``model`` and the search's limits."""

    model: str = "toy-tri"
    depth: int = 4  # steps from the empty arena
    max_states: int = 100_000  # stop adding states past this many
    pages: int = 1  # an admission's demand: 0..pages of each class
    capacity: int = 0  # bytes; 0: the smallest arena the reference builds
    page_size: int = 2
    max_context_len: int = 4
    impl: str | None = None  # MODULE:FACTORY replayed in lockstep; None: the reference alone
    level: str = "exact"
    deep: bool = True  # also run the reference's invariant predicates on an Arena-like implementation


@dataclass
class Violation:
    depth: int
    inv: str | None
    message: str
    steps: list[dict]  # the trace from the empty arena (vector step lines), the failing step last

    def to_json(self) -> dict:
        last = self.steps[-1] if self.steps else {}
        return {"depth": self.depth, "inv": self.inv, "message": self.message,
                "op": last.get("op"), "args": last.get("args"), "trace_steps": len(self.steps)}


@dataclass
class Expansion:
    """What expanding one state gave: its new successors (digest, pickled state) and counts."""

    children: list[tuple[bytes, Node]] = field(default_factory=list)
    transitions: int = 0
    refused: int = 0
    ops: Counter = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)


def _nowhere() -> str:
    return ""


Node = bytes | Conductor  # a state of the frontier: pickled, or (tensors inside) the conductor itself


def holds_tensors(obj: object) -> bool:
    """Whether pickling ``obj`` meets a torch tensor: plain pickle writes each tensor's storage on its own, so views
    of one tensor (gpu/'s page tables, its byte arena seen as words) would come back as separate copies."""
    torch = sys.modules.get("torch")  # an allocator holding tensors imported torch already
    if torch is None:
        return False
    found = []

    class Probe(pickle.Pickler):
        def persistent_id(self, x: object) -> None:
            if isinstance(x, (torch.Tensor, torch.UntypedStorage)):
                found.append(x)
            return None

    try:
        Probe(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception:  # not picklable at all: copy it as an object
        return True
    return bool(found)


def freeze(c: Conductor, by_object: bool) -> Node:
    """A successor for the frontier: the pickled conductor, or the conductor itself (it is not used again)."""
    return c if by_object else pickle.dumps(c, pickle.HIGHEST_PROTOCOL)


def thaw(node: Node) -> Conductor:
    """A working copy of a frontier state."""
    if isinstance(node, Conductor):  # the trace's lines are never changed once written: copy the list, not them
        return copy.deepcopy(node, {id(node.steps): list(node.steps)})
    return pickle.loads(node)


def load_impl(spec: str | None) -> Callable | None:
    if spec is None:
        return None
    from kvarena.conformance.adapter.protocol import load_factory

    return load_factory(spec)[1]


def smallest_capacity(bounds: Bounds) -> int:
    """The smallest capacity (bytes) the reference builds for the bounds' model, page size and context (the
    boundary scenarios' floor search, at the bounds' context)."""
    from kvarena.conformance.machine.boundary import feasibility_floor

    return feasibility_floor(bounds.model, bounds.page_size, context=bounds.max_context_len)


def root(bounds: Bounds, factory: Callable | None = None) -> Conductor:
    """The empty arena (and the implementation's), at the smallest capacity both build when none is given."""
    capacity = bounds.capacity or smallest_capacity(bounds)
    if factory is not None:  # a model geometry the implementation does not serve: say so, explore nothing else
        from kvarena.conformance.machine.harness import build
        from kvarena.spec.errors import ConfigError
        from kvarena.spec.models import ArenaConfig, preset
        from kvarena.text import UsageError

        try:
            build(factory, ArenaConfig(preset(bounds.model), capacity, page_size=bounds.page_size,
                                       max_context_len=bounds.max_context_len))
        except ConfigError as e:
            if e.code == "ConfigError":  # not its subclass CapacityTooSmall: a larger arena is tried below
                raise UsageError(f"{bounds.impl} does not serve {bounds.model}: ConfigError: {e}") from None
        except ArenaError:
            pass
    c = start(factory, bounds.model, capacity, bounds.page_size, level=bounds.level, deep=bounds.deep,
              max_context_len=bounds.max_context_len, step=64, fallback=None)
    c.where = _nowhere  # pickled with every state: a module-level function, not the default lambda
    c.trace_lines = 0
    return c


class Expander:
    """Expands states; keeps the digests it has emitted, so it sends each successor once."""

    def __init__(self, bounds: Bounds, seen: set[bytes] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.bounds = bounds
        self.seen: set[bytes] = set() if seen is None else seen
        self.progress = progress
        self.by_object = False  # states travel as objects (deep copies), not pickles: see holds_tensors

    def expand(self, node: Node, depth: int, grow: bool) -> Expansion:
        out = Expansion()
        c: Conductor | None = thaw(node)
        assert c is not None
        broken = check_state(c)
        if broken is not None:
            out.violations.append(Violation(depth, *broken, steps=list(c.steps)))
            return out
        if not grow:
            return out
        menu = list(alphabet(c, self.bounds.pages))  # names drawn here: every copy continues from this serial
        serial = c.serial
        for op, args in menu:
            if c is None:
                c = thaw(node)
                c.serial = serial
            mark, nstep = len(c.steps), c.nstep
            before = c.oracle.arena.snapshot()
            out.transitions += 1
            out.ops[op] += 1
            try:
                ok, code = run_step(c, op, args)
            except Divergence as e:
                out.violations.append(Violation(depth + 1, e.inv, str(e).split("\n")[0], list(c.steps)))
                c = None
                continue
            except AssertionError as e:  # the reference itself failed (harness.LiveReference says so)
                out.violations.append(Violation(depth + 1, None, str(e).split("\n")[0],
                                                [*c.steps, {"step": nstep + 1, "op": op, "args": args}]))
                c = None
                continue
            # the reference's own outcome (at safety the conductor undoes, on the reference, an admission the
            # implementation refused: that changes the reference and makes a new state, not a refusal)
            ref_ok = any("returns" in s.get("expect", {}) for s in c.steps[mark:])
            if not ref_ok or op in QUERIES:
                if c.oracle.arena.snapshot() != before:
                    what = f"refused with {code}" if not ref_ok else "a query"
                    out.violations.append(Violation(depth + 1, "INV-REFUSAL-IS-NOOP",
                                                    f"{op} {args} was {what} but changed the reference's state",
                                                    list(c.steps)))
                    c = None
                    continue
                if not ok or op in QUERIES:  # neither side changed (the conductor checked the implementation)
                    out.refused += not ok
                    del c.steps[mark:]
                    c.nstep = nstep
                    continue
            d = digest(state_key(c))
            if d not in self.seen:
                self.seen.add(d)
                out.children.append((d, freeze(c, self.by_object)))
            c = None
        return out

    def expand_many(self, nodes: Sequence[tuple[int, Node]], depth: int, grow: bool) -> list[tuple[int, Expansion]]:
        return [(i, self.expand(n, depth, grow)) for i, n in nodes]

    def expand_level(self, frontier: Sequence[tuple[bytes, Node]], depth: int,
                     grow: bool) -> list[tuple[int, Expansion]]:
        out, last = [], time.perf_counter()
        for i, (_d, n) in enumerate(frontier):
            out.append((i, self.expand(n, depth, grow)))
            if self.progress is not None and time.perf_counter() - last > PROGRESS_EVERY:
                last = time.perf_counter()
                self.progress(f"depth {depth}: {i + 1:,} of {len(frontier):,} states expanded")
        return out


def check_state(c: Conductor) -> tuple[str | None, str] | None:
    """The reference's invariants in this state, and every written row reading back its last tag."""
    a = c.oracle.arena
    for inv, check in INVARIANTS.items():
        try:
            check(a)
        except InvariantViolation as e:
            return e.inv, str(e)
        except Exception as e:  # a check's own failure on a broken state is that invariant's violation
            return inv, f"{type(e).__name__}: {e}"
    vid_of = c.oracle.h.vid_of
    for h, rows in c.expected.items():
        for (entry, row), tag in rows.items():
            try:
                got = a.read(vid_of[h], entry, row)
            except (ArenaError, KeyError) as e:
                return "INV-CONTENT-FOLLOWS-VID", f"page {h}'s written row ({entry}, {row}) cannot be read: {e}"
            if got != tag:
                return "INV-CONTENT-FOLLOWS-VID", f"page {h} entry {entry} row {row} reads {got}, last written {tag}"
    return None


class Backend(Protocol):
    """Expands a level: (frontier index, expansion) for every state of ``frontier`` ((digest, state) pairs)."""

    def expand_level(self, frontier: Sequence[tuple[bytes, Node]], depth: int,
                     grow: bool) -> list[tuple[int, Expansion]]: ...


@dataclass
class Result:
    bounds: Bounds
    capacity: int
    states: int = 0
    transitions: int = 0
    refused: int = 0
    depth_reached: int = 0
    per_depth: list[dict] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    truncated: bool = False  # stopped at max_states
    exhausted: bool = False  # the frontier emptied: every reachable state was seen
    seconds: float = 0.0
    workers: int = 1
    config_json: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"states": self.states, "transitions": self.transitions, "refused": self.refused,
                "violations": [v.to_json() for v in self.violations], "depth_reached": self.depth_reached,
                "exhausted": self.exhausted, "truncated": self.truncated, "per_depth": self.per_depth,
                "ops": dict(sorted(self.ops.items())), "seconds": round(self.seconds, 2), "workers": self.workers,
                "bounds": asdict(self.bounds), "config": self.config_json}

    def vector(self, i: int = 0) -> str:
        """Violation ``i``'s shortest trace as a vector file (conformance/vectors/FORMAT.md)."""
        from kvarena.conformance.vectors.replay import dumps_line, header_for

        v = self.violations[i]
        config = config_from_json(self.config_json)
        steps = renamed([s for s in v.steps if "expect" in s])
        head = header_for(f"explore-{self.bounds.model}", f"kvarena explore: {v.inv or 'failure'} at depth "
                          f"{v.depth}: {v.message}", config, steps, LiveReference(config).snapshot())
        return "\n".join(dumps_line(x) for x in [head, *steps]) + "\n"


def renamed(steps: list[dict]) -> list[dict]:
    """The trace with owners and users named r1, r2, ... and u1, u2, ... in order of appearance (the search draws
    names from one serial per state, so a shortest trace's names have gaps)."""
    names: dict[str, str] = {}
    fixed = {CACHE, "ghost", "never-acquired"}

    def name(x: str, prefix: str) -> str:
        if x in fixed:
            return x
        return names.setdefault(x, f"{prefix}{sum(1 for v in names.values() if v.startswith(prefix)) + 1}")

    out = []
    for s in steps:
        args = dict(s.get("args", {}))
        if "owner" in args:
            args["owner"] = name(args["owner"], "r")
        if "user" in args:
            args["user"] = name(args["user"], "u")
        out.append({**s, "args": args})
    return out


def explore(bounds: Bounds, progress: Callable[[str], None] | None = None, factory: Callable | None = None,
            sharded: Callable[[Bounds], Backend] | None = None, workers: int = 1) -> Result:
    """Breadth-first search to ``bounds.depth`` (or ``max_states``), stopping after the level of the first violation.
    ``factory``: the implementation itself, in this process (``bounds.impl`` then only names it); ``sharded``: a
    backend that expands each level elsewhere (shard.py's Ray actors, ``workers`` of them), states as pickles."""
    t0 = time.perf_counter()
    if factory is None:
        factory = load_impl(bounds.impl)
    elif sharded is not None:
        raise ValueError("a factory object cannot travel to other processes: name it in bounds.impl (MODULE:FACTORY)")
    c = root(bounds, factory)
    d0 = digest(state_key(c))
    visited: set[bytes] = {d0}
    by_object = c.impl is not None and holds_tensors(c.impl.alloc)
    if by_object and sharded is not None:
        from kvarena.text import UsageError

        raise UsageError(f"--ray ships states as pickles, and {bounds.impl}'s allocator holds torch tensors, whose "
                         "views do not survive pickling: run it without --ray (one process copies its states whole)")
    try:
        first = freeze(copy.deepcopy(c), by_object)
    except Exception as e:  # the allocator cannot be copied: say what to change, no traceback
        from kvarena.text import UsageError

        raise UsageError(f"explore copies the allocator at every state, and copy.deepcopy of {bounds.impl}'s raised "
                         f"{type(e).__name__}: {e}; make it copyable (a __deepcopy__, or drop references to modules "
                         "and open handles from its state)") from None
    backend: Backend
    if sharded is not None:
        backend = sharded(bounds)
    else:
        backend, workers = Expander(bounds, seen={d0}, progress=progress), 1
        backend.by_object = by_object
    result = Result(bounds, capacity=c.geo.capacity, workers=workers, config_json=dict(c.config_json))
    try:
        _search(bounds, backend, result, [(d0, first)], visited, progress, t0)
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    result.seconds = time.perf_counter() - t0
    return result


def _search(bounds: Bounds, backend: Backend, result: Result, frontier: list[tuple[bytes, Node]],
            visited: set[bytes], progress: Callable[[str], None] | None, t0: float) -> None:
    for depth in range(bounds.depth + 1):
        grow = depth < bounds.depth and not result.truncated
        nxt: list[tuple[bytes, Node]] = []
        level_t = time.perf_counter()
        expansions = backend.expand_level(frontier, depth, grow)
        expansions.sort(key=lambda x: x[0])
        for _i, ex in expansions:
            result.transitions += ex.transitions
            result.refused += ex.refused
            result.ops.update(ex.ops)
            result.violations.extend(ex.violations[:MAX_VIOLATIONS - len(result.violations)])
            for d, child in ex.children:
                if d in visited:
                    continue
                if len(visited) >= bounds.max_states:
                    result.truncated = True
                    continue
                visited.add(d)
                nxt.append((d, child))
        result.states = len(visited)
        result.depth_reached = depth
        result.per_depth.append({"depth": depth, "frontier": len(frontier), "new": len(nxt),
                                 "states": len(visited), "transitions": result.transitions,
                                 "seconds": round(time.perf_counter() - level_t, 2)})
        if progress:
            progress(f"depth {depth}: {len(frontier):,} states checked, {len(nxt):,} new, {len(visited):,} in all, "
                     f"{result.transitions:,} transitions, {time.perf_counter() - t0:.1f} s")
        if result.violations:
            break
        if not nxt:
            result.exhausted = grow
            break
        frontier = nxt
