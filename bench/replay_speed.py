"""Allocator operations per second of the default `kvarena replay`, unified arena vs split pools.

    python bench/replay_speed.py [--scale S] [--check-every N] [--out DIR]

Replays the built-in trace (GPT-OSS-20B at an H200's KV budget) once per configuration and writes
bench/results/replay-<date>.md with the machine, the command and the numbers. Invariants are
checked only at the end by default, so the figure is the reference allocator's own speed (plus
the scheduler model's bookkeeping).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from _provenance import machine_line, python_line, write

from kvarena.replay import compare
from kvarena.simulator.mixed_trace import kv_budget
from kvarena.spec.models import ArenaConfig, preset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-oss-20b")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--check-every", type=int, default=0, help="0: invariants at the end only (default)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())  # a busy machine slows both columns alike
    capacity, budget = kv_budget(args.model)
    trace, results = compare(ArenaConfig(preset(args.model), capacity), scale=args.scale,
                             check_every=args.check_every)
    today = datetime.date.today().isoformat()
    command = " ".join(["python bench/replay_speed.py", *(sys.argv[1:] if argv is None else argv)])
    rows = [f"| {m.config} | {m.operations:,} | {m.wall_s:.2f} | {m.operations / m.wall_s:,.0f} | "
            f"{m.invariant_checks} |" for m in results]
    ratio = (results[0].operations / results[0].wall_s) / (results[1].operations / results[1].wall_s)
    text = "\n".join([
        f"# replay speed, {today}",
        "",
        f"- command: `{command}`",
        machine_line(load),
        python_line(),
        f"- model {args.model}, {budget}, {len(trace):,} requests, scale {args.scale:g}, "
        "invariants " + (f"every {args.check_every} steps" if args.check_every else "at the end only"),
        "",
        "| configuration | allocator operations | wall s | operations / s | invariant checks |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Unified arena / split pools, operations per second: {ratio:.2f}x. Operations are admit, extend,",
        "slide, free, acquire and release calls; wall time includes the scheduler model's bookkeeping.",
        "",
    ])
    write(args.out, f"replay-{today}.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
