"""reference/arena.py where its other tests look past it (docs/mutation.md, reference/arena.py).

* The words of a refusal (§Errors: every refusal names the call and the fix): ``translate``, ``write`` / ``read``,
  ``translate_tokens``, ``release``, a policy that crashes, the ladder's rejection, a capacity too small (the
  bytes it names are the worst-case request's, plus one page of slack).
* ``stats``: what each admission adds (requests, pages, the rung, pages and bytes moved per rung), unchanged by
  a refusal; a free under a free-time hook that is not the ladder's keeps the counters and the holes.
* The ladder's knobs: ``max_rung=COMPACT`` still compacts and never relays (the full flush too); a relayout
  budget binds the full flush too, and a budget of exactly the bytes a relayout moves allows it; the full flush
  relays to its own span, not the default's.
* ``flush_idle``: a read source stays withheld, a writer's page is a barrier.
"""

from __future__ import annotations

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.policy import Ladder
from kvarena.spec.errors import (
    AdmissionRejectedError,
    CapacityTooSmallError,
    InvalidArgumentError,
    PlanError,
    UnknownPageError,
)
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Plan, Rung, UserKind
from tests.fast.test_ladder_sized import _state_with_far_holes, toy
from tests.fast.test_query_refusals import refusal as _refusal

PS = 4


def _arena() -> tuple[Arena, dict[str, tuple[int, ...]]]:
    a = Arena(ArenaConfig(preset("toy-tri"), capacity=8192, page_size=PS, max_context_len=16))
    return a, a.admit("r", {"state": 1, "window": 2, "full": 2}).pages


# =============================================================================================
# The words of a refusal


def test_translate_names_itself_and_the_fix() -> None:
    a, _ = _arena()
    assert _refusal(lambda: a.translate("x"), InvalidArgumentError) == (
        "translate: virtual page ids must be ints, got 'x' (str); pass the ids admit/extend returned")
    assert _refusal(lambda: a.translate(999), UnknownPageError) == (
        "translate: virtual page 999 is not bound; translate only pages returned by admit/extend and still owned")


def test_write_and_read_name_themselves() -> None:
    a, pages = _arena()
    for call in (lambda: a.write("x", 0, 0, 1), lambda: a.read("x", 0, 0)):
        assert _refusal(call, InvalidArgumentError).startswith("write/read: virtual page ids must be ints")
    for call in (lambda: a.write(999, 0, 0, 1), lambda: a.read(999, 0, 0)):
        assert _refusal(call, UnknownPageError) == (
            "write/read: virtual page 999 is not bound; pass only pages returned by admit/extend and still owned")
    f = pages["full"][0]
    assert _refusal(lambda: a.write(f, 0, 99, 1), InvalidArgumentError) == (
        f"page {f} (full) got entry 0, row 99; pass an int entry in [0, {PS}) and an int row in [0, 4)")
    assert _refusal(lambda: a.read(f, -1, 0), InvalidArgumentError).startswith(f"page {f} (full) got entry -1, row 0")


def test_translate_tokens_and_release_name_what_is_wrong() -> None:
    a, _ = _arena()
    assert _refusal(lambda: a.translate_tokens("nope", [0]), InvalidArgumentError) == (
        "translate_tokens: unknown class 'nope'; use one of ['state', 'window', 'full']")
    assert _refusal(lambda: a.release([1]), InvalidArgumentError).startswith(  # type: ignore[arg-type]
        "ledger user ids must be hashable: str or int, got list [1]")


def test_a_policy_that_crashes_is_named_in_plan() -> None:
    class Crash(Ladder):
        def plan(self, arena, demand, below=None):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    a = Arena(ArenaConfig(preset("toy-tri"), capacity=8192, page_size=PS, max_context_len=16), policy=Crash())
    msg = _refusal(lambda: a.admit("r", {"full": 1}), PlanError)
    assert "the policy raised RuntimeError: boom in plan()" in msg and "plan() returns a Plan" in msg


