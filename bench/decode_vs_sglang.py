"""One decode step's host cost: gpu/'s batched calls against SGLang 0.5.23's real per-step allocator call.

    python bench/decode_vs_sglang.py              # bench/results/decode_vs_sglang-<date>.md (minutes on 2 cores)
    python bench/decode_vs_sglang.py --threads 1  # one torch intra-op thread: decode_vs_sglang-<date>-1-thread.md
    python bench/decode_vs_sglang.py --smoke      # seconds: N = 64, 256, 3 repetitions; prints, writes no file

The worst step: N requests hold one page per grown class (pre = page size) and get a token each (seq = pre + 1).

* **SGLang, full + window** (default toy-swa): what its scheduler calls per step (``prepare_for_decode`` ->
  ``alloc_for_decode`` -> ``alloc_paged_token_slots_decode``, srt/mem_cache/allocation.py):
  ``UnifiedSWATokenToKVPoolAllocator.alloc_decode`` (allocator/unified_hybrid_swa.py): ``ensure_capacity``, the
  full member's ``MultiEndedAllocator.alloc_decode`` (allocator/unified_sub_pool.py), the swa member's
  ``alloc_with_virtual`` (a window page per new virtual page); a real ``UnifiedKVPool`` with sub-pools "full"
  (down) and "swa" (up), lazy compaction. Not SGLang's module code, and why: (1) the adapter's stubs
  (engines/sglang/adapter.py ``load_sglang``) and one for ``allocator.swa``, whose imports cannot load here
  (``allocator.paged``, ``srt.platforms``, ``utils.common``: no orjson); the composite inherits its
  ``SWATokenToKVPoolAllocator`` for isinstance only and never runs its ``__init__``; (2) ``get_num_new_pages``,
  ``next_power_of_2`` (srt/utils/common.py) and ``alloc_decode_naive`` (allocator/paged.py) are compiled from the
  wheel's own source, their modules being unimportable; (3) ``alloc_decode_kernel`` is a Triton launch that
  ``MultiEndedAllocator.alloc_decode`` makes with no CPU path: its launch site runs ``alloc_decode_naive``,
  SGLang's own torch fallback of that kernel (``PagedTokenToKVPoolAllocator.alloc_decode`` without Triton), with
  ``num_new_pages`` = the free-id count (it only bounds a clamp: same output); (4) the kv pools are the adapter's
  ``_EnvelopeKV`` (SGLang's ``zero_pages`` on the real byte buffer). Untimed on both sides (scheduler work
  around the call): the ``req_to_token`` gather of ``last_loc`` and write of the result, ``evict_from_tree_cache``.
* **SGLang, one class**: the full member's ``MultiEndedAllocator.alloc_decode`` alone (what
  ``UnifiedMambaTokenToKVPoolAllocator.alloc_decode`` forwards to), on the adapter's ``SGLangArena``.
* **gpu/** (``kvarena.gpu.allocator.make``), as engines/transformers/cache.py steps: per grown class
  ``extend_batch(rows, one page per request)`` (gpu/batch.py, lean path, int handles) and ``token_locs(cls,
  rows, pre_lens, seq_lens)``. More than SGLang's call: SGLang returns virtual token ids (its attention backend
  translates them per class later, untimed), gpu/ the physical entries per class.
* **Zeroing** apart: on a GPU one launch per class either way (SGLang ``zero_pages`` per member, gpu/
  ``zero_run`` / ``zero_slots``); on CPU SGLang's stand-in is an index_put. Off/on: SGLang's own switch
  ``_zero_pages_on_alloc`` per member; gpu/ has none, so kvarena.gpu.batch's and kvarena.gpu.allocator's
  ``zero_run`` / ``zero_slots`` become no-ops for the off calls. The four calls are interleaved.

Untimed after each call: the new pages are freed (gpu/: ``free_batch``, the prefix re-admitted; SGLang: ``free``,
``flush_opportunistic`` per member), so both take frontier pages every step. One process, CPU torch, shuffled
interleaved repetitions, the collector off in each call, medians ± IQR.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import importlib
import math
import os
import random
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import finish, machine_line, python_line, sh
from _timing import interleave

os.environ.pop("TRITON_INTERPRET", None)  # the plain-torch path of every kernel wrapper: the CPU torch path


def _stats(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return statistics.median(xs), q[2] - q[0]


def _fmt(s: tuple[float, float]) -> str:
    return f"{s[0] * 1e6:,.1f} ± {s[1] * 1e6:,.1f}"


def _real_defs(root: Path, rel: str, names: list[str]) -> dict[str, Any]:
    """Functions ``names`` of SGLang's ``rel``, compiled from the installed source (the module cannot import)."""
    ns: dict[str, Any] = {"torch": torch, "Optional": Optional}
    body = [n for n in ast.parse((root / rel).read_text()).body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body, []), str(root / rel), "exec"), ns)
    return {n: ns[n] for n in names}


