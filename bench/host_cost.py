"""Host cost of gpu/'s batched calls on the CPU torch path, against the reference and SGLang 0.5.23's allocator.

    python bench/host_cost.py            # full run (a few minutes on 2 cores): bench/results/host_cost-<date>.md
    python bench/host_cost.py --threads 1   # the same with one torch intra-op thread: host_cost-<date>-1-thread.md
    python bench/host_cost.py --smoke    # seconds (CI, tests/fast/test_host_cost.py): small N, few reps, no file

One process, one arena configuration (``--model``, default toy-swa at 16 MiB: 65,536 full pages of 256 B, so
per-page bytes are negligible and what is timed is the allocator's host work), interleaved repetitions (the
implementations take turns in a shuffled order each repetition, so a busy machine slows all alike), the
garbage collector disabled during each call (as ``timeit`` does: the reference's thousands of Python objects
would otherwise trigger collections inside the others' calls; it runs between them), medians and the
interquartile range.

* **decode step, every request crossing a page**: ``extend_batch`` of N owners (their int handles, as an
  engine passes request indices) by one full page each (the
  worst case: N new pages) — against the reference's N sequential ``extend`` calls and SGLang's
  ``MultiEndedAllocator.alloc`` of N pages (its composite ``alloc`` of N pages on CPU torch: the lower bound
  it can run here; its ``alloc_decode`` is GPU-only). Untimed between repetitions: the pages are freed.
* **free_batch** of the N owners (they are re-admitted untimed).
* **decode step, gpu and SGLang alone**: the same two calls interleaved without the reference, whose 20-180 ms
  of Python per repetition evicts every cache, so that whichever call follows it starts cold (both sides pay
  that; the ratio with and without it is reported).
* **compaction** of K holes (``compact()``, host planning plus the CPU copies of tiny pages), per moved page, on
  one arena per K that is fragmented, compacted and freed again every repetition (its memory touched, as an
  engine's arena is after warm-up: a fresh arena per repetition times page faults, not the allocator).
* **decode step under a placement limit**: ``extend_batch`` of N owners by one window page each into 2N holes,
  without and with ``below`` (spec §Placement limit), interleaved.
* **relayout** of a float band (toy-tri): the float pages a stand-alone ``relayout`` moves, per moved page.
* **translate_tokens** of 1e5 ids into a preallocated ``out``.
* launches (table scatters, zero and move launches) and uploads (staged copies) per call.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import finish, machine_line, python_line, sh
from _timing import interleave

os.environ.pop("TRITON_INTERPRET", None)  # the plain-torch path of every kernel wrapper: the CPU torch path


def _stats(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return statistics.median(xs), q[2] - q[0]


def _fmt(m: float, iqr: float) -> str:
    return f"{m * 1e6:,.1f} ± {iqr * 1e6:,.1f}"


class Sides:
    """The three allocators on one configuration, each with N owners ready to grow."""

    def __init__(self, config: object, n: int) -> None:
        from kvarena.gpu.allocator import make
        from kvarena.reference.arena import Arena

        self.n = n
        self.gpu, self.ref = make(config), Arena(config)
        self.owners = [f"r{i}" for i in range(n)]
        self.rows = self.gpu.admit_batch(self.owners, np.zeros((n, len(self.gpu.order)), dtype=np.int64)).rows
        for o in self.owners:
            self.ref.admit(o, {})
        self.full = self.gpu.order[-1]
        self.demand = np.zeros((n, len(self.gpu.order)), dtype=np.int64)
        self.demand[:, -1] = 1
        self.sg = None
        try:
            from kvarena.engines.sglang.adapter import SGLangArena

            self.sg = SGLangArena(config).allocs[self.full]
        except Exception as e:
            self.sg_error = f"{type(e).__name__}: {e}"

    def gpu_step(self) -> float:
        t0 = time.perf_counter()
        self.gpu.extend_batch(self.rows, self.demand)  # the engine's int handles (admit_batch's result.rows)
        t = time.perf_counter() - t0
        self.gpu.free_batch(self.rows)
        self.rows = self.gpu.admit_batch(self.owners, np.zeros_like(self.demand)).rows
        return t

    def ref_step(self) -> float:
        d = {self.full: 1}
        t0 = time.perf_counter()
        for o in self.owners:
            self.ref.extend(o, d)
        t = time.perf_counter() - t0
        for o in self.owners:
            self.ref.free(o)
            self.ref.admit(o, {})
        return t

    def sg_step(self) -> float:
        a = self.sg
        t0 = time.perf_counter()
        ids = a.alloc(self.n * a.page_size)
        t = time.perf_counter() - t0
        assert ids is not None, "SGLang refused the allocation"
        a.free(ids)
        return t

    def gpu_free(self) -> float:
        self.gpu.extend_batch(self.rows, self.demand)
        t0 = time.perf_counter()
        self.gpu.free_batch(self.rows)
        t = time.perf_counter() - t0
        self.rows = self.gpu.admit_batch(self.owners, np.zeros_like(self.demand)).rows
        return t


def counts_per_call(gpu: object, fn: Callable[[], object]) -> str:
    st, tb = gpu.staging, gpu.tables
    before = (st.uploads, tb.launches, gpu.stats["zero_launches"], gpu.stats["move_launches"])
    fn()
    after = (st.uploads, tb.launches, gpu.stats["zero_launches"], gpu.stats["move_launches"])
    up, scat, zero, move = (b - a for a, b in zip(before, after))
    return f"{up} uploads, {scat} table scatters, {zero} zero launches, {move} move launches"




def decode_rows(config: object, ns: list[int], reps: int, rng: random.Random) -> tuple[list[str], dict]:
    rows, summary = [], {}
    base = None
    for n in ns:
        s = Sides(config, n)
        fns = {"gpu": s.gpu_step, "ref": s.ref_step, "free": s.gpu_free}
        if s.sg is not None:
            fns["sg"] = s.sg_step
        samples = interleave(fns, reps, rng)
        g, r, fr = _stats(samples["gpu"]), _stats(samples["ref"]), _stats(samples["free"])
        sg = _stats(samples["sg"]) if "sg" in samples else None
        two = interleave({"gpu": s.gpu_step, "sg": s.sg_step}, reps, rng) if s.sg is not None else None
        g2, sg2 = (_stats(two["gpu"]), _stats(two["sg"])) if two else (None, None)
        base = base or g[0]
        launches = counts_per_call(s.gpu, lambda s=s: s.gpu.extend_batch(s.rows, s.demand))
        rows.append(f"| {n:,} | {_fmt(*g)} | {g[0] / base:.2f}x | {_fmt(*r)} | {r[0] / g[0]:.1f}x | "
                    + (f"{_fmt(*sg)} | {g[0] / sg[0]:.2f}x" if sg else f"not available ({s.sg_error[:60]}) | -")
                    + (f" | {_fmt(*g2)} / {_fmt(*sg2)} | {g2[0] / sg2[0]:.2f}x" if g2 and sg2 else " | - | -")
                    + f" | {_fmt(*fr)} | {launches} |")
        summary[n] = {"gpu": g[0], "ref": r[0], "sg": sg[0] if sg else None,
                      "gpu2": g2[0] if g2 else None, "sg2": sg2[0] if sg2 else None}
    return rows, summary


def compaction_rows(model: str, ks: list[int], reps: int) -> list[str]:
    from kvarena.gpu.allocator import make
    from kvarena.spec.models import ArenaConfig, preset

    rows = []
    for k in ks:
        samples, moved = [], 0
        gpu = make(ArenaConfig(preset(model), 64 << 20, page_size=4, max_context_len=16))
        low = gpu.order[0]
        owners = [f"c{i}" for i in range(2 * k)]
        d = np.zeros((2 * k, len(gpu.order)), dtype=np.int64)
        d[:, 0] = 1
        for rep in range(reps + 1):  # the first: warm-up (untimed)
            gpu.admit_batch(owners, d)
            gpu.free_batch(owners[::2])  # k holes in the low band, k live pages past them
            gc.disable()
            try:
                t0 = time.perf_counter()
                plan = gpu.compact()
                t = time.perf_counter() - t0
            finally:
                gc.enable()
            gpu.free_batch(owners[1::2])  # back to an empty arena, the same layout next time
            moved = len(plan.moves)
            assert moved, f"compaction of {k} {low} holes moved nothing"
            if rep:
                samples.append(t)
        m, iqr = _stats(samples)
        rows.append(f"| {k:,} | {moved:,} | {_fmt(m, iqr)} | {m / moved * 1e6:.2f} |")
    return rows


class HoleStep:
    """N owners, each to get one window page from ``extend_batch``, on an arena whose window band has 2N holes
    between live pages (4N admitted, every other one freed), and the limit 3/4 up the window span."""

    def __init__(self, config: object, n: int) -> None:
        from kvarena.gpu.allocator import make

        self.gpu = make(config)
        k, win = len(self.gpu.order), self.gpu.order[0]
        assert self.gpu.bands[win].role.value == "low", f"{win}: the limit section needs the window band low"
        live = [f"l{i}" for i in range(4 * n)]
        one = np.zeros((4 * n, k), dtype=np.int64)
        one[:, 0] = 1
        self.gpu.admit_batch(live, one)
        self.gpu.free_batch(live[::2])  # 2n holes, each between two live pages: the order picks which n
        band = self.gpu.bands[win]
        # 3/4 up the span: 1.5N holes under it, so the N nearest it are not the N nearest the anchor
        self.below = {win: (band.lo + 3 * (band.hi - band.lo) // 4) * band.page_bytes}
        self.owners, self.empty, self.demand = [f"o{i}" for i in range(n)], np.zeros((n, k), dtype=np.int64), one[:n]
        self.rows = self.gpu.admit_batch(self.owners, self.empty).rows

    def step(self, limit: dict[str, int] | None) -> float:
        t0 = time.perf_counter()
        r = self.gpu.extend_batch(self.rows, self.demand, below=limit)
        t = time.perf_counter() - t0
        assert not r.errors and not r.plans, "the step did not place every page in rung 1's batch"
        self.last_slots = r.slots.copy()
        self.gpu.free_batch(self.rows)  # untimed: the n pages are holes again, the owners empty
        self.rows = self.gpu.admit_batch(self.owners, self.empty).rows
        return t


def limit_rows(config: object, ns: list[int], reps: int, rng: random.Random) -> list[str]:
    """A decode step that reuses window holes, without and with a placement limit (spec §Placement limit): with
    the limit rung 1 takes the holes nearest it first instead of those nearest the anchor. Interleaved."""
    rows = []
    for n in ns:
        h = HoleStep(config, n)
        h.step(None)
        anchor = h.last_slots
        h.step(h.below)
        assert sorted(anchor) != sorted(h.last_slots), "the limit did not change which holes were taken"
        samples = interleave({"none": lambda h=h: h.step(None), "limit": lambda h=h: h.step(h.below)}, reps, rng)
        a, b = _stats(samples["none"]), _stats(samples["limit"])
        rows.append(f"| {n:,} | {_fmt(*a)} | {_fmt(*b)} | {b[0] / a[0]:.2f}x |")
    return rows


def relayout_rows(extras: list[int], reps: int) -> list[str]:
    """Stand-alone ``relayout`` of a float band (toy-tri, 8 MiB: 4,096 live window pages in one run at their
    hint) for a high-band demand ``extra`` pages past the room above the float: the float moves down, its pages
    outside the new span move (half of ``extra``: a window page is twice a full page). Warm arena, as above."""
    from kvarena.gpu.allocator import make
    from kvarena.spec.models import ArenaConfig, preset

    gpu = make(ArenaConfig(preset("toy-tri"), 8 << 20, page_size=4, max_context_len=16))
    f, hi = gpu.order[1], gpu.order[-1]
    n = 4096
    owners = [f"w{i}" for i in range(n)]
    d = np.zeros((n, len(gpu.order)), dtype=np.int64)
    d[:, 1] = 1
    rows = []
    for extra in extras:
        samples, moved = [], 0
        for rep in range(reps + 1):  # the first: warm-up (untimed)
            gpu.admit_batch(owners, d)
            fb, hb = gpu.bands[f], gpu.bands[hi]
            room = (hb.lo * hb.page_bytes - fb.hi * fb.page_bytes) // hb.page_bytes
            gc.disable()
            try:
                t0 = time.perf_counter()
                plan = gpu.relayout({hi: room + extra})
                t = time.perf_counter() - t0
            finally:
                gc.enable()
            gpu.free_batch(owners)
            moved = len(plan.moves)
            assert moved, f"relayout for {extra} pages past the room moved nothing"
            if rep:
                samples.append(t)
        m, iqr = _stats(samples)
        rows.append(f"| {extra:,} | {moved:,} | {_fmt(m, iqr)} | {m / moved * 1e6:.2f} |")
    return rows


def translate_row(config: object, n_ids: int, reps: int) -> str:
    import torch

    from kvarena.gpu.allocator import make

    gpu = make(config)
    n = 4096
    owners = [f"t{i}" for i in range(n)]
    d = np.zeros((n, len(gpu.order)), dtype=np.int64)
    d[:, -1] = 4
    gpu.admit_batch(owners, d)
    full = gpu.order[-1]
    epp = gpu.mem.epp[full]
    vt = torch.randint(0, 4 * n * epp, (n_ids,), dtype=torch.int64)
    out = torch.empty(n_ids + 64, dtype=torch.int64)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        gpu.translate_tokens(full, vt, out=out, out_width=n_ids + 64)
        samples.append(time.perf_counter() - t0)
    return f"| {n_ids:,} | {_fmt(*_stats(samples))} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="seconds: N = 16, 256; 3 repetitions; prints, writes nothing")
    p.add_argument("--model", default="toy-swa", help="preset (default toy-swa: tiny pages, host work only)")
    p.add_argument("--capacity-mib", type=int, default=16)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for every side (default: torch's own; 1 is the stricter comparison: "
                        "OpenMP fan-out of small CPU ops costs SGLang's alloc more than it costs gpu/)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)

    import torch

    from kvarena.spec.models import ArenaConfig, preset

    # the same intra-op threads for every side: on a shared 2-core machine OpenMP fan-out of small CPU "device"
    # ops costs more than the op itself (SGLang's alloc more than gpu/'s), so both settings are reported
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    reps = args.reps or (3 if args.smoke else 30)
    ns = [16, 256] if args.smoke else [16, 256, 1024, 4096]
    ks = [64] if args.smoke else [256, 4096]
    config = ArenaConfig(preset(args.model), args.capacity_mib << 20, page_size=4, max_context_len=16)
    rng = random.Random(0)
    t_start = time.perf_counter()
    rows, summary = decode_rows(config, ns, reps, rng)
    comp = compaction_rows(args.model, ks, max(3, reps // 3))
    rel = relayout_rows([200] if args.smoke else [500, 2000], max(3, reps // 3))
    lim = limit_rows(config, ns, reps, rng)
    tr = translate_row(config, 10_000 if args.smoke else 100_000, reps)
    big = max(ns)
    verdicts = [f"- extend_batch at {m:,} requests / at 16: {summary[m]['gpu'] / summary[16]['gpu']:.2f}x "
                "(target at 1,024: a few times)" for m in sorted({min(1024, big), big})]
    if 1024 in summary and summary[1024]["sg"]:
        r = summary[1024]["gpu"] / summary[1024]["sg"]
        verdicts.append(f"- decode step of 1,024 requests / SGLang alloc of 1,024 pages: {r:.3f}x (target <= 0.25x): "
                        + ("PASS" if r <= 0.25 else "FAIL") + " (the four sides interleaved)")
        if summary[1024]["gpu2"] and summary[1024]["sg2"]:
            r2 = summary[1024]["gpu2"] / summary[1024]["sg2"]
            verdicts.append(f"- the same, gpu and SGLang alone interleaved: {r2:.3f}x (target <= 0.25x): "
                            + ("PASS" if r2 <= 0.25 else "FAIL"))
    command = " ".join(["python bench/host_cost.py", *(sys.argv[1:] if argv is None else argv)])
    lscpu = sh("sh", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'")
    text = "\n".join([
        f"# gpu/ host cost on the CPU torch path, {datetime.date.today().isoformat()}",
        "",
        f"- command: `{command}` (wall {time.perf_counter() - t_start:.0f} s)",
        machine_line(load),
        f"- cpu: {lscpu or '?'}, {os.cpu_count()} cores",
        python_line(),
        f"- configuration: {args.model}, {args.capacity_mib} MiB, page size 4, every device tensor on the CPU, "
        f"torch intra-op threads {threads}{'' if args.threads else ' (torch default)'}; {reps} interleaved "
        "repetitions; median ± interquartile range, µs",
        "",
        "## Decode step: every request gets one new full page",
        "",
        "| requests N | gpu `extend_batch` µs | vs N=16 | reference: N `extend` µs | reference / gpu | "
        "SGLang `alloc` of N pages µs | gpu / SGLang | gpu / SGLang alone µs | gpu / SGLang alone | "
        "gpu `free_batch` µs | device work per extend_batch |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        *verdicts,
        "",
        "## Decode step: N window pages into 2N holes, without and with a placement limit "
        "(`extend_batch(..., below=)`)",
        "",
        "| requests N | no limit µs | limit 3/4 up the window span µs | with / without |",
        "|---:|---:|---:|---:|",
        *lim,
        "",
        "## Compaction of K holes (`compact()`: planning, host state, CPU copies of 128 B pages; warm arena)",
        "",
        "| holes K | pages moved | µs | µs per moved page (target <= 1) |",
        "|---:|---:|---:|---:|",
        *comp,
        "",
        "## Relayout of a float band (`relayout()` on toy-tri, 8 MiB: 4,096 window pages; warm arena)",
        "",
        "| high-band pages past the room | float pages moved | µs | µs per moved page (target <= 1) |",
        "|---:|---:|---:|---:|",
        *rel,
        "",
        "## translate_tokens into a preallocated out (torch ops on CPU)",
        "",
        "| ids | µs |",
        "|---:|---:|",
        tr,
        "",
    ])
    suffix = f"-{args.threads}-thread" if args.threads else ""
    return finish(args.out, f"host_cost-{datetime.date.today().isoformat()}{suffix}.md", text, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