def test_the_ladder_rejection_names_the_shortfall_and_the_fix() -> None:
    a, _ = _arena()
    a.admit("big", {"full": a.bands["full"].top - 8})
    msg = _refusal(lambda: a.admit("more", {"full": 8}), AdmissionRejectedError)
    assert msg.startswith("no rung of the ladder fits {'full': 8}: short {'full': ")
    assert msg.endswith("after compaction and relayout; evict cache-only pages (drop) or retract a request, then retry")


def test_a_capacity_too_small_names_the_worst_case_request_plus_a_page() -> None:
    config = ArenaConfig(preset("toy-tri"), capacity=600, page_size=PS, max_context_len=16)
    a = _arena()[0]
    worst = {"full": 4, "window": 3, "state": 1}  # 16 tokens: 4 full pages, a window of 8 on 3 pages, one state
    need = sum(n * a.bands[c].page_bytes for c, n in worst.items())
    most = max(b.page_bytes for b in a.bands.values())
    msg = _refusal(lambda: Arena(config), CapacityTooSmallError)
    assert f"({need} B: {worst})" in msg and f"raise capacity to at least {need + most} B" in msg


# =============================================================================================
# stats


def test_stats_count_each_admission_and_a_refusal_adds_nothing() -> None:
    a, _ = _state_with_far_holes()  # admitted A (8 full) and B (32 state); A dropped 3 full pages
    assert (a.stats.admitted, a.stats.pages_placed) == (2, 40)
    assert a.stats.rung_used == {0: 0, 1: 2, 2: 0, 3: 0}
    a.admit("C", {"state": 1})  # one full page off the frontier: rung 2, one move of 256 B
    assert (a.stats.admitted, a.stats.pages_placed) == (3, 41)
    assert a.stats.rung_used == {0: 0, 1: 2, 2: 1, 3: 0}
    assert a.stats.moves == {1: 0, 2: 1, 3: 0} and a.stats.bytes_moved == {1: 0, 2: 256, 3: 0}
    before = repr(a.stats)
    with pytest.raises(AdmissionRejectedError):
        a.admit("D", {"full": a.bands["full"].top})
    assert repr(a.stats) == before


class _Hook(Ladder):
    """A free-time hook that is not the ladder's and plans nothing: frees go through the checkpoint."""

    name = "hook"

    def after_free(self, arena) -> Plan | None:  # type: ignore[no-untyped-def]
        return None


def test_a_free_under_a_free_time_hook_keeps_the_holes_and_the_counters() -> None:
    a = toy("toy-tri", 4096)
    a.policy = _Hook()
    for o in "abcd":
        a.admit(o, {"full": 2})
    a.free("b")  # holes in the high band
    holes = list(a.bands["full"].holes)
    assert len(holes) == 2
    a.free("c")
    assert set(holes) <= set(a.bands["full"].holes) and len(a.bands["full"].holes) == 4
    check_all(a)
    assert (a.stats.admitted, a.stats.pages_placed) == (4, 8)
    assert a.stats.moves == {1: 0, 2: 0, 3: 0} and a.stats.rung_used == {0: 0, 1: 4, 2: 0, 3: 0}
    a.admit("e", {"full": 3})
    assert a.stats.rung_used[1] == 5


def test_a_free_time_hook_may_be_a_plain_function() -> None:
    a = toy("toy-tri", 4096)
    hook = _Hook()
    hook.after_free = lambda arena: None  # type: ignore[method-assign]  # no __func__: not the ladder's
    a.policy = hook
    a.admit("a", {"full": 2})
    a.free("a")
    check_all(a)


def test_eager_compaction_counts_its_free_time_moves() -> None:
    a, _ = _state_with_far_holes("eager-compaction")
    assert a.stats.moves == {1: 0, 2: 3, 3: 0} and a.stats.bytes_moved == {1: 0, 2: 768, 3: 0}
    assert a.stats.admitted == 2


# =============================================================================================
# The ladder's knobs


