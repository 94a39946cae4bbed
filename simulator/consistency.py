"""Can one budget reproduce a published pair? The calibration's check on itself.

calibrate.py fits a preset's budget on its published *split* figure and then predicts the unified one. When
the prediction misses, there are two readings: the model's unified column is wrong, or the published run had
a budget (or flags) at which the split figure alone does not pin the pair. This module tells them apart. It
runs both columns over a grid of budgets, fits the budget on each published figure in turn (bisection inside
the grid bracket nearest the split fit, so the two fits are as close as the curves allow), and says whether
any budget has the split value within 10 % (``SPLIT_TOL``) of the published split figure *and* the ratio
within 25 % of the published ratio. If none has, no single budget reproduces the pair under these rules: reaching it
would take a second fitted number for that row, which the simulator does not do.

    python -m kvarena.simulator.consistency qwen3.5-4b-512-16k --jobs 2 [--plot DIR]
    python -m kvarena.simulator.consistency                   # every preset fitted on a budget
    python -m kvarena.simulator.consistency qwen3.5-4b-512-16k --split-column sglang-split \
        --unified-column sglang-unified                         # SGLang's own allocators as the columns

A preset takes 1-3 minutes on 2 cores (9 budgets x 2 columns, then the bisection).

Only presets whose budget was fitted (``Workload.calibration``) on a metric that moves with memory (most or
mean running requests, retractions) take part; a latency metric moves with the cost model instead.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvarena.simulator import calibrate
from kvarena.simulator.workloads import PRESET_WORKLOADS, Workload, workload
from kvarena.spec.errors import CapacityTooSmallError, ConfigError

SPLIT_TOL = 0.10  # how near the published split figure a budget's split value must be to count as "fitted"
RATIO_TOL = 0.25  # the README table's "ratio within 25 %"
MEMORY_METRICS = ("max_active", "mean_active", "retractions_per_1k")


@dataclass(frozen=True)
class Point:
    gib: float
    split: float  # the split column's value (Report.columns[0])
    unified: float  # the unified column's value (Report.columns[1])

    @property
    def ratio(self) -> float:
        return self.unified / self.split if self.split else float("inf")


@dataclass(frozen=True)
class Report:
    workload: str
    metric: str
    published_split: float
    published_unified: float
    points: tuple[Point, ...]  # by budget, the two fits' budgets included
    fitted: dict[str, float]  # "split" / "unified" -> the budget fitted on that published figure
    columns: tuple[str, str] = ("split", "unified")  # the engines (calibrate.COLUMNS keys) run as the two

    @property
    def published_ratio(self) -> float:
        return self.published_unified / self.published_split

    def reproduces(self, p: Point) -> bool:
        """The split value near the published split figure and the ratio within 25 % of the published ratio."""
        return (abs(p.split / self.published_split - 1) <= SPLIT_TOL
                and abs(p.ratio / self.published_ratio - 1) <= RATIO_TOL)

    def at(self, gib: float) -> Point:
        return next(p for p in self.points if p.gib == gib)

    @property
    def consistent(self) -> bool:
        return any(self.reproduces(p) for p in self.points)


def grid(center: float, points: int, lo: float = 0.5, hi: float = 1.25) -> list[float]:
    """``points`` budgets from ``lo`` to ``hi`` times ``center`` (GiB, two decimals), ``center`` among them."""
    step = (hi - lo) / (points - 1)
    return sorted({round(center * (lo + i * step), 2) for i in range(points)} | {round(center, 2)})


def _point(args: tuple[Workload, float, tuple[str, str]]) -> Point:
    w, gib, (split, unified) = args
    return Point(gib, _value(w, gib, split), _value(w, gib, unified))


def _value(w: Workload, gib: float, kind: str) -> float:
    try:
        return calibrate.value(w, gib, kind)
    except CapacityTooSmallError:  # below one request: as if nothing ran
        return float("nan")


def fit_in_bracket(f: Callable[[float], float], target: float, points: Sequence[tuple[float, float]],
                   near: float, falling: bool, tol: float = 0.05) -> float | None:
    """The budget where ``f`` crosses ``target``, bisected inside the grid bracket nearest ``near``.

    ``points``: (budget, value) by budget. A bracket is two neighbours with the target between their values
    (a stepped metric may cross more than once). None when the grid never crosses it."""
    brackets = [(a, b) for (a, va), (b, vb) in zip(points, points[1:])
                if not (math.isnan(va) or math.isnan(vb)) and min(va, vb) <= target <= max(va, vb)]
    if not brackets:
        return None
    lo, hi = min(brackets, key=lambda ab: min(abs(ab[0] - near), abs(ab[1] - near)))

    def above(g: float) -> bool:  # past the target on the side more memory gives
        v = f(g)
        return v <= target if falling else v >= target

    if above(lo) == above(hi):  # a bracket whose ends sit on the same side after all: take its nearer end
        return lo if abs(lo - near) <= abs(hi - near) else hi
    while hi - lo > tol:
        mid = round((lo + hi) / 2, 3)
        if above(mid) == above(hi):
            hi = mid
        else:
            lo = mid
    return hi


def check(w: Workload, points: int = 9, jobs: int = 2, progress: Callable[[str], None] | None = None,
          columns: tuple[str, str] = ("split", "unified")) -> Report:
    """Both columns over a grid of budgets around the preset's fitted one, and the budget fitted on each
    published figure. ``columns``: the split and the unified engine (``sglang-split`` / ``sglang-unified``: SGLang's
    own allocators, the sglang extra)."""
    if w.calibration is None or w.published is None or w.published.metric not in MEMORY_METRICS:
        raise ValueError(f"{w.name}: its budget is not fitted on a memory metric (one of {MEMORY_METRICS})")
    from kvarena.simulator.engines import ENGINES

    for c in columns:
        if c not in calibrate.COLUMNS:
            raise ValueError(f"column {c!r}: choose one of {', '.join(calibrate.COLUMNS)}")
        if (why := ENGINES[c].missing()) is not None:
            raise ValueError(f"column {c!r}: {why}")
    say = progress or (lambda _: None)
    budgets = grid(w.calibration.gib, points)
    work = [(w, g, columns) for g in budgets]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            found = {p.gib: p for p in pool.map(_point, work)}
    else:  # in this process
        found = {p.gib: p for p in map(_point, work)}
    say(f"{w.name}: {len(budgets)} budgets x 2 columns")
    falling = w.published.metric == "retractions_per_1k"
    fitted = {"split": round(w.calibration.gib, 2)}  # the grid's own point for the preset's budget
    curve = [(g, found[g].unified) for g in budgets]
    g = fit_in_bracket(lambda x: _value(w, x, columns[1]), w.published.unified, curve, w.calibration.gib, falling)
    if g is not None:
        fitted["unified"] = g
        if g not in found:
            found[g] = _point((w, g, columns))
    say(f"{w.name}: budget fitted on the published unified figure ({columns[1]}): {g}")
    return Report(w.name, w.published.metric, w.published.split, w.published.unified,
                  tuple(found[g] for g in sorted(found)), fitted, columns)


def markdown(r: Report) -> str:
    """The report as a table and its verdict."""
    split, unified = (calibrate.COLUMNS[c] for c in r.columns)
    lines = [f"### {r.workload} ({r.metric}; published {r.published_unified:g} vs {r.published_split:g}, "
             f"ratio {r.published_ratio:.2f})", "",
             f"| budget (GiB) | {split} | {unified} | ratio | split vs published | ratio vs published | |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for p in r.points:
        tags = [f"fitted on {k}" for k, g in r.fitted.items() if g == p.gib]
        if r.reproduces(p):
            tags.append("reproduces the pair")
        lines.append(f"| {p.gib:.2f} | {p.split:,.1f} | {p.unified:,.1f} | {p.ratio:.3f} | "
                     f"{p.split / r.published_split - 1:+.1%} | {p.ratio / r.published_ratio - 1:+.1%} | "
                     f"{', '.join(tags)} |")
    lines.append("")
    s = r.at(r.fitted["split"])
    if "unified" in r.fitted:
        u = r.at(r.fitted["unified"])
        gap = u.gib - s.gib
        lines.append(f"Fitted on the split figure: {s.gib:.2f} GiB (unified {s.unified:,.1f}, ratio {s.ratio:.3f}). "
                     f"Fitted on the unified figure: {u.gib:.2f} GiB (split {u.split:,.1f}, "
                     f"{u.split / r.published_split - 1:+.1%} from the published split). The two fits are "
                     f"{abs(gap):.2f} GiB ({abs(gap) / s.gib:.0%}) apart.")
    else:
        best = min(r.points, key=lambda p: abs(p.unified - r.published_unified))
        lines.append(f"Fitted on the split figure: {s.gib:.2f} GiB (ratio {s.ratio:.3f}); the unified column never "
                     f"reaches {r.published_unified:g} on this grid (nearest: {best.unified:,.1f} at {best.gib:.2f} "
                     f"GiB, where the split value is {best.split:,.1f}).")
    good = [p.gib for p in r.points if r.reproduces(p)]
    lines.append(f"**One budget reproduces the pair** (split within {SPLIT_TOL:.0%}, ratio within {RATIO_TOL:.0%}): "
                 + (f"yes, at {', '.join(f'{g:.2f}' for g in good)} GiB." if good else "no budget on this grid."))
    return "\n".join(lines)


def plot(r: Report, out_dir: Path) -> Path:
    """Both columns' values against the budget, the published figures as lines, the fits marked."""
    from kvarena.simulator.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    gs = [p.gib for p in r.points]
    for kind, column, color in (("split", r.columns[0], "tab:orange"), ("unified", r.columns[1], "tab:blue")):
        ax.plot(gs, [getattr(p, kind) for p in r.points], "o-", color=color, label=calibrate.COLUMNS[column])
        ax.axhline(getattr(r, f"published_{kind}"), color=color, ls="--", lw=1, label=f"published {kind}")
        if kind in r.fitted:
            ax.axvline(r.fitted[kind], color=color, ls=":", lw=1)
    ax.set_xlabel("KV budget (GiB)")
    ax.set_ylabel(r.metric.replace("_", " "))
    ax.set_title(f"{r.workload}: one budget for both published figures?")
    ax.legend(fontsize=8)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if r.columns == ("split", "unified") else "-" + "-".join(r.columns)
    path = out_dir / f"consistency-{r.workload}{suffix}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvarena.simulator.consistency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="*", help="presets (default: every one fitted on a memory metric)")
    p.add_argument("--points", type=int, default=9, help="grid budgets, 0.5x to 1.25x the fitted one (default 9)")
    p.add_argument("--jobs", type=int, default=2, help="local processes for the grid (default 2)")
    p.add_argument("--plot", type=Path, metavar="DIR", help="also write consistency-NAME.png there")
    p.add_argument("--split-column", default="split", choices=["split", "sglang-split"],
                   help="the split engine: kvarena's split pools (default) or SGLang's own (the sglang extra)")
    p.add_argument("--unified-column", default="unified", choices=["unified", "sglang-unified"],
                   help="the unified engine: kvarena's arena (default) or SGLang's own unified allocator")
    args = p.parse_args(argv)
    names = args.workloads or [n for n, w in PRESET_WORKLOADS.items() if w.calibration is not None and w.published
                               is not None and w.published.metric in MEMORY_METRICS]
    if args.points < 2:
        p.error("--points must be at least 2")
    for name in names:
        t0 = time.perf_counter()
        try:
            r = check(workload(name), args.points, args.jobs, columns=(args.split_column, args.unified_column),
                      progress=lambda s: print(s, file=sys.stderr, flush=True))
        except (ConfigError, ValueError) as e:
            print(f"consistency: {e}", file=sys.stderr)
            return 2
        print(markdown(r), f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
        if args.plot:
            print(f"wrote {plot(r, args.plot)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
