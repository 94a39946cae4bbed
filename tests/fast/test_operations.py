"""One or more tests per public operation of the reference Arena and the SplitPools baseline.

Every scenario is built through the public API only and ends with ``check_all``.  Toy
geometry used throughout (page_size 4, capacity 4096 B):

* ``toy-tri``: state (low, 64 B pages, 64 slots) | window (float, 512 B pages, 8 slots, hint
  slot 4 = byte 2048) | full (high, 256 B pages, 16 slots);
* ``toy-state``: state (low, 64 B) | full (high, 256 B);
* ``toy-swa``: window (low, 512 B) | full (high, 256 B).
"""

from __future__ import annotations

import random

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Role
from kvarena.reference.invariants import check_all
from kvarena.reference.policy import POLICIES
from kvarena.reference.split import SplitPools
from kvarena.spec.errors import AdmissionRejectedError, ArenaError, UnknownOwnerError, UnknownPageError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.pools import split_regions
from kvarena.spec.types import Move, Rung, UserKind

CAP = 4096
PS = 4


# these tests are about geometry and use one owner's state pages as low-band filler, so an owner may hold
# more than the default one recurrent slot (tests/fast/test_recurrent.py tests the cap itself)
FILLER_SLOTS = 64


def make(model: str = "toy-tri", capacity: int = CAP, cls: type[Arena] = Arena) -> Arena:
    return cls(ArenaConfig(preset(model), capacity=capacity, page_size=PS, max_context_len=16,
                           recurrent_slots=FILLER_SLOTS))


def slots(a: Arena, vids) -> list[int]:
    return [a.translate(v)[1] for v in vids]


def band(a: Arena, name: str) -> dict:
    return a.snapshot()["bands"][name]


def all_locations(a: Arena) -> dict[int, tuple[str, int]]:
    return {v: a.translate(v) for v in sorted(a.v2p)}


# =============================================================================================
# Geometry sanity (the numbers every other test relies on)


def test_toy_geometry() -> None:
    a = make()
    assert a.order == ["state", "window", "full"]
    assert [a.bands[n].role for n in a.order] == [Role.LOW, Role.FLOAT, Role.HIGH]
    assert {n: b.page_bytes for n, b in a.bands.items()} == {"state": 64, "window": 512, "full": 256}
    assert {n: b.top for n, b in a.bands.items()} == {"state": 64, "window": 8, "full": 16}
    assert a.hints == {"window": 2048}
    assert a.used_bytes() == 0 and a.free_bytes() == CAP
    check_all(a)


# =============================================================================================
# admit: placement order


def test_admit_fresh_placement_low_up_high_down_float_at_hint() -> None:
    a = make()
    ad = a.admit("r1", {"state": 2, "window": 2, "full": 3})
    assert ad.plan.rung is Rung.REUSE
    assert ad.plan.placements == {"state": (0, 1), "window": (4, 5), "full": (15, 14, 13)}
    # owner order of the returned pages follows the placement order
    assert slots(a, ad.pages["state"]) == [0, 1]
    assert slots(a, ad.pages["window"]) == [4, 5]  # empty float starts at its hint (byte 2048)
    assert slots(a, ad.pages["full"]) == [15, 14, 13]  # high band grows down from top
    assert a.held("r1") == ad.pages
    assert band(a, "full")["lo"] == 13 and band(a, "full")["hi"] == 16
    assert a.used_bytes() == 2 * 64 + 2 * 512 + 3 * 256
    check_all(a)


def test_admit_low_band_holes_nearest_anchor_first_then_frontier() -> None:
    a = make("toy-state")
    s = a.admit("s", {"state": 6}).pages["state"]
    assert slots(a, s) == [0, 1, 2, 3, 4, 5]
    a.drop("s", [s[3], s[1]])  # holes at 3 and 1, not on the boundary
    assert band(a, "state")["holes"] == [1, 3]
    ad = a.admit("t", {"state": 3})
    assert slots(a, ad.pages["state"]) == [1, 3, 6]  # ascending holes, then the frontier
    assert ad.plan.moves == ()
    check_all(a)


