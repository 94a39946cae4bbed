"""Fit what the published setups do not state on their published split figures: one number each.

Where the published setup (budget, lengths, engine flags) is not known, the simulator does not guess a
``--mem-fraction``: it finds the budget at which the *split pools* reproduce the published split value
of the preset's metric (bisection on the budget), and then the unified arena's value at that budget is a
prediction. The metric's trend is monotone in the budget, but a retraction count steps: on
qwen3.5-4b-512-16k the split count wanders by ~20 per 1,000 around its trend, so the bisection lands on one
of its crossings; consistency.py runs both columns over a grid of budgets and says whether any one budget
reproduces the published pair. The one fitted constant of
the cost model, ``costmodel.HBM_EFFICIENCY``, is found the same way on the split TTFT p50 of
``gpt-oss-20b-c1000`` (43 s), at that preset's fitted budget. Run it as

    python -m kvarena.simulator.calibrate gpt-oss-20b-max qwen3.5-4b-16k-4k qwen3.5-4b-512-16k
    python -m kvarena.simulator.calibrate hbm-efficiency

and copy what it prints into ``workloads.py`` (``Calibration``) and ``costmodel.py``; the README records
them. Order: the GPT-OSS budget first (max active at t = 0 does not depend on the clock), then the
cost constant, then any budget fitted on a clock-weighted metric (mean active), which moves with it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvarena.simulator.budget import GiB
from kvarena.simulator.costmodel import HBM_EFFICIENCY, CostModel
from kvarena.simulator.report import percentile
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.simulation import Configuration, build_configuration
from kvarena.simulator.workloads import Workload, workload
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.models import preset

METRICS = {
    "max_active": lambda r: r.max_active,
    "mean_active": lambda r: r.mean_active,
    "retractions_per_1k": lambda r: 1000 * r.retractions / max(1, r.completed),
    "ttft_p50": lambda r: percentile(r.ttft, 50),
}


@dataclass(frozen=True)
class Fit:
    workload: str
    metric: str
    target: float
    fitted: float  # GiB for a budget, the share for HBM_EFFICIENCY
    value: float
    runs: int
    wall_s: float


# The configurations a published pair compares (engines.ENGINES kind -> column label, as kvarena simulate names
# them): kvarena's two, and SGLang's real allocators when the sglang extra is installed.
COLUMNS = {"split": "split pools", "unified": "unified arena", "sglang-split": "SGLang split pools",
           "sglang-unified": "SGLang unified"}


def value(w: Workload, gib: float, kind: str = "split", page_size: int = 64, model: SchedulerModel | None = None,
          hbm_efficiency: float = HBM_EFFICIENCY) -> float:
    """The value of the preset's published metric at a budget of ``gib`` on the ``kind`` column (a key of
    COLUMNS), built as ``kvarena simulate`` builds it."""
    c = Configuration(COLUMNS[kind], kind)
    context = w.max_context()
    base = SchedulerModel(check_every=0, stall_steps=max(50_000, 4 * context)) if model is None else model
    alloc, m = build_configuration(c, w.model, int(gib * GiB), page_size, context, base)  # as a simulate column
    r = run(alloc, w.source(), c.label, m, cost=CostModel(preset(w.model), hbm_efficiency))
    return METRICS[w.published.metric](r)


def split_value(w: Workload, gib: float, page_size: int = 64, model: SchedulerModel | None = None,
                hbm_efficiency: float = HBM_EFFICIENCY) -> float:
    """The split pools' value of the preset's published metric at a budget of ``gib``."""
    return value(w, gib, "split", page_size, model, hbm_efficiency)


def _bisect(above: Callable[[float], bool], lo: float, hi: float, tol: float, digits: int) -> tuple[float, int]:
    """The least x in [lo, hi] (within ``tol``) with ``above(x)``, for a monotone ``above``; and the runs made."""
    runs = 0
    while hi - lo > tol:
        mid = round((lo + hi) / 2, digits)
        runs += 1
        if above(mid):
            hi = mid
        else:
            lo = mid
    return hi, runs


def fit(w: Workload, lo: float, hi: float, tol_gib: float = 0.05, page_size: int = 64) -> Fit:
    """Bisect the budget in [lo, hi] GiB until the split value brackets the published split figure."""
    t0, target = time.perf_counter(), w.published.split
    falling = w.published.metric == "retractions_per_1k"  # more memory, fewer retractions

    def above(g: float) -> bool:
        try:
            v = split_value(w, g, page_size)
        except CapacityTooSmallError:
            return False  # too small for one request: the budget must grow
        return v <= target if falling else v >= target

    gib, runs = _bisect(above, lo, hi, tol_gib, 4)
    value = split_value(w, gib, page_size)
    return Fit(w.name, w.published.metric, target, gib, value, runs + 1, time.perf_counter() - t0)


def fit_hbm_efficiency(w: Workload, lo: float = 0.05, hi: float = 1.0, tol: float = 0.001) -> Fit:
    """Bisect ``HBM_EFFICIENCY`` in [lo, hi] until the split pools' value of ``w``'s published metric (a
    latency: it falls as the bandwidth share rises) brackets the published split figure, at ``w``'s budget."""
    t0, gib, target = time.perf_counter(), w.calibration.gib, w.published.split
    share, runs = _bisect(lambda s: split_value(w, gib, hbm_efficiency=s) <= target, lo, hi, tol, 5)
    value = split_value(w, gib, hbm_efficiency=share)
    return Fit(w.name, w.published.metric, target, share, value, runs + 1, time.perf_counter() - t0)


COST_FIT = "gpt-oss-20b-c1000"  # the preset HBM_EFFICIENCY is fitted on (its split TTFT p50)
RANGES = {"gpt-oss-20b-max": (8.0, 80.0), "qwen3.5-4b-16k-4k": (10.0, 60.0), "qwen3.5-4b-512-16k": (10.0, 60.0)}


def main(argv: list[str]) -> int:
    for name in argv or list(RANGES):
        if name == "hbm-efficiency":
            f = fit_hbm_efficiency(workload(COST_FIT))
            print(f"HBM_EFFICIENCY = {f.fitted:.4f} gives {f.workload} split {f.metric} {f.value:,.2f} s (published "
                  f"{f.target:g} s); {f.runs} runs, {f.wall_s:.0f} s", flush=True)
            continue
        f = fit(workload(name), *RANGES[name])
        print(f"{f.workload}: {f.fitted:.2f} GiB gives split {f.metric} {f.value:,.1f} (published {f.target:g}); "
              f"{f.runs} runs, {f.wall_s:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
