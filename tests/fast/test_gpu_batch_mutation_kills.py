"""gpu/batch.py's batched calls at the corners the lockstep tests rarely reach (docs/mutation.md, gpu/batch.py).

spec/arena.md §Batched operations defines ``admit_batch`` / ``extend_batch`` / ``free_batch`` as the single calls
in batch order: result k is what the sequential call k returned, or the error it raised (its class and, where
the batch raises it on the lane's behalf, the single call's message); the flat arrays of a result are those
pages in (request, class in chain order, page) order, integer ids and slots (§The validator's rules,
PLAN-SHAPE: slots are ints). Every scenario here is checked against the reference's sequential calls and the
observation after it, on the plain-torch path:

* empty batches; a demand array that is not an int array of the right shape; a lane over the arena's bytes, a
  lane of exactly the class's whole grid beside a malformed lane;
* owners sharing pages freed in one batch (which owner's free frees a shared page);
* the sequential fallbacks (a name twice, an owner with state demand twice) with a placement limit, and their
  flat arrays when no lane gets a page;
* the state-slot cap per lane after another lane's refusal; a refused lane's handle names no owner;
* the decode step's lean path (int handles, an int64 array) growing the low band, a float, both ends, more lanes
  than the class has slots, an empty float between the ends, and a non-recurrent low band beside a float;
* ``token_locs``' refusals (owner, shapes, lens, too few pages: the owner named), an empty call, ``out=``.
"""

from __future__ import annotations

import contextlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

from typing import Any

import numpy as np
import pytest
import torch

import kvarena.gpu.kernels as kernels
from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.gpu.allocator import make
from kvarena.gpu.kernels import use_interpreter
from kvarena.gpu.results import BatchResult, FreeResult
from kvarena.reference.arena import Arena
from kvarena.spec.errors import (
    AdmissionRejectedError,
    ArenaError,
    CapacityTooSmallError,
    DuplicateOwnerError,
    InvalidArgumentError,
    UnknownOwnerError,
)
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, ModelSpec, StateClass, mha_rows, preset
from tests.fast.test_errors import assert_actionable

use_interpreter()

I64 = np.int64


@pytest.fixture(autouse=True)
def _torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)


def _config(model: str | ModelSpec, cap: int, ps: int = 4, **kw: Any) -> ArenaConfig:
    m = preset(model) if isinstance(model, str) else model
    while True:
        config = ArenaConfig(m, cap, page_size=ps, max_context_len=16, **kw)
        try:
            Arena(config)
            return config
        except CapacityTooSmallError:
            cap += 256


def _pair(config: ArenaConfig, **kw: Any) -> tuple[Arena, Any]:
    return Arena(config), make(config, **kw)


def _call(a: Any, method: str, *args: Any, **kw: Any) -> Any:
    try:
        return getattr(a, method)(*args, **kw)
    except ArenaError as e:
        return e


def _norm(x: Any) -> tuple:
    if isinstance(x, ArenaError):
        return ("error", type(x).__name__, getattr(x, "shortfall", None))
    if hasattr(x, "pages"):
        return ("ok", dict(x.pages), x.plan)
    return ("ok", list(x))


def _flat_ok(res: BatchResult, order: list[str]) -> None:
    """The flat arrays are the lanes' pages and placements in (request, class, page) order: int64, and every
    placement an int (PLAN-SHAPE)."""
    vids: list[int] = []
    slots: list[int] = []
    for k in range(len(res)):
        x = res[k]
        if isinstance(x, ArenaError):
            continue
        for c in order:
            vids += x.pages.get(c, ())
            got = x.plan.placements.get(c, ())
            assert all(type(s) is int for s in got), f"lane {k}: placements {got} are not ints (PLAN-SHAPE)"
            slots += got
    assert isinstance(res.vids, np.ndarray) and res.vids.dtype == I64 and res.vids.tolist() == vids
    assert isinstance(res.slots, np.ndarray) and res.slots.dtype == I64 and res.slots.tolist() == slots


