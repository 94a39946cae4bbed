"""Recurrent state (spec/arena.md §INV-STATE-PRIVATE): one owner's, never shared, copied by ``copy_state``, at most
``ArenaConfig.recurrent_slots`` per owner; and the §1 argument checks that go with it (ids are ints, an acquire
holds something, a relayout that moves nothing returns a bare NONE plan). Every refusal leaves the state
bit-identical (pickle compare)."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.spec.errors import (
    AdmissionRejectedError,
    ArenaError,
    ConfigError,
    InvalidArgumentError,
    UnknownPageError,
)
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Rung, UserKind


def make(model: str = "toy-tri", capacity: int = 4096, slots: int = 1) -> Arena:
    return Arena(ArenaConfig(preset(model), capacity, page_size=4, max_context_len=16, recurrent_slots=slots))


def refused(a: Arena, err: type[ArenaError], fn: Callable[[], object], *words: str) -> ArenaError:
    before = pickle.dumps(a)
    with pytest.raises(err) as got:
        fn()
    assert pickle.dumps(a) == before, f"{err.__name__} changed the state"
    for w in words:
        assert w in got.value.message, got.value.message
    check_all(a)
    return got.value


def busy(slots: int = 1) -> tuple[Arena, int, list[int]]:
    """A request holding one written state page and two full pages."""
    a = make(slots=slots)
    got = a.admit("r", {"state": 1, "full": 2}).pages
    s = got["state"][0]
    a.write(s, 0, 0, 11)
    a.write(s, 0, 1, 12)
    return a, s, list(got["full"])


# -- the configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_recurrent_slots_must_be_an_int_of_at_least_one(bad: object) -> None:
    with pytest.raises(ConfigError, match="recurrent_slots"):
        make(slots=bad)  # type: ignore[arg-type]


def test_default_is_one_state_per_owner() -> None:
    assert ArenaConfig(preset("toy-tri"), 4096).recurrent_slots == 1
    a = make()
    refused(a, InvalidArgumentError, lambda: a.admit("r", {"state": 2}), "recurrent_slots=1", "extra_buffer")
    a.admit("r", {"state": 1, "full": 1})
    refused(a, InvalidArgumentError, lambda: a.extend("r", {"state": 1}), "would hold 2")
    a.extend("r", {"full": 1, "state": 0})  # token pages are not capped


def test_extra_buffer_mode_holds_three() -> None:
    a = make(slots=3)
    a.admit("r", {"state": 1})
    a.extend("r", {"state": 2})
    refused(a, InvalidArgumentError, lambda: a.extend("r", {"state": 1}), "would hold 4", "recurrent_slots=3")
    s = a.held("r")["state"][0]
    refused(a, InvalidArgumentError, lambda: a.copy_state("r", s), "would hold 4")
    a.drop("r", [s])
    assert a.copy_state("r", a.held("r")["state"][0]) in a.held("r")["state"]


# -- never shared ----------------------------------------------------------------------------------


def test_share_of_a_recurrent_page_is_refused() -> None:
    a, s, full = busy()
    refused(a, InvalidArgumentError, lambda: a.share("cache", [s]), "recurrent state", "copy_state")
    refused(a, InvalidArgumentError, lambda: a.share("cache", [full[0], s]), "copy_state")
    refused(a, InvalidArgumentError, lambda: a.admit("r2", {"full": 1}, shared=[s]), "copy_state")
    a.share("cache", full)  # token pages still are
    assert a.refs[full[0]] == 2 and a.refs[s] == 1


# -- copy_state ------------------------------------------------------------------------------------


def test_copy_state_gives_a_new_owner_a_copy_of_every_row() -> None:
    a, s, _ = busy()
    v = a.copy_state("cache/node-1", s)
    assert v != s and a.translate(v)[0] == "state" and a.translate(v) != a.translate(s)
    assert a.held("cache/node-1") == {"state": (v,), "window": (), "full": ()}
    assert a.refs[v] == 1 and a.refs[s] == 1
    assert [a.read(v, 0, r) for r in range(2)] == [11, 12]
    a.write(v, 0, 0, 99)  # the copy is its own page: the source keeps its rows
    assert a.read(s, 0, 0) == 11 and a.read(v, 0, 0) == 99
    a.free("r")
    assert a.read(v, 0, 1) == 12
    check_all(a)


def test_copy_state_into_a_request_with_a_free_slot() -> None:
    a, s, _ = busy()
    a.admit("hit", {"full": 1})  # a prefix-cache hit: token pages shared or new, the state copied in
    v = a.copy_state("hit", s)
    assert a.held("hit")["state"] == (v,) and a.read(v, 0, 0) == 11
    check_all(a)


def test_copy_state_of_an_unwritten_state_reads_zero() -> None:
    a = make()
    s = a.admit("r", {"state": 1}).pages["state"][0]
    v = a.copy_state("c", s)
    assert a.read(v, 0, 0) == 0 and a.read(v, 0, 1) == 0


def test_copy_state_refusals() -> None:
    a, s, full = busy()
    refused(a, InvalidArgumentError, lambda: a.copy_state("c", full[0]), "not recurrent", "share")
    refused(a, UnknownPageError, lambda: a.copy_state("c", 999))
    refused(a, InvalidArgumentError, lambda: a.copy_state("c", True), "must be ints")
    refused(a, InvalidArgumentError, lambda: a.copy_state("c", float(s)), "must be ints")
    refused(a, InvalidArgumentError, lambda: a.copy_state("r", s), "would hold 2")
    assert "c" not in a.owners


def packed() -> tuple[Arena, int]:
    """toy-state with every usable byte taken: full pages down from the top, then one-state owners up from 0."""
    a = make("toy-state", capacity=2432)
    s = a.admit("r", {"state": 1}).pages["state"][0]
    a.write(s, 0, 1, 7)
    for cls, prefix in (("full", "f"), ("state", "s")):
        n = 0
        while True:
            try:
                a.admit(f"{prefix}{n}", {cls: 1})
            except AdmissionRejectedError:
                break
            n += 1
    assert a.gap_bytes() == 0 and not a.bands["state"].holes and not a.bands["full"].holes
    return a, s


def test_copy_state_that_does_not_fit_is_rejected_and_creates_no_owner() -> None:
    a, s = packed()
    e = refused(a, AdmissionRejectedError, lambda: a.copy_state("cache/node", s), "evict")
    assert e.shortfall == {"state": 1}
    assert "cache/node" not in a.owners


def test_copy_state_uses_the_ladder() -> None:
    """No state slot is free and the gap is closed; a hole at the top of the full band: the copy compacts the
    full band (rung 2) like any extend, and the copy holds the source's rows."""
    a, s = packed()
    a.free("f0")  # the first full page: the slot at the top
    plan = a.plan_admission({"state": 1})
    assert plan.rung is Rung.COMPACT and plan.moves, plan
    v = a.copy_state("cache/node", s)
    assert a.read(v, 0, 1) == 7 and a.read(s, 0, 1) == 7
    assert a.stats.rung_used[2] == 1
    check_all(a)


