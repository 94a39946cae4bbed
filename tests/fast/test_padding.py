"""Padding lanes and foreign ids (spec/arena.md §Padding lanes): where they go, and that no padding write reaches a
page, proved (proofs/padding.py), replayed in the reference and written for real into gpu/'s bytes."""

from __future__ import annotations

import math

import pytest

from kvarena.conformance.vectors.replay import VECTOR_DIR, load, replay
from kvarena.proofs import padding as PD
from kvarena.reference.arena import Arena
from kvarena.spec.errors import InvalidArgumentError, InvariantViolation
from kvarena.spec.models import ArenaConfig, preset

GRAPH = VECTOR_DIR / "integration-cuda-graph.jsonl"
WIDTH = 8  # the fixed width of the simulated graph step


def _config(model: str = "toy-tri", capacity: int = 3328, page_size: int = 2) -> ArenaConfig:
    return ArenaConfig(preset(model), capacity, page_size=page_size, max_context_len=16)


# ---------------------------------------------------------------------------------------------
# The contract in the reference


@pytest.mark.parametrize(("model", "capacity", "page_size"), [("toy-tri", 3328, 2), ("toy-tri", 3424, 2),
                                                              ("toy-dsa", 4000, 2), ("gpt-oss-20b-eagle3", 1 << 20, 2)])
def test_pad_entry_is_the_first_entry_past_the_arena(model: str, capacity: int, page_size: int) -> None:
    a = Arena(_config(model, capacity, page_size))
    for c in a.order:
        e = a.layouts[c].entry_bytes
        pad = a.pad_entry(c)
        assert pad == math.ceil(capacity / e) and pad * e >= capacity > (pad - 1) * e
        assert (pad + 1) * e <= capacity + 2 * max(x.entry_bytes for x in a.layouts.values())
        for d in a.order:  # no slot of any grid reaches the padding entry's first byte
            assert a.page_offset(d, a.bands[d].top - 1) + a.bands[d].page_bytes <= pad * e


def test_translate_tokens_sends_every_lane_without_a_token_to_the_padding_entry() -> None:
    a = Arena(_config())
    got = a.admit("r", {"state": 1, "window": 1, "full": 2})
    full, state = got.pages["full"], got.pages["state"][0]
    epp = a.config.page_size
    owned = [full[0] * epp + 1, full[1] * epp]
    want = [a.translate_token("full", t) for t in owned]
    pad = a.pad_entry("full")
    foreign = [-1, -epp, 10_000 * epp, state * epp, got.pages["window"][0] * epp]  # unbound, negative, other classes
    assert a.translate_tokens("full", owned) == want
    assert a.translate_tokens("full", owned + foreign, out_width=WIDTH) == want + [pad] * (WIDTH - 2)
    assert a.translate_tokens("full", [], out_width=3) == [pad] * 3
    assert a.translate_tokens("state", [state]) == [a.translate_token("state", state)]
    a.free("r")
    assert a.translate_tokens("full", owned) == [pad, pad], "a freed page's tokens are foreign"


@pytest.mark.parametrize(("args", "words"), [((["x"],), "must be ints"), (([True],), "must be ints"),
                                             (([1, 2], 1), "out_width"), (([], -1), "out_width"),
                                             (([], 2.0), "out_width")])
def test_translate_tokens_refuses_bad_arguments_and_changes_nothing(args: tuple, words: str) -> None:
    a = Arena(_config())
    a.admit("r", {"full": 1})
    before = a.snapshot()
    with pytest.raises(InvalidArgumentError, match=words):
        a.translate_tokens("full", *args)
    with pytest.raises(InvalidArgumentError, match="unknown class"):
        a.translate_tokens("nope", [0])
    assert a.snapshot() == before


# ---------------------------------------------------------------------------------------------
# The proof, its mutant, and the reference replay


