"""Fit what the published setups do not state on their published split figures: one number each.

Where the published setup (budget, lengths, engine flags) is not known, the simulator does not guess a
``--mem-fraction``: it finds the budget at which the *split pools* reproduce the published split value
of the preset's metric (bisection on the budget; the metric moves monotonically with it in these
presets), and then the unified arena's value at that budget is a prediction. The one fitted constant of
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
from dataclasses import dataclass, replace

from kvarena.simulator.budget import GiB
from kvarena.simulator.costmodel import HBM_EFFICIENCY, CostModel
from kvarena.simulator.report import percentile
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.simulation import Configuration, engine_model
from kvarena.simulator.workloads import Workload, workload
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import Kind
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


def split_value(w: Workload, gib: float, page_size: int = 64, model: SchedulerModel | None = None,
                hbm_efficiency: float = HBM_EFFICIENCY) -> float:
    """The split pools' value of the preset's published metric at a budget of ``gib``."""
    c = Configuration("split pools", "split")
    context = w.max_context()
    base = SchedulerModel(check_every=0, stall_steps=max(50_000, 4 * context)) if model is None else model
    slots = base.state_slots if any(k.kind is Kind.RECURRENT for k in preset(w.model).classes) else 1
    alloc = c.build(w.model, int(gib * GiB), page_size, context, slots)  # as simulation.run_configuration
    m = engine_model(base if slots > 1 else replace(base, state_slots=1), c, alloc.config)
    r = run(alloc, w.source(), c.label, m, cost=CostModel(preset(w.model), hbm_efficiency))
    return METRICS[w.published.metric](r)


def fit(w: Workload, lo: float, hi: float, tol_gib: float = 0.05, page_size: int = 64) -> Fit:
    """Bisect the budget in [lo, hi] GiB until the split value brackets the published split figure."""
    t0, runs = time.perf_counter(), 0
    target = w.published.split
    falling = w.published.metric == "retractions_per_1k"  # more memory, fewer retractions

    def above(g: float) -> bool:
        nonlocal runs
        runs += 1
        try:
            v = split_value(w, g, page_size)
        except CapacityTooSmallError:
            return False  # too small for one request: the budget must grow
        return v <= target if falling else v >= target

    while hi - lo > tol_gib:
        mid = round((lo + hi) / 2, 4)
        if above(mid):
            hi = mid
        else:
            lo = mid
    value = split_value(w, hi, page_size)
    return Fit(w.name, w.published.metric, target, hi, value, runs + 1, time.perf_counter() - t0)


def fit_hbm_efficiency(w: Workload, lo: float = 0.05, hi: float = 1.0, tol: float = 0.001) -> Fit:
    """Bisect ``HBM_EFFICIENCY`` in [lo, hi] until the split pools' value of ``w``'s published metric (a
    latency: it falls as the bandwidth share rises) brackets the published split figure, at ``w``'s budget."""
    t0, runs = time.perf_counter(), 0
    gib, target = w.calibration.gib, w.published.split
    while hi - lo > tol:
        mid = round((lo + hi) / 2, 5)
        runs += 1
        if split_value(w, gib, hbm_efficiency=mid) <= target:
            hi = mid
        else:
            lo = mid
    value = split_value(w, gib, hbm_efficiency=hi)
    return Fit(w.name, w.published.metric, target, hi, value, runs + 1, time.perf_counter() - t0)


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
