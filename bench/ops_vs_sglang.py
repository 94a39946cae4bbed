"""The reference, gpu/ (CPU torch path) and SGLang 0.5.23's real allocator on the same operations.

    python bench/ops_vs_sglang.py            # full run (minutes on 2 cores): bench/results/ops_vs_sglang-<date>.md
    python bench/ops_vs_sglang.py --smoke    # seconds: few repetitions, small sizes, no file

One process, interleaved repetitions (the implementations take turns in a shuffled order each repetition, so
a busy machine slows all alike), the garbage collector off inside each timed call (as ``timeit`` does), medians
and interquartile ranges in µs.

* **Operations** on one geometry (``toy-swa``, 16 MiB, page size 4: 65,536 full pages of 256 B, so the bytes
  are negligible and what is timed is the allocator's host work): alloc of 1 / 16 / 256 full pages into a band
  with no holes (frontier growth) and into one with 1,024 holes; free of 1 / 16 / 256 pages; compaction of
  16 / 256 / 4,096 holes with as many live pages past them (the reference's and gpu/'s ``compact()``, SGLang's
  urgent flush ``flush_for_allocation``, the same two-pointer pack). The reference is timed through its
  public API (``admit`` / ``free`` / ``compact``), gpu/ through its batched calls with one owner, SGLang through
  ``MultiEndedAllocator.alloc`` / ``free`` / ``flush_for_allocation`` of the full-attention member.
* **One admission decision at H200 size** (the budget ``kvarena simulate`` gives gpt-oss-20b and hymba-1.5b on
  one H200), read-only ``plan_admission`` in a state that needs rung 1, 2 or 3; rung 3 on hymba-1.5b (its window
  float between the state and full bands) at three float band sizes, to show planning does not grow with the
  float. SGLang has no read-only plan (its ``alloc`` compacts as it goes), and gpu/ on the meta device plans on
  the host exactly as on a GPU.
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
from _provenance import machine_line, python_line, sh, write
from _timing import interleave

os.environ.pop("TRITON_INTERPRET", None)  # the plain-torch path of every kernel wrapper

GiB = 1 << 30


def _stats(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=100) if len(xs) >= 2 else [xs[0]] * 99
    iq = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return statistics.median(xs), iq[2] - iq[0], q[98]


def _fmt(s: tuple[float, float, float] | None) -> str:
    return "-" if s is None else f"{s[0] * 1e6:,.1f} ± {s[1] * 1e6:,.1f}"


def _timed(fn: Callable[[], object]) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()




# ---------------------------------------------------------------------------------------------------------------
# The three sides on the toy geometry


class Ref:
    def __init__(self, config) -> None:
        from kvarena.reference.arena import Arena

        self.a = Arena(config)
        self.full = self.a.order[-1]
        self.n = 0

    def _owner(self) -> str:
        self.n += 1
        return f"o{self.n}"

    def alloc(self, k: int, settle: bool = True) -> float:  # (a free gives frontier pages back at once)
        o = self._owner()
        t = _timed(lambda: self.a.admit(o, {self.full: k}))
        self.a.free(o)
        return t

    def free(self, k: int) -> float:
        o = self._owner()
        self.a.admit(o, {self.full: k})
        return _timed(lambda: self.a.free(o))

    def fragment(self, n: int) -> list[str]:
        owners = [self._owner() for _ in range(2 * n)]
        for o in owners:
            self.a.admit(o, {self.full: 1})
        for o in owners[::2]:
            self.a.free(o)
        return owners[1::2]

    def compact(self, k: int) -> float:
        live = self.fragment(k)
        t = _timed(self.a.compact)
        for o in live:
            self.a.free(o)
        return t


class Gpu:
    def __init__(self, config) -> None:
        from kvarena.gpu.allocator import make

        self.g = make(config)
        self.cols = len(self.g.order)
        self.n = 0

    def _d(self, rows: int, k: int) -> np.ndarray:
        d = np.zeros((rows, self.cols), dtype=np.int64)
        d[:, -1] = k
        return d

    def _owners(self, n: int) -> list[str]:
        self.n += n
        return [f"g{i}" for i in range(self.n - n, self.n)]

    def alloc(self, k: int, settle: bool = True) -> float:
        o = self._owners(1)
        d = self._d(1, k)
        t = _timed(lambda: self.g.admit_batch(o, d))
        self.g.free_batch(o)
        return t

    def free(self, k: int) -> float:
        o = self._owners(1)
        self.g.admit_batch(o, self._d(1, k))
        return _timed(lambda: self.g.free_batch(o))

    def fragment(self, n: int) -> list[str]:
        owners = self._owners(2 * n)
        self.g.admit_batch(owners, self._d(2 * n, 1))
        self.g.free_batch(owners[::2])
        return owners[1::2]

    def compact(self, k: int) -> float:
        live = self.fragment(k)
        t = _timed(self.g.compact)
        self.g.free_batch(live)
        return t


class SGLang:
    """The full-attention member of SGLang's unified chain (``MultiEndedAllocator``), on CPU torch."""

    def __init__(self, config) -> None:
        from kvarena.engines.sglang.adapter import SGLangArena, _cpu_streams

        self.arena = SGLangArena(config)
        self.m = self.arena.allocs[self.arena.order[-1]]
        self.ps = self.m.page_size
        self.streams = _cpu_streams

    def alloc(self, k: int, settle: bool = True) -> float:
        got: list = []
        t = _timed(lambda: got.append(self.m.alloc(k * self.ps)))
        assert got[0] is not None, "SGLang refused the allocation"
        self.m.free(got[0])
        if settle:  # SGLang frees lazily: its flush gives the freed frontier pages back, as the others do at once
            with self.streams():
                self.m.flush_for_allocation()
        return t

    def free(self, k: int) -> float:
        ids = self.m.alloc(k * self.ps)
        assert ids is not None
        return _timed(lambda: self.m.free(ids))

    def fragment(self, n: int) -> list:
        ids = [self.m.alloc(self.ps) for _ in range(2 * n)]
        assert all(i is not None for i in ids)
        for i in ids[::2]:
            self.m.free(i)
        return ids[1::2]

    def compact(self, k: int) -> float:
        live = self.fragment(k)
        with self.streams():
            t = _timed(self.m.flush_for_allocation)
        for i in live:
            self.m.free(i)
        with self.streams():
            self.m.flush_for_allocation()  # back to a packed band for the next repetition
        return t


