"""What the default ladder's rung-2 moves are on a simulator preset: which pages move, and why the frontier is live.

    python bench/rung2_moves.py                                   # gpt-oss-20b-max, the default policy
    python bench/rung2_moves.py --output-lengths uniform:512      # the same workload, outputs drawn (no lockstep)
    python bench/rung2_moves.py --variant reverse-extend          # placement variants, to test a hypothesis

Runs the unified-arena column alone (``simulator.simulation.simulate`` with the other configurations left out) and
instruments the reference ``Arena`` of that run: at every plan that moves pages it records the moved page's
origin (how many pages of its class the placement that bound it held: 1 = a decode step, more = a prefill or a
resumed request), the plan's demand, and the low band's live pages, span and holes. The variants are
measurement-only monkeypatches (never shipped): ``reverse-extend`` hands a window class's pages of one extend to
the owner in reverse slot order (its newest token page nearest the anchor, its oldest, which slide out first, at
the frontier); ``farthest-hole`` gives window pages the holes farthest from the anchor first.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from dataclasses import replace

from _unified import add_workload_args, unified_only, workload_and_budget

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Band
from kvarena.simulator import simulation as sim
from kvarena.simulator.rules import SchedulerModel
from kvarena.spec.layout import Kind


def _variant(name: str) -> None:
    if name == "reverse-extend":
        apply = Arena._apply

        def _apply(self: Arena, plan):  # type: ignore[no-untyped-def]
            pages = apply(self, plan)
            for c, vs in pages.items():
                if self.classes[c].kind is Kind.WINDOW:
                    vs.reverse()
            return pages

        Arena._apply = _apply  # type: ignore[method-assign]
    elif name == "farthest-hole":
        first = Band.first_holes

        def first_holes(self: Band, k: int) -> list[int]:
            if k > 0 and self.name == "window" and self.role.value == "low":
                return list(self.holes.islice(max(0, len(self.holes) - k), reverse=True))
            return first(self, k)

        Band.first_holes = first_holes  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--policy", default="default")
    p.add_argument("--variant", choices=("none", "reverse-extend", "farthest-hole"), default="none")
    p.add_argument("--placement-limit", action="store_true",
                   help="with the scheduler's placement limit (the simulator's default; off here: rung 1 alone)")
    args = p.parse_args(argv)
    w, cap = workload_and_budget(args)
    _variant(args.variant)

    origin: dict[int, int] = {}  # allocation serial -> pages of its class in the placement that bound it
    rows: list[tuple[int, str, int, int, int, int]] = []  # (serial now, demand, origin, low live, span, holes)
    apply = Arena._apply

    def _apply(self: Arena, plan):  # type: ignore[no-untyped-def]
        if plan.moves:
            low = self.bands[self.order[0]]
            demand = str({c: len(s) for c, s in plan.placements.items()})
            for m in plan.moves:
                g = self.gen[self.bands[m.cls].live[m.src]]
                rows.append((self._next_gen, demand, origin.get(g, 0), len(low.live), low.hi - low.lo,
                             len(low.holes)))
        pages = apply(self, plan)
        for vs in pages.values():
            for v in vs:
                origin[self.gen[v]] = len(vs)
        return pages

    Arena._apply = _apply  # type: ignore[method-assign]
    t0 = time.time()
    with unified_only():
        rep = sim.simulate(w, cap, "preset", policies=(args.policy,), scale=args.scale,
                           model=replace(SchedulerModel(), placement_limit=args.placement_limit))
    (o,) = rep.outcomes
    print(f"{w.name} (outputs {args.output_lengths}), policy {args.policy}, variant {args.variant}: "
          f"{o.bytes_moved_compaction / 2**30:.3f} GiB moved by compaction, {o.bytes_moved_relayout / 2**30:.3f} "
          f"by relayout, max active {o.max_active}, retractions {o.retractions} (wall {time.time() - t0:.0f} s)")
    if not rows:
        return 0
    plans = collections.Counter(r[1] for r in rows)
    print(f"pages moved {len(rows):,}; demands of the plans that moved (by pages moved): {plans.most_common(4)}")
    print("origin of the moved pages (pages in the placement that bound them):",
          dict(sorted(collections.Counter(r[2] for r in rows).items())))
    print(f"low band at those plans: live median {statistics.median(r[3] for r in rows):,.0f}, span "
          f"{statistics.median(r[4] for r in rows):,.0f}, holes {statistics.median(r[5] for r in rows):,.0f}")
    phases, last = [], None
    for r in rows:  # runs of moves with less than 2,000 allocations between them
        if last is None or r[0] - last > 2000:
            phases.append([r[0], r[0], 0])
        phases[-1][1], phases[-1][2], last = r[0], phases[-1][2] + 1, r[0]
    print(f"{len(phases)} phases of moves (serials first-last: pages moved): "
          + ", ".join(f"{a:,}-{b:,}: {n:,}" for a, b, n in phases[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
