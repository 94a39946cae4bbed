"""gpu/'s batched engine calls: exactly the sequential calls, with no device read and no data-dependent shape.

* ``admit_batch`` / ``extend_batch`` / ``free_batch`` against the reference's sequential ``admit`` / ``extend``
  / ``free`` in batch order (random batches with unknown and repeated owners, malformed and rejected demands,
  both demand forms), on the torch path and under TRITON_INTERPRET=1; observation and holdings after every step.
* The same calls, ``translate_tokens(out=, out_width=)`` and ``token_locs`` with every device tensor on torch's
  **meta** device: a meta tensor cannot be read (``.item()``, ``.tolist()``, ``.cpu()`` raise) and forbids
  data-dependent shapes, so passing proves the hot path neither syncs nor sizes anything from device data.
  The host state it leaves is the one a CPU arena doing the same leaves.
* A FORWARD user acquired with an event stays until its event completes, then is released at the next call.
* Padding lanes point past the arena's last byte; the staging ring never rewrites an in-flight buffer.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import random
from typing import Any

import numpy as np
import pytest
import torch

import kvarena.gpu.kernels as kernels
from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.gpu import staging
from kvarena.gpu.allocator import make
from kvarena.gpu.kernels import use_interpreter
from kvarena.gpu.results import Admission, BatchResult
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, CapacityTooSmallError, InvalidArgumentError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

use_interpreter()


def _config(model: str, cap: int, ps: int) -> ArenaConfig:
    while True:
        config = ArenaConfig(preset(model), cap, page_size=ps, max_context_len=16)
        try:
            Arena(config)
            return config
        except CapacityTooSmallError:
            cap += 256


def _norm(x: Any) -> tuple:
    if isinstance(x, ArenaError):
        return ("error", type(x).__name__, getattr(x, "shortfall", None), getattr(x, "shortfall_bytes", None))
    if isinstance(x, Admission) or hasattr(x, "pages"):
        return ("ok", dict(x.pages), x.plan)
    return ("ok", list(x) if isinstance(x, list) else x)


def _seq(ref: Arena, method: str, *args: Any) -> tuple:
    try:
        return _norm(getattr(ref, method)(*args))
    except ArenaError as e:
        return _norm(e)


class BatchLockstep:
    def __init__(self, model: str, seed: int, graph_width: int | None = None, page_width: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.hrng = random.Random(seed + 1000)  # names or int rows: drawn apart, the operations stay the same
        self.config = _config(model, 2400 + 128 * self.rng.randint(0, 12), self.rng.choice([2, 4]))
        self.ref, self.gpu = Arena(self.config), make(self.config, graph_width=graph_width, page_width=page_width)
        self.order = self.ref.order
        self.n = 0
        self.fast = self.fell_back = self.rejected = self.decodes = 0

    def name(self) -> str:
        self.n += 1
        return f"b{self.n}"

    def demands(self, k: int, hi: int) -> tuple[Any, list[dict]]:
        rows = [[self.rng.randint(0, hi) for _ in self.order] for _ in range(k)]
        if self.rng.random() < 0.15:
            rows[self.rng.randrange(k)][0] = self.rng.choice([-1, 10_000])  # malformed: each refused alone
        dicts = [dict(zip(self.order, r)) for r in rows]
        return (np.array(rows, dtype=np.int64) if self.rng.random() < 0.5 else dicts), dicts

    def owners(self, k: int) -> list[str]:
        live = [o for o in self.ref.owners]
        out = [self.rng.choice(live) if live and self.rng.random() < 0.85 else "ghost" for _ in range(k)]
        if out and self.rng.random() < 0.2:
            out.append(out[0])  # the same owner twice in one batch
        return out

    def step(self) -> None:
        r = self.rng
        op = r.choices(["admit", "extend", "free", "single"], [4, 5, 2, 3])[0]
        if op == "admit":
            k = r.randint(1, 6)
            owners = [self.name() for _ in range(k)]
            if r.random() < 0.1:
                owners[-1] = owners[0] if r.random() < 0.5 else (list(self.ref.owners) or ["x"])[0]
            arr, dicts = self.demands(k, 3)
            want = [_seq(self.ref, "admit", o, d) for o, d in zip(owners, dicts)]
            got = [_norm(x) for x in self.gpu.admit_batch(owners, arr)]
        elif op == "extend":
            owners = self.owners(r.randint(1, 8))
            arr, dicts = self.demands(len(owners), 2)
            want = [_seq(self.ref, "extend", o, d) for o, d in zip(owners, dicts)]
            handles = self.gpu.owners.lookup(owners) if self.hrng.random() < 0.3 else owners  # an engine's int rows
            res = self.gpu.extend_batch(handles, arr)
            got = [_norm(x) for x in res]
            self.fell_back += len(res.plans)
            self.fast += len(res) - len(res.plans) - len(res.errors)
            self.rejected += sum(g[1] == "AdmissionRejectedError" for g in got if g[0] == "error")
        elif op == "free":
            owners = self.owners(r.randint(1, 4))
            want = [_seq(self.ref, "free", o) for o in owners]
            handles = self.gpu.owners.lookup(owners) if self.hrng.random() < 0.3 else owners
            got = [_norm(x) for x in self.gpu.free_batch(handles)]
        else:
            self.single()
            return
        assert got == want, f"step {self.n} {op}:\n  reference {want}\n  gpu       {got}"
        if self.hrng.random() < 0.25:
            self.decode()

    def decode(self) -> None:
        """The engine's decode step: int handles, an int64 array, pages of the last class only (the lean path)."""
        owners = [o for o in self.ref.owners if o != "cache"]
        if not owners:
            return
        every = self.hrng.random() < 0.5  # one page per lane: the decode-demand fast path (a cached pattern)
        col = [1 if every else int(self.hrng.random() < 0.5) for _ in owners]
        want = [_seq(self.ref, "extend", o, {self.order[-1]: x}) for o, x in zip(owners, col)]
        d = np.zeros((len(owners), len(self.order)), dtype=np.int64)
        d[:, -1] = col
        got = [_norm(x) for x in self.gpu.extend_batch(self.gpu.owners.lookup(owners), d)]
        assert got == want, f"step {self.n} decode:\n  reference {want}\n  gpu       {got}"
        self.decodes += 1

    def single(self) -> None:
        """Sequential calls in between: holes (free every other), users, compaction."""
        r, owners = self.rng, list(self.ref.owners)
        case = r.randrange(4)
        if case == 0 and owners:
            for o in owners[::2]:
                assert _seq(self.ref, "free", o) == _norm(self.gpu.free(o))
        elif case == 1 and self.ref.v2p:
            vids = r.sample(sorted(self.ref.v2p), min(3, len(self.ref.v2p)))
            u, kind = self.name(), r.choice(list(UserKind))
            self.ref.acquire(u, kind, vids)
            self.gpu.acquire(u, kind, vids)
        elif case == 2 and self.ref.users:
            u = r.choice(sorted(self.ref.users))
            self.ref.release(u)
            self.gpu.release(u)
        else:
            mm = r.choice([None, 1, 2])
            assert _seq(self.ref, "compact", mm) == _norm(self.gpu.compact(mm))

    def compare(self) -> None:
        assert observe_reference(self.ref) == self.gpu.observe(), f"step {self.n}: observations differ"
        for o in self.ref.owners:
            assert self.ref.held(o) == self.gpu.held(o), f"step {self.n}: holdings of {o} differ"

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
            self.compare()