# -- virtual ids are ints, everywhere --------------------------------------------------------------


def _ops(a: Arena, bad: object) -> dict[str, Callable[[], object]]:
    return {
        "admit-shared": lambda: a.admit("n", {"full": 1}, shared=[bad]),  # type: ignore[list-item]
        "share": lambda: a.share("cache", [bad]),  # type: ignore[list-item]
        "drop": lambda: a.drop("r", [bad]),  # type: ignore[list-item]
        "acquire": lambda: a.acquire("u", UserKind.FORWARD_READ, [bad]),  # type: ignore[list-item]
        "write": lambda: a.write(bad, 0, 0, 1),  # type: ignore[arg-type]
        "read": lambda: a.read(bad, 0, 0),  # type: ignore[arg-type]
        "translate": lambda: a.translate(bad),  # type: ignore[arg-type]
        "copy_state": lambda: a.copy_state("c", bad),  # type: ignore[arg-type]
    }


@pytest.mark.parametrize("op", list(_ops(make(), 0)))
@pytest.mark.parametrize("bad", [True, False, 1.0, 0.0])
def test_a_bool_or_float_is_never_a_virtual_id(op: str, bad: object) -> None:
    """``True == 1`` and ``1.0 == 1`` hash alike: before, ``drop("r", [True])`` freed page 1."""
    a, s, full = busy()
    assert s == 0 and full == [1, 2]  # every bad id equals a bound id
    refused(a, InvalidArgumentError, _ops(a, bad)[op], "must be ints")