def test_admit_high_band_holes_nearest_anchor_first_then_frontier() -> None:
    a = make("toy-state")
    f = a.admit("f", {"full": 5}).pages["full"]
    assert slots(a, f) == [15, 14, 13, 12, 11]
    a.drop("f", [f[3], f[1]])  # holes at 12 and 14
    assert band(a, "full")["holes"] == [12, 14]
    ad = a.admit("g", {"full": 3})
    assert slots(a, ad.pages["full"]) == [14, 12, 10]  # descending holes, then down from lo
    check_all(a)


def test_admit_empty_float_clamped_above_low_frontier() -> None:
    a = make()
    a.admit("s", {"state": 40})  # low band reaches byte 2560, above the window's hint 2048
    ad = a.admit("w", {"window": 1})
    assert slots(a, ad.pages["window"]) == [5]  # first 512-B slot at or above byte 2560
    check_all(a)


def test_admit_float_grows_toward_larger_room_first() -> None:
    a = make()
    a.admit("s", {"state": 1})  # state [0, 64)
    w = a.admit("w", {"window": 2}).pages["window"]  # window slots 4, 5 = bytes [2048, 3072)
    a.admit("f", {"full": 2})  # full [3584, 4096): one window page of room above, three below
    ad = a.admit("w2", {"window": 4})
    assert slots(a, w) == [4, 5]
    assert slots(a, ad.pages["window"]) == [3, 2, 1, 6]  # down into the larger room, then up
    assert (band(a, "window")["lo"], band(a, "window")["hi"]) == (1, 7)
    check_all(a)


def test_admit_with_shared_prefix_pages() -> None:
    a = make()
    r1 = a.admit("r1", {"full": 2, "state": 1})
    prefix = list(r1.pages["full"])
    r2 = a.admit("r2", {"full": 1}, shared=prefix)
    assert a.held("r2")["full"] == (*prefix, *r2.pages["full"])
    assert a.refs[prefix[0]] == 2 and a.refs[r2.pages["full"][0]] == 1
    check_all(a)


def test_admit_empty_demand_places_nothing() -> None:
    a = make()
    ad = a.admit("idle", {})
    assert ad.pages == {} and ad.plan.rung is Rung.NONE
    assert a.held("idle") == {"state": (), "window": (), "full": ()}
    assert a.plan_admission({"full": 0}).rung is Rung.NONE
    check_all(a)


def test_admit_reuses_smallest_freed_virtual_id() -> None:
    a = make()
    r = a.admit("r", {"full": 4}).pages["full"]
    a.drop("r", [r[2], r[1]])
    ad = a.admit("s", {"full": 2})
    assert sorted(ad.pages["full"]) == sorted([r[1], r[2]])
    assert ad.pages["full"][0] == min(r[1], r[2])
    check_all(a)


# =============================================================================================
# extend


def test_extend_appends_in_owner_order() -> None:
    a = make()
    first = a.admit("r", {"full": 2, "window": 1}).pages
    more = a.extend("r", {"full": 2, "window": 1})
    assert more.plan.rung is Rung.REUSE
    held = a.held("r")
    assert held["full"] == first["full"] + more.pages["full"]
    assert held["window"] == first["window"] + more.pages["window"]
    assert slots(a, held["full"]) == [15, 14, 13, 12]
    assert a.extend("r", {}).pages == {}
    check_all(a)


# =============================================================================================
# share / drop / slide / free


def test_share_page_freed_only_when_last_owner_lets_go() -> None:
    a = make()
    r = a.admit("req", {"full": 3}).pages["full"]
    a.share("cache", r[:2])  # the prefix cache keeps the first two pages
    assert a.held("cache")["full"] == r[:2]
    assert [a.refs[v] for v in r] == [2, 2, 1]
    freed = a.free("req")
    assert freed == [r[2]]  # only the unshared page dies
    assert all(v in a.v2p for v in r[:2]) and r[2] not in a.v2p
    with pytest.raises(UnknownOwnerError):
        a.held("req")
    check_all(a)
    assert a.drop("cache", [r[0]]) == [r[0]]
    assert a.free("cache") == [r[1]]
    assert a.v2p == {} and a.used_bytes() == 0
    assert band(a, "full")["lo"] == band(a, "full")["hi"] == 16  # every page went back to the gap
    check_all(a)


