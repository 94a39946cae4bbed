"""A placement the scheduler could ask for: window pages below the full band's planned peak (a measured design).

    python bench/rung1_ceiling.py                               # gpt-oss-20b-max: default, ceiling, full flush
    python bench/rung1_ceiling.py --workload gpt-oss-20b-c1000

bench/rung2_bound.py shows that rung 1's "nearest the anchor" strands the pages rung 2 then moves, and that a
placement knowing how near the full band comes during each page's life strands none. The scheduler knows most
of that: every running request's final length (``ignore_eos``: its output is fixed; otherwise
``max_new_tokens`` bounds it) and when a new window page slides out (the window plus SGLang's eviction
interval, in the pager's own page arithmetic). While a window page lives its owner crosses ``L`` more page
boundaries, and so does every decoding request, so the full band can grow to at most

    planned = sum over running requests of min(final pages, pages now + L)

as long as nothing new is admitted. Admission is the one thing the plan cannot see, so the ceiling is given
only while admission is blocked (the last admission pass refused the queue head for memory, or the queue is
empty): a request admitted later takes the full pages its predecessors freed.

With a ceiling, rung 1 takes the window band's holes below ``top - planned`` highest first, and only when
none is left there the holes nearest the anchor. Everything else (rungs 2 and 3, the validator, the
scheduler's decisions) is the reference's, unchanged.

This is a measurement-only monkeypatch of the reference and the scheduler model (never shipped): the spec's
``admit`` / ``extend`` take no hint today. It reports, per run, the bytes moved and the decisions (most
running, retractions) of the default, the default with the ceiling, and ``full-compaction``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Band, Role
from kvarena.simulate import budget_of
from kvarena.simulator import simulation as sim
from kvarena.simulator.pager import Pager
from kvarena.simulator.scheduler import Scheduler
from kvarena.simulator.workloads import lengths_from, workload


def lifetime(n_after: int, keep: int, slack: int) -> int:
    """Crossings of its owner until the newest of ``n_after`` window pages slides out, by the pager's arithmetic
    (``Pager.trim``: before each new page, the pages beyond ``keep`` go once more than ``slack`` piled up).

    >>> lifetime(5, 3, 2), lifetime(3, 3, 2)
    (4, 3)
    """
    pages, mine, c = list(range(n_after)), n_after - 1, 0
    while mine in pages:
        c += 1
        n = len(pages) + 1 - keep
        if n > slack:
            del pages[:n]
        pages.append(-c)
    return c


class Ceiling:
    """The scheduler's side (a ceiling per window-page allocation) and the arena's (rung 1 below it)."""

    def __init__(self) -> None:
        self.value: int | None = None  # window-band slot the next placement should stay below
        self.band = ""  # the window class it is for (the low end band on GPT-OSS; a float elsewhere: unused)
        self.sched: Scheduler | None = None
        self.cache: dict[tuple[int, int], int] = {}
        self.placements = self.short = 0

    def planned(self, pg: Pager, sched: Scheduler, life: int) -> int:
        """``top - planned`` in window slots: the lowest the full band's lower edge can come while the page lives."""
        key = (sched.step, life)
        if key not in self.cache:
            if len(self.cache) > 64:
                self.cache.clear()
            full_pages = sum(min(-(-(r.orig_in + r.orig_out) // pg.pt), len(pg.vids[rid][pg.full]) + life)
                             for rid, r in sched.active.items() if rid in pg.vids)
            high = sched.alloc.bands[sched.alloc.order[-1]]
            window = next(iter(pg.keep))
            self.cache[key] = (high.top * high.page_bytes - full_pages * high.page_bytes) // pg.page_bytes[window]
        return self.cache[key]

    @contextmanager
    def installed(self) -> Iterator[Ceiling]:
        ceiling, first, one_step, grow_one = self, Band.first_holes, Scheduler.one_step, Pager.grow_one

        def first_holes(band: Band, k: int) -> list[int]:
            c = ceiling.value
            if c is None or k <= 0 or band.role is not Role.LOW or band.name != ceiling.band:
                return first(band, k)
            j = band.holes.bisect_left(c)
            below = list(band.holes.islice(max(0, j - k), j, reverse=True))  # highest below the ceiling first
            ceiling.placements += 1
            if len(below) < k:
                ceiling.short += 1
                below += list(band.holes.islice(j, j + k - len(below)))  # then the nearest above it
            return below

        def step(sched: Scheduler) -> None:
            blocked = sched.full or not sched.queue  # no admission can grow the full band while the page lives
            ceiling.sched = sched if blocked and isinstance(sched.alloc, Arena) else None
            one_step(sched)

        def grow(pg: Pager, rid: int) -> int:
            sched = ceiling.sched
            if sched is not None and pg.keep:
                w = next(iter(pg.keep))
                n = len(pg.vids[rid][w])
                gone = n + 1 - pg.keep[w]
                life = lifetime(n + 1 - (gone if gone > pg.slack[w] else 0), pg.keep[w], pg.slack[w])
                ceiling.value, ceiling.band = ceiling.planned(pg, sched, life), w
            try:
                return grow_one(pg, rid)
            finally:
                ceiling.value = None

        Band.first_holes, Scheduler.one_step, Pager.grow_one = first_holes, step, grow  # type: ignore[method-assign]
        try:
            yield self
        finally:
            Band.first_holes, Scheduler.one_step, Pager.grow_one = first, one_step, grow_one  # type: ignore[method-assign]


def run(w, cap: int, policy: str, ceiling: bool, scale: float) -> tuple[object, Ceiling]:
    c = Ceiling()
    configurations = sim.configurations
    sim.configurations = lambda *a, **k: [x for x in configurations(*a, **k) if x.kind == "unified"]
    try:
        if ceiling:
            with c.installed():
                rep = sim.simulate(w, cap, "preset", policies=(policy,), scale=scale)
        else:
            rep = sim.simulate(w, cap, "preset", policies=(policy,), scale=scale)
    finally:
        sim.configurations = configurations
    (o,) = rep.outcomes
    return o, c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="gpt-oss-20b-max")
    p.add_argument("--output-lengths", default="fixed", help="as kvarena simulate's (fixed, uniform[:LO])")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the preset's requests (a quick look)")
    p.add_argument("--capacity-gib", type=float, help="KV bytes in GiB instead of the preset's budget")
    args = p.parse_args(argv)
    w = workload(args.workload)
    if args.output_lengths != "fixed":
        w = w.with_lengths(lengths_from(args.output_lengths, w))
    cap, _ = budget_of(w, argparse.Namespace(capacity_gib=args.capacity_gib, mem_fraction=None, page_size=64))
    print(f"{w.name} (outputs {args.output_lengths}), {cap / 2**30:.2f} GiB")
    print("| unified arena | GiB moved (compaction + relayout) | x full-compaction | max active | retractions |"
          " ceiling placements (short of holes) | wall s |\n|---|---:|---:|---:|---:|---|---:|")
    rows = []
    for name, policy, ceiling in (("full-compaction", "full-compaction", False), ("default", "default", False),
                                  ("default + ceiling", "default", True)):
        t0 = time.time()
        o, c = run(w, cap, policy, ceiling, args.scale)
        moved = (o.bytes_moved_compaction + o.bytes_moved_relayout) / 2**30
        rows.append(moved)
        ratio = f"{moved / rows[0]:.3f}" if rows[0] else "-"
        extra = f"{c.placements:,} ({c.short:,})" if ceiling else "-"
        print(f"| {name} | {moved:.3f} | {ratio} | {o.max_active:,} | {o.retractions:,} | {extra} | "
              f"{time.time() - t0:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
