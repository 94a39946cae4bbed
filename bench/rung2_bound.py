"""How few rung-2 moves any placement of the window pages could need on a simulator preset, knowing the future.

    python bench/rung2_bound.py                          # gpt-oss-20b-max, the trace of the default policy
    python bench/rung2_bound.py --policy full-compaction # the same decisions, so the same trace

Runs the unified-arena column alone, without the scheduler's placement limit (``placement_limit=False``: the
spec's rung 1 alone, what this replays), and records its trace: every window page's lifetime (the op that bound it,
the op that freed it) and the full-attention band's live pages after every op. Then it replays the window pages
on a slot line offline, each placement rule choosing a slot at the page's birth, and counts the pages placed at or
above their *lifetime bound*: ``top - max(full live pages while the page lives)``, the highest slot the page may
hold when the full band, packed against the top, comes nearest. Each such page has to move at least once (or its
request be retracted), so the count is the moves that rule cannot avoid on this trace.

- ``lowest``: the spec's rung 1 (the free slot nearest the anchor), replayed without moves. Its count is the run's
  own window moves to within the relaxation (gpt-oss-20b-max 5,335 and 5,335; c1000 5,634 and 5,633; the smoke
  test's small run 68 and 65), printed next
  to it: the check that the replay is the run.
- ``oracle``: the highest free slot below the page's own lifetime bound, which needs the future: a placement
  no online rule can make, and the evidence that the trace itself does not force the moves (on the relaxed line).
- ``predict-K-c``: an online rule given each page's exact death op (an engine knows when a window page slides
  out) but not the full band's future: it extrapolates the full band's growth over the last K ops, c times over.

The relaxation makes every count a lower bound for its rule: withheld slots count as free, the full band as
packed, and window and full pages as the same size (true of GPT-OSS; the script refuses other geometries).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import numpy as np
from _unified import add_workload_args, unified_only, workload_and_budget
from sortedcontainers import SortedList

from kvarena.reference.arena import Arena
from kvarena.simulator import simulation as sim
from kvarena.simulator.rules import SchedulerModel
from kvarena.spec.models import preset


class Trace:
    """Window-page lifetimes and the full band's live count, per op of one run of the unified column."""

    def __init__(self) -> None:
        self.full: list[int] = []  # full-band live pages after op t
        self.born: dict[int, int] = {}  # window vid -> op that bound it
        self.life: list[tuple[int, int]] = []  # (birth op, death op)
        self.window_moves = 0
        self.top = 0
        self.page_bytes: set[int] = set()
        self.window_cls = ""

    def record(self, w, cap: int, policy: str, scale: float) -> None:
        trace, orig = self, {n: getattr(Arena, n) for n in ("_bind_all", "_free_page", "_apply", "admit", "extend",
                                                              "slide", "free")}

        def bind_all(self: Arena, band, slots):  # type: ignore[no-untyped-def]
            vids = orig["_bind_all"](self, band, slots)
            if band.name == trace.window_cls:
                trace.born.update(dict.fromkeys(vids, len(trace.full)))
            return vids

        def free_page(self: Arena, vid: int):  # type: ignore[no-untyped-def]
            if vid in trace.born:
                trace.life.append((trace.born.pop(vid), len(trace.full)))
            return orig["_free_page"](self, vid)

        def apply(self: Arena, plan):  # type: ignore[no-untyped-def]
            trace.window_moves += sum(m.cls == trace.window_cls for m in plan.moves)
            return orig["_apply"](self, plan)

        def op(name: str):  # type: ignore[no-untyped-def]
            def run(self: Arena, *a, **k):  # type: ignore[no-untyped-def]
                out = orig[name](self, *a, **k)
                high = self.bands[self.order[-1]]
                trace.top, trace.page_bytes = high.top, {b.page_bytes for b in self.bands.values()}
                trace.full.append(len(high.live))
                return out
            return run

        patches = {"_bind_all": bind_all, "_free_page": free_page, "_apply": apply,
                   **{n: op(n) for n in ("admit", "extend", "slide", "free")}}
        try:
            for n, f in patches.items():
                setattr(Arena, n, f)
            with unified_only():  # rung 1 nearest the anchor is what this replays: no placement limit
                sim.simulate(w, cap, "preset", policies=(policy,), scale=scale,
                             model=replace(SchedulerModel(), placement_limit=False))
        finally:
            for n, f in orig.items():
                setattr(Arena, n, f)
        self.life.extend((b, len(self.full)) for b in self.born.values())  # alive at the end