def test_share_existing_owner_and_cross_request_hit() -> None:
    a = make()
    r1 = a.admit("r1", {"full": 2}).pages["full"]
    r2 = a.admit("r2", {"full": 1}).pages["full"]
    a.share("r2", [r1[0]])
    assert a.held("r2")["full"] == (r2[0], r1[0])
    assert a.drop("r1", list(r1)) == [r1[1]]  # r1[0] survives: r2 still holds it
    assert r1[0] in a.v2p
    check_all(a)


def test_drop_returns_freed_and_keeps_rest() -> None:
    a = make()
    r = a.admit("r", {"full": 3, "state": 1}).pages
    freed = a.drop("r", [r["full"][1], r["state"][0]])
    assert sorted(freed) == sorted([r["full"][1], r["state"][0]])
    assert a.held("r") == {"state": (), "window": (), "full": (r["full"][0], r["full"][2])}
    assert band(a, "full")["holes"] == [14]  # interior slot: a hole, not the boundary
    assert band(a, "state")["hi"] == 0  # boundary slot: absorbed into the gap
    assert a.drop("r", []) == []
    check_all(a)


def test_drop_boundary_pages_absorbs_holes_behind_them() -> None:
    a = make()
    r = a.admit("r", {"full": 4}).pages["full"]  # slots 15, 14, 13, 12
    a.drop("r", [r[2]])  # slot 13: interior hole
    assert band(a, "full")["holes"] == [13]
    a.drop("r", [r[3]])  # slot 12 on the boundary; hole 13 behind it goes too
    assert (band(a, "full")["lo"], band(a, "full")["holes"]) == (14, [])
    check_all(a)


def test_slide_drops_oldest_window_pages() -> None:
    a = make()
    w = a.admit("r", {"window": 3}).pages["window"]
    a.share("cache", [w[0]])
    assert a.slide("r", "window", 2) == [w[1]]  # w[0] is still cached, w[1] dies
    assert a.held("r")["window"] == (w[2],)
    assert w[0] in a.v2p and w[1] not in a.v2p
    assert a.slide("r", "window", 0) == []
    check_all(a)
    assert a.slide("r", "window", 1) == [w[2]]
    assert a.held("r")["window"] == ()
    check_all(a)


def test_free_forgets_owner_and_returns_everything() -> None:
    a = make()
    r = a.admit("r", {"state": 1, "window": 2, "full": 2}).pages
    freed = a.free("r")
    assert sorted(freed) == sorted(v for vs in r.values() for v in vs)
    assert "r" not in a.owners and a.used_bytes() == 0 and a.v2p == {}
    assert a.gap_bytes() == CAP  # empty float parked, ends back on their anchors
    # the empty float is placed at its hint again
    assert slots(a, a.admit("s", {"window": 1}).pages["window"]) == [4]
    check_all(a)


# =============================================================================================
# acquire / release (the ledger)


def test_freed_page_with_reader_is_withheld_then_hole_on_release() -> None:
    a = make()
    f = a.admit("r", {"full": 3}).pages["full"]  # slots 15, 14, 13
    a.acquire("fwd", UserKind.FORWARD_READ, [f[1]])
    assert a.drop("r", [f[1]]) == [f[1]]  # logically free ...
    assert band(a, "full")["withheld"] == [14]  # ... but withheld: a reader holds slot 14
    # a withheld slot is never handed out again while held
    g = a.admit("g", {"full": 1}).pages["full"]
    assert slots(a, g) == [12]
    check_all(a)
    a.release("fwd")
    assert band(a, "full")["withheld"] == [] and band(a, "full")["holes"] == [14]
    assert slots(a, a.admit("h", {"full": 1}).pages["full"]) == [14]
    assert a.users == {} and not +a.readers
    check_all(a)