def test_padding_obligations_are_proved_and_the_mutant_refuted() -> None:
    ths = {th.name: th for th in PD.run(10_000)}
    assert ths["PAD-OUTSIDE-PAGES"].status == "proven"
    assert ths["PAD-IN-ALLOCATION"].status == "proven"
    mutant = ths["PAD-IN-LAST-BAND"]
    assert mutant.status == "counterexample (expected)" and "INV-NO-OVERLAP" in mutant.detail, mutant.status


def test_check_padding_fails_on_the_mutant_only() -> None:
    a = Arena(ArenaConfig(preset("toy-tri"), 2048, page_size=4, max_context_len=8))
    v = a.admit("r", {"full": 1}).pages["full"][0]
    assert a.translate(v) == ("full", a.bands["full"].top - 1)  # the high band's anchor page, at the top
    PD.check_padding(a)
    with pytest.raises(InvariantViolation) as e:
        PD.check_padding(a, lambda ar, c: ar.pad_entry(c) - 1)
    assert e.value.inv == "INV-NO-OVERLAP"


class PaddedReference(Arena):
    """The reference with the padding predicate checked after every operation that changes placement."""

    def _after(self, result):
        PD.check_padding(self)
        return result

    def admit(self, *a, **k):
        return self._after(super().admit(*a, **k))

    def extend(self, *a, **k):
        return self._after(super().extend(*a, **k))

    def compact(self, *a, **k):
        return self._after(super().compact(*a, **k))

    def relayout(self, *a, **k):
        return self._after(super().relayout(*a, **k))

    def release(self, *a, **k):
        return self._after(super().release(*a, **k))


def test_graph_vector_replays_with_the_padding_predicate_in_the_reference() -> None:
    r = replay(load(GRAPH), PaddedReference, "exact")
    assert r.status == "passed", r.message


# ---------------------------------------------------------------------------------------------
# gpu/: padding lanes written for real


torch = pytest.importorskip("torch")


def _padded_gpu(mutant: bool = False, foreign: bool = False, sentinel: bool = False):
    from kvarena.gpu.allocator import GpuArena

    class PaddedGpu(GpuArena):
        """gpu/ with a fixed-width graph step after every operation: for every class, ``translate_tokens`` of
        (optionally) foreign ids plus ``WIDTH`` lanes, and garbage written through every lane that is not an owned
        token, at ``lane * entry_bytes`` (a pointer-based store kernel, which writes every lane). ``mutant`` moves
        the padding entry to the last entry inside the arena; ``sentinel`` translates with ``-1`` in its place."""

        def pad_entry(self, cls: str) -> int:
            return super().pad_entry(cls) - (1 if mutant else 0)

        def _graph_step(self) -> None:
            for cls in self.order:
                e = self.mem.layouts[cls].entry_bytes
                ids = []
                if foreign:  # negative, past the id space, and tokens of live pages of the other classes
                    others = [v for v, (c2, _s) in self.observe().v2p.items() if c2 != cls][:2]
                    ids = [-1, -5, 1 << 40] + [v * self.mem.epp[cls] for v in others]
                lanes = torch.full((WIDTH,), -7, dtype=torch.int64)
                pad = -1 if sentinel else self.pad_entry(cls)
                from kvarena.gpu.kernels.translate import translate_tokens

                translate_tokens(torch.tensor(ids, dtype=torch.int64), self.tables.row(cls), self.mem.epp[cls],
                                 out=lanes, out_width=WIDTH, pad=pad)
                for lane in lanes.tolist():
                    if lane < 0 or (lane + 1) * e > self.mem.raw.numel():
                        raise InvariantViolation("INV-NO-OVERLAP", f"a {cls!r} lane translates to entry {lane}, "
                                                 "outside the implementation's buffer: a store through it writes "
                                                 "bytes no entry of the arena owns")
                    self.mem.raw[lane * e:(lane + 1) * e] = 0xA5

        def _op(self, name: str, *a, **k):
            out = getattr(super(), name)(*a, **k)
            self._graph_step()
            return out

        def admit(self, *a, **k):
            return self._op("admit", *a, **k)

        def extend(self, *a, **k):
            return self._op("extend", *a, **k)

        def compact(self, *a, **k):
            return self._op("compact", *a, **k)

        def release(self, *a, **k):
            return self._op("release", *a, **k)

        def write(self, *a, **k):
            return self._op("write", *a, **k)

    return PaddedGpu


