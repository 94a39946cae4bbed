"""``kvarena replay``: one mixed trace through the unified arena and the split-pool baseline.

A deliberately simple step-driven scheduler (FIFO, head-of-line admission, one
token per request per step, retract-newest on decode OOM; kvarena/simulator/scheduler.py SIMPLE,
shared with ``kvarena simulate``) drives both allocators through the same API;
the invariants are checked as it goes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.split import SplitPools
from kvarena.simulator.arrivals import Arrival, TraceSource
from kvarena.simulator.budget import GiB
from kvarena.simulator.engines import smallest_capacity
from kvarena.simulator.mixed_trace import build_trace, kv_budget, phase_sizes
from kvarena.simulator.scheduler import SIMPLE, SchedulerInvariantError, SchedulerModel
from kvarena.simulator.scheduler import run as run_scheduler
from kvarena.spec.errors import ArenaError, CapacityTooSmallError
from kvarena.spec.models import PRESETS, ArenaConfig, preset
from kvarena.spec.pools import split_regions
from kvarena.text import MAX_REQUESTS, UsageError, _floor, check_arena_size, check_requests, check_run_flags, gib

# ---- scheduler model (kvarena/simulator/scheduler.py SIMPLE, shared with `kvarena simulate`) ------
# Decode headroom kept at admission, as SGLang's new_token_ratio: reserve this share of every
# running request's remaining output. It decays each step (admitting more) and resets on a
# retraction, so the scheduler probes memory the way SGLang's does.
NEW_TOKEN_RATIO = SIMPLE.new_token_ratio  # initial, floor, decay per step: (0.7, 0.1, 0.001)
FWD_REQUESTS = 4  # requests whose pages a simulated forward pass holds in the ledger each step
DEFAULT_CHECK_EVERY = 200  # steps between full invariant checks (O(arena) each)
STALL_STEPS = 50_000  # far beyond any request's output plus its wait in the built-in trace
ReplayInvariantError = SchedulerInvariantError


@dataclass
class Metrics:
    """What one configuration's replay measured: the rows of the table."""

    config: str
    requests: int = 0
    admitted: int = 0  # successful admit() calls, re-admissions after retraction included
    completed: int = 0
    max_active: int = 0
    rejected_headroom: int = 0  # steps the queue head waited: not enough free pages + decode reserve
    rejected_ladder: int = 0  # steps the queue head waited: the allocator refused (AdmissionRejected)
    retractions: int = 0
    forward_waits: int = 0  # refused allocations retried after the in-flight forward released its pages
    mean_wait_steps: float = 0.0
    steps: int = 0
    moves: dict[int, int] = field(default_factory=dict)  # rung -> pages moved
    bytes_moved: dict[int, int] = field(default_factory=dict)  # rung -> bytes moved
    rung_used: dict[int, int] = field(default_factory=dict)  # rung -> admit / extend calls it placed
    peak_utilization: float = 0.0  # max over steps of (live + withheld bytes) / capacity
    invariant_checks: int = 0
    operations: int = 0  # allocator calls (admit / extend / slide / free / acquire / release)
    wall_s: float = 0.0