def load() -> types.SimpleNamespace:
    """SGLang's allocator modules with the decode path made runnable on CPU (the module docstring says how)."""
    from kvarena.engines.sglang import adapter as ad

    sg = ad.load_sglang()
    root = Path(sys.modules["sglang"].__path__[0])
    common = _real_defs(root, "srt/utils/common.py", ["get_num_new_pages", "next_power_of_2"])
    naive = _real_defs(root, "srt/mem_cache/allocator/paged.py", ["alloc_decode_naive"])["alloc_decode_naive"]
    name = "sglang.srt.mem_cache.allocator.swa"
    if name not in sys.modules:
        base = sys.modules["sglang.srt.mem_cache.allocator"].BaseTokenToKVPoolAllocator
        sys.modules[name] = types.ModuleType(name, "decode_vs_sglang stub: base class for isinstance only")
        sys.modules[name].__dict__.update(SWATokenToKVPoolAllocator=type("SWATokenToKVPoolAllocator", (base,), {}),
                                          UNIFIED_SWA_SEGMENT_BOUND=None, UNIFIED_SWA_SEGMENT_RELEASED=None)
    uhs = importlib.import_module("sglang.srt.mem_cache.allocator.unified_hybrid_swa")

    class _NaiveLaunch:  # alloc_decode_kernel[(bs,)](seq_lens, last_loc, free_page_ptr, out, bs_upper, page_size)
        def __getitem__(self, _grid: Any) -> Callable[..., None]:
            return lambda seq, last, free, out, _bs, ps: naive(seq, last, free, out, ps, free.numel())

    for m in (sg.alloc, uhs):
        m.get_num_new_pages = common["get_num_new_pages"]
    sg.alloc.next_power_of_2 = common["next_power_of_2"]
    sg.alloc.alloc_decode_kernel = _NaiveLaunch()
    return types.SimpleNamespace(ad=ad, pool=sg.pool, uhs=uhs)


