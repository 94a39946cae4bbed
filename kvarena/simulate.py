"""``kvarena simulate``: capacity of split pools, the unified arena and a vLLM-style pool on a workload.

Every configuration gets the same bytes (one H200's KV budget for the model), the same requests and
the same scheduler model (kvarena/scheduler.py, with SGLang's chunked prefill); the step times come
from the roofline of kvarena/costmodel.py, so throughput and time to first token are *modeled*.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvarena.costmodel import CostModel
from kvarena.reference.arena import Arena
from kvarena.reference.policy import POLICIES
from kvarena.reference.split import SplitPools, split_regions
from kvarena.replay_trace import GiB
from kvarena.scheduler import RunResult, SchedulerInvariantError, SchedulerModel, run
from kvarena.spec.errors import ArenaError, ConfigError
from kvarena.spec.layout import Kind
from kvarena.spec.models import (
    DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    PRESETS,
    ArenaConfig,
    preset,
)
from kvarena.vllm_pool import VllmPool
from kvarena.workloads import PRESET_WORKLOADS, Workload, kv_budget, trace_workload, workload

# ---- the scheduler model of a serving engine (SGLang defaults on an H200) -------------------------
PREFILL_CHUNK = 8192  # SGLang --chunked-prefill-size for a GPU of 90-160 GB
CLIP_NEW_TOKENS = 4096  # SGLang CLIP_MAX_NEW_TOKENS: a request's reserved output is capped at this
# SGLang frees out-of-window KV lazily (every sliding_window_size decode steps); vLLM frees skipped
# blocks every step (remove_skipped_blocks): the vLLM-style configuration runs with lazy_window off.
ENGINE = SchedulerModel(prefill_chunk=PREFILL_CHUNK, transient_window=True, lazy_window=True,
                        clip_new_tokens=CLIP_NEW_TOKENS, check_every=0)
PLOT_SAMPLES = 1500  # time-series points per configuration: between this and twice this
PARITY = 0.05  # "near parity": unified / split within 5 %

# Unified-arena admission policies: name -> allocator constructor. The default is the spec's ladder;
# every shipped plug-in policy (reference/policy.py) runs as one more configuration.
UNIFIED_POLICIES: dict[str, Callable[[ArenaConfig], Arena]] = {
    "default": Arena,
    **{name: (lambda cfg, f=factory: Arena(cfg, f())) for name, factory in POLICIES.items() if name != "ladder"},
}
DEFAULT_POLICIES = ("default",)  # `--policies all` runs every shipped policy as its own column
# --ratio-sweep: split pools at these ratios besides the default (the flag the model's kind uses)
SWEEP_SWA = (0.1, 0.2, 0.4, 0.6, 1.0)
SWEEP_MAMBA = (0.1, 0.3, 0.5, 1.5, 3.0)


@dataclass(frozen=True)
class Configuration:
    label: str
    kind: str  # "split" | "unified" | "vllm"
    policy: str = "default"
    swa_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    sweep: bool = False  # part of --ratio-sweep (reported in the sweep table)

    def build(self, model: str, capacity: int, page_size: int, context: int):
        cfg = ArenaConfig(preset(model), capacity, page_size, self.swa_ratio, self.mamba_ratio, context)
        if self.kind == "split":
            return SplitPools(cfg)
        if self.kind == "vllm":
            return VllmPool(cfg)
        return UNIFIED_POLICIES[self.policy](cfg)


def configurations(w: Workload, sweep: bool = False, policies: tuple[str, ...] = DEFAULT_POLICIES
                   ) -> list[Configuration]:
    """Split pools and the unified arena (each policy) at each of the workload's ratios, then vLLM."""
    out: list[Configuration] = []
    many = len(w.swa_ratios) > 1
    for r in w.swa_ratios:
        tag = f" (swa {r:g})" if many else ""
        out.append(Configuration(f"split pools{tag}", "split", swa_ratio=r))
        for name in policies:
            pol = "" if name == "default" else f" [{name}]"
            out.append(Configuration(f"unified arena{pol}{tag}", "unified", name, swa_ratio=r))
    out.append(Configuration("vLLM-style pool", "vllm"))
    if sweep:
        kinds = {c.kind for c in preset(w.model).classes}
        if Kind.WINDOW in kinds:
            out += [Configuration(f"split swa {r:g}", "split", swa_ratio=r, sweep=True)
                    for r in SWEEP_SWA if r not in w.swa_ratios]
        if Kind.RECURRENT in kinds:
            out += [Configuration(f"split mamba {r:g}", "split", mamba_ratio=r, sweep=True) for r in SWEEP_MAMBA]
    return out


