"""The engine's shortest paths are the ones taken, and the batched results keep their documented forms.

gpu/batch.py places a batch two ways that give the same pages: vectorized (the decode step's lean path, rung 1
over a batch prefix) or lane by lane through the ladder. The lockstep tests prove the two equal, so a path
that declines more often than it must passes them; the decode benches (bench/decode_vs_sglang.py) rest on
the short paths being taken. Here, every result is still the reference's sequential one, and:

* the engine's decode step (int handles, an int64 array, one end band growing, every page from rung 1) runs
  on the lean path (``stats["lean_steps"]``) and launches one zeroing per source of pages (holes, frontier);
* a batch rung 1 can place, up to a gap filled exactly and with holes covering part of it, is placed
  vectorized: no lane carries a ladder plan (``BatchResult.plans`` holds the ladder's lanes only);
* a refused lane's row is -1, the caller's demand array is never written, ``FreeResult.cuts`` has one more
  entry than the owners freed;
* ``token_locs`` gives the same entries from the page tables and, past their width, from the owner log, and
  refuses lens that are not ints (§Batched operations, Token level).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

from typing import Any

import numpy as np
import pytest

import kvarena.gpu.kernels as kernels
from kvarena.gpu.kernels import use_interpreter
from kvarena.reference.arena import Arena
from kvarena.spec.errors import AdmissionRejectedError, DuplicateOwnerError, InvalidArgumentError
from tests.fast.test_errors import assert_actionable
from tests.fast.test_gpu_batch_mutation_kills import (
    I64,
    _call,
    _config,
    _extends,
    _flat_ok,
    _norm,
    _pair,
    _same,
    _two_windows,
)

use_interpreter()


@pytest.fixture(autouse=True)
def _torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)


def _step(ref: Arena, gpu: Any, names: list[str], demand: Any, lean: bool, zeros: int | None = None) -> None:
    """One extend_batch in the engine's form, the sequential extends exactly; ``lean``: whether the lean path
    must take it; ``zeros``: the zeroing launches it must make."""
    steps, launches = gpu.stats["lean_steps"], gpu.stats["zero_launches"]
    _extends(ref, gpu, names, np.array(demand, dtype=I64))
    assert gpu.stats["lean_steps"] - steps == int(lean), f"lean path {'not ' if lean else ''}taken for {demand}"
    if zeros is not None:
        assert gpu.stats["zero_launches"] - launches == zeros


def _admitted(config: Any, names: list[str], demand: dict[str, int]) -> tuple[Arena, Any]:
    ref, gpu = _pair(config)
    for a in (ref, gpu):
        for o in names:
            a.admit(o, demand)
    return ref, gpu


# =============================================================================================
# The decode step's lean path


def test_the_decode_step_of_either_end_band_is_lean() -> None:
    """One page per lane (the decode step at page size 1), a mix of 0, 1 and 2 pages per lane (at larger page
    sizes most lanes need none), on the high end band and on the low one; a step that grows both ends is not
    one band's and takes the general path."""
    names = [f"r{i}" for i in range(6)]
    ref, gpu = _admitted(_config("toy-swa", 1 << 16), names, {"window": 1, "full": 1})
    _step(ref, gpu, names, [[0, 1]] * 6, lean=True, zeros=1)
    _step(ref, gpu, names, [[1, 0]] * 6, lean=True, zeros=1)
    _step(ref, gpu, names, [[0, 1], [0, 0], [0, 2], [0, 0], [0, 1], [0, 0]], lean=True, zeros=1)
    _step(ref, gpu, names, [[2, 0], [0, 0], [1, 0], [0, 0], [0, 0], [1, 0]], lean=True, zeros=1)
    _step(ref, gpu, names, [[0, 1], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0]], lean=True, zeros=1)  # one page
    _step(ref, gpu, names, [[0, 0]] * 6, lean=False)  # nothing to place: no step at all
    _step(ref, gpu, names, [[1, 1]] * 6, lean=False)


def test_the_decode_step_beside_a_float_is_lean() -> None:
    """toy-tri with the window float holding pages: the full band's room is the gap above the float."""
    names = [f"r{i}" for i in range(4)]
    ref, gpu = _admitted(_config("toy-tri", 1 << 16, recurrent_slots=4), names,
                         {"state": 1, "window": 1, "full": 1})
    assert not ref.bands["window"].empty
    _step(ref, gpu, names, [[0, 0, 1]] * 4, lean=True, zeros=1)
    _step(ref, gpu, names, [[0, 0, 2], [0, 0, 0], [0, 0, 1], [0, 0, 0]], lean=True, zeros=1)
    _step(ref, gpu, names, [[0, 1, 0]] * 4, lean=False)  # the float grows: the ladder's


