"""The placement limit in the simulator (simulator/ceiling.py, spec §Placement limit): bytes moved with it and without.

    python bench/rung1_ceiling.py                               # gpt-oss-20b-max
    python bench/rung1_ceiling.py --workload gpt-oss-20b-c1000

Runs the unified-arena column alone three ways on the same trace: ``full-compaction`` (SGLang's flush, which
takes no limit), the default ladder without the limit (``SchedulerModel.placement_limit=False``) and the default
with it (the simulator's default), and prints the bytes each moves beside its decisions (most running,
retractions), which the limit must not change. bench/rung2_bound.py is why: rung 1's nearest-the-anchor
order strands the window pages the full band reaches while they live.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from _unified import add_workload_args, unified_only, workload_and_budget

from kvarena.simulator import simulation as sim
from kvarena.simulator.rules import SchedulerModel


def run(w, cap: int, policy: str, limit: bool, scale: float):  # type: ignore[no-untyped-def]
    with unified_only():
        rep = sim.simulate(w, cap, "preset", policies=(policy,), scale=scale,
                           model=replace(SchedulerModel(), placement_limit=limit))
    (o,) = rep.outcomes
    return o


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    args = p.parse_args(argv)
    w, cap = workload_and_budget(args)
    print(f"{w.name} (outputs {args.output_lengths}), {cap / 2**30:.2f} GiB")
    print("| unified arena | GiB moved (compaction + relayout) | x full-compaction | max active | retractions |"
          " wall s |\n|---|---:|---:|---:|---:|---:|")
    base = None
    for name, policy, limit in (("full-compaction (SGLang's flush, no limit)", "full-compaction", False),
                                ("default, no placement limit", "default", False),
                                ("default + placement limit", "default", True)):
        t0 = time.time()
        o = run(w, cap, policy, limit, args.scale)
        moved = (o.bytes_moved_compaction + o.bytes_moved_relayout) / 2**30
        base = moved if base is None else base
        ratio = f"{moved / base:.3f}" if base else "-"
        print(f"| {name} | {moved:.3f} | {ratio} | {o.max_active:,} | {o.retractions:,} | {time.time() - t0:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
