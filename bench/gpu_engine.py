"""bench/gpu.py's engine sections: what an engine needs of gpu/ beyond fast kernels (issue: engine-grade).

Each function takes the device and returns rows for one table of the report (and a dict for the JSON):

* ``sync_audit``   every hot-path call under ``torch.cuda.set_sync_debug_mode("error")``: a call that
                   synchronises the host with the device raises there (CPU: the calls run, nothing audited).
* ``graph_decode`` a decode step's binds captured as a CUDA graph (``graph_width``) and replayed, against an
                   eager arena doing the same steps: tables equal after every step; device time of one replay.
* ``overlap``      a long kernel on another stream; the allocator's calls on the current stream return before
                   it finishes, and a FORWARD user acquired with its event is released only after it completed.
* ``preset_pages`` the move and zero kernels on every preset's page sizes (several are not a multiple of 16
                   words: their last vector access is masked), checked, then move bandwidth per size.
* ``batched_lockstep`` conformance/machine/batched.py's machine on the device at ``exact``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

NM = "not measured"


def _config(model: str = "toy-swa", capacity: int = 16 << 20) -> Any:
    from kvarena.spec.models import ArenaConfig, preset

    return ArenaConfig(preset(model), capacity, page_size=4, max_context_len=16)


def _decode_demand(n: int, k: int) -> np.ndarray:
    d = np.zeros((n, k), dtype=np.int64)
    d[:, -1] = 1
    return d


def sync_audit(device: Any, dry: bool, n: int = 1024) -> tuple[list[list[str]], dict]:
    import torch

    from kvarena.gpu.allocator import make

    cuda = device.type == "cuda"
    a = make(_config(), device)
    g = make(_config(), device, graph_width=n)
    pt = make(_config(), device, page_width=8)
    pt_rows = pt.admit_batch([f"p{i}" for i in range(n)], _decode_demand(n, len(pt.order)) * 3).rows
    pt_dev = torch.as_tensor(pt_rows, device=device)
    owners = [f"r{i}" for i in range(n)]
    k = len(a.order)
    vt = torch.randint(0, 4 * n, (4 * n,), dtype=torch.int64, device=device)
    out = torch.empty(8 * n, dtype=torch.int64, device=device)
    lens = np.full(n, 4), np.full(n, 5)
    calls = [
        ("admit_batch (rung 1)", lambda: a.admit_batch(owners, _decode_demand(n, k) * 2)),
        ("extend_batch (decode, every request a page)", lambda: a.extend_batch(owners, _decode_demand(n, k))),
        ("token_locs (decode)", lambda: a.token_locs(a.order[-1], owners, *lens)),
        ("translate_tokens(out=, out_width=)", lambda: a.translate_tokens(a.order[-1], vt, out=out, out_width=8 * n)),
        ("free_batch", lambda: a.free_batch(owners)),
        ("graph: admit_batch", lambda: g.admit_batch(owners, np.zeros((n, k), dtype=np.int64))),
        ("graph: extend_batch (replay)", lambda: g.extend_batch(owners, _decode_demand(n, k))),
        ("graph: free_batch", lambda: g.free_batch(owners)),
        ("page tables: extend_batch (lean, int handles)", lambda: pt.extend_batch(pt_rows, _decode_demand(n, k))),
        ("page tables: token_locs", lambda: pt.token_locs(pt.order[-1], pt_rows, np.full(n, 12), np.full(n, 13))),
        ("page tables: physical_pages", lambda: pt.physical_pages(pt.order[-1], pt_dev)),
    ]
    rows, res = [], {}
    for name, fn in calls:
        err = None
        t0 = time.perf_counter()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        except RuntimeError as e:  # the debug mode raises on a synchronising call
            err = str(e).splitlines()[0][:120]
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
        host = time.perf_counter() - t0
        verdict = NM if dry else ("0 syncs" if err is None else f"SYNC: {err}")
        rows.append([name, f"{n:,}", verdict, NM if dry else f"{host * 1e6:,.0f}"])
        res[name] = {"syncs": None if dry else (0 if err is None else err), "host_s": None if dry else host}
    return rows, res


def graph_decode(device: Any, dry: bool, n: int = 1024, steps: int = 6) -> tuple[list[list[str]], dict]:
    import torch

    from kvarena.gpu.allocator import make
    from kvarena.gpu.kernels import device_time

    eager, graph = make(_config(), device), make(_config(), device, graph_width=n)
    owners = [f"r{i}" for i in range(n)]
    k = len(eager.order)
    for a in (eager, graph):
        a.admit_batch(owners, np.zeros((n, k), dtype=np.int64))
    rng = np.random.default_rng(0)
    for _ in range(steps):  # some requests cross a page each step, some finish and return
        d = np.zeros((n, k), dtype=np.int64)
        d[:, -1] = rng.random(n) < 0.5
        for a in (eager, graph):
            a.extend_batch(owners, d)
        assert torch.equal(eager.tables.v2p.cpu(), graph.tables.v2p.cpu()), "graph replay: v2p differs from eager"
        assert torch.equal(eager.tables.p2v.cpu(), graph.tables.p2v.cpu()), "graph replay: p2v differs from eager"
    gs = graph.graph
    assert gs is not None and gs.binds == steps, f"{gs.binds} of {steps} steps ran at fixed shapes"
    t_replay = None
    if device.type == "cuda":
        b = (gs.turn + 1) % 2
        t_replay = device_time(lambda: gs.graphs[b].replay(), device, reps=50)
    rows = [[f"{n:,} requests, {steps} steps", "tables equal to eager after every step",
             f"{gs.replays} replays" if not dry else "eager fixed-shape ops (CPU)",
             NM if t_replay is None else f"{t_replay * 1e6:,.1f}",
             NM if t_replay is None else ("PASS" if t_replay <= 20e-6 else "FAIL")]]
    return rows, {"requests": n, "steps": steps, "replays": gs.replays, "replay_s": t_replay}


def overlap(device: Any, dry: bool, n: int = 1024) -> tuple[list[list[str]], dict]:
    import torch

    from kvarena.gpu.allocator import make
    from kvarena.spec.types import UserKind

    if device.type != "cuda":
        return [["long kernel on another stream", NM, NM, NM]], {"measured": False}
    a = make(_config(), device)
    owners = [f"r{i}" for i in range(n)]
    k = len(a.order)
    a.admit_batch(owners, _decode_demand(n, k) * 2)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time
        done = torch.cuda.Event()
        done.record()
    vids = [v for vs in a.held(owners[0]).values() for v in vs]
    a.acquire("fwd", UserKind.FORWARD_READ, vids, event=done)
    t0 = time.perf_counter()
    a.free_batch(owners[:1])
    a.extend_batch(owners[1:], _decode_demand(n - 1, k))
    a.token_locs(a.order[-1], owners[1:], np.full(n - 1, 8), np.full(n - 1, 9))
    a.compact()
    host = time.perf_counter() - t0
    still = not done.query()
    withheld = sum(len(b.withheld) for b in a.bands.values())
    done.synchronize()
    a.compact()  # the next call polls the completed event
    released = "fwd" not in a.users
    ok = still and withheld > 0 and released
    return ([["long kernel on another stream (~1 s)", f"{host * 1e3:,.2f} ms for 4 calls",
              "returned before it finished" if still else "WAITED", "PASS" if ok else "FAIL"]],
            {"host_s": host, "returned_before": still, "withheld_while_running": withheld, "released_after": released})


def preset_pages(device: Any, dry: bool) -> tuple[list[list[str]], dict]:
    from kvarena.gpu.kernels import move, zero
    from kvarena.spec.models import PRESETS, ArenaConfig, preset

    sizes: dict[int, list[str]] = {}
    for name in (*PRESETS, "toy-tri", "toy-swa", "toy-state"):
        spec = preset(name)
        for ps in (4, 16, 64):
            config = ArenaConfig(spec, 1 << 40, page_size=ps)
            for c in spec.classes:
                sizes.setdefault(config.page_bytes(c.name), []).append(f"{name}:{c.name}@{ps}")
    for words in (4, 40, 100, 1000):  # no shipped preset has a page that is not a multiple of 16 words
        sizes.setdefault(8 * words, []).append(f"synthetic {words} words")
    if dry:  # the interpreter copies every byte in Python-driven programs: small pages only
        sizes = {pb: v for pb, v in sizes.items() if pb <= 64 << 10}
    rows, res = [], {}
    for pb in sorted(sizes):
        words = pb // 8
        odd = words % 16 != 0
        n_pages = 4 if dry else max(4, min(256, (1 << 30) // pb))
        move.check(device, page_bytes=pb, n_pages=n_pages, n_moves=n_pages // 2, seed=pb % 1000)
        zero.check(device, page_bytes=pb, n_pages=n_pages, n_zero=n_pages // 2, seed=pb % 1000)
        bw = NM
        if not dry:
            r = move.bench(device, [pb * max(1, (256 << 20) // pb)], page_bytes=pb, reps=10, baselines=False)[0]
            bw = f"{2 * r['bytes'] / r['kernel_s'] / 1e9:,.0f}"
        rows.append([f"{pb:,}", "yes" if odd else "no", ", ".join(sizes[pb][:3]) + (" ..." if len(sizes[pb]) > 3
                                                                                  else ""), "pass", bw])
        res[pb] = {"not_multiple_of_16_words": odd, "classes": sizes[pb], "move_GBps": None if dry else bw}
    return rows, res


def batched_lockstep(device: Any, examples: int) -> tuple[list[list[str]], dict]:
    from hypothesis import settings

    from kvarena.conformance.machine.batched import run_batched_lockstep
    from kvarena.gpu.allocator import make

    t0 = time.perf_counter()
    run_batched_lockstep(lambda config: make(config, device), "exact",
                         settings(settings.get_profile("ci"), max_examples=examples, deadline=None))
    wall = time.perf_counter() - t0
    return ([["conformance/machine/batched.py at exact", f"{examples} examples x 50 steps", "exact agreement",
              f"{wall:.1f}"]], {"examples": examples, "wall_s": wall})