# ---- metrics ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One configuration's run, reduced to the reported metrics."""

    config: str
    kind: str
    swa_ratio: float
    mamba_ratio: float
    requests: int
    completed: int
    max_active: int
    mean_active: float
    retractions: int
    retractions_per_1k: float
    bytes_moved_compaction: int
    bytes_moved_relayout: int
    pages_moved: int
    throughput_tok_s: float  # modeled
    ttft_mean_s: float  # modeled
    ttft_p99_s: float  # modeled
    makespan_s: float  # modeled
    peak_utilization: float
    steps: int
    operations: int
    wall_s: float
    series: dict = field(default_factory=dict, repr=False)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def outcome(c: Configuration, r: RunResult, series: dict) -> Outcome:
    return Outcome(
        c.label, c.kind, c.swa_ratio, c.mamba_ratio, r.requests, r.completed, r.max_active, r.mean_active,
        r.retractions, 1000 * r.retractions / max(1, r.completed), r.bytes_moved.get(2, 0),
        r.bytes_moved.get(3, 0), sum(r.moves.values()), r.output_tokens / r.clock if r.clock else 0.0,
        sum(r.ttft) / max(1, len(r.ttft)), _pct(r.ttft, 0.99), r.clock, r.peak_utilization, r.steps,
        r.operations, r.wall_s, series)


class Series:
    """Time series for the plots: active requests, bytes per class, band spans and the gap.

    Called every step; keeps every ``stride``-th, and halves itself (doubling the stride) when it
    holds twice ``limit`` points, so a run of any length keeps between ``limit`` and 2 x ``limit``."""

    def __init__(self, limit: int = PLOT_SAMPLES) -> None:
        self.data: dict[str, list] = {"t": [], "active": [], "occupancy": [], "spans": [], "gap": []}
        self.limit, self.stride = limit, 1

    def __call__(self, step: int, clock: float, pager, active: int) -> None:
        if step % self.stride:
            return
        d, alloc = self.data, pager.alloc
        if len(d["t"]) >= 2 * self.limit:
            for k in d:
                d[k] = d[k][::2]
            self.stride *= 2
        d["t"].append(clock)
        d["active"].append(active)
        d["occupancy"].append(pager.occupancy())
        if hasattr(alloc, "bands"):
            d["spans"].append({n: (b.lo_byte, b.hi_byte) for n, b in alloc.bands.items()})
            d["gap"].append(alloc.gap_bytes() if isinstance(alloc, Arena) and alloc.ANCHORED_ENDS else 0)


# ---- running a workload ----------------------------------------------------------------------------


@dataclass
class Report:
    workload: Workload
    capacity: int
    budget: str
    context: int
    outcomes: list[Outcome]
    regions: dict[str, tuple[int, int]]
    vllm: dict[str, object]