def test_a_decode_step_from_holes_and_frontier_zeroes_each_once() -> None:
    """Freed owners leave holes in the full band: a step they cover zeroes by one index fill; a step past them
    by that fill and one memset of the frontier run."""
    names = [f"r{i}" for i in range(8)]
    ref, gpu = _admitted(_config("toy-swa", 1 << 16), names, {"full": 1})
    for a in (ref, gpu):
        for o in ("r1", "r3", "r5"):
            a.free(o)
    live = [o for o in names if o not in ("r1", "r3", "r5")]
    assert len(ref.bands["full"].holes) == 3
    _step(ref, gpu, live, [[0, 1], [0, 1], [0, 0], [0, 0], [0, 0]], lean=True, zeros=1)
    _step(ref, gpu, live, [[0, 1]] * 5, lean=True, zeros=2)
    _step(ref, gpu, live, [[0, 1]] * 5, lean=True, zeros=1)


def test_a_decode_step_that_takes_the_whole_class_is_lean() -> None:
    """As many lanes as the full class has slots, one page each, on an empty arena: the step takes every slot
    of the gap, exactly what the class's grid holds; one lane more is not the lean path's."""
    config = _config("toy-swa", 2048)
    ref, gpu = _pair(config)
    full = ref.bands["full"]
    top = full.top
    assert top == config.capacity // full.page_bytes
    names = [f"r{i}" for i in range(top + 1)]
    for a in (ref, gpu):
        for o in names:
            a.admit(o, {})
    _step(ref, gpu, names[:top], [[0, 1]] * top, lean=True, zeros=1)
    assert ref.bands["full"].lo == 0
    ref, gpu = _admitted(config, names, {})
    _step(ref, gpu, names, [[0, 1]] * (top + 1), lean=False)


# =============================================================================================
# Rung 1 over a batch: vectorized, up to an exactly filled gap