def _same(ref: Arena, gpu: Any) -> None:
    assert observe_reference(ref) == gpu.observe()
    for o in ref.owners:
        assert ref.held(o) == gpu.held(o), o


def _extends(ref: Arena, gpu: Any, names: list[str], demand: np.ndarray) -> BatchResult:
    """extend_batch with the engine's int handles and int64 array against the reference's sequential extends."""
    want = [_norm(_call(ref, "extend", o, dict(zip(ref.order, r)))) for o, r in zip(names, demand.tolist())]
    handles = gpu.owners.lookup(names)
    res = gpu.extend_batch(handles, np.ascontiguousarray(demand, dtype=I64))
    assert [_norm(x) for x in res] == want
    assert res.rows is not None and res.rows.tolist() == handles.tolist()  # the handles, for the next call
    _flat_ok(res, gpu.order)
    _same(ref, gpu)
    return res


# =============================================================================================
# Empty batches, malformed demand arrays


def test_an_empty_batch_is_no_call() -> None:
    ref, gpu = _pair(_config("toy-swa", 4096))
    before = observe_reference(ref)
    for res in (gpu.admit_batch([], np.zeros((0, 2), dtype=I64)), gpu.extend_batch([], np.zeros((0, 2), dtype=I64)),
                gpu.extend_batch(np.zeros(0, dtype=I64), np.zeros((0, 2), dtype=I64)), gpu.admit_batch([], [])):
        assert len(res) == 0 and list(res) == []
        _flat_ok(res, gpu.order)
        assert res.rows is not None and res.rows.dtype == I64 and len(res.rows) == 0
    freed = gpu.free_batch([])
    assert len(freed) == 0 and freed.freed.dtype == I64 and len(freed.freed) == 0
    assert gpu.observe() == before


def test_token_locs_of_no_owner_is_empty() -> None:
    for width in (None, 4):
        _, gpu = _pair(_config("toy-swa", 4096), page_width=width)
        gpu.admit_batch(["a"], np.array([[1, 2]], dtype=I64))
        got = gpu.token_locs("full", [], np.zeros(0, dtype=I64), np.zeros(0, dtype=I64))
        assert got.dtype == torch.int64 and got.tolist() == []


@pytest.mark.parametrize("bad", [np.zeros((2, 2), dtype=np.float64), np.zeros((2, 3), dtype=I64),
                                 np.zeros((3, 2), dtype=I64), torch.zeros((2, 2), dtype=torch.float32)])
def test_a_demand_array_that_is_not_int_of_the_batch_shape_is_refused(bad: Any) -> None:
    """§Batched operations: ``demands`` is an integer array of shape (owners, classes); anything else is refused
    as a whole (InvalidArgument, a message naming the form), nothing changed."""
    _, gpu = _pair(_config("toy-swa", 4096))
    gpu.admit_batch(["a", "b"], np.array([[1, 1], [1, 1]], dtype=I64))
    before = gpu.observe()
    for call in (lambda: gpu.admit_batch(["c", "d"], bad), lambda: gpu.extend_batch(["a", "b"], bad),
                 lambda: gpu.extend_batch(gpu.owners.lookup(["a", "b"]), bad)):
        with pytest.raises(InvalidArgumentError) as e:
            call()
        assert_actionable(e.value)
        assert gpu.observe() == before
    with pytest.raises(InvalidArgumentError) as e:
        gpu.extend_batch(["a", "b"], [{"full": 1}])  # one demand for two owners
    assert_actionable(e.value)
    assert gpu.observe() == before


