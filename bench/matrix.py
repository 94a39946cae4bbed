"""Every preset's matrix (allocators x rule sets) and its gap decomposed by rule group, timed.

    python bench/matrix.py [--jobs N] [--out DIR] [--no-decompose] [--workload NAME ...] [--scale S]

Runs, per preset, what ``kvarena simulate --matrix --decompose --jobs N`` runs (default 2: the budget is
2 minutes a preset on 2 cores for the matrix), and writes bench/results/matrix-<date>.md (the machine, the
command, the load average, per preset the matrix's wall and CPU seconds apart from the decomposition's, the
tables) and matrix-<date>.json (what ``--json`` prints). docs/arena-vs-vllm.md is written from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from _provenance import machine_line, python_line, write
from _timing import cpu_seconds

from kvarena.simulate import budget_of
from kvarena.simulator import matrix as mx
from kvarena.simulator.workloads import PRESET_WORKLOADS

LIMIT_S = 120.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--no-decompose", action="store_true")
    p.add_argument("--workload", action="append", help="a preset (repeatable; default every one)")
    p.add_argument("--scale", type=float, default=1.0, help="a smoke run: fewer requests (nothing written)")
    args = p.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    names = args.workload or list(PRESET_WORKLOADS)
    ns = argparse.Namespace(capacity_gib=None, mem_fraction=None)
    rows, blobs, texts = [], [], []
    for name in names:
        w = PRESET_WORKLOADS[name]
        capacity, budget = budget_of(w, ns)
        t0, c0 = time.perf_counter(), cpu_seconds()
        m = mx.matrix(w, capacity, budget, 64, 0, args.scale, args.jobs)
        mw, mc = time.perf_counter() - t0, cpu_seconds() - c0
        d, dw = None, 0.0
        if not args.no_decompose:
            t1 = time.perf_counter()
            d = mx.decompose(w, capacity, 64, 0, args.scale, args.jobs, start=m.cells[("kvarena arena", "sglang")])
            dw = time.perf_counter() - t1
        per = ", ".join(f"{a} / {s} {o.wall_s:.1f}" for (a, s), o in m.cells.items())
        rows.append(f"| {name} | {len(m.cells)} | {mw:.1f} | {mc:.1f} | {'yes' if mw <= LIMIT_S else 'no'} | "
                    f"{dw:.1f} | {per} |")
        blobs.append({**mx.matrix_json(m, d), "matrix_wall_s": mw, "matrix_cpu_s": mc, "decompose_wall_s": dw})
        texts.append(f"### {name}\n\n```\n" + "\n".join(mx.format_matrix(m) + (mx.format_decomposition(m, d) if d
                                                                               else [])) + "\n```\n")
        print(f"{name}: matrix {mw:.1f} s wall ({mc:.1f} s CPU), decomposition {dw:.1f} s\n{texts[-1]}",
              file=sys.stderr, flush=True)
    date = datetime.date.today().isoformat()
    cmd = "python bench/matrix.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join([
        f"# matrix: allocators x rule sets, {date}", "",
        f"- command: `{cmd.strip()}` (each preset as `kvarena simulate --matrix --decompose --workload NAME "
        f"--jobs {args.jobs}`, each preset's budget, page 64)",
        machine_line(load), python_line(), f"- limit: {LIMIT_S:.0f} s wall per preset for the matrix", "",
        "| preset | cells | matrix wall s | matrix CPU s | within limit | decomposition wall s | wall s per cell |",
        "|---|---:|---:|---:|---|---:|---|", *rows, "", "## The matrices", "", *texts])
    if args.scale != 1.0:
        print(text)
        return 0
    write(args.out, f"matrix-{date}.md", text)
    (args.out / f"matrix-{date}.json").write_text(json.dumps({"scale": 1.0, "page_size": 64, "matrix": blobs},
                                                             indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
