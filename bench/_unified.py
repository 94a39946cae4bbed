"""What the rung benches share: a preset (or its drawn-length variant) at its budget, run on the unified column."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from kvarena.simulate import budget_of
from kvarena.simulator import simulation as sim
from kvarena.simulator.workloads import Workload, lengths_from, workload


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="gpt-oss-20b-max")
    p.add_argument("--output-lengths", default="fixed", help="as kvarena simulate's (fixed, uniform[:LO])")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the preset's requests (a quick look)")
    p.add_argument("--capacity-gib", type=float, help="KV bytes in GiB instead of the preset's budget")


def workload_and_budget(args: argparse.Namespace) -> tuple[Workload, int]:
    w = workload(args.workload)
    if args.output_lengths != "fixed":
        w = w.with_lengths(lengths_from(args.output_lengths, w))
    cap, _ = budget_of(w, argparse.Namespace(capacity_gib=args.capacity_gib, mem_fraction=None, page_size=64))
    return w, cap


@contextmanager
def unified_only() -> Iterator[None]:
    """``simulation.simulate`` runs the unified-arena configurations alone meanwhile."""
    configurations = sim.configurations
    sim.configurations = lambda *a, **k: [c for c in configurations(*a, **k) if c.kind == "unified"]
    try:
        yield
    finally:
        sim.configurations = configurations