def test_graph_vector_replays_on_gpu_with_padding_writes() -> None:
    r = replay(load(GRAPH), _padded_gpu(), "exact")
    assert r.status == "passed", r.message


def test_padding_writes_at_the_mutant_entry_corrupt_a_live_page_on_gpu() -> None:
    r = replay(load(GRAPH), _padded_gpu(mutant=True), "exact")
    assert r.status == "failed", r.status
    assert "INV-PAGE-ATOMIC" in r.message or "INV-CONTENT-FOLLOWS-VID" in r.message, r.message


def test_foreign_ids_go_to_the_padding_entry_on_gpu() -> None:
    r = replay(load(GRAPH), _padded_gpu(foreign=True), "exact")
    assert r.status == "passed", r.message


def test_a_sentinel_in_place_of_the_padding_entry_is_caught() -> None:
    r = replay(load(GRAPH), _padded_gpu(foreign=True, sentinel=True), "exact")
    assert r.status == "failed" and "INV-NO-OVERLAP" in r.message, r.message


def test_gpu_translate_tokens_agrees_with_the_reference_on_every_kind_of_lane() -> None:
    from kvarena.gpu.allocator import make

    config = _config()
    ref, gpu = Arena(config), make(config)
    for a in (ref, gpu):
        a.admit("a", {"state": 1, "window": 2, "full": 3})
        a.admit("b", {"state": 1, "window": 1, "full": 1})
        a.free("a")
        a.admit("c", {"state": 1, "full": 2})
    assert ref.v2p == {v: gpu.translate(v) for v in ref.v2p}
    epp = config.page_size
    freed = max(ref.v2p) + 1  # never bound
    for cls in ref.order:
        n = 1 if cls == "state" else epp
        ids = [v * n + i for v in sorted(ref.v2p) for i in range(n)] + [-1, -n, freed * n, 1 << 40]
        want = ref.translate_tokens(cls, ids, out_width=len(ids) + 3)
        got = gpu.translate_tokens(cls, torch.tensor(ids, dtype=torch.int64), out_width=len(ids) + 3)
        assert got.tolist() == want, cls
        assert gpu.pad_entry(cls) == ref.pad_entry(cls)


def test_a_torch_store_through_padded_lanes_lands_past_the_arena() -> None:
    """An engine's store kernel written with torch indexing (``view[lanes] = x``) over a fixed-width step: the
    padded lanes index the row views (no IndexError) and change no byte below capacity, so every page keeps
    what it held; only the padding bytes past capacity change."""
    from kvarena.gpu.allocator import make

    config = _config()
    gpu = make(config)
    adm = gpu.admit("a", {"state": 1, "window": 2, "full": 3})
    for pages in adm.pages.values():
        for v in pages:
            gpu.write(v, 0, 0, v + 11)
    before = gpu.mem.raw.clone()
    for cls in gpu.order:
        lanes = gpu.translate_tokens(cls, torch.tensor([], dtype=torch.int64), out_width=WIDTH)
        assert set(lanes.tolist()) == {gpu.pad_entry(cls)}
        for view in gpu.views(cls).values():
            view[lanes] = torch.ones(view.shape[1:], dtype=view.dtype)
    cap = config.capacity
    assert torch.equal(gpu.mem.raw[:cap], before[:cap])
    assert not torch.equal(gpu.mem.raw[cap:], before[cap:])  # the stores happened, in the padding bytes
    assert all(gpu.read(v, 0, 0) == v + 11 for pages in adm.pages.values() for v in pages)
