"""Wall time of ``kvarena simulate`` per workload preset (the issue's budget: 2 minutes each on 2 cores).

    python bench/simulate_speed.py [--jobs N] [--mem-fraction F] [--out DIR] [--json FILE] [--engines none]

Runs every preset once, as ``kvarena simulate --workload NAME --jobs N`` does (default 2: the budget is
2 minutes on 2 cores; all its configurations, the real engines that are installed included, the preset's
own budget, SGLang's rules, invariants checked at the end of each run), and writes
bench/results/simulate-<date>.md with the machine, the command, the load average and, per preset, wall
and CPU seconds. CPU seconds are this process's and its --jobs workers' (``RUSAGE_CHILDREN``: the pool is
joined per preset), so they stay meaningful on a shared machine: on 2 idle cores a preset's wall is about
max(its longest configuration, CPU / 2). ``--json FILE`` also writes what ``kvarena simulate --workload
all --json`` prints, from the same runs (the README table is made from it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

from _provenance import machine_line, python_line, write
from _timing import cpu_seconds

from kvarena.simulate import budget_of
from kvarena.simulator.report import assumptions, report_json
from kvarena.simulator.simulation import real_engines, simulate
from kvarena.simulator.workloads import PRESET_WORKLOADS

LIMIT_S = 120.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mem-fraction", type=float, default=None,
                   help="an H200 budget at this --mem-fraction-static instead of each preset's own budget")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--json", type=Path, help="also write the reports as `kvarena simulate --json` prints them")
    p.add_argument("--engines", default="all", help="'all' (the installed real engines) or 'none'")
    p.add_argument("--jobs", type=int, default=2, help="processes per preset, as kvarena simulate --jobs (default 2)")
    args = p.parse_args(argv)
    real, skipped = real_engines(None if args.engines == "all" else ())
    reports = []

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for name, w in PRESET_WORKLOADS.items():
        capacity, budget = budget_of(w, argparse.Namespace(capacity_gib=None, mem_fraction=args.mem_fraction))
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        rep = simulate(w, capacity, budget, real=tuple(real), skipped=tuple(skipped), jobs=args.jobs)
        reports.append(rep)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        per = ", ".join(f"{o.config} {o.wall_s:.1f}" for o in rep.outcomes)
        ok = "yes" if wall <= LIMIT_S else "NO"
        rows.append(f"| {name} | {len(rep.outcomes)} | {w.count():,} | {wall:.1f} | {cpu:.1f} | {ok} | {per} |")
        print(rows[-1], flush=True)
    today = datetime.date.today().isoformat()
    command = " ".join(["python bench/simulate_speed.py", *(sys.argv[1:] if argv is None else argv)])
    text = "\n".join([
        f"# simulate speed, {today}",
        "",
        f"- command: `{command}` (each preset as `kvarena simulate --workload NAME --jobs {args.jobs}"
        + (f" --mem-fraction {args.mem_fraction:g}" if args.mem_fraction else "") + "`, each preset's budget)",
        machine_line(load) + " (other jobs may share the cores: compare CPU seconds)",
        python_line() + " plus the working tree",
        f"- limit: {LIMIT_S:.0f} s wall per preset (all its configurations)",
        f"- real engines: {', '.join(real) or 'none'}" + "".join(f"; {line}" for line in skipped),
        "",
        "| preset | configurations | requests | wall s | CPU s | within limit | wall s per configuration (in its "
        "worker) |",
        "|---|---:|---:|---:|---:|---|---|",
        *rows,
        "",
    ])
    write(args.out, f"simulate-{today}.md", text)
    if args.json:
        import json

        args.json.write_text(json.dumps({"assumptions": assumptions(64), "skipped_engines": skipped,
                                         "workloads": [report_json(r) for r in reports]}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