def test_lanes_over_the_arena_and_of_the_whole_grid() -> None:
    """A lane whose bytes exceed the arena (every class within its grid) is refused alone, with the single call's
    message; a lane of exactly the full class's whole grid (exactly the arena's bytes) beside a malformed lane is
    placed as the sequential call places it."""
    config = _config("toy-swa", 4096)
    ref, gpu = _pair(config)
    top = {c: b.top for c, b in ref.bands.items()}
    assert top["full"] * ref.bands["full"].page_bytes == config.capacity  # the full grid is the whole arena
    for owners in (["x", "y"], ["y", "x"]):
        demand = np.array([[top["window"], top["full"]], [0, 1]], dtype=I64)
        if owners[0] == "y":
            demand = demand[::-1].copy()
        want = [_call(ref, "admit", o, dict(zip(ref.order, r))) for o, r in zip(owners, demand.tolist())]
        res = gpu.admit_batch(owners, demand)
        assert [_norm(x) for x in res] == [_norm(x) for x in want]
        over = owners.index("x")
        single = _call(gpu, "admit", "z", dict(zip(ref.order, demand[over].tolist())))
        assert type(res[over]) is InvalidArgumentError and str(res[over]) == str(single)
        assert_actionable(res[over])
        _flat_ok(res, gpu.order)
        _same(ref, gpu)
        for o in ("y",):
            ref.free(o)
            gpu.free(o)
    ref, gpu = _pair(config)
    demand = np.array([[-1, 0], [0, top["full"]]], dtype=I64)
    want = [_call(ref, "admit", o, dict(zip(ref.order, r))) for o, r in zip(["bad", "all"], demand.tolist())]
    res = gpu.admit_batch(["bad", "all"], demand)
    assert [_norm(x) for x in res] == [_norm(x) for x in want]
    assert str(res[0]) == str(_call(gpu, "admit", "z", {"window": -1}))
    _flat_ok(res, gpu.order)
    _same(ref, gpu)


# =============================================================================================
# free_batch: shared pages, unknown owners


def test_free_batch_frees_a_shared_page_with_its_last_owner() -> None:
    """§Batched operations: ``free_batch`` is ``free`` per owner in order; a page two owners of the batch hold is
    freed by the second (many pages: the order among equal ids must hold past a small sort's stability)."""
    config = _config("toy-swa", 1 << 16)
    for order in (["a", "cache", "b", "c2"], ["cache", "b", "a", "c2"], ["c2", "a", "cache", "b"]):
        ref, gpu = _pair(config)
        for a in (ref, gpu):
            pa = a.admit("a", {"window": 3, "full": 24}).pages
            pb = a.admit("b", {"full": 5}).pages
            a.share("cache", list(pa["window"]) + list(pa["full"]) + list(pb["full"][:3]))
            a.share("c2", list(pa["full"][::2]))
        want = [_call(ref, "free", o) for o in order]
        res = gpu.free_batch(order)
        assert [list(x) for x in res] == want, order
        assert res.freed.dtype == I64 and res.freed.tolist() == [v for x in want for v in x]
        _same(ref, gpu)


def test_free_batch_of_unknown_owners_only() -> None:
    ref, gpu = _pair(_config("toy-swa", 4096))
    for a in (ref, gpu):
        a.admit("a", {"full": 1})
    res = gpu.free_batch(["ghost", "nobody"])
    assert isinstance(res, FreeResult) and res.freed.dtype == I64 and res.freed.tolist() == []
    for k, o in enumerate(["ghost", "nobody"]):
        assert type(res[k]) is UnknownOwnerError and repr(o) in str(res[k])
        assert_actionable(res[k])
    _same(ref, gpu)


# =============================================================================================
# The sequential fallbacks