def sglang_composite(s: types.SimpleNamespace, config: Any) -> Any:
    """``UnifiedSWATokenToKVPoolAllocator`` over a ``UnifiedKVPool`` of kvarena's window (as "swa", up) and full
    (as "full", down) classes: the composite names its sub-pools so."""
    from kvarena.spec.layout import Kind, entry_layout
    from kvarena.spec.models import chain

    cls = chain(config.model)
    if [c.kind for c in cls] != [Kind.WINDOW, Kind.FULL]:
        raise SystemExit(f"{config.model.name}: the SWA composite needs one window and one full class")
    specs = [dataclasses.replace(s.ad._spec_for(s.pool, c, d, entry_layout(c).entry_bytes), name=n)
             for c, d, n in zip(cls, ("up", "down"), ("swa", "full"))]
    ps, floor = config.page_size, s.pool._reserved_floor_bytes(specs, config.page_size)
    lcm = math.lcm(*(sp.entry_bytes() * ps for sp in specs))  # the sink floor, rounded as the adapter does
    pool = s.pool.UnifiedKVPool(total_bytes=config.capacity + -(-floor // lcm) * lcm, sub_pool_specs=specs,
                                device="cpu", enable_memory_saver=False, page_size=ps)
    kv = {n: s.ad._EnvelopeKV(pool, pool.max_slots(n) // ps, pool.spec(n).entry_bytes() * ps, ps)
          for n in ("full", "swa")}
    kvcache = types.SimpleNamespace(full_kv_pool=kv["full"], swa_kv_pool=kv["swa"], attach_allocators=lambda **_: None)
    comp = s.uhs.UnifiedSWATokenToKVPoolAllocator(unified_buffer=pool, kvcache=kvcache, device="cpu", page_size=ps,
                                                  lazy_compaction=True)
    return comp, [comp.full_attn_allocator, comp.swa_attn_allocator]


class Sg:
    """N requests holding one page each (per class), the step's tensors ready."""

    def __init__(self, alloc: Any, members: list[Any], n: int, ps: int) -> None:
        self.alloc, self.members = alloc, members
        prefix = alloc.alloc(n * ps)
        assert prefix is not None, "SGLang refused the prefix pages"
        self.last = prefix.view(n, ps)[:, -1].clone()  # last_loc: each request's last token (virtual)
        self.seq = torch.full((n,), ps + 1, dtype=torch.int64)  # seq_lens (the device's) and seq_lens_cpu
        self.seq_cpu = self.seq.clone()

    def zero(self, on: bool) -> None:  # SGLang's own switch (set as its MHA/MLA pools set it)
        for m in self.members:
            m._zero_pages_on_alloc = on

    def step(self) -> float:
        t0 = time.perf_counter()
        out = self.alloc.alloc_decode(self.seq, self.seq_cpu, self.last)
        t = time.perf_counter() - t0
        assert out is not None and len(out) == len(self.seq), "SGLang refused the decode step"
        self.alloc.free(out)  # untimed: the new pages, then their boundary holes absorbed
        for m in self.members:
            m.flush_opportunistic()
        return t


def _noop(*_a: Any, **_k: Any) -> None:  # gpu/'s zero functions, switched off
    return None


class Gpu:
    """gpu/ with N requests holding one page per grown class; ``step`` grows each class as the engine does."""

    def __init__(self, config: Any, n: int, grown: list[str]) -> None:
        from kvarena.gpu import allocator, batch
        from kvarena.gpu.kernels.zero import zero_run, zero_slots

        self.a = allocator.make(config)
        k, ps, self.grown = len(self.a.order), config.page_size, grown
        self.demand = {c: np.zeros((n, k), dtype=np.int64) for c in grown}
        for c, d in self.demand.items():
            d[:, self.a.order.index(c)] = 1
        self.prefix = sum(self.demand.values())
        self.owners = [f"r{i}" for i in range(n)]
        self.rows = self.a.admit_batch(self.owners, self.prefix).rows
        self.pre = np.full(n, ps, dtype=np.int64)
        self.seq = self.pre + 1  # decode: one token each, every request crossing a page
        self.real = [(batch, "zero_run", zero_run), (batch, "zero_slots", zero_slots),
                     (allocator, "zero_slots", zero_slots)]
        for c in grown:  # check once: every lane placed, one location per request
            r = self.a.extend_batch(self.rows, self.demand[c])
            assert not r.errors and len(self.a.token_locs(c, self.rows, self.pre, self.seq)) == n
        self._reset()

    def zero(self, on: bool) -> None:
        for mod, name, fn in self.real:
            setattr(mod, name, fn if on else _noop)

    def _reset(self) -> None:
        self.a.free_batch(self.rows)
        self.rows = self.a.admit_batch(self.owners, self.prefix).rows

    def work(self) -> None:
        for c in self.grown:
            self.a.extend_batch(self.rows, self.demand[c])
            self.a.token_locs(c, self.rows, self.pre, self.seq)

    def step(self) -> float:
        t0 = time.perf_counter()
        self.work()
        t = time.perf_counter() - t0
        self._reset()  # untimed
        return t

    def counts(self) -> str:  # device work of the timed calls (zeroing on)
        def now() -> tuple[int, ...]:
            return self.a.staging.uploads, self.a.tables.launches, self.a.stats["zero_launches"]
        before, _, after = now(), self.work(), now()
        self._reset()
        return "{} uploads, {} scatters, {} zero launches".format(*(y - x for x, y in zip(before, after)))




def rows_for(s: types.SimpleNamespace, config: Any, one_class: bool, ns: list[int], reps: int,
             rng: random.Random) -> list[str]:
    from kvarena.engines.sglang.adapter import SGLangArena, _cpu_streams
    from kvarena.spec.models import chain

    out, off = [], {}
    for n in ns:
        with _cpu_streams():
            if one_class:
                arena = SGLangArena(config)
                a = arena.allocs[arena.order[-1]]
                sg, gpu = Sg(a, [a], n, config.page_size), Gpu(config, n, [arena.order[-1]])
            else:
                comp, members = sglang_composite(s, config)
                order = [c.name for c in chain(config.model)]
                sg, gpu = Sg(comp, members, n, config.page_size), Gpu(config, n, [order[-1], order[0]])
            # the zeroing switch is set before each call's timer starts
            t = interleave({f"{k}{int(on)}": (lambda x=x, on=on: x.zero(on) or x.step())
                             for k, x in (("g", gpu), ("s", sg)) for on in (False, True)}, reps, rng)
        gpu.zero(True)
        g0, g1, s0, s1 = (_stats(t[k]) for k in ("g0", "g1", "s0", "s1"))
        off[n] = g0[0], s0[0]
        out.append(f"| {n:,} | {_fmt(g0)} | {_fmt(s0)} | **{g0[0] / s0[0]:.2f}x** | {_fmt(g1)} | {_fmt(s1)} | "
                   f"{g1[0] / s1[0]:.2f}x | {(g1[0] - g0[0]) * 1e6:,.1f} | {(s1[0] - s0[0]) * 1e6:,.1f} "
                   f"({max(0.0, s1[0] - s0[0]) / s1[0]:.0%}) | {gpu.counts()} |")
    lo, hi = min(ns), max(ns)
    return [*out, "", f"- zeroing off, N = {hi:,} against N = {lo:,}: gpu/ {off[hi][0] / off[lo][0]:.2f}x, "
            f"SGLang {off[hi][1] / off[lo][1]:.2f}x (1.00x: flat in the batch)"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="seconds: N = 64, 256; 3 repetitions; prints, writes nothing")
    p.add_argument("--model", default="toy-swa", help="a preset with one window and one full class (toy-swa: tiny "
                   "pages, host work only; gpt-oss-20b needs --capacity-mib of a few GiB)")
    for flag, default in (("--capacity-mib", 16), ("--page-size", 4), ("--reps", None)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads for both sides (default: "
                   "torch's own; 1 is the stricter comparison on a shared machine)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    from kvarena.spec.models import ArenaConfig, preset

    if args.threads:
        torch.set_num_threads(args.threads)
    load_avg = " ".join(f"{x:.2f}" for x in os.getloadavg())
    reps = args.reps or (3 if args.smoke else 30)
    ns = [64, 256] if args.smoke else [64, 256, 1024, 4096]
    config = ArenaConfig(preset(args.model), args.capacity_mib << 20, page_size=args.page_size,
                         max_context_len=4 * args.page_size)
    s = load()
    rng = random.Random(0)
    t_start = time.perf_counter()
    both = rows_for(s, config, False, ns, reps, rng)
    one = rows_for(s, config, True, ns, reps, rng)
    head = ["| requests N | gpu/ µs, zeroing off | SGLang µs, zeroing off | gpu/ / SGLang | gpu/ µs, zeroing on | "
            "SGLang µs, zeroing on | gpu/ / SGLang | gpu/ zeroing µs | SGLang zeroing µs (share) | gpu/ device work |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    command = " ".join(["python bench/decode_vs_sglang.py", *(sys.argv[1:] if argv is None else argv)])
    lscpu = sh("sh", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'")
    text = "\n".join([
        f"# One decode step, gpu/ against SGLang 0.5.23's per-step call, CPU torch, {datetime.date.today()}", "",
        f"- command: `{command}` (wall {time.perf_counter() - t_start:.0f} s)", machine_line(load_avg),
        f"- cpu: {lscpu or '?'}, {os.cpu_count()} cores", python_line(),
        f"- configuration: {args.model}, {args.capacity_mib} MiB, page size {args.page_size}, torch intra-op threads "
        f"{torch.get_num_threads()}{'' if args.threads else ' (torch default)'}; {reps} interleaved repetitions of "
        "the four calls; median ± interquartile range, µs; every request crosses a page (pre = page size, seq = "
        "pre + 1); what each side's timed call is: the docstring of bench/decode_vs_sglang.py",
        "- zeroing: one launch per class on a GPU on either side; on CPU the stand-ins differ (SGLang `zero_pages`: "
        "an index_put; gpu/ `zero_run`: a slice memset): the zeroing-off ratio is the allocators' host cost", "",
        "## Full + window: gpu/ `extend_batch` + `token_locs` per class vs "
        "`UnifiedSWATokenToKVPoolAllocator.alloc_decode`", "", *head, *both, "",
        "## One class (full): gpu/ `extend_batch` + `token_locs` vs the member's `MultiEndedAllocator.alloc_decode`",
        "", *head, *one, "",
        "SGLang's call on a GPU (its code, fast path): `alloc_decode_kernel`, per member `alloc_bind_inplace` and "
        "`zero_pages`, and the free-id slice `clone`; gpu/'s launches are counted above.", ""])
    suffix = f"-{args.threads}-thread" if args.threads else ""
    return finish(args.out, f"decode_vs_sglang-{datetime.date.today().isoformat()}{suffix}.md", text, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
