"""transformers 5.23.0's real sector pool as a simulator engine (simulator/transformers_real.py): ``fits`` says what
``admit`` does, a refusal changes nothing, a simulator run completes with its invariants checked throughout, and
``check_invariants`` fails on a corrupted state."""

from __future__ import annotations

import random

import pytest

pytestmark = [pytest.mark.transformers]
pytest.importorskip("transformers")

from kvarena.simulator.arrivals import Arrival  # noqa: E402
from kvarena.simulator.scheduler import SchedulerModel, run  # noqa: E402
from kvarena.simulator.transformers_real import TransformersPool, missing  # noqa: E402
from kvarena.simulator.workloads import Workload  # noqa: E402
from kvarena.spec.errors import AdmissionRejectedError, InvariantViolation  # noqa: E402
from kvarena.spec.models import ArenaConfig, preset  # noqa: E402
from kvarena.spec.types import UserKind  # noqa: E402

GiB = 1 << 30


def _toy() -> TransformersPool:
    return TransformersPool(ArenaConfig(preset("toy-tri"), 1 << 14, page_size=4, max_context_len=16))


def _books(p: TransformersPool) -> tuple:
    return (p.used_bytes(), p.occupancy(), list(p.pool.free_sectors),
            [len(p.pool._free_blocks[i]) for i in p.index.values()], p.adapter._next_vid, dict(p.adapter.owners))


def test_missing_is_none_here() -> None:
    assert missing() is None


def test_fits_agrees_with_admit_and_a_refusal_changes_nothing() -> None:
    p, rng = _toy(), random.Random(0)
    assert p.sector % 128 == 0 and len(set(p.per_sector.values())) > 1  # classes cut sectors differently
    owners: list[str] = []
    seen = {True: 0, False: 0}
    for i in range(400):
        d = {"full": rng.randint(0, 4), "window": rng.randint(0, 3), "state": 1}
        r = rng.randint(0, 3)
        fits = p.fits(d, r)
        assert fits == p.fits({**d, "full": d["full"] + r}, 0)  # the reserve is full-attention pages
        before = _books(p)
        try:
            got = p.admit(f"r{i}", {**d, "full": d["full"] + r}).pages
        except AdmissionRejectedError:
            assert not fits and _books(p) == before
            seen[False] += 1
        else:
            assert fits and {c: len(v) for c, v in got.items()} == {c: n for c, n in d.items() if n} | (
                {"full": d["full"] + r} if d["full"] + r else {})
            owners.append(f"r{i}")
            seen[True] += 1
        p.check_invariants()
        if owners and rng.random() < 0.35:
            p.free(owners.pop(rng.randrange(len(owners))))
            p.check_invariants()
    assert seen[True] > 20 and seen[False] > 20
    for o in owners:
        p.free(o)
    assert p.used_bytes() == 0 and not any(p.occupancy().values())
    p.check_invariants()


def test_a_freed_page_a_forward_holds_is_withheld_until_release() -> None:
    p = _toy()
    full = p.admit("a", {"full": 2, "state": 1}).pages["full"]
    p.acquire("f", UserKind.FORWARD_READ, full[:1])
    p.free("a")
    assert p.used_bytes() > 0 and not any(p.occupancy().values())  # its sector stays cut: one block is withheld
    p.check_invariants()
    p.release("f")
    assert p.used_bytes() == 0
    p.check_invariants()


@pytest.mark.parametrize(("model", "gib", "n", "inp", "out"), [("gpt-oss-20b", 0.5, 40, 900, 300),
                                                              ("qwen3.5-4b", 2.5, 10, 3000, 1500)])
def test_the_simulator_runs_it_to_completion(model: str, gib: float, n: int, inp: int, out: int) -> None:
    """At a budget that binds (requests wait for memory), every request completes, the invariants hold at every
    check and at the end, and every sector is back on the free list."""
    pool = TransformersPool(ArenaConfig(preset(model), int(gib * GiB), 64, max_context_len=inp + out))
    w = Workload("t", model, "", arrivals=tuple(Arrival(0.0, inp, out) for _ in range(n)))
    r = run(pool, w.source(), "t", SchedulerModel(state_slots=1, check_every=10))
    assert r.completed == n and r.invariant_checks > 10
    assert r.max_active < n and r.peak_utilization > 0.8  # memory bound the run
    assert r.prefix_cache == "" and r.moves == {2: 0, 3: 0}
    assert pool.used_bytes() == 0 and pool.pool.num_free_sectors == pool.pool.num_sectors


def test_check_invariants_can_fail() -> None:
    """Each corruption is one the check must see: a page under two owners, one block behind two pages, a sector
    lost from the free list."""
    def corrupted(mutate, match: str) -> None:
        p = _toy()
        a = p.admit("a", {"full": 2, "state": 1}).pages
        p.admit("b", {"full": 1, "window": 1, "state": 1})
        p.check_invariants()
        mutate(p, a)
        with pytest.raises(InvariantViolation, match=match):
            p.check_invariants()

    corrupted(lambda p, a: p.adapter.owners["b"]["full"].update({a["full"][0]: None}), "VMAP.*twice: \\[\\d")
    corrupted(lambda p, a: p.adapter.v2p.update({a["full"][1]: p.adapter.v2p[a["full"][0]]}), "VMAP.*two pages")
    corrupted(lambda p, a: p.pool.free_sectors.pop(), "BYTE-CONSERVATION.*free sectors")