def test_a_name_twice_keeps_the_placement_limit() -> None:
    """admit_batch with a name twice runs the admits one by one (the second is a duplicate); the placement limit
    still orders rung 1's holes (§Placement limit: nearest the limit on its anchor side first)."""
    ref, gpu = _pair(_config("toy-swa", 4096))
    for a in (ref, gpu):
        for o in "pqrst":
            a.admit(o, {"window": 1, "full": 1})
        a.free("p")
        a.free("r")
    below = {"window": 3 * ref.bands["window"].page_bytes}  # limit slot 3: hole 2 before hole 0
    demand = [{"window": 1, "full": 1}, {"window": 1}]
    want = [_call(ref, "admit", "x", demand[0], below=below), _call(ref, "admit", "x", demand[1], below=below)]
    res = gpu.admit_batch(["x", "x"], demand, below=below)
    assert [_norm(x) for x in res] == [_norm(x) for x in want]
    assert res[0].plan.placements["window"] == (2,)
    assert type(res[1]) is DuplicateOwnerError and str(res[1]) == str(_call(gpu, "admit", "x", {}))
    _flat_ok(res, gpu.order)
    _same(ref, gpu)


def test_sequential_fallbacks_with_no_page_placed() -> None:
    """Every lane refused on the sequential paths (a name twice; an owner with state demand twice): the flat
    arrays are empty int arrays, the rows the owners' handles (-1 for none), the errors the single calls'."""
    ref, gpu = _pair(_config("toy-state", 4096, recurrent_slots=1))
    for a in (ref, gpu):
        a.admit("s", {"state": 1, "full": 1})
    res = gpu.admit_batch(["s", "s"], np.array([[0, 1], [0, 2]], dtype=I64))
    assert all(type(x) is DuplicateOwnerError for x in res)
    _flat_ok(res, gpu.order)
    names = ["s", "s", "ghost"]
    want = [_norm(_call(ref, "extend", o, {"state": 1})) for o in names]
    res = gpu.extend_batch(names, [{"state": 1}] * 3)
    assert [_norm(x) for x in res] == want
    assert str(res[0]) == str(_call(gpu, "extend", "s", {"state": 1}))
    assert_actionable(res[2]) and "'ghost'" in str(res[2])
    _flat_ok(res, gpu.order)
    assert res.rows is not None and res.rows.tolist() == gpu.owners.lookup(names).tolist()
    # the state cap passes once: the sequential path places, and its flat arrays and rows say so
    for a in (ref, gpu):
        a.admit("t", {"full": 1})
    names = ["t", "t", "s"]
    demand = [{"state": 1, "full": 2}, {"state": 1}, {"full": 1}]
    want = [_norm(_call(ref, "extend", o, d)) for o, d in zip(names, demand)]
    res = gpu.extend_batch(names, demand)
    assert [_norm(x) for x in res] == want
    _flat_ok(res, gpu.order)
    assert res.rows.tolist() == gpu.owners.lookup(names).tolist()
    _same(ref, gpu)


def test_state_cap_is_checked_on_every_lane() -> None:
    """The per-owner state cap (§admit, §extend: held + new state pages <= recurrent_slots) refuses each lane over
    it, also after a lane refused for another reason; the message is the single call's."""
    ref, gpu = _pair(_config("toy-state", 8192, recurrent_slots=2))
    for a in (ref, gpu):
        a.admit("s", {"state": 1})
        a.admit("u", {"full": 1})
    names = ["ghost", "s", "u"]
    demand = np.array([[1, 0], [2, 0], [3, 1]], dtype=I64)
    want = [_norm(_call(ref, "extend", o, dict(zip(ref.order, r)))) for o, r in zip(names, demand.tolist())]
    res = gpu.extend_batch(names, demand)
    assert [_norm(x) for x in res] == want
    for k in (1, 2):
        single = _call(gpu, "extend", names[k], dict(zip(gpu.order, demand[k].tolist())))
        assert type(res[k]) is InvalidArgumentError and str(res[k]) == str(single)
    names = ["s", "n1", "n2"]
    demand = np.array([[0, 1], [3, 0], [1, 1]], dtype=I64)
    want = [_norm(_call(ref, "admit", o, dict(zip(ref.order, r)))) for o, r in zip(names, demand.tolist())]
    res = gpu.admit_batch(names, demand)
    assert [_norm(x) for x in res] == want
    assert str(res[0]) == str(_call(gpu, "admit", "s", {}))
    assert str(res[1]) == str(_call(gpu, "admit", "n1", {"state": 3}))
    _flat_ok(res, gpu.order)
    _same(ref, gpu)