class Progress:
    """On a TTY one carriage-return line holding every side in flight (at most 10 updates a second), else
    lines at 25 / 50 / 75 % per side."""

    def __init__(self, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty, self._last = self.stream.isatty(), 0.0
        self._quarter: dict[str, int] = {}
        self._shown: dict[str, tuple[int, int, int, int]] = {}  # label -> (done, total, step, active)

    def __call__(self, label: str, done: int, total: int, step: int, active: int) -> None:
        if self.tty:
            self._shown[label] = (done, total, step, active)
            finished = all(d == t for d, t, _, _ in self._shown.values())
            if time.monotonic() - self._last >= 0.1 or finished:
                self._last = time.monotonic()
                line = " | ".join(f"{lbl} {100 * d // t:3d}% {d:,}/{t:,} done, step {s:,}, active {a:,}"
                                  for lbl, (d, t, s, a) in self._shown.items())
                self.stream.write(f"\r{line}   " + ("\n" if finished else ""))
                self.stream.flush()
                if finished:
                    self._shown.clear()
            return
        quarter = self._quarter.get(label, 0)
        if total > done and done * 4 >= (quarter + 1) * total:
            self._quarter[label] = 4 * done // total
            print(f"{label}: {25 * self._quarter[label]}% ({done:,}/{total:,} requests, step {step:,})",
                  file=self.stream, flush=True)
        if done == total:
            self._quarter.pop(label, None)


def replay(alloc: Arena, trace: list[Arrival], label: str, check_every: int = DEFAULT_CHECK_EVERY,
           progress: Callable[[str, int, int, int, int], None] | None = None, seed: int = 0) -> Metrics:
    """Run ``trace`` through ``alloc`` (the shared scheduler model, one whole prompt per step, clock in
    steps); raises ReplayInvariantError on the first violation."""
    model = SchedulerModel(**{**SIMPLE.__dict__, "new_token_ratio": NEW_TOKEN_RATIO, "forward_requests": FWD_REQUESTS,
                              "check_every": check_every, "stall_steps": STALL_STEPS})
    r = run_scheduler(alloc, TraceSource(trace), label, model, seed=seed, progress=progress,
                      check=lambda a: check_all(a))  # looked up at call time (tests plant a broken check)
    return Metrics(label, r.requests, r.admitted, r.completed, r.max_active, r.rejected_headroom,
                   r.rejected_ladder, r.retractions, r.forward_waits, r.mean_wait_steps, r.steps, r.moves,
                   r.bytes_moved, r.rung_used, r.peak_utilization, r.invariant_checks, r.operations, r.wall_s)


SIDES = (("unified arena", Arena), ("split pools", SplitPools))


def compare(config: ArenaConfig, seed: int = 0, scale: float = 1.0, check_every: int = DEFAULT_CHECK_EVERY,
            progress: Callable[[str, int, int, int, int], None] | None = None, jobs: int = 2
            ) -> tuple[list[Arrival], list[Metrics]]:
    """The same trace through the unified arena and the split pools. With ``jobs`` >= 2 the split side runs
    in a child process while this one runs the unified side: the sides share nothing, so the metrics are the
    same as one after the other (tested), in about half the wall time on two cores."""
    trace = build_trace(config, seed, scale)
    if jobs < 2:
        return trace, [replay(kind(config), trace, label, check_every, progress, seed) for label, kind in SIDES]
    # fork where there is one: the child starts at once, without pickling the trace or re-importing
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    events = ctx.SimpleQueue()
    (label_a, kind_a), (label_b, _) = SIDES
    child = ctx.Process(target=_side, args=(1, config, trace, check_every, seed, events, progress is not None),
                        name=f"kvarena replay: {label_b}", daemon=True)
    child.start()
    other: list = []

    def drain() -> None:  # the child's progress, shown by this process; its result kept for below
        while not other and not events.empty():
            kind, payload = events.get()
            if kind == "progress":
                progress(*payload)
            else:
                other.append((kind, payload))

    def local(*a) -> None:
        progress(*a)
        drain()

    try:
        mine = replay(kind_a(config), trace, label_a, check_every, local if progress else None, seed)
        while not other:
            if events.empty():
                if not child.is_alive() and events.empty():
                    raise RuntimeError(f"kvarena replay: the {label_b} process died (exit code {child.exitcode}) "
                                       "before it reported; rerun with --jobs 1 to see its error here")
                time.sleep(0.02)
            drain()
    finally:
        if child.is_alive() and not other:
            child.terminate()  # this side failed: the other side's result is not needed
        child.join()
    kind, payload = other[0]
    if kind == "error":
        raise payload
    return trace, [mine, payload]


def _side(index: int, config: ArenaConfig, trace: list[Arrival], check_every: int, seed: int, events,
          report: bool) -> None:
    """One side of ``compare`` in a child process; progress at each whole percent, then its Metrics or error."""
    label, kind = SIDES[index]
    last = [-1]

    def progress(lbl: str, done: int, total: int, step: int, active: int) -> None:
        pct = 100 * done // total
        if pct != last[0]:
            last[0] = pct
            events.put(("progress", (lbl, done, total, step, active)))

    try:
        events.put(("done", replay(kind(config), trace, label, check_every, progress if report else None, seed)))
    except Exception as e:  # any failure goes to the parent, which raises it
        try:
            events.put(("error", e))
        except Exception:  # it does not pickle: send its type and message
            events.put(("error", RuntimeError(f"{label}: {type(e).__name__}: {e}")))


def format_table(results: list[Metrics]) -> str:
    def mib(b: int) -> str:
        return f"{b / (1 << 20):,.1f} MiB"

    rows: list[tuple[str, Callable[[Metrics], str]]] = [
        ("requests admitted (incl. re-admits)", lambda x: f"{x.admitted:,}"),
        ("requests completed", lambda x: f"{x.completed:,} / {x.requests:,}"),
        ("max active requests", lambda x: f"{x.max_active:,}"),
        ("admission rejections: no headroom", lambda x: f"{x.rejected_headroom:,}"),
        ("admission rejections: ladder", lambda x: f"{x.rejected_ladder:,}"),
        ("retractions (decode out of memory)", lambda x: f"{x.retractions:,}"),
        ("waits for the forward pass (ledger)", lambda x: f"{x.forward_waits:,}"),
        ("mean queue wait (steps)", lambda x: f"{x.mean_wait_steps:,.1f}"),
        ("steps to drain the trace", lambda x: f"{x.steps:,}"),
        ("rung 2 (compact): placements", lambda x: f"{x.rung_used.get(2, 0):,}"),
        ("rung 2: pages / bytes moved", lambda x: f"{x.moves[2]:,} / {mib(x.bytes_moved[2])}"),
        ("rung 3 (relayout): placements", lambda x: f"{x.rung_used.get(3, 0):,}"),
        ("rung 3: pages / bytes moved", lambda x: f"{x.moves[3]:,} / {mib(x.bytes_moved[3])}"),
        ("peak utilization (used / capacity)", lambda x: f"{100 * x.peak_utilization:.1f} %"),
        ("invariant checks passed", lambda x: f"{x.invariant_checks:,}"),
        ("allocator operations", lambda x: f"{x.operations:,}"),
        ("wall time", lambda x: f"{x.wall_s:.1f} s"),
    ]
    w = max(24, *(len(fn(x)) + 2 for _, fn in rows for x in results))
    lines = [f"{'':<36}" + "".join(f"{x.config:>{w}}" for x in results)]
    lines += [f"{name:<36}" + "".join(f"{fn(x):>{w}}" for x in results) for name, fn in rows]
    return "\n".join(lines)


HELP = """\
Replay one deterministic request trace through two allocators over the same bytes, and compare:
  unified arena  the reference Arena: one byte range, bands grow toward each other; the admission
                 ladder reuses holes (rung 1), compacts the end bands (rung 2), moves float bands (rung 3)
  split pools    SGLang's fixed per-class pools, sized by --swa-full-tokens-ratio 0.8 /
                 --mamba-full-memory-ratio 0.9; nothing grows or moves

The built-in trace (kvarena/simulator/mixed_trace.py) has three phases, each sized to the KV budget so that
both allocators must queue:
  long     a burst of 32K-100K-token prompts with 256-1024 output tokens
  short    a high-concurrency stream of ~1K-token prompts with ~256 output tokens
  mixed    60% short, 35% medium (2K-16K in), 5% long prompts

Scheduler model, kept simple on purpose (SIMPLE in kvarena/simulator/scheduler.py; `kvarena simulate`
runs SGLang's own rules instead). Each step, every running request decodes one token. At a
page boundary it extends one full page (and one window page), then slides out the window pages
that lie wholly outside the window. The FIFO queue is admitted head-of-line while the free pages
cover the prompt plus a decode reserve. The reserve is a share of the running requests' remaining
output, as SGLang's new_token_ratio: it starts at 0.7, decays to 0.1 and resets on a retraction.
If an extend is refused, the newest request is retracted and re-queued at the front. A simulated
forward pass holds a few pages in the ledger each step, so moved pages are withheld.
All invariants are checked every --check-every steps and at the end. A violation exits 1.

Rows of the table:
  admitted            successful admit() calls; a re-admission after a retraction counts again
  max active          the most requests running at once
  rejections          steps the queue head waited: "no headroom" = free pages short of prompt +
                      reserve; "ladder" = the allocator refused (AdmissionRejected)
  retractions         extends refused during decode
  waits for forward   refused admit / extend calls that succeeded or failed again once the last
                      step's forward pass let go of its pages (its ledger users pin them in place)
  mean queue wait     steps from arrival to first admission, over all requests
  rung 2 / rung 3     admit / extend calls placed after compaction / relayout, and pages and bytes moved
  peak utilization    the highest (live + withheld bytes) / capacity seen after any step
  operations          allocator calls (admit, extend, slide, free, acquire, release)

To keep the pressure but run faster, lower --capacity-gib (the trace is sized to it). The two sides run
in two processes at once (--jobs 2, the default); --jobs 1 runs them one after the other, same numbers.

examples:
  kvarena replay                                   # GPT-OSS-20B at an H200's KV budget (make run)
  kvarena replay --model qwen3.5-4b --scale 0.5    # recurrent-state model, phases half as long
  kvarena replay --capacity-gib 16 --json          # a 16 GiB arena, metrics as JSON
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a mixed trace: unified arena vs split pools (make run)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-oss-20b", metavar="NAME",
                   help=f"model preset (default gpt-oss-20b): {', '.join(sorted(PRESETS))}; "
                        "kimi-k3 needs --capacity-gib")
    p.add_argument("--capacity-gib", type=float, help="arena bytes in GiB (default: the model's H200 budget)")
    p.add_argument("--page-size", type=int, default=64, help="tokens per page (default 64)")
    p.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply each phase's length, so its request count (default 1.0; rates stay)")
    p.add_argument("--check-every", type=int, default=DEFAULT_CHECK_EVERY,
                   help=f"steps between invariant checks, 0: end only (default {DEFAULT_CHECK_EVERY})")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON instead of the table")
    p.add_argument("--jobs", type=int, default=2, metavar="N",
                   help="processes: 2 (default) runs the two sides at once, 1 one after the other "
                        "(same numbers; a side's error surfaces in this process)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Flags in the user's units: one line naming the flag to change (UsageError, exit 2)."""
    check_run_flags(args)
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs} must be >= 1 (1: the sides one after the other)")