def test_max_rung_compact_still_compacts_and_never_relays() -> None:
    a, _ = _state_with_far_holes()
    assert a.ladder({"state": 1}, max_rung=Rung.COMPACT).rung is Rung.COMPACT
    b, _ = _state_with_far_holes("full-compaction")
    assert b.ladder({"state": 1}, max_rung=Rung.COMPACT, full=True).rung is Rung.COMPACT
    with pytest.raises(AdmissionRejectedError):
        a.ladder({"state": 1}, max_rung=Rung.REUSE)
    c = toy("toy-tri", 4096)
    c.admit("w", {"window": 3})
    room = (c.bands["full"].top * 256 - c.bands["window"].hi * 512) // 256
    for full in (False, True):
        assert c.ladder({"full": room + 2}, full=full).rung is Rung.RELAYOUT
        with pytest.raises(AdmissionRejectedError):
            c.ladder({"full": room + 2}, full=full, max_rung=Rung.COMPACT)


def test_full_compaction_relays_to_its_own_span() -> None:
    """The window float holds slots 0 and 4 with holes between; four full pages need two window slots of room.
    Both ladders move the page at slot 4 down to slot 1, but the full flush records its own span (SGLang's:
    nearest the float's position), not the default's fewest-moves span: the two policies stay apart."""
    a = toy("toy-tri", 4096)
    for o, d in (("o0", {"full": 3}), ("o1", {"window": 2}), ("o2", {"full": 1}), ("o3", {"window": 3, "full": 2})):
        a.admit(o, d)
    a.free("o2")
    a.free("o3")
    assert sorted(a.bands["window"].live) == [0, 4] and list(a.bands["window"].holes) == [1, 2, 3]
    flush, default = a.ladder({"full": 4}, full=True), a.ladder({"full": 4})
    assert flush.rung is default.rung is Rung.RELAYOUT and flush.moves == default.moves
    assert flush.spans != default.spans


def test_flush_idle_keeps_a_read_page_withheld_and_stops_at_a_writer() -> None:
    """§flush_idle is the full flush under a budget: a source a reader holds moves but stays withheld; nothing at
    or beyond a page a writer holds moves (its barrier)."""
    a, _ = _state_with_far_holes()  # full band [8, 16): holes 12, 14, 15; live 8, 9, 10, 11, 13
    live = list(a.owners["A"]["full"])
    a.acquire("rd", UserKind.FORWARD_READ, [live[-1]])  # the frontier page, slot 8
    plan = a.flush_idle(1 << 20)
    assert [(m.src, m.dst) for m in plan.moves] == [(8, 15), (9, 14), (10, 12)]
    assert a.bands["full"].withheld == {8} and list(a.bands["full"].holes) == [9, 10]
    check_all(a)
    b, _ = _state_with_far_holes()
    b.acquire("wr", UserKind.FORWARD_WRITE, [list(b.owners["A"]["full"])[-2]])  # slot 9
    plan = b.flush_idle(1 << 20)
    assert [(m.src, m.dst) for m in plan.moves] == [(8, 15)]
    check_all(b)


@pytest.mark.parametrize("full", [False, True])
def test_a_relayout_budget_binds_at_exactly_the_bytes_moved(full: bool) -> None:
    a = toy("toy-tri", 4096)
    a.admit("w", {"window": 3})
    room = (a.bands["full"].top * 256 - a.bands["window"].hi * 512) // 256
    demand = {"full": room + 2}
    plan = a.ladder(demand, full=full)
    assert plan.rung is Rung.RELAYOUT
    need = plan.bytes_moved[3]
    assert a.ladder(demand, full=full, relayout_budget=need).rung is Rung.RELAYOUT
    with pytest.raises(AdmissionRejectedError):
        a.ladder(demand, full=full, relayout_budget=need - 1)
    with pytest.raises(AdmissionRejectedError):  # within budget, but no relayout makes room for this much
        a.ladder({"full": a.bands["full"].top}, full=full, relayout_budget=1 << 30)

