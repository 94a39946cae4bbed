"""``kvarena simulate``: capacity of split pools, the unified arena and a vLLM-style pool on a workload.

The command only parses and prints; the simulator is kvarena/simulator/ (its __init__ maps the modules).
Every configuration gets the same bytes, the same requests and SGLang 0.5.23's scheduler rules
(kvarena/simulator/rules.py); the step times come from a roofline, so throughput and latency are
*modeled*.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from kvarena.simulator.budget import GiB, sglang_budget
from kvarena.simulator.costmodel import CostModel
from kvarena.simulator.engines import ENGINES, UNIFIED_POLICIES, smallest_capacity
from kvarena.simulator.matrix import ALLOCATORS as MATRIX_ALLOCATORS
from kvarena.simulator.report import SLO, Report, assumptions, comparison, format_table, report_json
from kvarena.simulator.scheduler import SchedulerInvariantError, SchedulerModel
from kvarena.simulator.simulation import configurations, real_engines, simulate
from kvarena.simulator.workloads import PRESET_WORKLOADS, Workload, lengths_from, trace_workload, workload
from kvarena.spec.errors import ArenaError, CapacityTooSmallError
from kvarena.spec.models import preset
from kvarena.text import MAX_REQUESTS, UsageError, _floor, check_arena_size, check_requests, check_run_flags, gib

REAL_ENGINES = tuple(n for n, k in ENGINES.items() if k.real and k.column)
RULES = {f.name: f for f in dataclasses.fields(SchedulerModel)
         if f.name not in ("check_every", "stall_steps", "forward_requests", "max_running")}


def _gib(b: float) -> str:
    return f"{b / GiB:,.1f} GiB"


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

HELP = """\
Simulate a workload on one H200 under each memory layout, with SGLang 0.5.23's scheduler rules:
  split pools       SGLang's fixed per-kind pools sized by --swa-full-tokens-ratio / --mamba-full-memory-ratio
  unified arena     the reference allocator (one byte range; reuse, compact the ends, relayout), one
                    column per admission policy (today: the default); the scheduler gives it each new
                    window page's placement limit (the full band's planned peak while the page lives,
                    simulator/ceiling.py; --rule placement_limit=false drops it)
  vLLM-style pool   one pool of equal pages; attention pages enlarged until a page holds one layer's
                    recurrent state (528 tokens on Qwen3.5-4B), state padded to a page; nothing moves;
                    mamba "align" mode (vLLM's prefix caching default): decides as vLLM v1 below
and, when installed (make sglang / make vllm; --engines picks), the real engines' own code:
  SGLang split pools / SGLang unified   SGLang 0.5.23's allocators (byte buffer on torch's meta device)
  vLLM v1                               vLLM 0.33.0's KVCacheManager, configured by vLLM's own planning
Each column's "implementation" in --json says what its numbers come from.

Metrics: the most and the mean requests running at once, retractions (per 1,000 completed), bytes
moved by compaction and relayout, and the modeled output throughput, TTFT / TPOT / end-to-end latency
percentiles and drain time from a roofline of an H200 (kvarena/simulator/costmodel.py). Modeled
means computed, not measured.

Scheduler rules (kvarena/simulator/rules.py cites each in the sglang 0.5.23 source): chunked prefill
of 8,192 tokens in steps of their own (enable_mixed_chunk off); admission while free memory covers the
prompt, the new request's own output in full, and the running requests' remaining output at
new_token_ratio (0.7 -> 0.098) or 1.0 for ignore_eos requests; before a decode step, retract the request
with the fewest decoded tokens until the step fits, keeping one; out-of-window KV freed 128 tokens past
the window; Qwen3.5 requests hold 1 + 2 state slots and the radix tree 1 per prefill chunk (the
earlier ones unlocked, reclaimed only by state allocations), running capped at max_mamba_cache_size // 5.
--rule NAME=VALUE changes one (e.g. --rule mixed_chunk=true, --rule retraction=newest).

Workloads: the published single-H200 presets (--list), or --trace FILE: CSV with a header
(arrival,input,output: seconds, tokens, tokens) or JSON lines ({"arrival": 0.5, "input": 900,
"output": 200}), on --model. --concurrency C re-drives a workload with C closed-loop clients (a comma
list sweeps), --request-rate R with Poisson arrivals; --output-lengths draws lengths.

