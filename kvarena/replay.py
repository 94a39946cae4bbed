"""``kvarena replay``: one mixed trace through the unified arena and the split-pool baseline.

A deliberately simple step-driven scheduler (FIFO, head-of-line admission, one
token per request per step, retract-newest on decode OOM) drives both
allocators through the same API; the invariants are checked as it goes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.split import SplitPools, split_regions
from kvarena.replay_trace import Arrival, GiB, build_trace, kv_budget, request_demand
from kvarena.spec.errors import AdmissionRejectedError, ArenaError, ConfigError, InvariantViolation
from kvarena.spec.layout import Kind
from kvarena.spec.models import PRESETS, ArenaConfig, preset
from kvarena.spec.types import UserKind

# ---- scheduler model ----------------------------------------------------------------------
# Decode headroom kept at admission, as SGLang's new_token_ratio: reserve this share of every
# running request's remaining output. It decays each step (admitting more) and resets on a
# retraction, so the scheduler probes memory the way SGLang's does.
NEW_TOKEN_RATIO = (0.7, 0.1, 0.001)  # initial, floor, decay per step
FWD_REQUESTS = 4  # requests whose pages a simulated forward pass holds in the ledger each step
DEFAULT_CHECK_EVERY = 200  # steps between full invariant checks (O(arena) each)
STALL_STEPS = 50_000  # far beyond any request's output plus its wait in the built-in trace


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


class _Req:
    __slots__ = ("admit_step", "arrival", "epoch", "finish", "first_admit", "input", "output", "pos",
                 "rid", "vids")

    def __init__(self, rid: int, a: Arrival) -> None:
        self.rid, self.arrival, self.input, self.output = rid, a.step, a.input_tokens, a.output_tokens
        self.admit_step = self.finish = self.first_admit = self.pos = -1
        self.epoch = 0  # bumped when it stops running: its scheduled events of older epochs are stale
        self.vids: dict[str, list[int]] = {}


class Progress:
    """One carriage-return line on a TTY (at most 10 updates a second), else lines at 25 / 50 / 75 %."""

    def __init__(self, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty, self._last, self._quarter = self.stream.isatty(), 0.0, 0

    def __call__(self, label: str, done: int, total: int, step: int, active: int) -> None:
        if self.tty and (time.monotonic() - self._last >= 0.1 or done == total):
            self._last = time.monotonic()
            end = "\n" if done == total else ""
            self.stream.write(f"\r{label:<14} {100 * done // total:3d}%  {done:,}/{total:,} requests done  "
                              f"step {step:,}  active {active:,}   {end}")
            self.stream.flush()
        elif not self.tty and total > done and done * 4 >= (self._quarter + 1) * total:
            self._quarter = 4 * done // total
            print(f"{label}: {25 * self._quarter}% ({done:,}/{total:,} requests, step {step:,})",
                  file=self.stream, flush=True)
        if done == total:
            self._quarter = 0


class ReplayInvariantError(Exception):
    def __init__(self, label: str, step: int, err: InvariantViolation) -> None:
        super().__init__(f"invariant violated in {label} at step {step}: {err}")
        self.inv = err.inv


def replay(alloc: Arena, trace: list[Arrival], label: str, check_every: int = DEFAULT_CHECK_EVERY,
           progress: Callable[[str, int, int, int, int], None] | None = None, seed: int = 0) -> Metrics:
    """Run ``trace`` through ``alloc``; raises ReplayInvariantError on the first violation."""
    t0 = time.perf_counter()
    cfg, ps = alloc.config, alloc.config.page_size
    full = next(c.name for c in cfg.model.classes if c.kind is Kind.FULL)
    windows = {c.name: -(-c.window // ps) + 1 for c in cfg.model.classes if c.kind is Kind.WINDOW}
    grow_demand = {full: 1, **dict.fromkeys(windows, 1)}
    pbytes = {c: alloc.bands[c].page_bytes for c in alloc.order}
    split = isinstance(alloc, SplitPools)
    m = Metrics(label, requests=len(trace))
    reqs = [_Req(i, a) for i, a in enumerate(trace)]
    queue: deque[_Req] = deque()
    active: dict[int, _Req] = {}  # admission order: the last one is the newest (retraction victim)
    pool: list[_Req] = []  # the same requests, for O(1) random picks
    grow: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # step -> page-boundary crossings
    fin: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # step -> last token
    rng = random.Random(seed)
    ratio = NEW_TOKEN_RATIO[0]
    sum_finish = 0  # sum of active finish steps: remaining output of all = sum_finish - n * step
    users: list[str] = []
    nxt = step = 0
    last_check = -1

    def unlink(r: _Req) -> None:
        nonlocal sum_finish
        del active[r.rid]
        last = pool.pop()
        if last is not r:
            pool[r.pos], last.pos = last, r.pos
        sum_finish -= r.finish
        r.epoch += 1

    def retract(r: _Req) -> None:
        nonlocal ratio
        ratio = NEW_TOKEN_RATIO[0]
        gen = max(0, step - r.admit_step - 1)  # this step's token is lost with it
        alloc.free(f"r{r.rid}")
        unlink(r)
        r.input, r.output = r.input + gen, r.output - gen
        queue.appendleft(r)
        m.retractions += 1
        m.operations += 1

    def settle() -> None:
        """The forward pass of the last step finishes: its pages may move and be reused again."""
        for uid in users:
            alloc.release(uid)
        m.operations += len(users)
        users.clear()

    def on_grow(r: _Req) -> None:
        while True:
            try:
                m.operations += 1
                got = alloc.extend(f"r{r.rid}", grow_demand).pages
                break
            except AdmissionRejectedError:
                if users:  # wait for the in-flight forward (as SGLang's urgent flush), then retry
                    settle()
                    m.forward_waits += 1
                    continue
                victim = active[next(reversed(active))]
                retract(victim)
                if victim is r:
                    return
        for c, vs in got.items():
            r.vids[c].extend(vs)
        for c, keep in windows.items():  # drop window pages wholly outside the window
            if (n := len(r.vids[c]) - keep) > 0:
                alloc.slide(f"r{r.rid}", c, n)
                del r.vids[c][:n]
                m.operations += 1
        if step + ps <= r.finish:
            grow[step + ps].append((r, r.epoch))

    def headroom(r: _Req, demand: dict[str, int]) -> bool:
        if not active:
            return True  # always admit one: the feasibility floor says it fits an empty allocator
        reserve = -(-int(ratio * (sum_finish - len(active) * step + r.output)) // ps)
        if split:
            return all(demand.get(c, 0) + (reserve if c == full else 0) <= len(alloc.bands[c].holes)
                       for c in alloc.order)
        return sum(n * pbytes[c] for c, n in demand.items()) + reserve * pbytes[full] <= alloc.free_bytes()

    def admit() -> None:
        nonlocal sum_finish
        while queue:
            r = queue[0]
            demand = request_demand(cfg.model, ps, r.input)
            if not headroom(r, demand):
                m.rejected_headroom += 1
                return
            try:
                m.operations += 1
                got = alloc.admit(f"r{r.rid}", demand).pages
            except AdmissionRejectedError:
                if users:
                    settle()
                    m.forward_waits += 1
                    continue
                m.rejected_ladder += 1
                return
            queue.popleft()
            r.vids = {c: list(got.get(c, ())) for c in alloc.order}
            r.admit_step, r.finish, r.pos = step, step + r.output, len(pool)
            r.first_admit = step if r.first_admit < 0 else r.first_admit
            active[r.rid] = r
            pool.append(r)
            sum_finish += r.finish
            first = step + -(-r.input // ps) * ps - r.input + 1  # first step whose token needs a new page
            if first <= r.finish:
                grow[first].append((r, r.epoch))
            fin[r.finish].append((r, r.epoch))

    def forward() -> None:
        # a forward pass reads KV of a few requests and writes their newest page: the ledger at work
        picks = {pool[rng.randrange(len(pool))].rid: None for _ in range(min(FWD_REQUESTS, len(pool)))}
        reads, writes = [], []
        for rid in picks:
            v = active[rid].vids
            reads += [v[full][0]] + [x for c in alloc.order if c != full for x in v[c]]
            writes.append(v[full][-1])
        for uid, kind, vids in ((f"fr{step}", UserKind.FORWARD_READ, reads),
                                (f"fw{step}", UserKind.FORWARD_WRITE, writes)):
            vids = list(dict.fromkeys(vids))
            if vids:
                alloc.acquire(uid, kind, vids)
                users.append(uid)
                m.operations += 1

    def check() -> None:
        try:
            check_all(alloc)
        except InvariantViolation as e:
            raise ReplayInvariantError(label, step, e) from e
        m.invariant_checks += 1

    stall = (0, 0)  # (completed, step) at the last completion: a livelock guard
    while m.completed < len(reqs):  # one iteration = one scheduler step
        if m.completed != stall[0]:
            stall = (m.completed, step)
        elif step - stall[1] > STALL_STEPS:
            raise RuntimeError(f"{label}: no request completed in {STALL_STEPS} steps (step {step}, "
                               f"{len(active)} running, {len(queue)} queued): the scheduler model livelocked")
        if not active and not queue and nxt < len(reqs):
            step = max(step, reqs[nxt].arrival)  # idle: jump to the next arrival
        while nxt < len(reqs) and reqs[nxt].arrival <= step:
            queue.append(reqs[nxt])
            nxt += 1
        for r, ep in grow.pop(step, ()):
            if ep == r.epoch:
                on_grow(r)
        for r, ep in fin.pop(step, ()):
            if ep == r.epoch:
                alloc.free(f"r{r.rid}")
                unlink(r)
                m.completed += 1
                m.operations += 1
        admit()
        # last step's forward ran while this step's frees and moves were planned (an overlap
        # scheduler): it lets go of its pages only now, so pages it held were withheld meanwhile
        settle()
        if pool:
            forward()
        ratio = max(NEW_TOKEN_RATIO[1], ratio - NEW_TOKEN_RATIO[2])
        m.max_active = max(m.max_active, len(active))
        m.peak_utilization = max(m.peak_utilization, alloc.used_bytes() / alloc.capacity)
        if check_every and step // check_every != last_check:
            last_check = step // check_every
            check()
        if progress is not None:
            progress(label, m.completed, len(reqs), step, len(active))
        step += 1
    for uid in users:
        alloc.release(uid)
    check()  # the end state, ledger empty
    st = alloc.stats
    m.admitted, m.steps = st.admitted, step
    m.moves, m.bytes_moved = {k: st.moves[k] for k in (2, 3)}, {k: st.bytes_moved[k] for k in (2, 3)}
    m.rung_used = dict(st.rung_used)
    m.mean_wait_steps = sum(r.first_admit - r.arrival for r in reqs) / max(1, len(reqs))
    m.wall_s = time.perf_counter() - t0
    return m


def compare(config: ArenaConfig, seed: int = 0, scale: float = 1.0, check_every: int = DEFAULT_CHECK_EVERY,
            progress: Callable[[str, int, int, int, int], None] | None = None
            ) -> tuple[list[Arrival], list[Metrics]]:
    """The same trace through the unified arena and the split pools."""
    trace = build_trace(config, seed, scale)
    results = [replay(kind(config), trace, label, check_every, progress, seed)
               for kind, label in ((Arena, "unified arena"), (SplitPools, "split pools"))]
    return trace, results


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

The built-in trace (kvarena/replay_trace.py) has three phases, each sized to the KV budget so that
both allocators must queue:
  long     a burst of 32K-100K-token prompts with 256-1024 output tokens
  short    a high-concurrency stream of ~1K-token prompts with ~256 output tokens
  mixed    60% short, 35% medium (2K-16K in), 5% long prompts

Scheduler model, kept simple on purpose. Each step, every running request decodes one token. At a
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

To keep the pressure but run faster, lower --capacity-gib (the trace is sized to it).

examples:
  kvarena replay                                   # GPT-OSS-20B at an H200's KV budget (make run)
  kvarena replay --model qwen3.5-4b --scale 0.5    # recurrent-state model, phases half as long
  kvarena replay --capacity-gib 16 --json          # a 16 GiB arena, metrics as JSON
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a mixed trace: unified arena vs split pools (make run)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-oss-20b", choices=sorted(PRESETS), metavar="NAME",
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
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.capacity_gib is not None:
            capacity = int(args.capacity_gib * GiB)
            budget = f"KV budget: {args.capacity_gib:g} GiB (--capacity-gib)"
        else:
            capacity, budget = kv_budget(args.model)
        if args.scale <= 0 or args.check_every < 0:
            raise ConfigError("--scale must be > 0 and --check-every >= 0")
        config = ArenaConfig(preset(args.model), capacity, page_size=args.page_size)
        Arena(config), SplitPools(config)  # fail fast on a configuration either side refuses
        trace, results = compare(config, args.seed, args.scale, args.check_every,
                                 None if args.quiet else Progress())
    except ReplayInvariantError as e:
        print(f"kvarena replay: {e}", file=sys.stderr)
        return 1
    except ArenaError as e:
        print(f"kvarena replay: {e}", file=sys.stderr)
        return 2
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
