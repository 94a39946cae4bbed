"""Every rule of the plan validator rejects its own minimal bad plans, and the state stays bit-identical.

The plans are built by hand against one busy toy-tri arena (``world``), not produced by a policy: a policy
that never makes a bad plan proves nothing about the validator.  Each rule gets the smallest plans that
break it (off by one slot, one page, one count) next to the nearest plan it must accept, so a rule that is
too weak and a rule that is too strong both fail here.  The layout of ``world`` (toy-tri, 4096 B, slots of
64 / 512 / 256 B):

    state  (low)   span [0, 4)    live 0, 3   hole 1   withheld 2 (a sender holds it)
    window (float) span [2, 5)    live 2, 4   withheld 3 (a sender holds it)
    full   (high)  span [11, 16)  live 11, 12 (a writer), 13 (a reader), 15   hole 14
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Band, BandView, Role, explicit_view, merge_anchor_order
from kvarena.reference.invariants import check_all
from kvarena.reference.policy import Ladder
from kvarena.reference.validate import RULES, validate_plan
from kvarena.spec.errors import PlanError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Move, Plan, Rung, UserKind

R, C, X, N = Rung.REUSE, Rung.COMPACT, Rung.RELAYOUT, Rung.NONE


def toy(model: str = "toy-tri") -> Arena:
    # one owner's state pages are low-band filler here: the plans are the subject, not the recurrent cap
    return Arena(ArenaConfig(preset(model), 4096, page_size=4, max_context_len=16, recurrent_slots=64))


def world() -> Arena:
    a = toy()
    r = a.admit("r", {"state": 4, "window": 3, "full": 5}).pages
    f, w, s = r["full"], r["window"], r["state"]
    a.drop("r", [f[1], s[1]])  # holes inside both end bands
    a.acquire("rd", UserKind.FORWARD_READ, [f[2]])
    a.acquire("wr", UserKind.FORWARD_WRITE, [f[3]])
    a.acquire("snd", UserKind.NET_SEND, [s[2], w[1]])
    a.drop("r", [s[2], w[1]])  # withheld: freed while sent
    got = {n: (b.lo, b.hi, sorted(b.live), list(b.holes), sorted(b.withheld)) for n, b in a.bands.items()}
    assert got == {"state": (0, 4, [0, 3], [1], [2]), "window": (2, 5, [2, 4], [], [3]),
                   "full": (11, 16, [11, 12, 13, 15], [14], [])}, got
    assert a.writers == {("full", 12): 1} and a.readers[("full", 13)] == 1
    check_all(a)
    return a


@pytest.fixture
def a() -> Arena:
    return world()


def refused(a: Arena, plan: Plan, demand: dict[str, int], rule: str, match: str | None = None) -> None:
    before, snap = pickle.dumps(a), a.snapshot()
    with pytest.raises(PlanError, match=match) as info:
        validate_plan(a, plan, demand)
    err = info.value
    assert (err.rule, err.inv) == (rule, RULES[rule]), f"expected {rule}, got {err.rule}: {err}"
    assert str(err).startswith(f"{rule} ({RULES[rule]}): ")
    assert str(err).endswith("; the policy must plan only moves and placements the spec allows "
                             "(spec/arena.md §Policies)")
    assert a.snapshot() == snap and pickle.dumps(a) == before, "a refused plan changed the state"


def accepted(a: Arena, plan: Plan, demand: dict[str, int]) -> None:
    before = pickle.dumps(a)
    validate_plan(a, plan, demand)
    assert pickle.dumps(a) == before, "validation changed the state"


def test_world_plans_that_are_valid(a: Arena) -> None:
    """The nearest valid plan of each family: the rules below are not simply refusing everything."""
    accepted(a, Plan(N), {})
    accepted(a, Plan(R, placements={"full": (14,)}), {"full": 1})
    accepted(a, Plan(R, placements={"full": (14, 10)}), {"full": 2})  # the hole, then the frontier down
    accepted(a, Plan(R, placements={"state": (1, 4, 5)}), {"state": 3})  # the hole, then the frontier up
    accepted(a, Plan(R, placements={"window": (1,)}), {"window": 1})  # a float grows down (up: the full band)
    accepted(a, Plan(R, placements={"state": (1,), "full": (14,)}), {"state": 1, "full": 1})
    accepted(a, Plan(R, placements={"full": (), "state": (1,)}), {"state": 1})  # an empty entry places nothing
    accepted(a, Plan(C, (Move("full", 11, 14),)), {})  # absorbed: the full band then starts at 12
    accepted(a, Plan(C, (Move("full", 13, 14),)), {})  # a reader's page may move (its slot is withheld)
    accepted(a, Plan(C, (Move("full", 11, 14), Move("full", 15, 11))), {})  # onto a slot vacated earlier
    accepted(a, Plan(C, (Move("state", 3, 1),)), {})
    accepted(a, Plan(C, (Move("state", 3, 1),), placements={"state": (3,)}), {"state": 1})  # absorbed, re-grown
    accepted(a, Plan(X, (Move("full", 11, 14),)), {})  # rung 3 may carry rung 2's end moves
    accepted(a, Plan(X, (Move("window", 4, 1),), spans={"window": (1, 4)}), {})  # into the gap, inside the span
    accepted(a, Plan(X, spans={"window": (2, 5)}), {})
    accepted(a, Plan(X, spans={"window": (1, 5)}, placements={"window": (1,)}), {"window": 1})


# -- PLAN-RUNG -----------------------------------------------------------------------------------


def test_rung(a: Arena) -> None:
    refused(a, Plan(R, (Move("full", 11, 14),)), {}, "PLAN-RUNG", "rung-1 plan moves 1 pages")
    refused(a, Plan(N, (Move("full", 11, 14),)), {}, "PLAN-RUNG", "rung NONE carries moves")
    refused(a, Plan(N, spans={"window": (2, 5)}), {}, "PLAN-RUNG", "a float target span in a rung-0 plan")
    refused(a, Plan(C, (Move("window", 2, 1),)), {}, "PLAN-RUNG", "a float page")
    refused(a, Plan(X, (Move("window", 4, 1),)), {}, "PLAN-RUNG", "without a target span")
    refused(a, Plan(X, (Move("window", 4, 1),), spans={"state": (0, 4)}), {}, "PLAN-RUNG", "not a float band")
    refused(a, Plan(X, spans={"full": (11, 16)}), {}, "PLAN-RUNG", "not a float band")
    refused(a, Plan(X, spans={"nope": (0, 1)}), {}, "PLAN-RUNG", "not a float band")
    refused(a, Plan(C, spans={"window": (2, 5)}), {}, "PLAN-RUNG", "rung-2 plan")
    refused(a, Plan(R, spans={"window": (2, 5)}), {}, "PLAN-RUNG", "rung-1 plan")
    # rung 2 moves the ends only, at any end
    refused(a, Plan(C, (Move("state", 3, 1), Move("window", 2, 1))), {}, "PLAN-RUNG")


# -- PLAN-EXTENT of a target span ----------------------------------------------------------------


def test_target_span_leaves_the_grid(a: Arena) -> None:
    refused(a, Plan(X, spans={"window": (-1, 5)}), {}, "PLAN-EXTENT", "leaves its grid")
    refused(a, Plan(X, spans={"window": (5, 4)}), {}, "PLAN-EXTENT", "leaves its grid")
    refused(a, Plan(X, spans={"window": (2, 9)}), {}, "PLAN-EXTENT", "leaves its grid")  # top is 8
    # inside the grid, the span's bytes are checked against the neighbours at the end
    refused(a, Plan(X, spans={"window": (2, 8)}), {}, "PLAN-EXTENT", "above the start of full")


def test_target_span_at_the_grid_edges() -> None:
    """An empty arena: the float's span may touch slot 0 and the grid's top, a span may be empty."""
    a = toy()
    a.admit("f", {"window": 1})
    lo = a.bands["window"].lo
    assert 0 < lo < a.bands["window"].top - 1  # at its hint, away from both edges
    accepted(a, Plan(X, (Move("window", lo, 0),), spans={"window": (0, 1)}), {})
    top = a.bands["window"].top
    accepted(a, Plan(X, (Move("window", lo, top - 1),), spans={"window": (top - 1, top)}), {})
    refused(a, Plan(X, (Move("window", lo, top),), spans={"window": (top, top + 1)}), {}, "PLAN-EXTENT")
    refused(a, Plan(X, spans={"window": (lo, lo)}), {}, "PLAN-SPAN")  # an empty span keeps nothing


# -- PLAN-MOVE-SOURCE, PLAN-MOVE-WRITER ----------------------------------------------------------


def test_move_source(a: Arena) -> None:
    refused(a, Plan(C, (Move("nope", 0, 1),)), {}, "PLAN-MOVE-SOURCE", "unknown class")
    refused(a, Plan(C, (Move("full", 14, 10),)), {}, "PLAN-MOVE-SOURCE", "which is hole")
    refused(a, Plan(C, (Move("state", 2, 1),)), {}, "PLAN-MOVE-SOURCE", "which is withheld")
    refused(a, Plan(C, (Move("full", 10, 14),)), {}, "PLAN-MOVE-SOURCE", "which is gap")
    refused(a, Plan(C, (Move("full", 16, 14),)), {}, "PLAN-MOVE-SOURCE", "which is gap")  # off the grid
    # a page moves once: its source is a hole after the first move
    refused(a, Plan(C, (Move("full", 11, 14), Move("full", 11, 14))), {}, "PLAN-MOVE-SOURCE", "which is hole")
    # a reader's page that moved leaves a withheld slot, which cannot move again
    refused(a, Plan(C, (Move("full", 13, 14), Move("full", 13, 14))), {}, "PLAN-MOVE-SOURCE", "withheld")


def test_move_writer(a: Arena) -> None:
    refused(a, Plan(C, (Move("full", 12, 14),)), {}, "PLAN-MOVE-WRITER", "ledger user writes")
    refused(a, Plan(X, (Move("full", 12, 14),)), {}, "PLAN-MOVE-WRITER")
    accepted(a, Plan(C, (Move("full", 13, 14),)), {})  # a reader does not pin


# -- PLAN-MOVE-DEST, PLAN-DEST-USERS -------------------------------------------------------------


def test_move_dest(a: Arena) -> None:
    refused(a, Plan(C, (Move("full", 11, 11),)), {}, "PLAN-MOVE-DEST", "onto itself")
    refused(a, Plan(C, (Move("full", 11, 15),)), {}, "PLAN-MOVE-DEST", "which is live")
    refused(a, Plan(C, (Move("full", 11, 10),)), {}, "PLAN-MOVE-DEST", "which is gap")  # the gap next to it
    refused(a, Plan(C, (Move("state", 3, 4),)), {}, "PLAN-MOVE-DEST", "which is gap")
    refused(a, Plan(X, (Move("full", 11, 10),)), {}, "PLAN-MOVE-DEST", "which is gap")
    # a later move onto the slot an earlier move filled
    refused(a, Plan(C, (Move("full", 11, 14), Move("full", 15, 14))), {}, "PLAN-MOVE-DEST", "which is live")


def test_move_into_the_gap_outside_the_target_span(a: Arena) -> None:
    """A float page may move into the gap only inside its target span; one slot past either end is refused."""
    refused(a, Plan(X, (Move("window", 4, 5),), spans={"window": (2, 5)}), {}, "PLAN-MOVE-DEST", "which is gap")
    refused(a, Plan(X, (Move("window", 4, 1),), spans={"window": (2, 5)}), {}, "PLAN-MOVE-DEST", "which is gap")
    refused(a, Plan(X, (Move("window", 4, 0),), spans={"window": (1, 4)}), {}, "PLAN-MOVE-DEST", "which is gap")
    accepted(a, Plan(X, (Move("window", 4, 1),), spans={"window": (1, 4)}), {})
    # a gap slot inside another class's span is still the gap for this class
    refused(a, Plan(X, (Move("full", 11, 10),), spans={"window": (1, 4)}), {}, "PLAN-MOVE-DEST", "which is gap")


def test_dest_users(a: Arena) -> None:
    refused(a, Plan(C, (Move("state", 3, 2),)), {}, "PLAN-DEST-USERS", "ledger user still holds")  # withheld
    refused(a, Plan(C, (Move("full", 11, 13),)), {}, "PLAN-DEST-USERS")  # live, read
    refused(a, Plan(C, (Move("full", 11, 12),)), {}, "PLAN-DEST-USERS")  # live, written
    refused(a, Plan(X, (Move("window", 4, 3),), spans={"window": (2, 5)}), {}, "PLAN-DEST-USERS")  # withheld
    # the slot a reader's page left earlier in the plan is withheld
    refused(a, Plan(C, (Move("full", 13, 14), Move("full", 11, 13))), {}, "PLAN-DEST-USERS")


# -- PLAN-SPAN -----------------------------------------------------------------------------------


def test_span_keeps_every_page(a: Arena) -> None:
    refused(a, Plan(X, spans={"window": (3, 5)}), {}, "PLAN-SPAN", r"keeps pages \[2\]")  # one page short below
    refused(a, Plan(X, spans={"window": (2, 4)}), {}, "PLAN-SPAN", r"keeps pages \[4\]")  # one page short above
    refused(a, Plan(X, spans={"window": (4, 5)}), {}, "PLAN-SPAN", r"keeps pages \[2, 3\]")  # withheld too
    # the moved page is inside, but the withheld slot is not
    refused(a, Plan(X, (Move("window", 2, 5),), spans={"window": (4, 6)}), {}, "PLAN-SPAN", r"keeps pages \[3\]")
    # a page moved into a hole of the old span that the target span leaves out
    b2 = toy()
    w2 = b2.admit("w", {"window": 3}).pages["window"]
    b2.drop("w", [w2[1]])
    lo = b2.bands["window"].lo
    refused(b2, Plan(X, (Move("window", lo + 2, lo + 1),), spans={"window": (lo + 2, lo + 3)}), {}, "PLAN-SPAN")
    accepted(b2, Plan(X, (Move("window", lo + 2, lo + 1),), spans={"window": (lo, lo + 2)}), {})


# -- PLAN-PLACE-COUNT ----------------------------------------------------------------------------


def test_place_count(a: Arena) -> None:
    refused(a, Plan(R, placements={"full": (14,)}), {"full": 2}, "PLAN-PLACE-COUNT",
            "places 1 'full' pages for a demand of 2")
    refused(a, Plan(R, placements={"full": (14, 10)}), {"full": 1}, "PLAN-PLACE-COUNT", "for a demand of 1")
    refused(a, Plan(R), {"full": 1}, "PLAN-PLACE-COUNT", "places 0")
    refused(a, Plan(R, placements={"nope": (0,)}), {}, "PLAN-PLACE-COUNT", "unknown class")
    refused(a, Plan(R, placements={"full": (14,), "nope": ()}), {"full": 1}, "PLAN-PLACE-COUNT", "unknown class")


def test_place_count_every_class(a: Arena) -> None:
    """A class nobody asked for gets nothing: in admit the owner would receive it, in a free-time plan it leaks."""
    refused(a, Plan(R, placements={"full": (14,), "state": (1,)}), {"full": 1}, "PLAN-PLACE-COUNT",
            "places 1 'state' pages for a demand of 0")
    refused(a, Plan(R, placements={"state": (1,)}), {}, "PLAN-PLACE-COUNT", "for a demand of 0")  # free-time
    refused(a, Plan(C, (Move("full", 11, 14),), placements={"full": (11,)}), {}, "PLAN-PLACE-COUNT")
    refused(a, Plan(X, spans={"window": (1, 5)}, placements={"window": (1,)}), {}, "PLAN-PLACE-COUNT")


# -- PLAN-PLACE-FREE -----------------------------------------------------------------------------


def test_place_free(a: Arena) -> None:
    refused(a, Plan(R, placements={"full": (14, 14)}), {"full": 2}, "PLAN-PLACE-FREE", "twice on one slot")
    refused(a, Plan(R, placements={"full": (15,)}), {"full": 1}, "PLAN-PLACE-FREE", "which is live")
    refused(a, Plan(R, placements={"state": (2,)}), {"state": 1}, "PLAN-PLACE-FREE", "which is withheld")
    refused(a, Plan(R, placements={"window": (3,)}), {"window": 1}, "PLAN-PLACE-FREE", "which is withheld")
    refused(a, Plan(C, (Move("full", 11, 14),), placements={"full": (14,)}), {"full": 1}, "PLAN-PLACE-FREE",
            "which is live")  # the hole a move filled
    refused(a, Plan(C, (Move("full", 13, 14),), placements={"full": (13,)}), {"full": 1}, "PLAN-PLACE-FREE",
            "which is withheld")  # the slot a reader's page left


def test_place_free_slot_a_writer_alone_holds(a: Arena) -> None:
    """A page freed while a writer holds it leaves a withheld slot with a writer and no reader: the writer's
    count alone refuses a placement there (the fast path of the placement check tests readers and writers)."""
    (v,) = [v for v, page in a.v2p.items() if page == ("full", 12)]
    a.drop("r", [v])
    assert 12 in a.bands["full"].withheld and not a.readers[("full", 12)] and a.writers[("full", 12)]
    refused(a, Plan(R, placements={"full": (12,)}), {"full": 1}, "PLAN-PLACE-FREE", "which is withheld")
    refused(a, Plan(R, placements={"full": (14, 12)}), {"full": 2}, "PLAN-PLACE-FREE", "which is withheld")


def test_place_only_next_to_a_frontier(a: Arena) -> None:
    """Gap slots are taken one after another from a growing edge; one slot off is refused."""
    refused(a, Plan(R, placements={"full": (9,)}), {"full": 1}, "PLAN-PLACE-FREE", "not next to")  # lo - 2
    refused(a, Plan(R, placements={"full": (16,)}), {"full": 1}, "PLAN-PLACE-FREE", "not next to")  # the high
    refused(a, Plan(R, placements={"state": (5,)}), {"state": 1}, "PLAN-PLACE-FREE", "not next to")  # hi + 1
    refused(a, Plan(R, placements={"state": (-1,)}), {"state": 1}, "PLAN-PLACE-FREE", "not next to")  # the low
    refused(a, Plan(R, placements={"window": (0,)}), {"window": 1}, "PLAN-PLACE-FREE", "not next to")
    refused(a, Plan(R, placements={"window": (6,)}), {"window": 1}, "PLAN-PLACE-FREE", "not next to")
    refused(a, Plan(R, placements={"full": (9, 10)}), {"full": 2}, "PLAN-PLACE-FREE", "not next to")  # order
    accepted(a, Plan(R, placements={"state": (4, 5)}), {"state": 2})


def test_place_starts_an_empty_float_anywhere() -> None:
    a = toy()
    a.admit("s", {"state": 2})
    a.admit("f", {"full": 2})
    assert a.bands["window"].empty
    accepted(a, Plan(R, placements={"window": (3, 4)}), {"window": 2})
    accepted(a, Plan(R, placements={"window": (3, 2)}), {"window": 2})
    refused(a, Plan(R, placements={"window": (3, 5)}), {"window": 2}, "PLAN-PLACE-FREE", "not next to")


# -- PLAN-EXTENT after the plan ------------------------------------------------------------------


def test_extent_after_the_plan(a: Arena) -> None:
    # the high band grown down to the float's top (byte 2560 = full slot 10), then one page too many
    accepted(a, Plan(R, placements={"full": (10,)}), {"full": 1})
    refused(a, Plan(R, placements={"full": (10, 9)}), {"full": 2}, "PLAN-EXTENT",
            "window would end at byte 2560 above the start of full at 2304")
    refused(a, Plan(R, placements={"window": (5,)}), {"window": 1}, "PLAN-EXTENT", "above the start of full")
    refused(a, Plan(R, placements={"window": (1, 0)}), {"window": 2}, "PLAN-EXTENT",
            "state would end at byte 256 above the start of window at 0")
    # the low band grown into the float
    accepted(a, Plan(R, placements={"state": tuple(range(4, 16))}), {"state": 12})
    refused(a, Plan(R, placements={"state": tuple(range(4, 17))}), {"state": 13}, "PLAN-EXTENT",
            "state would end at byte 1088 above the start of window at 1024")
    # the float retargeted onto the low band
    refused(a, Plan(X, (Move("window", 4, 0),), spans={"window": (0, 4)}), {}, "PLAN-EXTENT",
            "state would end at byte 256 above the start of window at 0")


def test_extent_counts_absorbed_end_slots(a: Arena) -> None:
    """After rung-2 moves the ends give back their emptied boundary slots before placements are checked."""
    # full: 11 moves into the hole 14; slot 11 goes back to the gap, so 11 and then 10 are frontier slots
    accepted(a, Plan(C, (Move("full", 11, 14),), placements={"full": (11, 10)}), {"full": 2})
    refused(a, Plan(C, (Move("full", 11, 14),), placements={"full": (10,)}), {"full": 1}, "PLAN-PLACE-FREE",
            "not next to")
    # state: 3 moves into the hole 1; slot 3 is absorbed, so the next frontier slot is 3 again
    accepted(a, Plan(C, (Move("state", 3, 1),), placements={"state": (3, 4)}), {"state": 2})
    refused(a, Plan(C, (Move("state", 3, 1),), placements={"state": (4,)}), {"state": 1}, "PLAN-PLACE-FREE",
            "not next to")


def test_span_message_names_the_first_six_pages() -> None:
    a = Arena(ArenaConfig(preset("toy-tri"), 16384, page_size=4, max_context_len=16))
    w = a.admit("w", {"window": 8}).pages["window"]
    lo = a.bands["window"].lo
    assert sorted(a.translate(v)[1] for v in w) == list(range(lo, lo + 8))
    refused(a, Plan(X, spans={"window": (lo + 8, lo + 9)}), {}, "PLAN-SPAN",
            rf"keeps pages \[{', '.join(str(lo + i) for i in range(6))}\] outside its target span")


def test_span_counts_the_pages_moved_out_of_it() -> None:
    """The only page outside the target span is one a move of the plan put there."""
    a = toy()
    w = a.admit("w", {"window": 3}).pages["window"]
    lo = a.bands["window"].lo
    a.drop("w", [w[1]])  # an interior hole at lo + 1
    a.admit("s", {"state": 1})  # a low-band page in the overlay's slot numbers too
    refused(a, Plan(X, (Move("window", lo + 2, lo + 1),), spans={"window": (lo, lo + 1)}), {}, "PLAN-SPAN",
            rf"keeps pages \[{lo + 1}\]")
    refused(a, Plan(X, (Move("state", 0, 1), Move("window", lo + 2, lo + 1)), spans={"window": (lo, lo + 1)}),
            {}, "PLAN-MOVE-DEST")  # (state slot 1 is the gap)
    accepted(a, Plan(X, (Move("window", lo + 2, lo + 1),), spans={"window": (lo, lo + 2)}), {})


def test_extent_with_an_empty_float() -> None:
    """With the float empty the ends are still checked against each other (the empty float is skipped)."""
    a = toy()
    a.admit("s", {"state": 2})
    a.admit("f", {"full": 2})
    assert a.bands["window"].empty
    low_top = a.bands["full"].lo * a.bands["full"].page_bytes // a.bands["state"].page_bytes  # 56
    accepted(a, Plan(R, placements={"state": tuple(range(2, low_top))}), {"state": low_top - 2})
    refused(a, Plan(R, placements={"state": tuple(range(2, low_top + 1))}), {"state": low_top - 1}, "PLAN-EXTENT",
            f"state would end at byte {(low_top + 1) * 64} above the start of full at {low_top * 64}")


def test_extent_outside_the_arena() -> None:
    """A band that would start below byte 0 or end past the capacity is named for that, before the order check."""
    a = toy()
    a.admit("s", {"state": 2})
    a.admit("f", {"full": 2})
    refused(a, Plan(R, placements={"window": (-1,)}), {"window": 1}, "PLAN-EXTENT",
            r"window would span bytes \[-512, 0\) outside the arena")
    refused(a, Plan(R, placements={"window": (8,)}), {"window": 1}, "PLAN-EXTENT",
            r"window would span bytes \[4096, 4608\) outside the arena")


# -- the band helpers the validator's overlay mirrors ----------------------------------------


def band(role: Role, lo: int, hi: int, holes: tuple[int, ...] = ()) -> Band:
    b = Band("b", role, 64, 1024)  # a grid of 16 slots
    b.lo, b.hi = lo, hi
    b.holes.update(holes)
    b.live.update({s: s for s in range(lo, hi) if s not in holes})
    return b


def test_absorb_boundary_holes() -> None:
    low = band(Role.LOW, 0, 6, (1, 4, 5))
    assert low.absorb_boundary_holes() == 2 and (low.lo, low.hi) == (0, 4) and list(low.holes) == [1]
    high = band(Role.HIGH, 10, 16, (10, 11, 13, 15))
    assert high.absorb_boundary_holes() == 2 and (high.lo, high.hi) == (12, 16) and list(high.holes) == [13, 15]
    flt = band(Role.FLOAT, 3, 8, (3, 4, 6, 7))
    assert flt.absorb_boundary_holes() == 4 and (flt.lo, flt.hi) == (5, 6) and not flt.holes
    gone = band(Role.FLOAT, 3, 6, (3, 4, 5))
    assert gone.absorb_boundary_holes() == 3 and (gone.lo, gone.hi) == (0, 0)  # parked at 0
    assert band(Role.LOW, 0, 3).absorb_boundary_holes() == 0


def test_extend_to_and_state_of() -> None:
    high = band(Role.HIGH, 12, 16)
    high.extend_to(11)
    assert (high.lo, high.hi) == (11, 16)
    for role, lo, hi, slot in ((Role.HIGH, 12, 16, 16), (Role.HIGH, 12, 16, 10), (Role.LOW, 0, 4, -1),
                               (Role.LOW, 0, 4, 5), (Role.FLOAT, 4, 6, 7)):
        b = band(role, lo, hi)
        with pytest.raises(AssertionError, match=rf"b: slot {slot} is not adjacent to span \[{lo}, {hi}\)"):
            b.extend_to(slot)
        assert (b.lo, b.hi) == (lo, hi)
    flt = band(Role.FLOAT, 0, 0)
    flt.extend_to(9)
    assert (flt.lo, flt.hi) == (9, 10)
    b = band(Role.LOW, 0, 4, (2,))
    b.withheld.add(3)
    del b.live[3]
    assert [b.state_of(s) for s in (-1, 0, 2, 3, 4)] == ["gap", "live", "hole", "withheld", "gap"]


def test_views() -> None:
    b = band(Role.HIGH, 10, 16, (11, 13))
    v = BandView.of(b)
    assert (v.name, v.role, v.page_bytes, v.top, v.lo, v.hi, v.hole_count) == ("b", Role.HIGH, 64, 16, 10, 16, 2)
    assert v.first_holes(1) == [13] and v.first_holes(0) == [] and v.first_holes(-1) == []
    e = explicit_view(b, 12, 14, [13, 12])
    assert (e.name, e.role, e.top, e.lo, e.hi, e.hole_count) == ("b", Role.HIGH, 16, 12, 14, 2)
    assert e.first_holes(0) == [] and e.first_holes(1) == [13] and e.first_holes(5) == [13, 12]
    assert (e.lo_byte, e.hi_byte, e.empty) == (768, 896, False)
    assert b.first_holes(0) == [] and b.first_holes(5) == [13, 11]
    low = band(Role.LOW, 0, 8, (1, 3, 6))
    assert low.first_holes(2) == [1, 3] and list(low.holes_in_anchor_order()) == [1, 3, 6]


def test_merge_anchor_order() -> None:
    assert list(merge_anchor_order(Role.HIGH, iter([9, 5, 2]), iter([8, 3]))) == [9, 8, 5, 3, 2]
    assert list(merge_anchor_order(Role.LOW, iter([2, 5, 9]), iter([3, 8]))) == [2, 3, 5, 8, 9]
    assert list(merge_anchor_order(Role.FLOAT, iter([4]), iter([1]))) == [1, 4]


# -- PLAN-SHAPE: a plan's types, checked before every other rule ---------------------------------
#
# A plug-in policy returns whatever it likes. Each malformed shape below used to pass the rules and crash half-way
# through Arena._apply (a rung 7 after its page was bound: a leak; a float span of 1.5 after the float was
# retargeted), be applied (rung "1"), or crash the validator with an untyped error. Now each is PLAN-SHAPE, named
# by the field at fault, with the state bit-identical. ``shape_checks`` lists every case as a zero-argument check,
# for the test functions below and for the planted bugs of tests/quality/test_mutants.py that they must kill.

# (id, plan, demand, the field the message names): each against ``world``, whose free slots the good part of each
# plan uses (full 14, window 1), so only the shape is wrong
SHAPES: list[tuple[str, object, dict[str, int], str]] = [
    ("plan-none", None, {}, "the plan is None"),
    ("plan-dict", {"rung": R, "placements": {"full": (14,)}}, {"full": 1}, "the plan is {"),
    ("plan-tuple", (R, (), {"full": (14,)}), {"full": 1}, "the plan is ("),
    ("rung-int", Plan(1, placements={"full": (14,)}), {"full": 1}, "plan.rung is 1 (int)"),  # type: ignore[arg-type]
    ("rung-7", Plan(7, placements={"full": (14,)}), {"full": 1}, "plan.rung is 7 (int)"),  # type: ignore[arg-type]
    ("rung-bool", Plan(True, placements={"full": (14,)}), {"full": 1}, "plan.rung is True (bool)"),  # type: ignore
    ("rung-str", Plan("1", placements={"full": (14,)}), {"full": 1}, "plan.rung is '1' (str)"),  # type: ignore
    ("rung-float", Plan(1.0, placements={"full": (14,)}), {"full": 1}, "plan.rung is 1.0 (float)"),  # type: ignore
    ("rung-none", Plan(None), {}, "plan.rung is None"),  # type: ignore[arg-type]
    ("moves-none", Plan(C, None), {}, "plan.moves is None"),  # type: ignore[arg-type]
    ("moves-set", Plan(C, {Move("full", 11, 14)}), {}, "plan.moves is {"),  # type: ignore[arg-type]  (no order)
    ("move-tuple", Plan(C, (("full", 11, 14),)), {}, "plan.moves[0] is ('full', 11, 14) (tuple)"),  # type: ignore
    ("move-none", Plan(C, (Move("full", 11, 14), None)), {}, "plan.moves[1] is None"),  # type: ignore[arg-type]
    ("move-cls-int", Plan(C, (Move(2, 11, 14),)), {}, "plan.moves[0].cls is 2 (int)"),  # type: ignore[arg-type]
    ("move-src-float", Plan(C, (Move("full", 11.0, 14),)), {}, "plan.moves[0] is Move("),  # type: ignore[arg-type]
    ("move-dst-bool", Plan(C, (Move("full", 11, True),)), {}, "plan.moves[0] is Move("),
    ("move-dst-str", Plan(C, (Move("full", 11, "14"),)), {}, "plan.moves[0] is Move("),  # type: ignore[arg-type]
    ("spans-none", Plan(X, spans=None), {}, "plan.spans is None"),  # type: ignore[arg-type]
    ("span-float", Plan(X, spans={"window": (1.5, 3)}), {}, "plan.spans['window'] is (1.5, 3)"),  # type: ignore
    ("span-float-end", Plan(X, spans={"window": (2, 5.0)}), {}, "plan.spans['window']"),  # type: ignore[dict-item]
    ("span-triple", Plan(X, spans={"window": (2, 3, 5)}), {}, "plan.spans['window']"),  # type: ignore[dict-item]
    ("span-int", Plan(X, spans={"window": 2}), {}, "plan.spans['window'] is 2"),  # type: ignore[dict-item]
    ("span-class-int", Plan(X, spans={1: (2, 5)}), {}, "plan.spans[1]"),  # type: ignore[dict-item]
    ("placements-none", Plan(R, placements=None), {"full": 1}, "plan.placements is None"),  # type: ignore
    ("placements-list", Plan(R, placements=[("full", (14,))]), {"full": 1}, "plan.placements is ["),  # type: ignore
    ("placements-int", Plan(R, placements={"full": 14}), {"full": 1}, "plan.placements['full'] is 14"),  # type: ignore
    ("placements-str", Plan(R, placements={"full": "14"}), {"full": 1}, "plan.placements['full'] is '14'"),  # type: ignore
    ("placements-set", Plan(R, placements={"full": {14}}), {"full": 1}, "plan.placements['full'] is {14}"),  # type: ignore
    ("placements-class-int", Plan(R, placements={2: (14,)}), {"full": 1}, "plan.placements[2]"),  # type: ignore
    ("slot-str", Plan(R, placements={"full": ("14",)}), {"full": 1}, "a slot of plan.placements['full'] is '14'"),  # type: ignore
    ("slot-float", Plan(R, placements={"full": (14.0,)}), {"full": 1}, "placements['full'] is 14.0 (float)"),  # type: ignore
    ("slot-bool", Plan(R, placements={"full": (True,)}), {"full": 1}, "placements['full'] is True (bool)"),  # type: ignore
    ("slot-none", Plan(R, placements={"full": (14, None)}), {"full": 2}, "placements['full'] is None"),  # type: ignore
    ("bytes-moved-none", Plan(R, placements={"full": (14,)}, bytes_moved=None), {"full": 1},  # type: ignore
     "plan.bytes_moved is None"),
    ("bytes-moved-float", Plan(C, (Move("full", 11, 14),), bytes_moved={2: 1.5}), {}, "plan.bytes_moved is {2: 1.5}"),  # type: ignore
    # malformed and breaking a later rule too (PLAN-SPAN, PLAN-MOVE-WRITER, PLAN-RUNG): the shape is named first
    ("first-span", Plan(X, spans={"window": (3.5, 5)}), {}, "plan.spans['window']"),  # type: ignore[dict-item]
    ("first-writer", Plan(C, (Move("full", 12, 14.0),)), {}, "plan.moves[0]"),  # type: ignore[arg-type]
    ("first-rung", Plan(1, (Move("full", 11, 14),)), {}, "plan.rung is 1"),  # type: ignore[arg-type]
]


def refused_shape(plan: object, demand: dict[str, int], field: str) -> None:
    a = world()
    refused(a, plan, demand, "PLAN-SHAPE", re.escape(field) + r".*; make it ")  # type: ignore[arg-type]
    check_all(a)


@pytest.mark.parametrize("plan, demand, field", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_malformed_shape_is_refused_first(plan: object, demand: dict[str, int], field: str) -> None:
    refused_shape(plan, demand, field)


def test_shapes_next_to_the_malformed_ones_are_accepted(a: Arena) -> None:
    """Lists where tuples are expected, and NONE with empty entries, are well formed: the stage is not too strong."""
    accepted(a, Plan(C, [Move("full", 11, 14)]), {})  # type: ignore[arg-type]
    accepted(a, Plan(R, placements={"full": [14]}), {"full": 1})  # type: ignore[dict-item]
    accepted(a, Plan(X, spans={"window": [2, 5]}), {})  # type: ignore[dict-item]
    accepted(a, Plan(N, placements={"full": ()}), {})
    accepted(a, Plan(C, (Move("full", 11, 14),), bytes_moved={2: 256}), {})


def test_none_places_nothing(a: Arena) -> None:
    """The rung table: NONE places nothing (nor moves, nor retargets: test_rung). Its pages would count as rung 0."""
    refused(a, Plan(N, placements={"full": (14,)}), {"full": 1}, "PLAN-RUNG", "rung NONE places 1 pages")
    refused(a, Plan(N, placements={"full": (), "window": (1,)}), {"window": 1}, "PLAN-RUNG", "NONE places nothing")


# The same malformed plans from a policy, through the arena (the issue's reproducers), and policies that crash.
def _issue_arena(policy: Ladder | None = None) -> Arena:
    a = Arena(ArenaConfig(preset("toy-tri"), 4096, page_size=4, max_context_len=8))
    a.admit("o", {"full": 2, "state": 1})  # a state to keep bit-identical; the window float stays empty
    if policy is not None:
        a.policy = policy
    return a


def _raise(exc: Exception) -> Plan:
    raise exc


# (id, the policy's plan from the ladder's plan ``p`` for {"full": 1}, the rule, the text the message names)
ADMIT_SHAPES: list[tuple[str, Callable[[Plan], object], str, str]] = [
    ("rung-7", lambda p: Plan(7, (), p.placements), "PLAN-SHAPE", "plan.rung is 7"),  # type: ignore[arg-type]
    ("rung-str", lambda p: Plan("1", (), p.placements), "PLAN-SHAPE", "plan.rung is '1'"),  # type: ignore
    ("rung-int", lambda p: Plan(1, (), p.placements), "PLAN-SHAPE", "plan.rung is 1 (int)"),  # type: ignore
    ("rung-bool", lambda p: Plan(True, (), p.placements), "PLAN-SHAPE", "plan.rung is True"),  # type: ignore
    ("none-places", lambda p: Plan(N, (), p.placements), "PLAN-RUNG", "rung NONE places"),
    ("span-float", lambda p: Plan(X, (), p.placements, spans={"window": (1.5, 3)}), "PLAN-SHAPE",  # type: ignore
     "plan.spans['window'] is (1.5, 3)"),
    ("plan-none", lambda p: None, "PLAN-SHAPE", "the plan is None"),
    ("plan-dict", lambda p: {"rung": 1, "placements": p.placements}, "PLAN-SHAPE", "the plan is {"),
    ("slots-str", lambda p: Plan(p.rung, (), {c: tuple(map(str, s)) for c, s in p.placements.items()}), "PLAN-SHAPE",
     "a slot of plan.placements['full'] is '13'"),  # type: ignore[misc]
    ("move-tuple", lambda p: Plan(C, (("full", 14, 13),), p.placements), "PLAN-SHAPE", "plan.moves[0] is ("),  # type: ignore
    ("moves-none", lambda p: Plan(C, None, p.placements), "PLAN-SHAPE", "plan.moves is None"),  # type: ignore
    ("raises-key", lambda p: _raise(KeyError("no such band")), "PLAN-SHAPE", "the policy raised KeyError"),
    ("raises-type", lambda p: _raise(TypeError("bad")), "PLAN-SHAPE", "the policy raised TypeError: bad in plan()"),
]


class _ShapePolicy(Ladder):
    """A policy whose admission plan (``hook="plan"``) or free-time plan (``"after_free"``) is case ``case`` of
    ADMIT_SHAPES / FREE_SHAPES applied to the ladder's plan (for a free: of one full page). Named by its case, not
    holding the lambda, so the arena stays picklable (the bit-identity check)."""

    name = "shape"

    def __init__(self, hook: str, case: str) -> None:
        self.hook, self.case = hook, case

    def _make(self, p: Plan) -> Plan:
        table = ADMIT_SHAPES if self.hook == "plan" else FREE_SHAPES
        return next(make for i, make, _, _ in table if i == self.case)(p)  # type: ignore[return-value]

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        p = arena.ladder(demand)
        return self._make(p) if self.hook == "plan" else p

    def after_free(self, arena: Arena) -> Plan | None:
        return self._make(arena.ladder({"full": 1})) if self.hook == "after_free" else None


def _refused_by_arena(a: Arena, call: Callable[[], object], rule: str, field: str) -> PlanError:
    before, snap = pickle.dumps(a), a.snapshot()
    with pytest.raises(PlanError) as info:
        call()
    err = info.value
    assert (err.rule, err.inv) == (rule, RULES[rule]) and field in str(err), err
    assert a.snapshot() == snap and pickle.dumps(a) == before, "a refused plan changed the state"
    check_all(a)
    return err


def admit_refused(case: str, rule: str, field: str) -> None:
    a = _issue_arena(_ShapePolicy("plan", case))
    err = _refused_by_arena(a, lambda: a.admit("r", {"full": 1}), rule, field)
    if "policy raised" in field:  # the policy's own crash is the cause, and the message says where it raised
        assert isinstance(err.__cause__, (KeyError, TypeError)) and "in _raise: raise exc" in str(err), err
    a.policy = Ladder()
    a.admit("r", {"full": 1})  # nothing was left behind: the same admission goes through
    check_all(a)


@pytest.mark.parametrize("case, rule, field", [(s[0], *s[2:]) for s in ADMIT_SHAPES], ids=[s[0] for s in ADMIT_SHAPES])
def test_a_policys_malformed_plan_is_refused_untouched(case: str, rule: str, field: str) -> None:
    admit_refused(case, rule, field)


# (id, the free-time plan from the ladder's plan ``p`` of one full page, the rule, the text the message names)
FREE_SHAPES: list[tuple[str, Callable[[Plan], object], str, str]] = [
    ("raises-key", lambda p: _raise(KeyError("x")), "PLAN-SHAPE", "the policy raised KeyError: 'x' in after_free()"),
    ("raises-type", lambda p: _raise(TypeError("t")), "PLAN-SHAPE", "the policy raised TypeError"),
    ("returns-int", lambda p: 5, "PLAN-SHAPE", "the plan is 5 (int)"),
    ("returns-dict", lambda p: {"moves": ()}, "PLAN-SHAPE", "the plan is {'moves': ()} (dict)"),
    ("returns-str", lambda p: "compact", "PLAN-SHAPE", "the plan is 'compact' (str)"),
    ("moves-none", lambda p: Plan(C, None), "PLAN-SHAPE", "plan.moves is None"),  # type: ignore[arg-type]
    ("move-tuple", lambda p: Plan(C, (("full", 15, 14),)), "PLAN-SHAPE", "plan.moves[0] is ("),  # type: ignore
    ("rung-7", lambda p: Plan(7), "PLAN-SHAPE", "plan.rung is 7"),  # type: ignore[arg-type]
    ("span-float", lambda p: Plan(X, spans={"window": (1.5, 3)}), "PLAN-SHAPE", "plan.spans['window']"),  # type: ignore
    ("none-places", lambda p: Plan(N, (), p.placements), "PLAN-RUNG", "rung NONE places"),
]


def free_refused(case: str, rule: str, field: str, op: str) -> None:
    a = _issue_arena()
    x = a.admit("x", {"full": 2, "window": 1}).pages
    a.policy = _ShapePolicy("after_free", case)
    call = {"drop": lambda: a.drop("x", [x["full"][0]]), "free": lambda: a.free("x"),
            "slide": lambda: a.slide("x", "window", 1)}[op]
    err = _refused_by_arena(a, call, rule, field)
    if "policy raised" in field:
        assert isinstance(err.__cause__, (KeyError, TypeError)), err
    a.policy = Ladder()
    call()  # the free itself was fine: with a hook that plans nothing it goes through
    check_all(a)


@pytest.mark.parametrize("op", ["drop", "slide", "free"])
@pytest.mark.parametrize("case, rule, field", [(s[0], *s[2:]) for s in FREE_SHAPES], ids=[s[0] for s in FREE_SHAPES])
def test_a_malformed_free_time_plan_undoes_the_free(case: str, rule: str, field: str, op: str) -> None:
    free_refused(case, rule, field, op)


def shape_checks() -> list[tuple[str, Callable[[], None]]]:
    """Every PLAN-SHAPE case above as (id, check): tests/quality/test_mutants.py runs them on planted bugs."""
    out: list[tuple[str, Callable[[], None]]] = []
    out += [(f"validate-{i}", lambda p=p, d=d, f=f: refused_shape(p, d, f)) for i, p, d, f in SHAPES]
    out += [(f"admit-{i}", lambda i=i, r=r, f=f: admit_refused(i, r, f)) for i, _, r, f in ADMIT_SHAPES]
    out += [(f"free-{i}", lambda i=i, r=r, f=f: free_refused(i, r, f, "free")) for i, _, r, f in FREE_SHAPES]
    return out