Budget: a preset's own (calibrated on its published split figure where the published setup is not
known: one number fitted, the rest predicted), else SGLang's profile of an H200 at --mem-fraction;
--capacity-gib sets it outright.

The matrix (--matrix): every allocator (kvarena's arena, SGLang's unified and split, vLLM's manager,
transformers' sector pool) under every rule set (SGLang's with mamba strategy extra_buffer or no_buffer,
vLLM 0.33's own scheduler), the same bytes and requests in every cell: what the allocator buys, apart from
what the rules cost. --decompose also splits the gap between the best cell and the arena under SGLang's
rules, switching one group of rules to vLLM's value at a time (docs/arena-vs-vllm.md).

examples:
  kvarena simulate --matrix                          # every preset: allocators x rule sets
  kvarena simulate --matrix --workload qwen3.5-4b-16k-4k --decompose --jobs 2
  kvarena simulate --list
  kvarena simulate --workload qwen3.5-4b-16k-4k
  kvarena simulate --workload all --plots            # PNGs in ./kvarena-plots
  kvarena simulate --workload gpt-oss-20b-max --concurrency 256,512,1024
  kvarena simulate --trace my.csv --model gpt-oss-20b --json
  kvarena simulate --workload gpt-oss-20b-max --mem-fraction 0.9 --ratio-sweep
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="capacity simulator: split pools vs unified arena vs vLLM-style pool",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", action="append", metavar="NAME",
                   help="a preset (repeatable), or 'all'; see --list")
    p.add_argument("--trace", metavar="FILE", help="a CSV or JSON-lines trace: arrival (s), input, output (tokens)")
    p.add_argument("--model", default="gpt-oss-20b", metavar="NAME",
                   help="model of a --trace (default gpt-oss-20b)")
    p.add_argument("--list", action="store_true", help="name the workload presets and exit")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON instead of tables")
    p.add_argument("--plots", nargs="?", const="kvarena-plots", metavar="DIR",
                   help="write PNGs there (default ./kvarena-plots); needs matplotlib")
    p.add_argument("--ratio-sweep", action="store_true", help="also run split pools at a sweep of ratios")
    p.add_argument("--policies", default="default",
                   help="unified-arena admission policies to compare, each its own column: 'default' (the spec's "
                        f"ladder), 'all', or a comma list of {', '.join(UNIFIED_POLICIES)}")
    p.add_argument("--concurrency", metavar="C[,C...]",
                   help="closed-loop clients (each sends its next request when its last completes); a comma list "
                        "runs a concurrency sweep")
    p.add_argument("--request-rate", type=float, metavar="R", help="Poisson arrivals at R requests per second")
    p.add_argument("--requests", type=int, metavar="N", help="requests per run with --concurrency / --request-rate "
                   "(default: the workload's count)")
    p.add_argument("--output-lengths", default="fixed", metavar="DIST",
                   help="fixed (default), uniform[:LO] (output drawn in LO..the workload's output; EOS-terminated), "
                        "or trace:FILE (input and output drawn from FILE's rows)")
    p.add_argument("--rule", action="append", default=[], metavar="NAME=VALUE",
                   help=f"change one scheduler rule (repeatable): {', '.join(RULES)}")
    p.add_argument("--mem-fraction", type=float,
                   help="SGLang --mem-fraction-static for an H200 budget (instead of the preset's own budget)")
    p.add_argument("--capacity-gib", type=float, help="KV bytes in GiB, instead of the preset's or the H200's")
    p.add_argument("--page-size", type=int, default=64,
                   help="tokens per page (default 64; SGLang uses 1 on Hopper, simulated at 64 for speed)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the presets' request counts (default 1)")
    p.add_argument("--check-every", type=int, default=0,
                   help="steps between full invariant checks (default 0: at the end of each run only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the forward-pass ledger picks and drawn lengths")
    p.add_argument("--slo-ttft", type=float, metavar="S", help="goodput: a request's TTFT must be <= S seconds")
    p.add_argument("--slo-tpot", type=float, metavar="MS", help="goodput: its time per output token <= MS ms")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="run a workload's configurations in N local processes (default 1, --matrix: one per core; "
                        "progress is per workload then)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run each configuration as a Ray task on that cluster ('auto', 'ray://HOST:10001', or "
                        "'local' to start one here); needs the ray extra (tested with 2.60.0): "
                        "pip install 'kvarena[ray]'")
    p.add_argument("--engines", default="all", metavar="LIST",
                   help="real engines to run beside kvarena's configurations: 'all' (default: every installed "
                        f"one), 'none', or a comma list of {', '.join(REAL_ENGINES)}; a missing extra is skipped "
                        "with one line saying how to add it")
    p.add_argument("--matrix", action="store_true",
                   help="every allocator under every rule set (rows x columns; every preset unless --workload)")
    p.add_argument("--decompose", action="store_true",
                   help="with --matrix: split the gap between the best cell and the arena under SGLang's rules by "
                        "rule group (one group at a time, and cumulatively); ~12 more runs of the arena per preset")
    p.add_argument("--allocators", metavar="LIST",
                   help=f"with --matrix: rows to run, a comma list of {', '.join(MATRIX_ALLOCATORS)} (default: every "
                        "installed one)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def list_presets(out=None) -> None:
    out = out or sys.stdout
    for w in PRESET_WORKLOADS.values():
        pub = f"  published: {w.published.text}" if w.published else ""
        print(f"{w.name:<22} {w.describe()}\n{'':<22} {w.summary}.{pub}", file=out)


def _rule_value(name: str, text: str) -> object:
    f = RULES.get(name)
    if f is None:
        raise UsageError(f"--rule {name}: no such rule; the rules are {', '.join(RULES)}")
    default = getattr(SchedulerModel(), name)
    low = text.strip().lower()
    try:
        if default is None and "int" in str(f.type):  # max_num_seqs: an int or none
            return None if low in ("none", "off") else int(text)
        if low in ("none", "off") and ("None" in str(f.type)):
            return None
        if isinstance(default, bool):
            if low not in ("true", "false", "1", "0", "on", "off"):
                raise ValueError
            return low in ("true", "1", "on")
        if isinstance(default, tuple):
            return tuple(float(x) for x in text.split(","))
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise UsageError(f"--rule {name}={text}: expected a value like {default!r}") from None
    choices = {"retraction": ("fewest_decoded", "newest"), "ratio_after_retract": ("estimate", "reset")}
    if text not in choices.get(name, (text,)):
        raise UsageError(f"--rule {name}={text}: choose one of {', '.join(choices[name])}")
    return text


def scheduler_model(specs: list[str]) -> SchedulerModel:
    changes = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        if not eq:
            raise UsageError(f"--rule {spec!r}: write NAME=VALUE, e.g. --rule mixed_chunk=true")
        changes[name.strip()] = _rule_value(name.strip(), value)
    return dataclasses.replace(SchedulerModel(), **changes)


def check_args(args: argparse.Namespace) -> None:
    """Flags in the user's units: one line naming the flag to change (UsageError, exit 2)."""
    check_run_flags(args)
    if args.mem_fraction is not None and not 0 < args.mem_fraction <= 1:
        raise UsageError(f"--mem-fraction {args.mem_fraction:g} must be in (0, 1] (SGLang's is ~0.9 on an H200)")
    if args.request_rate is not None and not (math.isfinite(args.request_rate) and args.request_rate > 0):
        raise UsageError(f"--request-rate {args.request_rate:g} must be > 0 requests per second")
    if args.request_rate is not None and args.concurrency:
        raise UsageError("--concurrency and --request-rate are two arrival processes; pass one")
    for flag, v in (("--slo-ttft", args.slo_ttft), ("--slo-tpot", args.slo_tpot)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"{flag} {v:g} must be > 0")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs} must be >= 1 (processes on this machine)")
    if args.requests is not None and args.requests < 1:
        raise UsageError(f"--requests {args.requests} must be >= 1")
    if args.ray is not None and (args.jobs or 1) > 1:
        raise UsageError("--ray and --jobs both spread the runs; pass one (Ray schedules on the cluster's cores)")
    if args.ray is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UsageError("--ray needs the ray extra (tested with 2.60.0): pip install 'kvarena[ray]'")
    bad = [e for e in engines_wanted(args.engines) or () if e not in REAL_ENGINES]
    if bad:
        raise UsageError(f"--engines: unknown {', '.join(bad)}; choose from {', '.join(REAL_ENGINES)}, 'all' or 'none'")