def simulate(w: Workload, capacity: int, budget: str, page_size: int = 64, seed: int = 0, scale: float = 1.0,
             sweep: bool = False, plots: bool = False, check_every: int = 0,
             progress: Callable[[str, int, int, int, int], None] | None = None,
             policies: tuple[str, ...] = DEFAULT_POLICIES) -> Report:
    context = w.max_context()
    cost = CostModel(preset(w.model))
    engine = SchedulerModel(**{**ENGINE.__dict__, "check_every": check_every,
                               "stall_steps": max(50_000, 4 * context)})
    outcomes = []
    vllm_info: dict[str, object] = {}
    for c in configurations(w, sweep, policies):
        alloc = c.build(w.model, capacity, page_size, context)
        if isinstance(alloc, VllmPool):
            g = alloc.geometry
            vllm_info = {"block_tokens": g.block_tokens, "page_bytes": g.page_bytes, "groups": g.groups,
                         "padding_bytes": {n: alloc.padding_bytes(n) for n in alloc.order}}
        series = Series() if plots else None
        model = SchedulerModel(**{**engine.__dict__, "lazy_window": c.kind != "vllm"})
        r = run(alloc, w.source(scale), c.label, model, seed=seed, cost=cost, progress=progress,
                sampler=series, sample_every=1 if plots else 0)
        outcomes.append(outcome(c, r, series.data if series else {}))
    regions = split_regions(ArenaConfig(preset(w.model), capacity, page_size, max_context_len=context))
    return Report(w, capacity, budget, context, outcomes, regions, vllm_info)


# ---- output ----------------------------------------------------------------------------------------


def _gib(b: float) -> str:
    return f"{b / GiB:,.1f} GiB"


ROWS: list[tuple[str, Callable[[Outcome], str]]] = [
    ("requests completed", lambda o: f"{o.completed:,} / {o.requests:,}"),
    ("max active requests", lambda o: f"{o.max_active:,}"),
    ("mean active requests (time-weighted)", lambda o: f"{o.mean_active:,.1f}"),
    ("retractions", lambda o: f"{o.retractions:,}"),
    ("retractions per 1,000 completed", lambda o: f"{o.retractions_per_1k:,.1f}"),
    ("bytes moved: compaction (rung 2)", lambda o: _gib(o.bytes_moved_compaction)),
    ("bytes moved: relayout (rung 3)", lambda o: _gib(o.bytes_moved_relayout)),
    ("modeled output throughput (tok/s)", lambda o: f"{o.throughput_tok_s:,.0f}"),
    ("modeled TTFT mean / p99 (s)", lambda o: f"{o.ttft_mean_s:,.2f} / {o.ttft_p99_s:,.2f}"),
    ("modeled time to drain (s)", lambda o: f"{o.makespan_s:,.1f}"),
    ("peak utilization (used / capacity)", lambda o: f"{100 * o.peak_utilization:.1f} %"),
    ("scheduler steps", lambda o: f"{o.steps:,}"),
    ("wall time", lambda o: f"{o.wall_s:.1f} s"),
]


def format_table(outcomes: list[Outcome]) -> str:
    w = max(18, *(len(o.config) + 2 for o in outcomes), *(len(fn(o)) + 2 for _, fn in ROWS for o in outcomes))
    lines = [f"{'':<38}" + "".join(f"{o.config:>{w}}" for o in outcomes)]
    lines += [f"{name:<38}" + "".join(f"{fn(o):>{w}}" for o in outcomes) for name, fn in ROWS]
    return "\n".join(lines)


def comparison(rep: Report) -> dict | None:
    """Our value of the published metric for the unified arena and the split pools (default policy,
    first ratio), and whether the direction (which side is better, or parity) agrees."""
    p = rep.workload.published
    if p is None:
        return None
    sweep = sweep_outcomes(rep)
    splits = [o for o in rep.outcomes if o.kind == "split" and o not in sweep]
    unis = [o for o in rep.outcomes if o.kind == "unified"]
    if p.metric == "ratio_throughput":
        ours_split = splits[1].throughput_tok_s / splits[0].throughput_tok_s
        ours_uni = unis[1].throughput_tok_s / unis[0].throughput_tok_s
        return {"metric": p.metric, "published": p.text, "split": ours_split, "unified": ours_uni,
                "agrees": (ours_split < 1) == (p.split < 1)}
    get: Callable[[Outcome], float] = {
        "throughput": lambda o: o.throughput_tok_s, "max_active": lambda o: o.max_active,
        "mean_active": lambda o: o.mean_active, "retractions_per_1k": lambda o: o.retractions_per_1k}[p.metric]
    u, s = get(unis[0]), get(splits[0])
    ratio = u / s if s else (float("inf") if u else 1.0)
    if p.unified is None or p.split is None:  # published parity
        agree = abs(ratio - 1) <= PARITY
    else:
        agree = u != s and (u > s) == (p.unified > p.split)
    return {"metric": p.metric, "published": p.text, "unified": u, "split": s, "ratio": ratio,
            "published_ratio": p.unified / p.split if p.unified and p.split else None, "agrees": agree}


