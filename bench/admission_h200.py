"""The admission decision at H200 size: how long the reference and gpu/ take to PLAN an admission that needs
rung 2 (compaction of the end bands) or rung 3 (relayout of a float band), with hundreds of moves.

    python bench/admission_h200.py            # full run: bench/results/admission-h200-<date>.md
    python bench/admission_h200.py --smoke    # seconds: small arenas, few states, 2 repetitions, no file

What is timed: ``Arena.plan_admission(demand)`` (reference: the policy's ladder plus ``validate_plan``) and
``GpuArena.plan_admission(demand)`` (gpu/, ``make(config, device="meta")``: every device tensor on torch's meta
device, so no arena bytes exist; planning is host work, numpy and Python, on either side). It is the decision an
engine waits on when a request arrives: which rung, which moves, which slots. Nothing is applied.

How the states are built, the same operations on both implementations (each admission's plan compared):

* one arena per preset at an H200's KV budget, ``kvarena.simulator.budget.sglang_budget`` (139 GiB usable x 0.9
  - the preset's weights, as ``kvarena simulate`` computes it), page size 64;
* filled with short requests (U[lo, hi] tokens, ``request_pages``) while rung 1 places them; a scattered
  ``--free`` fraction of them freed (random owners); refilled with long prompts, then short ones, while rung 1
  places them: the long ones take the full band's holes with few window/state pages each, so the full band ends
  nearly hole-free, the other end band (and hymba's window float) keep hundreds to thousands of holes, the gap
  a few pages (the table's setup lines give the bands after the last state);
* ``--states`` states, each after ``--churn`` random frees and the same refill. The demand is a prompt of n
  full-attention pages (``request_pages(model, 64, 64 n)``: its window/state pages too): past the largest n the
  rung below places, the smallest n whose plan at the wanted rung moves >= m pages, m drawn from ``--moves``
  (galloping and bisection on the reference's plans, untimed). n is sized to the rung, not capped at the
  model's context length (qwen3.5-4b's exceeds it: read it as a batch of prompts).

Rung 2 on gpt-oss-20b (window | full) and qwen3.5-4b (state | full): neither has a float band, so rung 3 cannot
occur there; the rung-3 figure is hymba-1.5b's (state | window float | full), the one preset with a float.
Each decision: one untimed call of each implementation, then ``--reps`` timed calls each, shuffled, ``gc`` off
during each call; median and p99 (nearest rank) over all states' calls.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import finish, machine_line, python_line, sh

from kvarena.gpu.allocator import make
from kvarena.reference.arena import Arena
from kvarena.simulator.budget import GiB, sglang_budget
from kvarena.spec.errors import AdmissionRejectedError
from kvarena.spec.models import ArenaConfig, preset, request_pages
from kvarena.spec.types import Rung

PS = 64
# preset, rung wanted, tokens of the short requests and of the long ones (U[lo, hi], capped at the context length)
CASES = (("gpt-oss-20b", Rung.COMPACT, (256, 4096), (16384, 131072)),
         ("qwen3.5-4b", Rung.COMPACT, (64, 2048), (16384, 262144)),
         ("hymba-1.5b", Rung.RELAYOUT, (256, 4096), (4096, 8192)))
TARGET_MS = {"gpu": 0.5, "reference": 2.0}  # p99, rung 2 and rung 3 alike (the targets)
IMPLS = ("reference", "gpu")


class Pair:
    """The reference and gpu/ driven by one sequence of operations."""

    def __init__(self, config: ArenaConfig, rng: random.Random) -> None:
        self.ref, self.gpu = Arena(config), make(config, device="meta")
        self.model, self.rng, self.ctx = config.model, rng, config.context_len
        self.live: list[str] = []
        self.serial = 0
        self.admit_diffs = 0

    def admit_if_rung1(self, d: dict[str, int]) -> bool:
        if (got := plan_of(self.ref, d)) is None or got.rung is not Rung.REUSE:
            return False
        name = f"r{self.serial}"
        self.serial += 1
        a, b = self.ref.admit(name, d), self.gpu.admit(name, d)
        self.admit_diffs += a.plan != b.plan or a.pages != b.pages
        self.live.append(name)
        return True

    def free_random(self, k: int) -> None:
        for _ in range(min(k, len(self.live))):
            name = self.live.pop(self.rng.randrange(len(self.live)))
            self.ref.free(name)
            self.gpu.free(name)

    def fill(self, tokens: tuple[int, int], misses: int) -> None:
        """Admit requests of U[tokens] tokens (capped at the context length) while rung 1 places them."""
        while misses:
            d = request_pages(self.model, PS, min(self.ctx, self.rng.randint(*tokens)))
            misses -= not self.admit_if_rung1(d)


def plan_of(arena: Arena, d: dict[str, int]):  # type: ignore[no-untyped-def]
    try:
        return arena.plan_admission(d)
    except AdmissionRejectedError:
        return None


def demand(model, n: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return request_pages(model, PS, n * PS)


def last_ok(ok, lo: int) -> int:  # type: ignore[no-untyped-def]
    """The largest n >= lo with ok(n), given ok(lo): galloping (lo + 1, 2, 4, ...) then bisection (ok taken as
    monotone); probes stay near the answer, where a failed plan is cheap."""
    step, hi = 1, None
    while hi is None:
        if ok(lo + step):
            lo, step = lo + step, 2 * step
        else:
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def pick_n(pair: Pair, rung: Rung, want: int) -> int | None:
    """Full pages n that the wanted ``rung`` places and the rungs below do not, its plan moving about ``want``
    pages: the smallest such n whose plan moves >= ``want``, else the largest the rung places."""
    def plan(n: int):  # type: ignore[no-untyped-def]
        return plan_of(pair.ref, demand(pair.model, n))

    def within(r: Rung):  # type: ignore[no-untyped-def]
        return lambda n: (got := plan(n)) is not None and got.rung <= r

    n_below = last_ok(within(Rung.REUSE), 0)
    if rung is Rung.RELAYOUT:
        n_below = last_ok(within(Rung.COMPACT), n_below)
    if (first := plan(n_below + 1)) is None or first.rung is not rung:
        return None
    few = last_ok(lambda n: n == n_below or ((got := plan(n)) is not None and got.rung is rung
                                            and len(got.moves) < want), n_below)
    nxt = plan(few + 1)
    return few + 1 if nxt is not None and nxt.rung is rung else few


def time_state(pair: Pair, d: dict[str, int], reps: int, rng: random.Random):  # type: ignore[no-untyped-def]
    """Each implementation's plan of ``d`` and its ``reps`` timings (seconds), the calls shuffled."""
    samples: dict[str, list[float]] = {k: [] for k in IMPLS}
    calls = [("reference", pair.ref), ("gpu", pair.gpu)] * reps  # type: ignore[list-item]
    rng.shuffle(calls)
    for arena in (pair.ref, pair.gpu):
        arena.plan_admission(d)  # untimed warm-up of each: the reference's was warmed by pick_n's probes
    plans = {}
    for name, arena in calls:
        gc.disable()
        t0 = time.perf_counter()
        plan = arena.plan_admission(d)
        t1 = time.perf_counter()
        gc.enable()
        samples[name].append(t1 - t0)
        plans.setdefault(name, plan)
    return plans["reference"], plans["gpu"], samples