def too_small(model: str, capacity: int, page_size: int, given: str) -> str:
    """Why ``capacity`` cannot run ``model``, in GiB, naming the flag to change (replay has no context flag)."""
    need = {name: smallest_capacity(lambda c, k=k: k(ArenaConfig(preset(model), c, page_size=page_size)), capacity)
            for name, k in SIDES}
    least = math.ceil(max(need.values()) / GiB * 100) / 100
    ctx = preset(model).max_context_len
    return (f"{given} cannot hold one worst-case {model} request of {ctx:,} tokens "
            f"({', '.join(f'{n} {gib(b)}' for n, b in need.items())}); pass --capacity-gib {least:g} or more")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    try:
        if args.capacity_gib is not None:
            capacity = int(args.capacity_gib * GiB)
            budget = f"KV budget: {args.capacity_gib:g} GiB (--capacity-gib)"
        else:
            capacity, budget = kv_budget(args.model)
        given = (f"--capacity-gib {args.capacity_gib:g}" if args.capacity_gib is not None
                 else f"the H200 budget of {gib(capacity)}")
        config = ArenaConfig(preset(args.model), capacity, page_size=args.page_size)
        # The trace grows with --scale and the capacity, the arena's memory with the capacity: refuse either
        # past its limit before building anything (phase_sizes draws no request)
        n = sum(k for _, k in phase_sizes(config, args.seed, args.scale))
        most_gib = capacity / GiB * MAX_REQUESTS / n
        check_arena_size(args.model, capacity, args.page_size, given, most_gib)
        try:
            Arena(config), SplitPools(config)  # fail fast on a configuration either side refuses
        except CapacityTooSmallError:
            raise UsageError(too_small(args.model, capacity, args.page_size, given)) from None
        check_requests(n, f"--scale {args.scale:g} at {given}",
                       f"pass --scale {_floor(args.scale * MAX_REQUESTS / n)} or less"
                       + (f", or --capacity-gib {_floor(most_gib)} or less" if args.capacity_gib is not None else ""))
        trace, results = compare(config, args.seed, args.scale, args.check_every,
                                 None if args.quiet else Progress(), args.jobs)
    except ReplayInvariantError as e:
        print(f"kvarena replay: {e}", file=sys.stderr)
        return 1
    except ArenaError as e:
        raise UsageError(str(e)) from None
    phases = {p: sum(1 for a in trace if a.phase == p) for p in ("long", "short", "mixed")}
    if args.json:
        print(json.dumps({"model": args.model, "budget": budget, "capacity_bytes": capacity,
                          "page_size": args.page_size,
                          "seed": args.seed, "scale": args.scale, "phases": phases,
                          "results": {x.config: asdict(x) for x in results}}, indent=2))
        return 0
    regions = " | ".join(f"{c} {(hi - lo) / GiB:.1f} GiB" for c, (lo, hi) in split_regions(config).items())
    print(f"kvarena replay: {args.model}, page_size {args.page_size}, seed {args.seed}, scale {args.scale:g}")
    print(f"{budget} ({capacity:,} B)")
    print(f"split pools: {regions} (SGLang ratio flags); unified arena: one shared range")
    print(f"trace: {len(trace):,} requests: long-context {phases['long']:,} (32K-100K in), short "
          f"{phases['short']:,} (~1K in / ~256 out), mixed {phases['mixed']:,} (short/medium/long)\n")
    print(format_table(results))
    return 0