def test_withheld_boundary_page_absorbed_into_gap_on_release() -> None:
    a = make()
    f = a.admit("r", {"full": 3}).pages["full"]
    a.acquire("save", UserKind.HOST_SAVE, [f[2]])  # slot 13: the boundary
    a.drop("r", [f[2]])
    assert band(a, "full")["withheld"] == [13] and band(a, "full")["lo"] == 13
    check_all(a)
    a.release("save")
    assert band(a, "full")["lo"] == 14 and band(a, "full")["holes"] == []
    assert band(a, "full")["withheld"] == []
    check_all(a)


def test_release_by_last_of_two_users() -> None:
    a = make()
    f = a.admit("r", {"full": 2}).pages["full"]
    a.acquire("u1", UserKind.NET_SEND, [f[0]])
    a.acquire("u2", UserKind.FORWARD_WRITE, [f[0], f[1]])
    assert a.readers[("full", 15)] == 1 and a.writers[("full", 15)] == 1
    a.free("r")
    assert band(a, "full")["withheld"] == [14, 15]
    a.release("u2")
    assert band(a, "full")["withheld"] == [15]  # u1 still reads slot 15
    check_all(a)
    a.release("u1")
    assert band(a, "full")["lo"] == band(a, "full")["hi"] == 16
    check_all(a)


def test_user_kind_modes() -> None:
    writers = {k for k in UserKind if k.mode.value == "write"}
    assert writers == {UserKind.FORWARD_WRITE, UserKind.HOST_LOAD, UserKind.NET_RECV}


# =============================================================================================
# write / read


def test_unwritten_rows_read_zero_in_every_class() -> None:
    a = make()
    r = a.admit("r", {"state": 1, "window": 1, "full": 1}).pages
    assert a.read(r["state"][0], 0, 1) == 0  # recurrent slots start zeroed
    assert a.read(r["window"][0], 3, 0) == 0  # token pages too: a hand-out zeroes every class
    assert a.read(r["full"][0], 0, 3) == 0
    a.write(r["full"][0], 2, 1, 41)
    a.write(r["state"][0], 0, 0, 7)
    assert a.read(r["full"][0], 2, 1) == 41
    assert a.read(r["full"][0], 2, 0) == 0
    assert a.read(r["state"][0], 0, 0) == 7
    a.write(r["full"][0], 2, 1, 42)  # overwrite
    assert a.read(r["full"][0], 2, 1) == 42
    check_all(a)


def test_freed_then_reallocated_page_reads_clean() -> None:
    a = make()
    f = a.admit("r", {"full": 1, "state": 1}).pages
    a.write(f["full"][0], 0, 0, 5)
    a.write(f["state"][0], 0, 0, 6)
    a.free("r")
    g = a.admit("s", {"full": 1, "state": 1}).pages
    assert slots(a, g["full"]) == slots(a, f["full"])  # same physical slot ...
    assert a.read(g["full"][0], 0, 0) == 0  # ... but no stale content: it reads zeroed
    assert a.read(g["state"][0], 0, 0) == 0
    check_all(a)


# =============================================================================================
# compact (rung 2 on its own)


def _full_with_far_holes() -> tuple[Arena, tuple[int, ...]]:
    """toy-state: full pages at slots 8..15, state fills bytes [0, 2048) (no gap), holes at 15, 14."""
    a = make("toy-state")
    f = a.admit("A", {"full": 8}).pages["full"]
    a.admit("B", {"state": 32})
    assert a.gap_bytes() == 0
    a.drop("A", [f[0], f[1]])
    assert band(a, "full")["holes"] == [14, 15]
    return a, f


def test_compact_packs_high_band_toward_top_and_content_follows() -> None:
    a, f = _full_with_far_holes()
    a.write(f[7], 3, 2, 99)  # slot 8: the farthest page
    plan = a.compact()
    assert plan.rung is Rung.COMPACT
    assert plan.moves == (Move("full", 8, 15), Move("full", 9, 14))
    assert plan.bytes_moved == {2: 512} and plan.placements == {}
    assert a.translate(f[7]) == ("full", 15) and a.translate(f[6]) == ("full", 14)
    assert a.read(f[7], 3, 2) == 99  # the tag followed the page
    assert (band(a, "full")["lo"], band(a, "full")["holes"]) == (10, [])
    assert a.gap_bytes() == 512
    assert a.stats.moves[2] == 2 and a.stats.bytes_moved[2] == 512
    check_all(a)
    again = a.compact()  # nothing left to do
    assert again.rung is Rung.NONE and again.moves == ()
    check_all(a)