def engines_wanted(text: str) -> tuple[str, ...] | None:
    """--engines as names (None: all)."""
    if text == "all":
        return None
    if text == "none":
        return ()
    return tuple(x.strip() for x in text.split(",") if x.strip())


def concurrencies(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise UsageError(f"--concurrency {text!r}: give clients as whole numbers >= 1, e.g. 64 or 64,128,256")
    return out


def _workloads(args: argparse.Namespace) -> list[Workload]:
    out: list[Workload] = []
    for name in args.workload or ():
        out += list(PRESET_WORKLOADS.values()) if name == "all" else [workload(name)]
    if args.trace:
        out.append(trace_workload(args.trace, args.model))
    if not out:
        raise UsageError("name a workload: --workload NAME (or all), or --trace FILE; --list names the presets")
    if args.output_lengths != "fixed":
        out = [w.with_lengths(lengths_from(args.output_lengths, w)) if not w.arrivals else w for w in out]
    clients = concurrencies(args.concurrency)
    if clients:
        out = [w.with_load(clients=c, requests=args.requests or max(w.count(), 4 * c)) for w in out for c in clients]
    elif args.request_rate is not None:
        out = [w.with_load(rate=args.request_rate, requests=args.requests) for w in out]
    return out


def budget_of(w: Workload, args: argparse.Namespace) -> tuple[int, str]:
    if args.capacity_gib is not None:
        return int(args.capacity_gib * GiB), f"--capacity-gib {args.capacity_gib:g}"
    if args.mem_fraction is None and w.calibration is not None and w.calibration.gib > 0:
        c = w.calibration
        what = "calibrated on the published split figure" if w.published is not None else "the preset's budget"
        return int(c.gib * GiB), f"{what}: {c.fitted}"
    return sglang_budget(w.model, args.mem_fraction or 0.9)


def check_size(w: Workload, args: argparse.Namespace) -> None:
    """A run the limits of kvarena/text.py refuse (an arena too large to build, more requests than a run may
    simulate), in one line naming the flag, before anything is built. A trace file's rows are run as given."""
    capacity, _ = budget_of(w, args)
    given = (f"--capacity-gib {args.capacity_gib:g}" if args.capacity_gib is not None
             else f"{w.name}'s KV budget of {gib(capacity)}")
    check_arena_size(w.model, capacity, args.page_size, given)
    if w.arrivals:
        return
    n, base = w.count(args.scale), max(1, w.requests)  # base: the requests at --scale 1
    if args.requests:
        what, fix = f"--requests {args.requests}", f"pass --requests {_floor(MAX_REQUESTS / args.scale)} or fewer"
    elif w.clients and args.concurrency:
        what = f"--concurrency {w.clients} (4 requests per client unless --requests says)"
        fix = f"pass --concurrency {_floor(MAX_REQUESTS / 4 / args.scale)} or fewer, or --requests"
    else:
        what, fix = w.name, f"pass --scale {_floor(args.scale * MAX_REQUESTS / n)} or less"
    if args.scale != 1:
        what += f" at --scale {args.scale:g}"
        if not fix.startswith("pass --scale"):
            fix += f", or --scale {_floor(MAX_REQUESTS / base)} or less"
    check_requests(n, what, fix)


def check_capacity(w: Workload, capacity: int, args: argparse.Namespace) -> None:
    """A budget no configuration can run says so in GiB, naming the flag to change."""
    context = w.max_context()
    for c in configurations(w):
        try:
            c.build(w.model, capacity, args.page_size, context)
        except CapacityTooSmallError:
            need = max(smallest_capacity(lambda n, c=c: c.build(w.model, n, args.page_size, context), capacity)
                       for c in configurations(w))
            least = f"--capacity-gib {math.ceil(need / GiB * 100) / 100:g} or more"
            fix = f"pass {least}" if args.capacity_gib is not None else f"raise --mem-fraction or pass {least}"
            raise UsageError(f"{w.name}: a KV budget of {gib(capacity)} cannot hold one request of {context:,} "
                             f"tokens in the {c.label} ({gib(need)} needed); {fix}") from None


def print_report(rep: Report, out=None) -> None:
    out = out or sys.stdout
    w = rep.workload
    print(f"== {w.name}: {w.describe()}", file=out)
    print(f"   {w.summary}", file=out)
    eos = "ignore_eos (reserved at ratio 1.0)" if w.eos() else "EOS-terminated (reserved at new_token_ratio)"
    print(f"   KV budget {_gib(rep.capacity)} ({rep.budget}); context {rep.context:,} tokens; requests {eos}",
          file=out)
    regions = " | ".join(f"{c} {_gib(hi - lo)}" for c, (lo, hi) in rep.regions.items())
    print(f"   split pools (default ratios): {regions}", file=out)
    if rep.vllm:
        pad = ", ".join(f"{c} {b / (1 << 20):,.2f} MiB" for c, b in rep.vllm["padding_bytes"].items() if b)
        print(f"   vLLM-style pool: {rep.vllm['block_tokens']}-token pages of {rep.vllm['page_bytes'] / (1 << 20):.2f} "
              f"MiB, groups {rep.vllm['groups']}" + (f", padding per page: {pad}" if pad else ""), file=out)
    print(format_table(rep.main()), file=out)
    sweep = rep.sweep()
    if sweep:
        print("   ratio sweep (split pools):", file=out)
        for o in [o for o in rep.main() if o.kind == "split"] + sweep:
            print(f"     {o.config:<26} max active {o.max_active:>6,}  mean active {o.mean_active:>9,.1f}  "
                  f"retractions/1k {o.retractions_per_1k:>7,.1f}  throughput {o.throughput_tok_s:>9,.0f} tok/s",
                  file=out)
    cmp = comparison(rep)
    if cmp:
        if cmp["metric"] == "ratio_throughput":
            ours = (f"split pools {cmp['split']:.3f}x, unified arena {cmp['unified']:.3f}x throughput at swa 0.1 "
                    "vs 0.8")
        else:
            ours = (f"unified {cmp['unified']:,.1f} vs split {cmp['split']:,.1f} ({cmp['metric']}, ratio "
                    f"{cmp['ratio']:.2f} vs published {cmp['published_ratio']:.2f})")
        print(f"   published: {cmp['published']}; simulated: {ours}; direction "
              f"{'agrees' if cmp['agrees'] else 'DIFFERS'}", file=out)
    print(file=out)


def check_matrix_args(args: argparse.Namespace) -> None:
    if not args.matrix:
        for flag, v in (("--decompose", args.decompose), ("--allocators", args.allocators)):
            if v:
                raise UsageError(f"{flag} goes with --matrix: kvarena simulate --matrix {flag} ...")
        return
    for flag, v in (("--rule", args.rule), ("--ratio-sweep", args.ratio_sweep), ("--ray", args.ray),
                    ("--policies", args.policies != "default"), ("--engines", args.engines != "all")):
        if v:
            raise UsageError(f"{flag} does not go with --matrix: the matrix's columns are the rule sets and its rows "
                             "the allocators (pick rows with --allocators)")
    bad = [a for a in allocators_wanted(args) or () if a not in MATRIX_ALLOCATORS
           and a not in MATRIX_ALLOCATORS.values()]
    if bad:
        raise UsageError(f"--allocators: unknown {', '.join(bad)}; choose from {', '.join(MATRIX_ALLOCATORS)}")


def allocators_wanted(args: argparse.Namespace) -> list[str] | None:
    return [x.strip() for x in args.allocators.split(",") if x.strip()] if args.allocators else None


def matrix_main(args: argparse.Namespace) -> int:
    """--matrix: each workload's allocators x rule sets (and --decompose), as text or JSON, and a plot."""
    from kvarena.simulator import matrix as mx

    if not args.workload and not args.trace:
        args.workload = ["all"]
    loads = _workloads(args)
    for w in loads:
        check_size(w, args)
    out, mats = [], []
    for i, w in enumerate(loads):
        capacity, budget = budget_of(w, args)
        check_capacity(w, capacity, args)
        t0 = time.perf_counter()
        tag, metric = f"[{i + 1}/{len(loads)} {w.name}]", mx.metric_of(w)

        def done(job, o, tag=tag, t0=t0, metric=metric) -> None:
            if not args.quiet:
                print(f"{tag} {job.allocator} / {job.rule_set}: {mx.fmt(mx.value(o, metric), metric)} "
                      f"({o.wall_s:.1f} s; {time.perf_counter() - t0:.0f} s in)", file=sys.stderr, flush=True)

        jobs = args.jobs or os.cpu_count() or 1
        m = mx.matrix(w, capacity, budget, args.page_size, args.seed, args.scale, jobs,
                      allocators_wanted(args), done=done)
        d = None
        if args.decompose and "kvarena arena" in m.allocators:
            d = mx.decompose(w, capacity, args.page_size, args.seed, args.scale, jobs,
                             start=m.cells[("kvarena arena", "sglang")], done=done)
        wall = time.perf_counter() - t0
        mats.append(m)
        out.append({**mx.matrix_json(m, d), "wall_s": wall})
        if not args.json:
            print(f"== {w.name}: {w.describe()}")
            print(f"   KV budget {_gib(capacity)} ({budget}); {len(m.cells)} cells in {wall:.0f} s")
            print("\n".join(mx.format_matrix(m)))
            if d is not None:
                print("\n".join(mx.format_decomposition(m, d)))
            print()
    if args.plots:
        from kvarena.simulator import plots

        path = plots.plot_matrix(mats, Path(args.plots) / "matrix.png")
        if not args.json:
            print(f"wrote {path}")
    if args.json:
        print(json.dumps({"seed": args.seed, "scale": args.scale, "page_size": args.page_size, "matrix": out},
                         indent=2))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.list:
        list_presets()
        return 0
    check_args(args)
    check_matrix_args(args)
    if args.matrix:
        try:
            return matrix_main(args)
        except SchedulerInvariantError as e:
            print(f"kvarena simulate: {e}", file=sys.stderr)
            return 1
        except ArenaError as e:
            raise UsageError(str(e)) from None
    model = scheduler_model(args.rule)
    try:
        loads = _workloads(args)
        if args.plots:
            from kvarena.simulator import plots

            plots.require()  # fail before simulating if matplotlib is missing
        reports = []
        policies = tuple(UNIFIED_POLICIES) if args.policies == "all" else tuple(args.policies.split(","))
        unknown = [p for p in policies if p not in UNIFIED_POLICIES]
        if unknown:
            raise UsageError(f"--policies: unknown {', '.join(unknown)}; choose from {', '.join(UNIFIED_POLICIES)} "
                             "or 'all'")
        for w in loads:  # every workload's size before the first runs: a later one's must not wait behind it
            check_size(w, args)
        real, skipped = real_engines(engines_wanted(args.engines))
        for i, w in enumerate(loads):
            capacity, budget = budget_of(w, args)
            check_capacity(w, capacity, args)
            bar = None if args.quiet else ProgressBar(f"[{i + 1}/{len(loads)} {w.name}] ")
            rep = simulate(w, capacity, budget, args.page_size, args.seed, args.scale, args.ratio_sweep,
                           bool(args.plots), args.check_every, bar, policies, model, args.jobs or 1,
                           SLO(args.slo_ttft, None if args.slo_tpot is None else args.slo_tpot / 1e3),
                           tuple(real), tuple(skipped), args.ray)
            reports.append(rep)
            if not args.json:
                if i == 0:
                    for line in skipped:
                        print(f"kvarena simulate: {line}")
                    print("kvarena simulate: assumptions")
                    for a in assumptions(args.page_size):
                        print(f"  - {a}")
                    print("  - " + "\n    ".join(CostModel(preset(w.model)).describe()[:1]) + "\n")
                print_report(rep)
            if args.plots:
                from kvarena.simulator import plots

                for path in plots.write_all(rep, Path(args.plots)):
                    if not args.json:
                        print(f"wrote {path}")
    except SchedulerInvariantError as e:
        print(f"kvarena simulate: {e}", file=sys.stderr)
        return 1
    except ArenaError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps({"assumptions": assumptions(args.page_size), "seed": args.seed, "scale": args.scale,
                          "rules": {k: getattr(model, k) for k in RULES}, "skipped_engines": skipped,
                          "workloads": [report_json(r) for r in reports]}, indent=2))
    return 0