def op_rows(reps: int, sizes: list[int], holes: int, ks: list[int], rng: random.Random) -> tuple[list[str], list]:
    from kvarena.spec.models import ArenaConfig, preset

    config = ArenaConfig(preset("toy-swa"), 16 << 20, page_size=4, max_context_len=16)
    sides: dict[str, object] = {"reference": Ref(config), "gpu": Gpu(config)}
    sg_error = ""
    try:
        sides["sglang"] = SGLang(config)
    except Exception as e:  # not installed, or it refuses the geometry: say so in the table
        sg_error = f"{type(e).__name__}: {e}"[:80]
    rows, verdicts = [], []

    def row(label: str, fns: dict[str, Callable[[], float]], fair_batched: str = "") -> None:
        got = {k: _stats(v) for k, v in interleave(fns, reps, rng).items()}
        r, g, s = got.get("reference"), got.get("gpu"), got.get("sglang")
        ratio = r[0] / s[0] if r and s else None
        g_ratio = g[0] / s[0] if g and s else None
        if ratio is None:
            target = "-"
        elif ratio <= 0.5:
            target = "PASS"
        elif fair_batched:
            target = f"no; batched is the fair comparison ({fair_batched}): gpu/ / SGLang {g_ratio:.2f}x"
        else:
            target = "no"
        rows.append(f"| {label} | {_fmt(r)} | {_fmt(g)} | {_fmt(s)} | "
                    f"{'-' if ratio is None else f'{ratio:.2f}x'} | {'-' if g_ratio is None else f'{g_ratio:.2f}x'} "
                    f"| {target} |")
        verdicts.append((label, ratio))

    per_page = "the reference binds page by page in Python; SGLang hands out pages in tensor ops"
    for k in sizes:
        row(f"alloc {k}, no holes", {n: (lambda s=s, k=k: s.alloc(k)) for n, s in sides.items()},
            fair_batched=per_page if k >= 256 else "")
    frag = {n: s.fragment(holes) for n, s in sides.items()}  # holes stay for the next rows
    for k in sizes:
        row(f"alloc {k}, {holes:,} holes", {n: (lambda s=s, k=k: s.alloc(k, settle=False)) for n, s in sides.items()},
            fair_batched=per_page if k >= 256 else "")
    for k in sizes:
        row(f"free {k}", {n: (lambda s=s, k=k: s.free(k)) for n, s in sides.items()},
            fair_batched="the reference unbinds page by page in Python; SGLang frees a tensor" if k >= 256 else "")
    for n, s in sides.items():  # back to no holes
        for o in frag[n]:
            if n == "reference":
                s.a.free(o)
            elif n == "gpu":
                s.g.free_batch([o])
            else:
                s.m.free(o)
    if "sglang" in sides:
        with sides["sglang"].streams():
            sides["sglang"].m.flush_for_allocation()
    for k in ks:
        row(f"compaction of {k:,} holes", {n: (lambda s=s, k=k: s.compact(k)) for n, s in sides.items()},
            fair_batched="SGLang packs all K pages in a few tensor ops; the reference plans and applies "
                         "page by page")
    if sg_error:
        rows.append(f"| (SGLang not run: {sg_error}) | | | | | | |")
    return rows, verdicts