def test_compact_packs_low_band_toward_zero() -> None:
    a = make("toy-state")
    s = a.admit("S", {"state": 6}).pages["state"]
    a.drop("S", [s[1], s[3]])
    plan = a.compact()
    assert plan.moves == (Move("state", 5, 1), Move("state", 4, 3))
    assert (band(a, "state")["lo"], band(a, "state")["hi"]) == (0, 4)
    assert sorted(slots(a, a.held("S")["state"])) == [0, 1, 2, 3]
    check_all(a)


def test_compact_never_moves_a_page_with_a_writer() -> None:
    a, f = _full_with_far_holes()
    a.acquire("w", UserKind.FORWARD_WRITE, [f[7]])  # slot 8 is being written
    plan = a.compact()
    # the pinned page holds the frontier, so moving the pages behind it would gain nothing
    assert plan.moves == ()
    assert a.translate(f[7]) == ("full", 8)
    assert band(a, "full")["lo"] == 8
    check_all(a)
    a.release("w")
    plan = a.compact()
    assert plan.moves == (Move("full", 8, 15), Move("full", 9, 14))
    assert band(a, "full")["lo"] == 10
    check_all(a)


def test_compact_moved_page_with_reader_leaves_old_slot_withheld() -> None:
    a, f = _full_with_far_holes()
    a.acquire("r", UserKind.FORWARD_READ, [f[7]])  # slot 8 is being read
    plan = a.compact()
    assert Move("full", 8, 15) in plan.moves
    assert a.translate(f[7]) == ("full", 15)  # the page moved ...
    assert band(a, "full")["withheld"] == [8]  # ... its old copy is still read
    assert band(a, "full")["lo"] == 8  # and the withheld slot stops the retraction
    check_all(a)
    a.release("r")
    assert band(a, "full")["lo"] == 10 and band(a, "full")["withheld"] == []
    check_all(a)


def test_compact_respects_max_moves() -> None:
    a, _f = _full_with_far_holes()
    assert a.compact(0).moves == ()
    plan = a.compact(1)
    assert plan.moves == (Move("full", 8, 15),)
    assert band(a, "full")["holes"] == [14] and band(a, "full")["lo"] == 9
    check_all(a)


# =============================================================================================
# relayout (rung 3 on its own)


def _float_in_the_way() -> tuple[Arena, dict]:
    """toy-tri: state fills [0, 2048), window at slots 4, 5 = [2048, 3072), full at [3584, 4096).

    The only free room is one window page above the float; the state band can grow only if
    the float moves up.
    """
    a = make()
    w = a.admit("W", {"window": 2}).pages
    a.admit("F", {"full": 2})
    a.admit("S", {"state": 32})
    assert slots(a, w["window"]) == [4, 5]
    assert a.gap_bytes() == 512
    return a, w


def test_relayout_moves_float_and_content_follows() -> None:
    a, w = _float_in_the_way()
    a.write(w["window"][0], 1, 2, 77)
    plan = a.relayout({"state": 4})
    assert plan.rung is Rung.RELAYOUT
    assert plan.moves == (Move("window", 4, 6),)
    assert plan.bytes_moved == {3: 512} and plan.placements == {}
    assert plan.spans == {"window": (5, 7)}
    assert a.translate(w["window"][0]) == ("window", 6)
    assert a.read(w["window"][0], 1, 2) == 77
    assert (band(a, "window")["lo"], band(a, "window")["hi"]) == (5, 7)
    check_all(a)
    # the room opened below the float is now reachable by rung 1
    ad = a.admit("S2", {"state": 4})
    assert ad.plan.rung is Rung.REUSE and slots(a, ad.pages["state"]) == [32, 33, 34, 35]
    check_all(a)