def range_max(f: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(f[lo:hi]) for each pair (hi > lo), by a sparse table."""
    table = [f]
    while (1 << len(table)) <= len(f):
        prev, h = table[-1], 1 << (len(table) - 1)
        table.append(np.maximum(prev[:-h], prev[h:]))
    j = np.floor(np.log2(hi - lo)).astype(int)
    out = np.empty(len(lo), dtype=f.dtype)
    for k in np.unique(j):
        m = j == k
        out[m] = np.maximum(table[k][lo[m]], table[k][hi[m] - (1 << k)])
    return out


def replay(trace: Trace, rule: str) -> int:
    """Pages a placement rule puts at or above their lifetime bound, replaying the trace's window pages."""
    full = np.asarray(trace.full)
    birth = np.array([b for b, _ in trace.life])
    death = np.array([d for _, d in trace.life])
    last = len(full) - 1
    bound = trace.top - range_max(full, np.minimum(birth, last), np.minimum(np.maximum(death, birth + 1), last + 1))
    events = sorted([(int(d), 0, i) for i, d in enumerate(death)] + [(int(b), 1, i) for i, b in enumerate(birth)])
    k, c = (int(rule.split("-")[1]), float(rule.split("-")[2])) if rule.startswith("predict") else (0, 0.0)
    free, slot, over = SortedList(range(trace.top)), {}, 0
    for t, kind, i in events:
        if kind == 0:
            if i in slot:
                free.add(slot.pop(i))
            continue
        if rule == "lowest":
            s = free[0]
        else:
            if rule == "oracle":
                limit = int(bound[i])
            else:
                now = int(full[min(t, last)])
                rate = max(0, now - int(full[max(0, t - k)])) / k
                limit = trace.top - now - int(c * rate * (int(death[i]) - t))
            j = free.bisect_left(limit) - 1
            s = free[j] if j >= 0 else free[0]
        over += s >= bound[i]
        free.remove(s)
        slot[i] = s
    return over


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--policy", default="default", help="the unified column's policy whose trace is replayed")
    p.add_argument("--rules", default="lowest,oracle,predict-500-1,predict-500-2,predict-500-4,predict-2000-2")
    args = p.parse_args(argv)
    w, cap = workload_and_budget(args)
    sizes = {c.kind.value: c for c in preset(w.model).classes}
    if set(sizes) != {"full", "window"}:
        p.error(f"{w.name}: the replay needs one full and one window class (GPT-OSS), not {sorted(sizes)}")
    trace = Trace()
    trace.window_cls = sizes["window"].name
    t0 = time.time()
    trace.record(w, cap, args.policy, args.scale)
    if len(trace.page_bytes) != 1:
        p.error(f"{w.name}: window and full pages differ in size ({sorted(trace.page_bytes)} B); the slot line "
                "needs equal pages")
    print(f"{w.name} (outputs {args.output_lengths}), trace of policy {args.policy}: {len(trace.full):,} ops, "
          f"{len(trace.life):,} window pages, "
          f"{trace.window_moves:,} window pages moved by the run (wall {time.time() - t0:.0f} s)")
    print("| placement rule | pages placed over their lifetime bound (moves it cannot avoid) |\n|---|---|")
    for rule in args.rules.split(","):
        print(f"| {rule} | {replay(trace, rule):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