def test_a_refused_lane_handle_names_no_owner() -> None:
    """admit_batch's rows are handles for later calls (§Batched operations: a handle of an owner that is not
    admitted names no owner): the lane the ladder refused gets UnknownOwner when its handle is used."""
    ref, gpu = _pair(_config("toy-swa", 4096))
    top = ref.bands["full"].top
    names = ["a", "b", "huge"]
    demand = np.array([[1, 2], [0, 1], [0, top - 2]], dtype=I64)
    want = [_norm(_call(ref, "admit", o, dict(zip(ref.order, r)))) for o, r in zip(names, demand.tolist())]
    res = gpu.admit_batch(names, demand)
    assert [_norm(x) for x in res] == want and type(res[2]) is AdmissionRejectedError
    _same(ref, gpu)
    again = gpu.extend_batch(res.rows, np.array([[0, 1]] * 3, dtype=I64))
    want = [_norm(_call(ref, "extend", o, {"full": 1})) for o in names]
    assert [_norm(x) for x in again] == want and type(again[2]) is UnknownOwnerError
    assert again.rows is not None and again.rows.tolist() == gpu.owners.lookup(names).tolist()
    _same(ref, gpu)


def test_unknown_owners_in_a_batch() -> None:
    ref, gpu = _pair(_config("toy-swa", 4096))
    for a in (ref, gpu):
        a.admit("a", {"full": 1})
    for owners in (["a", "ghost"], np.array([gpu.owners.lookup(["a"])[0], 9], dtype=I64)):
        res = gpu.extend_batch(owners, np.array([[0, 1], [0, 1]], dtype=I64))
        _call(ref, "extend", "a", {"full": 1})
        assert type(res[1]) is UnknownOwnerError
        assert_actionable(res[1])
        assert res.rows.tolist() == gpu.owners.lookup(owners).tolist()
        _same(ref, gpu)


# =============================================================================================
# The decode step's lean path


def test_lean_path_low_band_float_and_mixed_demands() -> None:
    """Int handles and an int64 array (the engine's decode step): demands of the low band only, of the float
    only (which grows up here: more room above it, §Rung 1), of both ends, several pages per lane; each the
    sequential extends exactly."""
    ref, gpu = _pair(_config("toy-swa", 1 << 16))
    names = [f"r{i}" for i in range(4)]
    for a in (ref, gpu):
        for o in names:
            a.admit(o, {"window": 1, "full": 1})
    _extends(ref, gpu, names, np.array([[2, 0]] * 4))
    _extends(ref, gpu, names, np.array([[1, 0], [2, 0], [0, 0], [1, 0]]))
    _extends(ref, gpu, names, np.array([[1, 1]] * 4))
    _extends(ref, gpu, names, np.array([[1, 2], [0, 1], [2, 0], [1, 1]]))
    ref, gpu = _pair(_config("toy-tri", 1 << 16, recurrent_slots=4))
    for a in (ref, gpu):
        for o in names:
            a.admit(o, {"state": 1, "window": 1, "full": 1})
    w = ref.bands["window"]
    assert ref.bands["full"].lo_byte - w.hi_byte >= w.lo_byte - ref.bands["state"].hi_byte  # it grows up
    _extends(ref, gpu, names, np.array([[0, 1, 0]] * 4))
    _extends(ref, gpu, names, np.array([[0, 2, 0]] * 4))
    _extends(ref, gpu, names, np.array([[0, 0, 2]] * 4))
    for bad in (np.ones((4, 4), dtype=I64), np.array([[0, 0, 1, 0]] * 4, dtype=I64), np.ones((4, 2), dtype=I64)):
        with pytest.raises(InvalidArgumentError):  # not the batch's shape: refused, also on the lean path's types
            gpu.extend_batch(gpu.owners.lookup(names), bad)
    _same(ref, gpu)