def test_relayout_with_nothing_to_move_is_rung_none() -> None:
    a = make()
    w = a.admit("r", {"window": 1, "full": 1}).pages["window"]
    before = all_locations(a)
    plan = a.relayout({"state": 1})
    assert plan.rung is Rung.NONE and plan.moves == () and plan.bytes_moved == {}
    assert all_locations(a) == before and slots(a, w) == [4]
    check_all(a)


@pytest.mark.parametrize(("model", "demand"), [("toy-state", {"full": 1}), ("toy-tri", {"state": 1}),
                                               ("toy-tri", {})])
def test_relayout_without_a_float_to_move_is_a_no_op(model: str, demand: dict) -> None:
    """Regression: relayout used to reject (with an empty shortfall for {}) when no float could move."""
    a = make(model)
    a.admit("r", {"full": 1})
    before = a.snapshot()
    plan = a.relayout(demand)
    assert plan.rung is Rung.NONE and plan.moves == ()
    assert a.snapshot() == before
    check_all(a)


# =============================================================================================
# plan_admission: the ladder picks the lowest rung that fits


def test_plan_rung1_moves_nothing() -> None:
    a = make()
    a.admit("r", {"state": 3, "window": 1, "full": 2})
    before = all_locations(a)
    plan = a.plan_admission({"state": 1, "window": 1, "full": 1})
    assert plan.rung is Rung.REUSE
    assert plan.moves == () and plan.bytes_moved == {} and plan.total_bytes_moved == 0 and plan.spans == {}
    ad = a.admit("s", {"state": 1, "window": 1, "full": 1})
    assert ad.plan == plan
    assert {v: a.translate(v) for v in before} == before  # no existing page moved
    check_all(a)


def test_plan_rung2_when_only_compaction_opens_the_gap() -> None:
    a, _f = _full_with_far_holes()
    before = a.snapshot()
    plan = a.plan_admission({"state": 4})
    assert a.snapshot() == before  # planning is read-only
    assert plan.rung is Rung.COMPACT
    # shortfall-sized: one full page (256 B) opens the 4 state pages (64 B each); the full flush moves two
    assert plan.moves == (Move("full", 8, 15),)
    assert plan.bytes_moved == {2: 256} and plan.total_bytes_moved == 256
    assert plan.placements == {"state": (32, 33, 34, 35)}
    ad = a.admit("C", {"state": 4})
    assert ad.plan == plan
    assert slots(a, ad.pages["state"]) == [32, 33, 34, 35]
    assert a.stats.rung_used[2] == 1
    check_all(a)
    full, _f = _full_with_far_holes()
    full.policy = POLICIES["full-compaction"]()
    plan = full.plan_admission({"state": 4})
    assert plan.moves == (Move("full", 8, 15), Move("full", 9, 14)) and plan.bytes_moved == {2: 512}


def test_plan_rung3_when_only_moving_the_float_fits() -> None:
    a, w = _float_in_the_way()
    a.write(w["window"][1], 0, 0, 13)
    plan = a.plan_admission({"state": 4})
    assert plan.rung is Rung.RELAYOUT
    assert plan.moves == (Move("window", 4, 6),)
    assert plan.bytes_moved == {3: 512}
    assert plan.spans == {"window": (5, 7)}
    assert plan.placements == {"state": (32, 33, 34, 35)}
    ad = a.admit("S2", {"state": 4})
    assert ad.plan == plan
    assert a.read(w["window"][1], 0, 0) == 13
    assert a.stats.rung_used[3] == 1 and a.stats.moves[3] == 1
    check_all(a)


def test_plan_rung3_keeps_float_pages_in_use_in_place() -> None:
    """A float page with a writer is an obstacle: the target span covers it and it does not move."""
    a, w = _float_in_the_way()
    a.acquire("fwd", UserKind.FORWARD_WRITE, [w["window"][1]])  # slot 5
    plan = a.plan_admission({"state": 4})
    assert plan.rung is Rung.RELAYOUT
    assert plan.spans == {"window": (5, 7)} and plan.moves == (Move("window", 4, 6),)
    a.admit("S2", {"state": 4})
    assert a.translate(w["window"][1]) == ("window", 5)
    check_all(a)
    a.release("fwd")
    check_all(a)