def diff(a, b) -> str:  # type: ignore[no-untyped-def]
    for what in ("rung", "moves", "placements", "spans", "bytes_moved"):
        if getattr(a, what) != getattr(b, what):
            return f"{what} differ (reference {len(a.moves)} moves, gpu {len(b.moves)})"
    return "equal"


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, -(-99 * len(s) // 100) - 1)]


def run_case(name: str, rung: Rung, short: tuple[int, int], long: tuple[int, int], args: argparse.Namespace) -> dict:
    capacity, budget_line = sglang_budget(name)
    capacity //= args.shrink
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    ctx = 8192 if args.smoke else None  # a small arena's floor: one request of 8K tokens, not the model's limit
    pair = Pair(ArenaConfig(preset(name), capacity, page_size=PS, max_context_len=ctx), rng)

    def refill() -> None:  # long prompts take the full band's holes (few window/state pages each), then short ones
        pair.fill(long, 4)
        pair.fill(short, 4)

    pair.fill(short, 8)
    pair.free_random(int(args.free * len(pair.live)))
    refill()
    built = time.perf_counter() - t0
    samples: dict[str, list[float]] = {k: [] for k in IMPLS}
    moves, float_moves, ns, diffs, skipped = [], [], [], [], 0
    for i in range(args.states):
        if i:
            pair.free_random(args.churn)
            refill()
        n = pick_n(pair, rung, rng.randint(*args.moves))
        if n is None:
            skipped += 1
            continue
        d = demand(pair.model, n)
        a, b, got = time_state(pair, d, args.reps, rng)
        if a.rung is not rung:  # (pick_n checked it: never expected) not counted
            skipped += 1
            continue
        for k in IMPLS:
            samples[k].extend(got[k])
        if a != b:
            diffs.append(f"state {i}, n {n}: {diff(a, b)}")
        moves.append(len(a.moves))
        float_moves.append(sum(1 for m in a.moves if m.cls in a.spans))
        ns.append(n)
    return dict(name=name, rung=rung, capacity=capacity, budget=budget_line, built=built, samples=samples,
                moves=moves, float_moves=float_moves, ns=ns, diffs=diffs, skipped=skipped,
                admit_diffs=pair.admit_diffs, live=len(pair.live),
                bands={c: (b.hi - b.lo, len(b.live), b.hole_count) for c, b in pair.ref.bands.items()},
                gap=pair.ref.gap_bytes())


def report(cases: list[dict]) -> tuple[list[str], list[str]]:
    rows, verdicts = [], []
    for c in cases:
        if not c["moves"]:
            rows.append(f"| {c['name']} | {int(c['rung'])} | 0 states placed at rung {int(c['rung'])} |" + " |" * 9)
            continue
        ms = {k: [x * 1e3 for x in v] for k, v in c["samples"].items()}
        fm = f" ({statistics.median(c['float_moves']):.0f} float)" if c["rung"] is Rung.RELAYOUT else ""
        cells = []
        for k in IMPLS:
            med, top = statistics.median(ms[k]), p99(ms[k])
            target = TARGET_MS[k]
            met = "met" if top <= target else "NOT met"
            cells += [f"{med:.3f}", f"{top:.3f}"]
            verdicts.append(f"- {c['name']}, rung {int(c['rung'])}, {k}: p99 {top:.3f} ms, target <= {target:g} ms: "
                            f"**{met}**")
        rows.append(f"| {c['name']} | {int(c['rung'])} | {len(c['moves'])} (+{c['skipped']} skipped) | "
                    f"{len(ms['gpu'])} | {statistics.median(c['moves']):.0f}{fm} | "
                    f"{min(c['moves'])}-{max(c['moves'])} | {statistics.median(c['ns']):.0f} | " + " | ".join(cells)
                    + f" | {statistics.median(ms['reference']) / statistics.median(ms['gpu']):.1f}x |")
    return rows, verdicts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="arenas at 1/16 of the budget, 4 states, 2 reps; no file")
    p.add_argument("--states", type=int, default=None, help="timed states per preset (default 100; smoke 4)")
    p.add_argument("--reps", type=int, default=None, help="timings per state and implementation (default 3)")
    p.add_argument("--free", type=float, default=0.35, help="fraction of the fill's requests freed, scattered")
    p.add_argument("--churn", type=int, default=6, help="random frees and rung-1 admissions between states")
    p.add_argument("--moves", type=int, nargs=2, default=(100, 1000),
                   help="each state's demand is sized to a plan of m moves, m drawn from [LO, HI]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    args.states = args.states or (4 if args.smoke else 100)
    args.reps = args.reps or (2 if args.smoke else 3)
    args.shrink = 16 if args.smoke else 1
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t_start = time.perf_counter()
    cases = [run_case(*case, args) for case in CASES]
    rows, verdicts = report(cases)
    diffs = [f"- {c['name']}: {d}" for c in cases for d in c["diffs"]]
    agree = [f"- {c['name']}: {len(c['moves']) - len(c['diffs'])} of {len(c['moves'])} timed plans equal "
             f"(rung, moves in order, placements, spans, bytes moved); the fill's and churn's admissions: "
             f"{c['admit_diffs']} differing" for c in cases]
    setup = [f"- {c['name']}: {c['capacity'] / GiB:.2f} GiB ({c['budget']}{', /16 for --smoke' if args.smoke else ''});"
             f" built in {c['built']:.1f} s; after the last state {c['live']} requests live, bands (span slots, live, "
             f"holes) {c['bands']}, gap {c['gap'] / GiB:.3f} GiB" for c in cases]
    command = " ".join(["python bench/admission_h200.py", *(sys.argv[1:] if argv is None else argv)])
    lscpu = sh("sh", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'")
    today = datetime.date.today().isoformat()
    text = "\n".join([
        f"# The admission decision at H200 size (plan_admission, rungs 2 and 3), {today}",
        "",
        f"- command: `{command}` (wall {time.perf_counter() - t_start:.0f} s)",
        machine_line(load),
        f"- cpu: {lscpu or '?'}; the decision is host work on either side (gpu/ on the meta device)",
        python_line(),
        f"- {args.states} states per preset, {args.reps} timings per state and implementation (shuffled, gc off "
        f"during each call); fill requests freed {args.free:g}, churn {args.churn}, moves wanted per plan drawn "
        f"from {tuple(args.moves)}",
        *setup,
        "",
        "| preset | rung | states timed | samples per impl | moves per plan, median | moves min-max | "
        "full pages demanded, median | reference median ms | reference p99 ms | gpu median ms | gpu p99 ms | "
        "reference / gpu (median) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Targets (the issue's): gpu/ rung 2 and rung 3 each <= 0.5 ms p99, the reference <= 2 ms p99."
        + (" --smoke: 1/16-size arenas, few states: these verdicts say nothing about H200 size." if args.smoke else ""),
        "",
        *verdicts,
        "",
        "## Do the plans agree?",
        "",
        *agree,
        *(diffs or ["- no timed plan differed"]),
        "",
    ])
    return finish(args.out, f"admission-h200-{today}.md", text, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