def test_lean_path_more_lanes_than_the_class_has_slots() -> None:
    """One page per lane for more lanes than the class's grid has slots: the sequential extends, the later ones
    refused."""
    config = _config("toy-swa", 2048)
    ref, gpu = _pair(config)
    top = ref.bands["full"].top
    names = [f"r{i}" for i in range(top + 3)]
    for a in (ref, gpu):
        for o in names:
            a.admit(o, {})
    d = np.zeros((len(names), 2), dtype=I64)
    d[:, 1] = 1
    res = _extends(ref, gpu, names, d)
    assert any(isinstance(x, AdmissionRejectedError) for x in res)


def test_lean_path_decode_sizes_past_the_pattern_cache() -> None:
    """One page per lane at many batch sizes in turn (each its own demand pattern, each twice), and a caller
    writing into a result's arrays where they are writable: later steps, on slots freed and taken again, are
    still the sequential extends."""
    ref, gpu = _pair(_config("toy-swa", 1 << 16))
    names = [f"r{i}" for i in range(20)]
    for a in (ref, gpu):
        for o in names:
            a.admit(o, {})
    for col in (1, 0):
        for n in range(1, 20):
            for _ in range(2):
                d = np.zeros((n, 2), dtype=I64)
                d[:, col] = 1
                res = _extends(ref, gpu, names[:n], d)
                for arr in (res.counts, res.slots, res.vids):
                    with contextlib.suppress(ValueError):  # read-only: a cached pattern or a cached run's slice
                        arr[...] = 0
            if n % 5 == 0:  # free and admit again: the frontier retracts, its slots are handed out again
                for a in (ref, gpu):
                    for o in names:
                        a.free(o)
                        a.admit(o, {})
                _same(ref, gpu)


def _fill_low(ref: Arena, gpu: Any, cls: str, leave: int) -> list[str]:
    """Owners of one ``cls`` page each until the gap below the high band holds ``leave`` high pages or fewer."""
    names = []
    high = ref.bands[ref.order[-1]]
    while (high.lo_byte - ref.bands[ref.order[0]].hi_byte) // high.page_bytes > leave:
        o = f"f{len(names)}"
        for a in (ref, gpu):
            a.admit(o, {cls: 1})
        names.append(o)
    return names


def test_lean_path_with_an_empty_float_between_the_ends() -> None:
    """toy-tri with the window float empty: the gap between the state band and the full band is what the full
    band may grow into; a decode step needing more is the ladder's (compaction or refusal), as sequentially."""
    ref, gpu = _pair(_config("toy-tri", 4096, recurrent_slots=1))
    fill = _fill_low(ref, gpu, "state", 2)
    assert ref.bands["window"].empty
    names = fill[:6]
    d = np.zeros((len(names), 3), dtype=I64)
    d[:, 2] = 1
    _extends(ref, gpu, names, d)
    _extends(ref, gpu, names, d)


def _two_windows() -> ModelSpec:
    full = StateClass("full", Kind.FULL, mha_rows([2], kv_heads=1, head_dim=8))
    long = StateClass("long", Kind.WINDOW, mha_rows([0], kv_heads=1, head_dim=8), window=16)
    short = StateClass("short", Kind.WINDOW, mha_rows([1], kv_heads=2, head_dim=8), window=8)
    return ModelSpec("two-windows", (full, short, long), max_context_len=32)