def test_plan_rung3_includes_compaction_moves_first() -> None:
    """Rung 3 runs on the compacted ends: the plan carries the rung-2 moves, then the float's."""
    a = make()
    w = a.admit("W", {"window": 2}).pages["window"]  # slots 4, 5
    f = a.admit("F", {"full": 3}).pages["full"]  # slots 15, 14, 13
    a.admit("S", {"state": 32})
    a.drop("F", [f[0]])  # hole at 15; full [3328, 4096) with one hole
    plan = a.plan_admission({"state": 8})  # 512 B: needs the float one page higher
    assert plan.rung is Rung.RELAYOUT
    assert plan.moves[0] == Move("full", 13, 15)
    assert plan.moves[1:] == (Move("window", 4, 6),)
    assert plan.bytes_moved == {2: 256, 3: 512}
    a.admit("S2", {"state": 8})
    assert slots(a, w) == [6, 5] and slots(a, f[1:]) == [14, 15]
    check_all(a)


def test_plan_rejects_with_shortfall_when_nothing_fits() -> None:
    a = make()
    a.admit("r", {"full": 16})
    with pytest.raises(AdmissionRejectedError) as exc:
        a.plan_admission({"full": 1})
    assert exc.value.shortfall == {"full": 1} and exc.value.shortfall_bytes == 256
    check_all(a)


# =============================================================================================
# determinism


def _drive(a: Arena, seed: int, steps: int = 400) -> list:
    """A deterministic pseudo-random op mix; returns what each op returned (or the error code)."""
    rng = random.Random(seed)
    out: list = []
    owners: list[str] = []
    users: list[str] = []
    for step in range(steps):
        op = rng.choice(["admit", "admit", "extend", "drop", "free", "share", "slide", "acquire", "release",
                         "compact", "write"])
        vids = sorted(a.v2p)
        try:
            if op == "admit":
                ad = a.admit(f"o{step}", {c: rng.randint(0, 3) for c in a.order},
                             rng.sample(vids, min(len(vids), rng.randint(0, 2))))
                owners.append(f"o{step}")
                out.append(ad)
            elif op == "extend" and owners:
                out.append(a.extend(rng.choice(owners), {c: rng.randint(0, 2) for c in a.order}))
            elif op == "drop" and owners:
                o = rng.choice(owners)
                held = [v for vs in a.held(o).values() for v in vs]
                out.append(a.drop(o, rng.sample(held, min(len(held), 2))))
            elif op == "free" and owners:
                o = owners.pop(rng.randrange(len(owners)))
                out.append(a.free(o))
            elif op == "share" and owners and vids:
                o = rng.choice(owners)
                mine = {v for vs in a.held(o).values() for v in vs}
                cand = [v for v in vids if v not in mine]
                a.share(o, rng.sample(cand, min(len(cand), 1)))
            elif op == "slide" and owners:
                o = rng.choice(owners)
                out.append(a.slide(o, "window", rng.randint(0, len(a.held(o)["window"]))))
            elif op == "acquire" and vids:
                a.acquire(f"u{step}", rng.choice(list(UserKind)), rng.sample(vids, 1))
                users.append(f"u{step}")
            elif op == "release" and users:
                a.release(users.pop(rng.randrange(len(users))))
            elif op == "compact":
                out.append(a.compact(rng.choice([None, 1])))
            elif op == "write" and vids:
                a.write(rng.choice(vids), 0, 0, step)
        except ArenaError as e:
            out.append(e.code)
    return out


def test_determinism_same_ops_same_state() -> None:
    a, b = make(), make()
    ra, rb = _drive(a, seed=7), _drive(b, seed=7)
    assert ra == rb
    assert a.snapshot() == b.snapshot()
    assert a.stats == b.stats
    # the mix climbed every rung of the ladder and also hit rejections
    assert all(a.stats.rung_used[r] > 0 for r in (1, 2, 3))
    assert "AdmissionRejected" in ra
    check_all(a)
    check_all(b)