# ---------------------------------------------------------------------------------------------------------------
# One admission decision at H200 size


def _h200(model: str) -> int:
    from kvarena.simulator.budget import sglang_budget

    return sglang_budget(model, 0.9)[0]


def _fill_two_class(a, n_req: int, window_pages: int, full_pages: int) -> None:
    low, high = a.order[0], a.order[-1]
    for i in range(n_req):
        a.admit(f"r{i}", {low: window_pages, high: full_pages})


def admission_rows(reps: int, scale: float, rng: random.Random) -> tuple[list[str], dict]:
    from kvarena.gpu.allocator import make
    from kvarena.reference.arena import Arena
    from kvarena.spec.errors import AdmissionRejectedError
    from kvarena.spec.models import ArenaConfig, preset

    rows, summary = [], {}
    cap = int(_h200("gpt-oss-20b") * scale)
    config = ArenaConfig(preset("gpt-oss-20b"), cap, page_size=64, max_context_len=4096)
    a = Arena(config)
    low, high = a.order[0], a.order[-1]
    per = a.bands[low].top
    n_req = int(per * 0.45) // 3  # the bands meet in the middle once the full band grows
    _fill_two_class(a, n_req, 3, 3)
    gap_pages = (a.bands[high].lo * a.bands[high].page_bytes - a.bands[low].hi * a.bands[low].page_bytes) \
        // a.bands[high].page_bytes
    cases = {1: {low: 2, high: 2}, 2: {high: 8}}  # rung 1: window holes and the two gap pages
    g = make(config, device="meta")
    for i in range(n_req):
        g.admit(f"r{i}", {low: 3, high: 3})
    for arena in (a, g):
        for i in range(0, n_req, 2):  # every other request's window pages slide out: holes in the low band
            arena.slide(f"r{i}", low, 3)
        arena.admit("filler", {high: gap_pages - 2})  # two pages of gap left: 8 more need compaction
    for rung, demand in cases.items():
        plan = a.plan_admission(demand)
        assert int(plan.rung) == rung, (rung, plan.rung)
        try:
            gp = g.plan_admission(demand)
            gpu_note = f"{gp.rung.name}, {len(gp.moves):,} moves"
            gfn = {"gpu": lambda d=demand: _timed(lambda: g.plan_admission(d))}
        except AdmissionRejectedError as e:
            gpu_note, gfn = f"rejects ({e})"[:40], {}
        got = {k: _stats(v) for k, v in interleave(
            {"reference": lambda d=demand: _timed(lambda: a.plan_admission(d)), **gfn}, reps, rng).items()}
        r = got["reference"]
        rows.append(f"| gpt-oss-20b, {cap / GiB:.1f} GiB | {rung} | {demand} | {len(plan.moves):,} "
                    f"| {_fmt(r)} | {r[2] * 1e6:,.1f} | {_fmt(got.get('gpu'))} ({gpu_note}) |")
        summary[rung] = r

    cap3 = int(_h200("hymba-1.5b") * scale)
    c3 = ArenaConfig(preset("hymba-1.5b"), cap3, page_size=64, max_context_len=8192)
    top = Arena(c3).bands[Arena(c3).order[1]].top
    for float_pages in (max(10, top // 100), top // 10, top * 4 // 10):
        a3 = Arena(c3)
        s, w, f = a3.order
        a3.admit("float", {w: float_pages})  # the window float at its hint
        ws = a3.bands[w]
        room = (a3.bands[f].lo * a3.bands[f].page_bytes - ws.hi * ws.page_bytes) // a3.bands[f].page_bytes
        a3.admit("full", {f: max(0, room - 4)})
        below = (ws.lo * ws.page_bytes - a3.bands[s].hi * a3.bands[s].page_bytes) // a3.bands[s].page_bytes
        a3.admit("state", {s: 1})
        demand = {f: 4 + 2 * (ws.page_bytes // a3.bands[f].page_bytes + 1)}
        plan = a3.plan_admission(demand)
        assert plan.rung.name == "RELAYOUT", plan.rung
        samples = interleave({"reference": lambda d=demand, a3=a3: _timed(lambda: a3.plan_admission(d))}, reps, rng)
        r = _stats(samples["reference"])
        rows.append(f"| hymba-1.5b, {cap3 / GiB:.1f} GiB, float {float_pages:,} pages (gap below {below:,}) | 3 "
                    f"| {demand} | {len(plan.moves):,} | {_fmt(r)} | {r[2] * 1e6:,.1f} | - |")
        summary[(3, float_pages)] = r
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="few repetitions, small sizes, H200 scaled down; no file")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--admission-only", action="store_true", help="only the H200-size admission rows; no file")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--name", help="file name under --out (default ops_vs_sglang-<date>.md; e.g. a second run that day: "
                                  "ops_vs_sglang-<date>-2.md)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for gpu/ and SGLang (default 1: on a "
                                                           "shared 2-core machine two threads wait on each other)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.time()
    reps = 3 if args.smoke else args.reps
    sizes, holes, ks = ([1, 16], 64, [16]) if args.smoke else ([1, 16, 256], 1024, [16, 256, 4096])
    ops, verdicts = ([], []) if args.admission_only else op_rows(reps, sizes, holes, ks, rng)
    adm, summary = admission_rows(3 if args.smoke else max(10, args.reps // 2), 0.02 if args.smoke else 1.0, rng)
    date = datetime.date.today().isoformat()
    cpu = sh("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    r3 = [v for k, v in summary.items() if isinstance(k, tuple)]
    lines = [
        f"# Reference vs gpu/ vs SGLang 0.5.23: host cost per operation, {date}", "",
        f"- command: `python bench/ops_vs_sglang.py{' --smoke' if args.smoke else ''}"
        f"{f' --name {args.name}' if args.name else ''}` (wall {time.time() - t0:.0f} s)",
        machine_line(load), f"- cpu: {cpu}",
        python_line(),
        f"- {reps} interleaved repetitions per row; median ± interquartile range, µs; gc off inside each timed call; "
        f"torch intra-op threads {args.threads}",
        "", "## Operations (toy-swa, 16 MiB, page size 4: 65,536 full pages of 256 B)", "",
        "| operation | reference µs | gpu/ (torch CPU) µs | SGLang 0.5.23 µs | reference / SGLang | gpu/ / SGLang "
        "| target: reference <= 0.5x |",
        "|---|---:|---:|---:|---:|---:|---|", *ops, "",
        "## One admission decision at H200 size (`plan_admission`, read-only)", "",
        "| arena | rung | demand | moves | reference µs | reference p99 µs | gpu/ (meta device) µs |",
        "|---|---:|---|---:|---:|---:|---|", *adm, "",
        "- rung-3 planning p99 at the three float sizes: "
        + ", ".join(f"{s[2] * 1e3:.3f} ms" for s in r3) + " (target <= 1 ms, independent of the float's size)",
        "- rows where the reference is above 0.5x SGLang: "
        + (", ".join(f"{label} ({ratio:.2f}x)" for label, ratio in verdicts if ratio is not None and ratio > 0.5)
           or "none"),
    ]
    text = "\n".join(lines) + "\n"
    if args.smoke or args.admission_only:
        print(text)
        return 0
    write(Path(args.out), args.name or f"ops_vs_sglang-{date}.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