def test_lean_path_grows_a_non_recurrent_low_band_below_a_float() -> None:
    """long-window | short-window | full: the low band is not recurrent, so the decode step may grow it; its room
    is the gap up to the float (non-empty), not the gap below the high band."""
    ref, gpu = _pair(_config(_two_windows(), 1 << 14))
    assert ref.order == ["long", "short", "full"]
    names = [f"r{i}" for i in range(6)]
    for a in (ref, gpu):
        for o in names:
            a.admit(o, {"short": 1, "full": 1})
    short, full, long = ref.bands["short"], ref.bands["full"], ref.bands["long"]
    assert not short.empty and full.lo_byte - short.hi_byte > 2 * (short.lo_byte - long.hi_byte)  # more room above
    for k in (1, 2, 3):
        d = np.zeros((len(names), 3), dtype=I64)
        d[:, 0] = k
        _extends(ref, gpu, names, d)


# =============================================================================================
# token_locs


def test_token_locs_refusals_name_the_owner() -> None:
    """Each refusal is InvalidArgument or UnknownOwner (§Errors), its message naming the owner it is about and the
    fix; nothing changed."""
    for width in (None, 8):
        _, gpu = _pair(_config("toy-swa", 4096), page_width=width)
        gpu.admit_batch(["a", "b", "c"], np.array([[1, 1], [1, 2], [1, 0]], dtype=I64))
        epp = gpu.mem.epp["full"]
        before = gpu.observe()

        def refused(exc: type, *args: Any, names: str | None = None, gpu: Any = gpu, before: Any = before,
                    **kw: Any) -> None:
            with pytest.raises(exc) as e:
                gpu.token_locs(*args, **kw)
            msg = str(e.value)
            assert type(e.value) is exc and msg.startswith("token_locs: "), msg  # says which call refused
            if names is not None:
                assert repr(names) in msg, msg
            assert gpu.observe() == before

        with pytest.raises(InvalidArgumentError) as e:
            gpu.token_locs("nope", ["a"], [0], [1])
        assert_actionable(e.value) and "'nope'" in str(e.value)
        # (the UnknownOwner message names no fix, against §Errors: reported in docs/mutation.md, not pinned here)
        refused(UnknownOwnerError, "full", ["a", "ghost"], [0, 0], [1, 1], names="ghost")
        refused(UnknownOwnerError, "full", np.array([1, 99], dtype=I64), [0, 0], [1, 1], names="99")
        refused(InvalidArgumentError, "full", ["a", "a"], [0, 0], [1, 1])
        refused(InvalidArgumentError, "full", ["a", "b"], [0, -1], [1, 1])
        refused(InvalidArgumentError, "full", ["a", "b"], [0, 0], [1])
        refused(InvalidArgumentError, "full", ["a", "b"], [0], [1, 1])
        refused(InvalidArgumentError, "full", ["a", "b"], [0, 2], [1, 1])
        # too few pages: b holds 2 full pages, a 1, c none; the owner named is the one short
        refused(InvalidArgumentError, "full", ["a", "b"], [0, 0], [epp, 2 * epp + 1], names="b")
        refused(InvalidArgumentError, "full", ["a", "b"], [0, 0], [epp + 1, 2 * epp], names="a")
        refused(InvalidArgumentError, "full", ["a", "b", "c"], [0, 0, 0], [epp, epp, 1], names="c")
        refused(InvalidArgumentError, "full", ["b", "a"], [0, epp], [epp, epp + 1], names="a")


def test_token_locs_writes_into_out() -> None:
    _, gpu = _pair(_config("toy-swa", 4096))
    gpu.admit_batch(["a", "b"], np.array([[1, 1], [1, 2]], dtype=I64))
    epp = gpu.mem.epp["full"]
    want = gpu.token_locs("full", ["a", "b"], [0, 1], [epp, 2 * epp])
    assert want.dtype == torch.int64
    out = torch.full((64,), -7, dtype=torch.int64)
    got = gpu.token_locs("full", ["a", "b"], [0, 1], [epp, 2 * epp], out=out)
    assert got.tolist() == want.tolist() and out[:len(want)].tolist() == want.tolist()
    assert got.data_ptr() == out.data_ptr() and out[len(want):].tolist() == [-7] * (64 - len(want))
