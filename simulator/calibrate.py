"""Fit a preset's KV budget on its published split figure: one number, the rest predicted.

Where the published setup (budget, lengths, engine flags) is not known, the simulator does not guess a
``--mem-fraction``: it finds the budget at which the *split pools* reproduce the published split value
of the preset's metric (bisection on the budget; the metric moves monotonically with it in these
presets), and then the unified arena's value at that budget is a prediction. Run it as

    python -m kvarena.simulator.calibrate gpt-oss-20b-max qwen3.5-4b-16k-4k qwen3.5-4b-512-16k

and copy the budgets it prints into ``workloads.py`` (``Calibration``); the README records them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from kvarena.simulator.budget import GiB
from kvarena.simulator.costmodel import CostModel
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.simulation import Configuration, engine_model
from kvarena.simulator.workloads import Workload, workload
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.models import preset

METRICS = {
    "max_active": lambda r: r.max_active,
    "mean_active": lambda r: r.mean_active,
    "retractions_per_1k": lambda r: 1000 * r.retractions / max(1, r.completed),
}


@dataclass(frozen=True)
class Fit:
    workload: str
    metric: str
    target: float
    gib: float
    value: float
    runs: int
    wall_s: float


def split_value(w: Workload, gib: float, page_size: int = 64, model: SchedulerModel | None = None) -> float:
    """The split pools' value of the preset's published metric at a budget of ``gib``."""
    c = Configuration("split pools", "split")
    context = w.max_context()
    alloc = c.build(w.model, int(gib * GiB), page_size, context)
    m = engine_model(SchedulerModel(check_every=0, stall_steps=max(50_000, 4 * context))
                     if model is None else model, c, alloc.config)
    r = run(alloc, w.source(), c.label, m, cost=CostModel(preset(w.model)))
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


RANGES = {"gpt-oss-20b-max": (8.0, 80.0), "qwen3.5-4b-16k-4k": (10.0, 60.0), "qwen3.5-4b-512-16k": (10.0, 60.0)}


def main(argv: list[str]) -> int:
    for name in argv or list(RANGES):
        f = fit(workload(name), *RANGES[name])
        print(f"{f.workload}: {f.gib:.2f} GiB gives split {f.metric} {f.value:,.1f} (published {f.target:g}); "
              f"{f.runs} runs, {f.wall_s:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