def test_acquire_of_no_pages_is_refused() -> None:
    a, _, _ = busy()
    refused(a, InvalidArgumentError, lambda: a.acquire("u", UserKind.FORWARD_READ, []), "no pages")
    assert "u" not in a.users


def test_relayout_that_moves_nothing_returns_a_bare_none_plan() -> None:
    a = make()
    a.admit("w", {"window": 2, "full": 1})
    snap = a.snapshot()
    plan = a.relayout({})
    assert plan.rung is Rung.NONE and not plan.spans and not plan.moves
    assert a.snapshot() == snap


# -- INV-STATE-PRIVATE: its predicate can fail on its own ------------------------------------------


def test_state_private_detects() -> None:
    """A recurrent page held by two owners, and an owner over its slots: each caught by the predicate alone."""
    from kvarena.reference.invariants import INVARIANTS, check_state_private
    from kvarena.spec.errors import InvariantViolation

    assert INVARIANTS["INV-STATE-PRIVATE"] is check_state_private
    a, s, _ = busy()
    check_state_private(a)
    a.owners["cache"] = {c: {} for c in a.order}  # a share that skipped the refusal
    a.owners["cache"]["state"][s] = None
    a.refs[s] += 1
    with pytest.raises(InvariantViolation, match="held by more than one owner") as e:
        check_state_private(a)
    assert e.value.inv == "INV-STATE-PRIVATE"
    b = make()
    b.admit("r", {"state": 1})
    (v,) = b.admit("q", {"state": 1}).pages["state"]
    del b.owners["q"]  # an extend that skipped the cap: r holds both
    b.owners["r"]["state"][v] = None
    with pytest.raises(InvariantViolation, match="more than recurrent_slots=1"):
        check_state_private(b)


# -- the vector and the coverage counts -------------------------------------------------------------


def test_the_recurrent_vector_covers_copy_state_and_its_refusals() -> None:
    from kvarena.conformance.vectors import replay as vectors
    from kvarena.conformance.vectors.replay import VECTOR_DIR

    r = vectors.replay(VECTOR_DIR / "recurrent-copy-state.jsonl", Arena, "exact")
    assert r.status == "passed", r.message
    cov = r.coverage
    assert cov.ops["copy_state"] >= 5 and cov.exposure["INV-STATE-PRIVATE"] > 0
    assert {"InvalidArgument", "UnknownPage", "AdmissionRejected"} <= set(cov.refusals)
    head = vectors.load(VECTOR_DIR / "recurrent-copy-state.jsonl").header
    assert set(head["covers"]["errors"]["copy_state"]) == {"AdmissionRejected", "InvalidArgument", "UnknownPage"}
    assert "InvalidArgument" in head["covers"]["errors"]["share"]
    assert "InvalidArgument" in head["covers"]["errors"]["acquire"]


def test_an_implementation_without_copy_state_stops_the_vector_with_the_reason() -> None:
    """copy_state is optional in the adapter protocol: a trace that copies state stops there (allowed)."""
    from kvarena.conformance.vectors import replay as vectors
    from kvarena.conformance.vectors.replay import VECTOR_DIR

    class NoCopy(Arena):
        copy_state = None  # type: ignore[assignment]

    r = vectors.replay(VECTOR_DIR / "recurrent-copy-state.jsonl", NoCopy, "safety", deep=False)
    assert r.status == "stopped" and "has no copy_state" in r.message, r.message