@pytest.mark.parametrize("model", ["toy-tri", "toy-swa", "toy-state"])
@pytest.mark.parametrize("path", ["torch", "interpreter"])
def test_batched_calls_are_the_sequential_calls(model: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "torch":
        monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    fast = fell_back = rejected = decodes = 0
    for seed in range(2 if path == "torch" else 1):
        ls = BatchLockstep(model, seed)
        ls.run(120 if path == "torch" else 60)
        fast, fell_back, rejected = fast + ls.fast, fell_back + ls.fell_back, rejected + ls.rejected
        decodes += ls.decodes
    assert fast and fell_back and rejected and decodes, \
        f"vectorized {fast}, by the ladder {fell_back}, rejected {rejected}, decode steps {decodes}"


@pytest.mark.parametrize("model", ["toy-swa", "toy-tri"])
def test_decode_step_refuses_handles_of_no_owner(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean decode path's liveness test (one clipped take, no ufunc): a negative handle, one past every row,
    a freed owner's and row 0 (never an owner's) each get UnknownOwnerError exactly as sequential extends do,
    the live lanes their pages; the one-page-per-lane demand (the cached pattern) and another demand alike."""
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    config = _config(model, 4096, 2)
    for every in (True, False):
        ref, gpu = Arena(config), make(config)
        k = len(gpu.order)
        res = gpu.admit_batch(["a", "b", "c"], np.zeros((3, k), dtype=np.int64))
        for o in ("a", "b", "c"):
            ref.admit(o, {})
        ref.free("c")
        gpu.free("c")
        ra, rb, rc = (int(x) for x in res.rows)
        # one bad handle per batch (any of them sends the whole batch to the general path), then all live
        for bad, name in ((-1, "neg"), (rc, "c"), (len(gpu.owners.names) + 7, "past"), (-2**62, "neg2"), (0, "zero"),
                          (None, None)):
            handles = [ra, rb] if bad is None else [ra, bad, rb]
            names = ["a", "b"] if bad is None else ["a", name, "b"]
            col = [1] * len(handles) if every else [2] + [1] * (len(handles) - 1)
            d = np.zeros((len(handles), k), dtype=np.int64)
            d[:, -1] = col
            want = [_seq(ref, "extend", o, {gpu.order[-1]: x}) for o, x in zip(names, col)]
            got = [_norm(x) for x in gpu.extend_batch(np.array(handles, dtype=np.int64), d)]
            assert got == want, f"every={every} bad={bad}:\n  reference {want}\n  gpu       {got}"
            assert bad is None or got[1][1] == "UnknownOwnerError"
            assert observe_reference(ref) == gpu.observe()
        low = np.zeros((2, k), dtype=np.int64)  # one page per lane of the low end class: the other band's run
        low[:, 0] = 1
        want = [_seq(ref, "extend", o, {gpu.order[0]: 1}) for o in ("b", "a")]
        got = [_norm(x) for x in gpu.extend_batch(np.array([rb, ra], dtype=np.int64), low)]
        assert got == want and observe_reference(ref) == gpu.observe(), f"low end:\n  {want}\n  {got}"


def test_unhashable_owner_lanes_are_refused_as_the_sequential_calls_refuse_them() -> None:
    """An unhashable owner id in a batch (a list, a tuple holding a list) is that lane's InvalidArgument, as
    ``extend``/``free`` raise it (spec/guards.py ``check_hashable_id``), not a TypeError out of the whole call;
    the other lanes are served; ``token_locs`` refuses with InvalidArgument. Nothing else changes."""
    config = _config("toy-swa", 4096, 2)
    ref, gpu = Arena(config), make(config)
    for o in ("a", "b"):
        ref.admit(o, {"full": 1})
    gpu.admit_batch(["a", "b"], np.array([[0, 1], [0, 1]], dtype=np.int64))
    bad = [["x"], ("t", [1])]
    names = ["a", bad[0], "zz", bad[1], "b"]
    d = np.zeros((len(names), 2), dtype=np.int64)
    d[:, 1] = 1
    want = [_seq(ref, "extend", o, {"full": 1}) for o in names]
    got = [_norm(x) for x in gpu.extend_batch(names, d)]
    assert got == want, f"extend_batch:\n  reference {want}\n  gpu       {got}"
    assert [g[1] if isinstance(g, tuple) else None for g in got][1:4] == [
        "InvalidArgumentError", "UnknownOwnerError", "InvalidArgumentError"], got
    assert observe_reference(ref) == gpu.observe()
    before = gpu.observe()
    with pytest.raises(InvalidArgumentError, match="hashable"):
        gpu.token_locs("full", ["a", bad[0]], [0, 0], [1, 1])
    assert gpu.observe() == before
    names = [bad[1], "a", bad[0]]
    want = [_seq(ref, "free", o) for o in names]
    got = [_norm(x) for x in gpu.free_batch(names)]
    assert got == want, f"free_batch:\n  reference {want}\n  gpu       {got}"
    assert observe_reference(ref) == gpu.observe()


@pytest.mark.parametrize("model", ["toy-tri", "toy-state"])
def test_fixed_shape_steps_are_the_same_binds(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """graph_width: steps of up to 3 pages per class run the fixed-shape (graph-capturable) ops, larger ones the
    eager launches; both in exact lockstep with the reference (tables read back, rows, recurrent zeroing)."""
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    binds = fallbacks = 0
    for seed in (3, 4, 5):  # together: both kinds of step (which one a seed draws shifts with the rules)
        ls = BatchLockstep(model, seed, graph_width=3)
        ls.run(100)
        g = ls.gpu.graph
        assert g is not None
        binds, fallbacks = binds + g.binds, fallbacks + g.eager_fallbacks
    assert binds and fallbacks, (binds, fallbacks)


@pytest.mark.parametrize("model", ["toy-tri", "toy-swa"])
def test_page_tables_follow_the_holdings(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """page_width=3: every owner's row of every class is its first 3 held pages (device = host mirror), the
    physical page table is the reference's slots, and token_locs agrees with and without the tables."""
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    ls = BatchLockstep(model, 5, page_width=3)
    overflowed = 0
    for _ in range(80):
        ls.step()
        ls.compare()
        pt = ls.gpu.ptab
        assert torch.equal(pt.dev.cpu(), torch.from_numpy(pt.host)), "device page tables differ from the host's"
        owners = list(ls.ref.owners)
        if not owners:
            continue
        rows = ls.gpu.owners.lookup(owners)
        for c in ls.order:
            want_v = [list(ls.ref.held(o)[c][:3]) + [-1] * (3 - min(3, len(ls.ref.held(o)[c]))) for o in owners]
            assert pt.host[ls.gpu.cidx[c], rows].tolist() == want_v, f"{c} page tables differ from held()"
            want_s = [[ls.ref.v2p[v][1] if v >= 0 else -1 for v in r] for r in want_v]
            got = ls.gpu.physical_pages(c, torch.from_numpy(rows)).tolist()
            assert got == want_s, f"{c} physical page table differs from the reference's slots"
            overflowed += int((pt.count[ls.gpu.cidx[c], rows] > 3).sum())
            epp = ls.gpu.mem.epp[c]
            if ls.gpu.mem.is_recurrent(c):
                continue
            seq = [min(len(ls.ref.held(o)[c]), 3) * epp for o in owners]  # within the tables: their path
            want_t = [ls.ref.v2p[ls.ref.held(o)[c][q // epp]][1] * epp + q % epp for o, n in zip(owners, seq)
                      for q in range(n)]
            assert ls.gpu.token_locs(c, rows, np.zeros(len(rows), dtype=np.int64), np.array(seq)).tolist() == want_t
    assert overflowed, "no owner ever held more pages than the table's width"


# ---------------------------------------------------------------------------------------------
# The meta device: no host read, no data-dependent shape


def _steps(a: Any, n: int) -> list[Any]:
    owners = [f"r{i}" for i in range(n)]
    out = [a.admit_batch(owners, np.tile([[2, 4]], (n, 1)))]
    for _ in range(3):
        out.append(a.extend_batch(owners, np.tile([[1, 1]], (n, 1))))
    out.append(a.free_batch([*owners[::3], "ghost"]))
    out.append(a.extend_batch(owners[1::3], [{"full": 2}] * len(owners[1::3])))  # reuses the holes just freed
    rows = a.owners.lookup(owners[1::3])
    for _ in range(6):  # the lean path: from holes until they run out, then frontier runs
        out.append(a.extend_batch(rows, np.tile(np.array([[0, 1]], dtype=np.int64), (len(rows), 1))))
    live = owners[1::3]
    locs = a.token_locs("full", live, np.full(len(live), 4 * 5), np.full(len(live), 4 * 5 + 1))  # decode
    out.append(tuple(locs.shape))
    vt = torch.empty(100, dtype=torch.int64, device=a.device)
    buf = torch.empty(256, dtype=torch.int64, device=a.device)
    out.append(tuple(a.translate_tokens("full", vt, out=buf, out_width=128).shape))
    return out


def test_hot_path_runs_on_the_meta_device() -> None:
    config = ArenaConfig(preset("toy-swa"), 1 << 20, page_size=4, max_context_len=16)  # window low, full high
    meta, cpu = make(config, device="meta", page_width=8), make(config, device="cpu", page_width=8)
    assert meta.mem.raw.is_meta and meta.tables.v2p.is_meta and meta.tables.p2v.is_meta
    got_meta, got_cpu = _steps(meta, 96), _steps(cpu, 96)
    for m, c in zip(got_meta, got_cpu):
        assert m == c if isinstance(m, tuple) else [_norm(x) for x in m] == [_norm(x) for x in c]
    batches = [x for x in got_meta if isinstance(x, BatchResult)]
    assert len(batches) == 11 and all(not x.errors and not x.plans for x in batches), "every call: rung 1, batched"
    for c in meta.order:
        assert np.array_equal(meta.bands[c].live.arr, cpu.bands[c].live.arr)
        assert list(meta.bands[c].holes) == list(cpu.bands[c].holes)
    assert np.array_equal(meta.vslot, cpu.vslot) and np.array_equal(meta.vcls, cpu.vcls)
    with pytest.raises((RuntimeError, NotImplementedError)):
        meta.tables.v2p.cpu()  # the proof means something: a read of a meta tensor fails


def test_decode_frontier_run_on_the_meta_device() -> None:
    """The decode step whose fresh ids and frontier slots are both runs (one strided copy into both tables, one
    memset) on the meta device, low end and high end: the host state is the CPU twin's, whose tables read back
    equal the host mirrors."""
    config = ArenaConfig(preset("toy-swa"), 1 << 20, page_size=4, max_context_len=16)
    arenas = make(config, device="meta"), make(config, device="cpu")
    for a in arenas:
        rows = a.admit_batch([f"d{i}" for i in range(40)], np.zeros((40, 2), dtype=np.int64)).rows
        for c in (1, 0, 1):
            d = np.zeros((40, 2), dtype=np.int64)
            d[:, c] = 1
            res = a.extend_batch(rows, d)
            assert not res.errors and not res.plans
            assert np.array_equal(res.vids, np.arange(res.vids[0], res.vids[0] + 40)), "fresh ids: a run"
    meta, cpu = arenas
    for c in meta.order:
        assert np.array_equal(meta.bands[c].live.arr, cpu.bands[c].live.arr)
    assert np.array_equal(meta.vslot, cpu.vslot) and np.array_equal(meta.vcls, cpu.vcls)
    v2p = cpu.tables.v2p.cpu().numpy()
    for vid in range(120):
        assert v2p[cpu.vcls[vid], vid] == cpu.vslot[vid], f"vid {vid}: the device v->p is not the host's"


# ---------------------------------------------------------------------------------------------
# Events, padding lanes, staging


class FakeEvent:
    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_event_released_user_is_released_only_after_its_event() -> None:
    config = _config("toy-swa", 3000, 2)
    ref, gpu = Arena(config), make(config)
    for a in (ref, gpu):
        a.admit("a", {"window": 2, "full": 2})
        a.admit("b", {"window": 1, "full": 1})
    vids = [v for vs in ref.held("a").values() for v in vs]
    ev = FakeEvent()
    ref.acquire("fwd", UserKind.FORWARD_READ, vids)
    gpu.acquire("fwd", UserKind.FORWARD_READ, vids, event=ev)
    assert ref.free("a") == gpu.free("a")
    for _ in range(3):  # not completed: the pages stay withheld, call after call
        assert _seq(ref, "compact", None) == _norm(gpu.compact())
        assert observe_reference(ref) == gpu.observe() and any(gpu.observe().withheld.values())
    ev.done = True
    ref.release("fwd")  # the reference's user is released by hand where the gpu polls it
    assert _seq(ref, "compact", None) == _norm(gpu.compact())
    assert observe_reference(ref) == gpu.observe() and not any(gpu.observe().withheld.values())
    assert "fwd" not in gpu.users and gpu.stats["released_by_event"] == 1


def test_padding_lanes_point_past_every_page() -> None:
    config = _config("toy-tri", 3000, 4)
    gpu = make(config)
    gpu.admit_batch(["a", "b"], np.array([[1, 1, 2], [0, 1, 1]]))
    for c in gpu.order:
        pad, eb = gpu.pad_entry(c), gpu.mem.layouts[c].entry_bytes
        assert pad * eb >= config.capacity and (pad + 1) * eb <= gpu.mem.raw.numel(), "pad entry outside the arena"
        vt = torch.tensor([v * gpu.mem.epp[c] for v in gpu.held("a")[c]], dtype=torch.int64)
        out = torch.full((16,), 7, dtype=torch.int64)
        got = gpu.translate_tokens(c, vt, out=out, out_width=8)
        assert got.tolist()[len(vt):] == [pad] * (8 - len(vt)) and out[8:].tolist() == [7] * 8


def test_staging_never_rewrites_a_buffer_in_flight() -> None:
    staging.check()