def _exact_fill(gap: int, low_bytes: int, high_bytes: int) -> tuple[int, int]:
    """``(gl, gh)`` pages, both some, with ``gl * low_bytes + gh * high_bytes == gap``, most high pages first."""
    for gh in range(gap // high_bytes - 1, 0, -1):
        rest = gap - gh * high_bytes
        if rest % low_bytes == 0:
            return rest // low_bytes, gh
    raise AssertionError(f"no exact fill of {gap} bytes")


def _lanes(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _admit_batch(ref: Arena, gpu: Any, names: list[str], demands: list[dict[str, int]]) -> Any:
    want = [_norm(_call(ref, "admit", o, d)) for o, d in zip(names, demands)]
    res = gpu.admit_batch(names, demands)
    assert [_norm(x) for x in res] == want
    _flat_ok(res, gpu.order)
    _same(ref, gpu)
    return res


def test_a_batch_that_fills_the_shared_gap_exactly_is_vectorized() -> None:
    ref, gpu = _pair(_config("toy-swa", 1 << 14))
    low, high = ref.bands["window"], ref.bands["full"]
    gl, gh = _exact_fill(high.lo_byte - low.hi_byte, low.page_bytes, high.page_bytes)
    assert gl and gh
    demands = [{"window": a, "full": b} for a, b in zip(_lanes(gl, 3), _lanes(gh, 3))] + [{}]
    res = _admit_batch(ref, gpu, ["a", "b", "c", "d"], demands)
    assert not res.errors and not res.plans, "a batch rung 1 places was sent to the ladder"
    assert ref.bands["full"].lo_byte == ref.bands["window"].hi_byte


def test_a_batch_that_fills_a_gap_beside_a_float_exactly_is_vectorized() -> None:
    """long | short (float) | full: the low band's room ends at the float, the high band's begins above it."""
    ref, gpu = _admitted(_config(_two_windows(), 1 << 14), ["s0", "s1"], {"short": 1, "full": 1})
    long, short, full = ref.bands["long"], ref.bands["short"], ref.bands["full"]
    room_low = (short.lo_byte - long.hi_byte) // long.page_bytes
    room_high = (full.lo_byte - short.hi_byte) // full.page_bytes
    assert room_low and room_high
    demands = [{"long": a, "full": b} for a, b in zip(_lanes(room_low, 2), _lanes(room_high, 2))]
    res = _admit_batch(ref, gpu, ["a", "b"], demands)
    assert not res.errors and not res.plans, "a batch rung 1 places was sent to the ladder"


@pytest.mark.parametrize("cls", ["window", "full"])
def test_holes_cover_what_the_gap_cannot(cls: str) -> None:
    """The arena full of ``cls`` pages, three freed: lanes the holes cover are placed vectorized (with no gap
    left), the first lane past them goes to the ladder alone (refused), the lanes after it resume."""
    ref, gpu = _pair(_config("toy-swa", 1 << 12))
    band, other = ref.bands[cls], ref.bands["full" if cls == "window" else "window"]
    names = []
    while ref.bands["full"].lo_byte - ref.bands["window"].hi_byte >= band.page_bytes:
        names.append(f"f{len(names)}")
        for a in (ref, gpu):
            a.admit(names[-1], {cls: 1})
    for a in (ref, gpu):
        for o in names[1:7:2]:
            a.free(o)
    assert len(band.holes) == 3 and ref.bands["full"].lo_byte - ref.bands["window"].hi_byte < other.page_bytes
    res = _admit_batch(ref, gpu, ["a", "b"], [{cls: 2}, {cls: 1}])
    assert not res.errors and not res.plans
    for a in (ref, gpu):
        for o in names[-4::2]:
            a.free(o)
    res = _admit_batch(ref, gpu, ["c", "d", "e"], [{cls: 1}, {cls: 2}, {}])
    assert not res.plans and set(res.errors) == {1} and type(res[1]) is AdmissionRejectedError


# =============================================================================================
# Result forms


def test_a_refused_lane_row_is_minus_one() -> None:
    """Refused before its name is taken (a duplicate) or by the ladder after (too big): -1 either way."""
    ref, gpu = _admitted(_config("toy-swa", 4096), ["a"], {"full": 1})
    top = ref.bands["full"].top
    res = _admit_batch(ref, gpu, ["b", "a", "huge", "c"], [{"full": 1}, {"full": 1}, {"full": top}, {}])
    assert type(res[1]) is DuplicateOwnerError and type(res[2]) is AdmissionRejectedError
    assert res.rows is not None and res.rows.dtype == I64
    assert res.rows.tolist() == [gpu.owners.lookup(["b"])[0], -1, -1, gpu.owners.lookup(["c"])[0]]


def test_the_callers_demand_array_is_never_written() -> None:
    """A refused lane's demand is zeroed inside the call, on a copy: the engine reuses its arrays."""
    _, gpu = _admitted(_config("toy-swa", 4096), ["a", "b"], {"full": 1})
    for call in (lambda d: gpu.admit_batch(["c", "e"], d), lambda d: gpu.extend_batch(["a", "b"], d),
                 lambda d: gpu.extend_batch(gpu.owners.lookup(["a", "b"]), d)):
        d = np.array([[0, 1], [-1, 2]], dtype=I64)
        res = call(d)
        assert type(res[1]) is InvalidArgumentError and not isinstance(res[0], Exception)
        assert d.tolist() == [[0, 1], [-1, 2]]


def test_free_result_cuts_have_one_entry_more_than_owners_freed() -> None:
    ref, gpu = _admitted(_config("toy-swa", 4096), ["a", "b", "c"], {"full": 1, "window": 1})
    res = gpu.free_batch(["a", "ghost", "c"])
    for o in ("a", "c"):
        ref.free(o)
    assert res.cuts.tolist() == [0, 2, 4] and res.slot_of == {0: 0, 2: 1}
    res = gpu.free_batch(["ghost", "a"])
    assert res.cuts.tolist() == [0] and res.slot_of == {} and res.freed.dtype == I64 and len(res.freed) == 0
    _same(ref, gpu)


# =============================================================================================
# token_locs


def test_token_locs_past_the_page_tables_width_reads_the_owner_log() -> None:
    """An owner holding more pages than the tables' width: the entries are the ones the log gives, on a
    second arena with no tables."""
    config = _config("toy-swa", 1 << 14)
    wide, narrow = _pair(config)[1], _pair(config, page_width=2)[1]
    for a in (wide, narrow):
        a.admit_batch(["a", "b"], np.array([[0, 5], [0, 1]], dtype=I64))
    assert narrow.ptab.overflowed("full", narrow.owners.lookup(["a"]))
    epp = wide.mem.epp["full"]
    for owners, pre, seq in ((["a", "b"], [0, 0], [5 * epp, epp]), (["b"], [1], [epp]), (["a"], [3 * epp], [5 * epp]),
                             (["a"], [0], [epp]), (["a", "b"], [1, 0], [2 * epp, 1])):
        want = wide.token_locs("full", owners, pre, seq).tolist()
        assert narrow.token_locs("full", owners, pre, seq).tolist() == want


@pytest.mark.parametrize("pre,seq", [([0.5], [3]), ([0], [3.0]), ([True], [3]), (["0"], [3]), ([0], [None])])
def test_token_locs_refuses_lens_that_are_not_ints(pre: list[Any], seq: list[Any]) -> None:
    """The refusal names the argument that is wrong, its dtype and the fix; nothing changes."""
    which, bad = ("pre_lens", pre) if not isinstance(pre[0], int) or isinstance(pre[0], bool) else ("seq_lens", seq)
    for width in (None, 4):
        _, gpu = _pair(_config("toy-swa", 4096), page_width=width)
        gpu.admit("a", {"full": 2})
        before = gpu.observe()
        with pytest.raises(InvalidArgumentError) as e:
            gpu.token_locs("full", ["a"], pre, seq)
        assert_actionable(e.value)
        assert str(e.value) == (f"token_locs: {which} must be ints (token counts), got {np.asarray(bad).dtype}; "
                                "pass one int per owner")
        assert gpu.observe() == before
    assert gpu.token_locs("full", ["a"], np.array([1], dtype=np.int32), [3]).tolist() == \
        gpu.token_locs("full", ["a"], [1], [3]).tolist()