def print_report(rep: Report, out=None) -> None:
    out = out or sys.stdout
    w = rep.workload
    print(f"== {w.name}: {w.describe()}", file=out)
    print(f"   {w.summary}", file=out)
    print(f"   KV budget {_gib(rep.capacity)} ({rep.budget}); context {rep.context:,} tokens", file=out)
    regions = " | ".join(f"{c} {_gib(hi - lo)}" for c, (lo, hi) in rep.regions.items())
    print(f"   split pools (default ratios): {regions}", file=out)
    if rep.vllm:
        pad = ", ".join(f"{c} {b / (1 << 20):,.2f} MiB" for c, b in rep.vllm["padding_bytes"].items() if b)
        print(f"   vLLM-style pool: {rep.vllm['block_tokens']}-token pages of {rep.vllm['page_bytes'] / (1 << 20):.2f} "
              f"MiB, groups {rep.vllm['groups']}" + (f", padding per page: {pad}" if pad else ""), file=out)
    sweep = sweep_outcomes(rep)
    print(format_table([o for o in rep.outcomes if o not in sweep]), file=out)
    if sweep:
        print("   ratio sweep (split pools):", file=out)
        for o in [o for o in rep.outcomes if o.kind == "split" and o not in sweep] + sweep:
            print(f"     {o.config:<26} max active {o.max_active:>6,}  mean active {o.mean_active:>9,.1f}  "
                  f"retractions/1k {o.retractions_per_1k:>7,.1f}  throughput {o.throughput_tok_s:>9,.0f} tok/s",
                  file=out)
    cmp = comparison(rep)
    if cmp:
        if cmp["metric"] == "ratio_throughput":
            ours = (f"split pools {cmp['split']:.3f}x, unified arena {cmp['unified']:.3f}x throughput at swa 0.1 "
                    "vs 0.8")
        else:
            ours = f"unified {cmp['unified']:,.1f} vs split {cmp['split']:,.1f} ({cmp['metric']})"
        print(f"   published: {cmp['published']}; simulated: {ours}; direction "
              f"{'agrees' if cmp['agrees'] else 'DIFFERS'}", file=out)
    print(file=out)


def sweep_outcomes(rep: Report) -> list[Outcome]:
    labels = {c.label for c in configurations(rep.workload, True) if c.sweep}
    return [o for o in rep.outcomes if o.config in labels]


def report_json(rep: Report) -> dict:
    from dataclasses import asdict

    return {"workload": rep.workload.name, "description": rep.workload.describe(), "model": rep.workload.model,
            "capacity_bytes": rep.capacity, "budget": rep.budget, "context_tokens": rep.context,
            "split_regions_bytes": {c: hi - lo for c, (lo, hi) in rep.regions.items()}, "vllm": rep.vllm,
            "results": {o.config: {k: v for k, v in asdict(o).items() if k != "series"} for o in rep.outcomes},
            "published": comparison(rep)}