def test_determinism_split_pools() -> None:
    a, b = make(capacity=16384, cls=SplitPools), make(capacity=16384, cls=SplitPools)
    assert _drive(a, seed=3) == _drive(b, seed=3)
    assert a.snapshot() == b.snapshot()
    check_all(a)


# =============================================================================================
# translate / translate_token / page_offset


def test_translate_translate_token_page_offset() -> None:
    a = make()
    r = a.admit("r", {"state": 1, "window": 1, "full": 2}).pages
    full = r["full"][1]
    assert a.translate(full) == ("full", 14)
    for i in range(PS):
        assert a.translate_token("full", full * PS + i) == 14 * PS + i
    win = r["window"][0]
    assert a.translate_token("window", win * PS + 3) == 4 * PS + 3
    st = r["state"][0]  # a recurrent page is one entry: vtoken == vpage
    assert a.translate_token("state", st) == a.translate(st)[1] == 0
    assert a.page_offset("full", 14) == 14 * 256
    assert a.page_offset("window", 4) == 2048 == a.hints["window"]
    assert a.page_offset("state", 3) == 3 * 64
    check_all(a)


def test_translate_follows_moves() -> None:
    a, f = _full_with_far_holes()
    vt = f[7] * PS + 2
    assert a.translate_token("full", vt) == 8 * PS + 2
    a.compact()
    assert a.translate_token("full", vt) == 15 * PS + 2
    a.free("A")
    with pytest.raises(UnknownPageError):
        a.translate(f[7])
    check_all(a)


# =============================================================================================
# SplitPools: the same API over fixed regions


def test_split_pools_regions_are_fixed_and_never_move() -> None:
    cap = 16384
    a = make(capacity=cap, cls=SplitPools)
    regions = split_regions(a.config)
    for name, (lo, hi) in regions.items():
        b = a.bands[name]
        assert (b.lo_byte, b.hi_byte) == (lo, hi)
        assert b.hole_count == b.hi - b.lo  # every slot starts a hole
    spans = {n: (b.lo, b.hi) for n, b in a.bands.items()}
    ad = a.admit("r", {"state": 2, "window": 2, "full": 2})
    assert ad.plan.rung is Rung.REUSE and ad.plan.moves == ()
    assert slots(a, ad.pages["state"]) == [a.bands["state"].lo, a.bands["state"].lo + 1]
    assert slots(a, ad.pages["window"]) == [a.bands["window"].lo, a.bands["window"].lo + 1]
    top = a.bands["full"].hi
    assert slots(a, ad.pages["full"]) == [top - 1, top - 2]  # anchor order: from the region's top
    a.free("r")
    assert {n: (b.lo, b.hi) for n, b in a.bands.items()} == spans  # freed slots stay holes
    assert a.compact().rung is Rung.NONE and a.relayout({"state": 1}).rung is Rung.NONE
    assert {n: (b.lo, b.hi) for n, b in a.bands.items()} == spans
    check_all(a)


def test_split_pools_cannot_borrow_between_regions() -> None:
    a = make(capacity=16384, cls=SplitPools)
    n_full = a.bands["full"].hi - a.bands["full"].lo
    a.admit("r", {"full": n_full})
    assert a.free_bytes() > 256  # plenty of bytes left in the other regions ...
    with pytest.raises(AdmissionRejectedError) as exc:
        a.admit("s", {"full": 1})  # ... but none of them is the full pool
    assert exc.value.shortfall == {"full": 1}
    # the unified arena of the same size serves the same sequence
    u = make(capacity=16384)
    u.admit("r", {"full": n_full})
    u.admit("s", {"full": 1})
    check_all(a)
    check_all(u)


def test_split_pools_ledger_and_data() -> None:
    a = make(capacity=16384, cls=SplitPools)
    r = a.admit("r", {"full": 2}).pages["full"]
    a.write(r[0], 1, 1, 3)
    a.acquire("u", UserKind.NET_SEND, [r[0]])
    a.drop("r", [r[0]])
    s = a.translate(r[1])[1]
    assert a.bands["full"].withheld == {s + 1}
    a.release("u")
    assert a.bands["full"].withheld == set() and s + 1 in a.bands["full"].holes
    check_all(a)