class ProgressBar:
    """A bar on a TTY (at most 10 redraws a second), else one line per configuration at 50 % and 100 %."""

    def __init__(self, prefix: str = "", stream=None, width: int = 28) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.prefix, self.width = prefix, width
        self.tty, self._last, self._half = self.stream.isatty(), 0.0, set()

    def __call__(self, label: str, done: int, total: int, step: int, active: int) -> None:
        if self.tty:
            if time.monotonic() - self._last < 0.1 and done < total:
                return
            self._last = time.monotonic()
            fill = self.width * done // max(1, total)
            self.stream.write(f"\r{self.prefix}{label:<24} [{'#' * fill}{'.' * (self.width - fill)}] "
                              f"{100 * done // max(1, total):3d}%  {done:,}/{total:,}  step {step:,}  "
                              f"active {active:,} " + ("\n" if done == total else ""))
            self.stream.flush()
        else:
            key = (label, 2 * done // max(1, total))
            if done and key[1] and key not in self._half:
                self._half.add(key)
                print(f"{self.prefix}{label}: {50 * key[1]}% ({done:,}/{total:,} requests, step {step:,})",
                      file=self.stream, flush=True)


# ---- the command -----------------------------------------------------------------------------------

ASSUMPTIONS = [
    "KV budget: one H200, 139 GiB usable x --mem-fraction (default 0.9, SGLang --mem-fraction-static) "
    "- the preset's weights - 4 GiB activations/CUDA graphs; the same bytes for every configuration",
    f"scheduler: chunked prefill {PREFILL_CHUNK:,} tokens/step mixed with decode, one token per running request "
    "per step, FIFO head-of-line admission with SGLang's new_token_ratio reserve (0.7 -> 0.1, reserve per "
    f"request capped at {CLIP_NEW_TOKENS:,} tokens), retract-newest on a refused decode page",
    "window pages outside the window are released: by SGLang's rule for split pools and the unified arena "
    "(once a window's worth piled up, so a request holds W..2W tokens), every page for vLLM; a prefill chunk "
    "holds its whole chunk's window pages through its forward; recurrent state is one slot per request; "
    "no prefix cache",
    "split pools: SGLang's ratio flags (--swa-full-tokens-ratio 0.8, --mamba-full-memory-ratio 0.9); "
    "unified arena: the reference Arena; vLLM-style: one page size, state padded to one page, no moves",
    "throughput and TTFT are MODELED by the roofline in kvarena/costmodel.py, not measured",
]

HELP = """\
Simulate a workload on one H200 under three memory layouts, with the same scheduler model:
  split pools       SGLang's fixed per-kind pools sized by --swa-full-tokens-ratio / --mamba-full-memory-ratio
  unified arena     the reference allocator (one byte range; reuse, compact the ends, relayout), one
                    column per admission policy (today: the default)
  vLLM-style pool   one pool of equal pages; attention pages enlarged until a page holds one layer's
                    recurrent state (528 tokens on Qwen3.5-4B), state padded to a page; nothing moves

Metrics: the most and the mean requests running at once, retractions (per 1,000 completed), bytes
moved by compaction and relayout, and the modeled output throughput, time to first token and drain
time from a roofline of an H200 (kvarena/costmodel.py). Modeled means computed, not measured.

Workloads: the published single-H200 presets (--list), or --trace FILE: CSV with a header
(arrival,input,output: seconds, tokens, tokens) or JSON lines ({"arrival": 0.5, "input": 900,
"output": 200}), on --model.

examples:
  kvarena simulate --list
  kvarena simulate --workload qwen3.5-4b-16k-4k
  kvarena simulate --workload all --plots            # PNGs in ./kvarena-plots
  kvarena simulate --trace my.csv --model gpt-oss-20b --json
  kvarena simulate --workload gpt-oss-20b-max --mem-fraction 0.3 --ratio-sweep
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="capacity simulator: split pools vs unified arena vs vLLM-style pool",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", action="append", metavar="NAME",
                   help="a preset (repeatable), or 'all'; see --list")
    p.add_argument("--trace", metavar="FILE", help="a CSV or JSON-lines trace: arrival (s), input, output (tokens)")
    p.add_argument("--model", default="gpt-oss-20b", choices=sorted(PRESETS), metavar="NAME",
                   help="model of a --trace (default gpt-oss-20b)")
    p.add_argument("--list", action="store_true", help="name the workload presets and exit")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON instead of tables")
    p.add_argument("--plots", nargs="?", const="kvarena-plots", metavar="DIR",
                   help="write PNGs there (default ./kvarena-plots); needs matplotlib")
    p.add_argument("--ratio-sweep", action="store_true", help="also run split pools at a sweep of ratios")
    p.add_argument("--policies", default="default",
                   help="unified-arena admission policies to compare, each its own column: 'default' (the spec's "
                        f"ladder), 'all', or a comma list of {', '.join(UNIFIED_POLICIES)}")
    p.add_argument("--mem-fraction", type=float, default=0.9, help="share of the H200 the engine claims (0.9)")
    p.add_argument("--capacity-gib", type=float, help="KV bytes in GiB, instead of the H200 arithmetic")
    p.add_argument("--page-size", type=int, default=64, help="tokens per page (default 64)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the presets' request counts (default 1)")
    p.add_argument("--check-every", type=int, default=0,
                   help="steps between full invariant checks (default 0: at the end of each run only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the forward-pass ledger picks (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def list_presets(out=None) -> None:
    out = out or sys.stdout
    for w in PRESET_WORKLOADS.values():
        pub = f"  published: {w.published.text}" if w.published else ""
        print(f"{w.name:<22} {w.describe()}\n{'':<22} {w.summary}.{pub}", file=out)


def _workloads(args: argparse.Namespace) -> list[Workload]:
    out: list[Workload] = []
    for name in args.workload or ():
        out += list(PRESET_WORKLOADS.values()) if name == "all" else [workload(name)]
    if args.trace:
        out.append(trace_workload(args.trace, args.model))
    if not out:
        raise ConfigError("name a workload: --workload NAME (or all), or --trace FILE; --list names the presets")
    return out


def main(args: argparse.Namespace) -> int:
    if args.list:
        list_presets()
        return 0
    try:
        if args.scale <= 0 or args.check_every < 0:
            raise ConfigError("--scale must be > 0 and --check-every >= 0")
        loads = _workloads(args)
        if args.plots:
            from kvarena import plots  # fail before simulating if matplotlib is missing
        reports = []
        policies = tuple(UNIFIED_POLICIES) if args.policies == "all" else tuple(args.policies.split(","))
        unknown = [p for p in policies if p not in UNIFIED_POLICIES]
        if unknown:
            raise ConfigError(f"unknown policy {unknown}; choose from {', '.join(UNIFIED_POLICIES)} or 'all'")
        for i, w in enumerate(loads):
            if args.capacity_gib is not None:
                capacity, budget = int(args.capacity_gib * GiB), f"--capacity-gib {args.capacity_gib:g}"
            else:
                capacity, budget = kv_budget(w.model, args.mem_fraction)
            bar = None if args.quiet else ProgressBar(f"[{i + 1}/{len(loads)} {w.name}] ")
            rep = simulate(w, capacity, budget, args.page_size, args.seed, args.scale, args.ratio_sweep,
                           bool(args.plots), args.check_every, bar, policies)
            reports.append(rep)
            if not args.json:
                if i == 0:
                    print("kvarena simulate: assumptions")
                    for a in ASSUMPTIONS:
                        print(f"  - {a}")
                    print("  - " + "\n    ".join(CostModel(preset(w.model)).describe()[:1]) + "\n")
                print_report(rep)
            if args.plots:
                from kvarena import plots

                for path in plots.write_all(rep, Path(args.plots)):
                    if not args.json:
                        print(f"wrote {path}")
    except SchedulerInvariantError as e:
        print(f"kvarena simulate: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"kvarena simulate: --plots needs matplotlib ({e}); pip install matplotlib", file=sys.stderr)
        return 2
    except ArenaError as e:
        print(f"kvarena simulate: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"assumptions": ASSUMPTIONS, "seed": args.seed, "scale": args.scale,
                          "workloads": [report_json(r) for r in reports]}, indent=2))
    return 0
