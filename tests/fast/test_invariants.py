"""Each invariant predicate catches the corruption it exists for (spec/arena.md §Invariants).

Every ``test_<inv>_detects`` builds a valid arena through the public API, checks that the
predicate accepts it, corrupts the state directly the way the invariant rules out, and asserts
an ``InvariantViolation`` whose ``.inv`` is the invariant's ID.  The spec's traceability table
links to these function names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from kvarena.reference.arena import Arena, User
from kvarena.reference.invariants import (
    INVARIANTS,
    check_all,
    check_band_order,
    check_conservation,
    check_content_follows_vid,
    check_feasibility_floor,
    check_ledger,
    check_no_overlap,
    check_page_atomic,
    check_refusal_is_noop,
    check_vmap,
)
from kvarena.reference.split import SplitPools
from kvarena.spec.errors import CapacityTooSmallError, InvalidArgumentError, InvariantViolation
from kvarena.spec.layout import entries_per_page
from kvarena.spec.models import PRESETS, ArenaConfig, GiB, chain, preset, worst_case_demand
from kvarena.spec.types import UserKind

CAP = 4096
PS = 4


def make(model: str = "toy-tri", cls: type[Arena] = Arena, capacity: int = CAP) -> Arena:
    # one owner's state pages are low-band filler here (the predicates are the subject, not the recurrent cap)
    return cls(ArenaConfig(preset(model), capacity=capacity, page_size=PS, max_context_len=16, recurrent_slots=64))


def populated(cls: type[Arena] = Arena, capacity: int = CAP, check: bool = True) -> tuple[Arena, dict]:
    """A valid arena with pages in every band, an interior hole, a reader, a writer, a withheld
    slot, a shared page and written content."""
    a = make(cls=cls, capacity=capacity)
    r = a.admit("r", {"state": 3, "window": 2, "full": 5}).pages
    a.share("cache", [r["full"][0]])
    a.drop("r", [r["full"][2]])  # interior hole in the full band
    a.acquire("rd", UserKind.FORWARD_READ, [r["full"][1]])
    a.acquire("wr", UserKind.FORWARD_WRITE, [r["window"][0]])
    a.acquire("snd", UserKind.NET_SEND, [r["full"][3]])
    a.drop("r", [r["full"][3]])  # withheld: freed while sent
    a.write(r["full"][0], 1, 2, 11)
    a.write(r["state"][0], 0, 1, 12)
    if check:
        check_all(a)
    return a, r


def expect(check: Callable[[Arena], None], a: Arena, inv: str, match: str | None = None) -> None:
    with pytest.raises(InvariantViolation, match=match) as exc:
        check(a)
    assert exc.value.inv == inv
    assert str(exc.value).startswith(f"{inv}: ")
    assert INVARIANTS[inv] is check


def test_invariant_ids() -> None:
    assert list(INVARIANTS) == ["INV-NO-OVERLAP", "INV-BAND-ORDER", "INV-LEDGER-SAFETY", "INV-PAGE-ATOMIC",
                                "INV-VMAP-BIJECTIVE", "INV-CONTENT-FOLLOWS-VID", "INV-BYTE-CONSERVATION",
                                "INV-FEASIBILITY-FLOOR", "INV-STATE-PRIVATE", "INV-REFUSAL-IS-NOOP"]


def test_no_overlap_detects() -> None:
    """INV-NO-OVERLAP: live / hole / withheld partition each span; bands are disjoint in bytes."""
    a, r = populated()
    slot = a.translate(r["full"][4])[1]
    a.bands["full"].holes.add(slot)  # a live slot that is also a hole
    expect(check_no_overlap, a, "INV-NO-OVERLAP")

    a, r = populated()
    a.bands["full"].hi -= 1  # the span no longer covers the top live slot
    expect(check_no_overlap, a, "INV-NO-OVERLAP")

    a, r = populated()
    w = a.bands["window"]  # the float slides down onto the state band's bytes
    shift = w.lo
    w.live = {s - shift: v for s, v in w.live.items()}
    w.lo, w.hi = 0, w.hi - shift
    expect(check_no_overlap, a, "INV-NO-OVERLAP")


def test_band_order_detects() -> None:
    """INV-BAND-ORDER: non-empty spans follow the chain order; the end bands sit on their anchors."""
    a, _r = populated()
    s = a.bands["state"]  # the low band leaves byte 0: its pages shift one slot up
    s.live = {slot + 1: v for slot, v in s.live.items()}
    s.lo, s.hi = 1, s.hi + 1
    for slot, v in s.live.items():
        a.v2p[v] = ("state", slot)
    a.content = {(("state", k[1] + 1) if k[0] == "state" else k): d for k, d in a.content.items()}
    check_no_overlap(a)  # still a partition, still disjoint: only the anchoring is broken
    check_vmap(a)
    expect(check_band_order, a, "INV-BAND-ORDER", match="left their anchors")

    a, _r = populated()
    a.bands["full"].hi -= 1  # the high band leaves the top
    expect(check_band_order, a, "INV-BAND-ORDER")

    a, _r = populated()
    s = a.bands["state"]  # the low band reaches past the start of the float above it
    start = s.hi
    s.hi = a.bands["window"].lo_byte // s.page_bytes + 1
    s.holes.update(range(start, s.hi))
    expect(check_band_order, a, "INV-BAND-ORDER", match="above the start of window")


def test_ledger_safety_detects() -> None:
    """INV-LEDGER-SAFETY: a held page is never handed out again, never moves while written;
    withheld slots have users; use counts match the users."""
    a, r = populated()
    b = a.bands["full"]
    hole = next(iter(b.holes))
    b.holes.remove(hole)
    b.withheld.add(hole)  # withheld with no user
    expect(check_ledger, a, "INV-LEDGER-SAFETY")

    a, r = populated()
    b = a.bands["full"]
    wh = next(iter(b.withheld))
    b.withheld.remove(wh)
    b.holes.add(wh)  # a slot still being sent, handed back as a hole
    check_no_overlap(a)
    expect(check_ledger, a, "INV-LEDGER-SAFETY")

    a, r = populated()
    a.readers[("full", a.translate(r["full"][0])[1])] += 1  # a count with no user behind it
    expect(check_ledger, a, "INV-LEDGER-SAFETY")

    a, r = populated()
    v = r["window"][0]  # the written window page moves to a fresh slot above the float
    w = a.bands["window"]
    old = a.translate(v)[1]
    new = w.hi
    w.hi += 1
    w.live[new] = w.live.pop(old)
    w.withheld.add(old)  # the old slot is correctly withheld: only the move itself is wrong
    a.v2p[v] = ("window", new)
    expect(check_ledger, a, "INV-LEDGER-SAFETY", match="while user wr writes it")

    a, r = populated()
    slot = a.translate(r["full"][1])[1]  # the read slot is rebound to another allocation
    a.gen[r["full"][1]] += 1000
    assert a.bands["full"].live[slot] == r["full"][1]
    expect(check_ledger, a, "INV-LEDGER-SAFETY")


def test_page_atomic_detects() -> None:
    """INV-PAGE-ATOMIC: rows live, move and die with their page."""
    a, r = populated()
    hole = next(iter(a.bands["full"].holes))
    a.content[("full", hole)] = {(0, 0): 1}  # rows left behind at a hole
    expect(check_page_atomic, a, "INV-PAGE-ATOMIC")

    a, r = populated()
    a.content[a.translate(r["full"][0])] = {(0, 4): 1}  # row 4 of a 4-row layout
    expect(check_page_atomic, a, "INV-PAGE-ATOMIC")

    a, r = populated()
    a.content[a.translate(r["state"][0])] = {(1, 0): 1}  # entry 1 of a one-entry recurrent slot
    expect(check_page_atomic, a, "INV-PAGE-ATOMIC")


class ReadsNoneWhenUnwritten(Arena):
    """The old contract: an unwritten token row reads None instead of the zeroed page's 0."""

    def read(self, vid: int, entry: int, row: int) -> int | None:  # type: ignore[override]
        page = self._row_check(vid, entry, row)
        tag = self.content.get(page, {}).get((entry, row))
        return 0 if tag is None and self.classes[page[0]].kind.name == "RECURRENT" else tag


class ReadsTheNeighbour(Arena):
    """read looks one slot up from where v2p says the page is (a stale or off-by-one translation)."""

    def read(self, vid: int, entry: int, row: int) -> int:
        cls, slot = self._row_check(vid, entry, row)
        return self.content.get((cls, slot + 1), {}).get((entry, row), 0)


def test_content_follows_vid_detects() -> None:
    """INV-CONTENT-FOLLOWS-VID: content is reached through v2p; a hand-out reads 0; written rows read back."""
    a, _r = populated()
    check_content_follows_vid(a)
    hole = next(iter(a.bands["full"].holes))
    a.content[("full", hole)] = {(0, 0): 1}  # a freed page's rows stay for the next hand-out
    expect(check_content_follows_vid, a, "INV-CONTENT-FOLLOWS-VID", "no virtual page is bound")

    a, _r = populated()
    withheld = next(iter(a.bands["full"].withheld))
    a.content[("full", withheld)] = {(1, 1): 3}  # rows at a withheld slot, which no id translates to
    expect(check_content_follows_vid, a, "INV-CONTENT-FOLLOWS-VID", "no virtual page is bound")

    bad, _r = populated(ReadsNoneWhenUnwritten, check=False)
    expect(check_content_follows_vid, bad, "INV-CONTENT-FOLLOWS-VID", r"reads None, .*never written")

    bad, _r = populated(ReadsTheNeighbour, check=False)
    expect(check_content_follows_vid, bad, "INV-CONTENT-FOLLOWS-VID", "reads 0, its content is 1[12]")


def test_content_follows_vid_after_moves_and_reuse() -> None:
    """Fresh pages of every class read 0 in every row, also on a slot a written page of the class left;
    written rows follow their id through compaction."""
    a = make()
    r = a.admit("r", {"state": 2, "window": 2, "full": 4}).pages
    for c, vs in r.items():
        for i, v in enumerate(vs):
            a.write(v, 0, 0, 100 * i + len(c))
    a.drop("r", [r["full"][0], r["full"][1], r["window"][0]])
    kept = {v: a.read(v, 0, 0) for c in r for v in r[c] if v in a.v2p}
    a.compact()
    check_content_follows_vid(a)
    assert {v: a.read(v, 0, 0) for v in kept} == kept
    g = a.admit("s", {"state": 1, "window": 1, "full": 2}).pages
    for c, vs in g.items():
        n_e, n_r = entries_per_page(a.classes[c], PS), len(a.layouts[c].slots)
        for v in vs:
            assert {a.read(v, e, w) for e in range(n_e) for w in range(n_r)} == {0}, (c, v)
    check_all(a)


def test_vmap_bijective_detects() -> None:
    """INV-VMAP-BIJECTIVE: v->p and p->v are inverses; owned = bound; refs = owners."""
    a, r = populated()
    v1, v2 = r["full"][0], r["full"][4]
    a.v2p[v1], a.v2p[v2] = a.v2p[v2], a.v2p[v1]  # stale map
    expect(check_vmap, a, "INV-VMAP-BIJECTIVE")

    a, r = populated()
    a.refs[r["full"][4]] += 1  # a reference with no owner
    expect(check_vmap, a, "INV-VMAP-BIJECTIVE")

    a, r = populated()
    held = a.owners["r"]["full"]  # bound, unowned: a leak
    held.pop(r["full"][4]) if isinstance(held, dict) else held.remove(r["full"][4])
    del a.refs[r["full"][4]]
    expect(check_vmap, a, "INV-VMAP-BIJECTIVE")

    a, r = populated()
    a._free_vids.append(r["full"][4])  # an id both free and bound
    expect(check_vmap, a, "INV-VMAP-BIJECTIVE")

    a, r = populated()
    s = a.bands["state"]
    s.live[s.hi] = r["state"][0]  # one virtual page bound to two slots
    s.hi += 1
    expect(check_vmap, a, "INV-VMAP-BIJECTIVE")


def test_byte_conservation_detects() -> None:
    """INV-BYTE-CONSERVATION: capacity = live + withheld + holes + gaps + padding, all >= 0."""
    a, _r = populated()
    a.bands["full"].holes.add(0)  # a hole counted outside every span: bytes out of thin air
    expect(check_conservation, a, "INV-BYTE-CONSERVATION")

    a, _r = populated()
    w = a.bands["window"]  # the float overlaps the high band: a negative gap
    top_full = a.bands["full"].lo_byte // w.page_bytes
    w.holes.update(range(w.hi, top_full + 1))
    w.hi = top_full + 1
    expect(check_conservation, a, "INV-BYTE-CONSERVATION")


@pytest.mark.parametrize("query, wrong", [
    ("used_bytes", lambda a: sum(len(b.live) * b.page_bytes for b in a.bands.values())),  # withheld forgotten
    ("free_bytes", lambda a: a.capacity - sum(len(b.live) * b.page_bytes for b in a.bands.values())),
    ("gap_bytes", lambda a: a.bands["full"].lo_byte - a.bands["state"].hi_byte),  # the float's bytes as gap
])
def test_byte_conservation_detects_accounting_alone(query: str, wrong: Callable[[Arena], int]) -> None:
    """INV-BYTE-CONSERVATION on its own: the bands are sound (every other predicate passes), but an accounting
    query a scheduler reads disagrees with them. The first two corruptions above also break INV-NO-OVERLAP."""
    a, _r = populated()
    setattr(a, query, lambda: wrong(a))
    for inv, check in INVARIANTS.items():
        if inv not in ("INV-BYTE-CONSERVATION", "INV-REFUSAL-IS-NOOP"):  # (the probes read free_bytes too)
            check(a)
    expect(check_conservation, a, "INV-BYTE-CONSERVATION", rf"accounting disagrees .*'{query}\(\)'")


def closed_form_floor(config: ArenaConfig) -> bool:
    """spec/arena.md §The feasibility floor: by hand (one float at most)."""
    order = chain(config.model)
    d = worst_case_demand(config)
    P = {c.name: config.page_bytes(c.name) for c in order}
    low, high = order[0].name, order[-1].name
    L = d.get(low, 0) * P[low]
    H = (config.capacity // P[high] - d.get(high, 0)) * P[high]
    floats = [c.name for c in order[1:-1] if d.get(c.name, 0)]
    return L <= H and all(-(-L // P[f]) + d[f] <= H // P[f] for f in floats)


def test_feasibility_floor_closed_form() -> None:
    """The closed form equals the constructor's check (``place`` on the empty arena), on both sides of the floor."""
    seen = {True: 0, False: 0}
    configs = []
    for name in sorted(PRESETS):
        base = ArenaConfig(preset(name), capacity=GiB)
        need = floor_bytes(base)
        configs += [ArenaConfig(preset(name), capacity=c) for c in range(max(1, need - 2**21), need + 2**22, 2**18)]
    for name in ("toy-tri", "toy-swa", "toy-state"):
        for ps, ctx in ((2, 8), (4, 16), (4, 24), (8, 40)):
            configs += [ArenaConfig(preset(name), capacity=c, page_size=ps, max_context_len=ctx)
                        for c in range(256, 8192, 96)]
    for cfg in configs:
        try:
            Arena(cfg)
            real = True
        except CapacityTooSmallError:
            real = False
        assert closed_form_floor(cfg) is real, (cfg.model.name, cfg.capacity, cfg.page_size, cfg.context_len)
        seen[real] += 1
    assert seen[True] > 100 and seen[False] > 100
    # the spec's worked example: toy-tri, page_size 4, an 8-token context, at 2048 B and one byte less
    assert closed_form_floor(ArenaConfig(preset("toy-tri"), capacity=2048, page_size=4, max_context_len=8))
    assert not closed_form_floor(ArenaConfig(preset("toy-tri"), capacity=2047, page_size=4, max_context_len=8))


def test_feasibility_floor_detects() -> None:
    """INV-FEASIBILITY-FLOOR: an empty arena of this configuration holds one worst-case request."""
    a, _r = populated()
    check_feasibility_floor(a)
    a.config = dataclasses.replace(a.config, max_context_len=1024)  # 256 full pages on a 16-page grid
    expect(check_feasibility_floor, a, "INV-FEASIBILITY-FLOOR")

    s, _r = populated(SplitPools, 16384)
    check_feasibility_floor(s)
    full = s.bands["full"]
    need = worst_case_demand(s.config)["full"]
    full.lo = full.hi - (need - 1)  # the fixed full pool shrinks below one request
    expect(check_feasibility_floor, s, "INV-FEASIBILITY-FLOOR")


# =============================================================================================
# INV-REFUSAL-IS-NOOP: the predicate runs refusals, so the corruptions are arenas with a buggy operation


class FreeThenRefuse(Arena):
    """The free applies, then the free-time plan is refused without restoring it (the bug of issue 12)."""

    def _rollback(self, undo: tuple) -> None:
        pass


class DropsBeforeChecking(Arena):
    """drop lets go of the pages it can find, then checks the rest (a half-applied refusal)."""

    def drop(self, owner: str, vids):  # type: ignore[override]
        held = self._owner(owner)
        if any(v not in self.v2p for v in vids):
            for v in vids:
                if v in self.v2p:
                    held[self.v2p[v][0]].pop(v, None)
        return super().drop(owner, vids)


class AcquiresBeforeChecking(Arena):
    """acquire records the user, then validates the ids."""

    def acquire(self, user, kind, vids) -> None:  # type: ignore[override]
        if user not in self.users:
            self.users[user] = User(kind, ())  # recorded before the ids are checked
            if all(v in self.v2p for v in vids):
                del self.users[user]
        super().acquire(user, kind, vids)


class SlideAccepted(Arena):
    """slide of more pages than held drops what there is instead of refusing."""

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        return super().slide(owner, cls, min(n, len(self.owners[owner][cls])) if cls in self.bands else n)


class UntypedWrite(Arena):
    """write's bad index escapes as an IndexError, not an ArenaError."""

    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        if entry < 0:
            raise IndexError("entry")
        super().write(vid, entry, row, tag)


class PlanNotValidated(Arena):
    """admit applies the policy's plan without validating it."""

    def _plan_admission(self, demand: dict[str, int], limits: dict[str, int] | None = None):  # type: ignore[override]
        return self.policy.plan(self, demand) if demand else super()._plan_admission(demand, limits)


@pytest.mark.parametrize("cls, match", [
    (FreeThenRefuse, "refused free-time plan was refused but changed the state"),
    (DropsBeforeChecking, r"changed the observable state \(fields \['owners'\]\)"),
    (AcquiresBeforeChecking, r"acquire\(bound \+ unbound\) was refused but changed the state"),
    (SlideAccepted, r"slide\(one too many\) was not refused"),
    (UntypedWrite, "write\\(bad entry\\) raised IndexError"),
    (PlanNotValidated, "admit \\+ refused plan"),
])
def test_refusal_is_noop_detects(cls: type[Arena], match: str) -> None:
    """INV-REFUSAL-IS-NOOP: a raised ArenaError leaves the observable state unchanged."""
    good, _r = populated()
    check_refusal_is_noop(good)
    bad, _r = populated(cls, check=False)
    expect(check_refusal_is_noop, bad, "INV-REFUSAL-IS-NOOP", match)


def test_refusal_probes_leave_the_state_bit_identical() -> None:
    """The probes themselves change nothing, not even what the snapshot leaves out (pickle)."""
    import pickle

    for a in (populated()[0], populated(SplitPools, 16384)[0], make()):
        before = pickle.dumps(a)
        check_refusal_is_noop(a)
        assert pickle.dumps(a) == before
    with pytest.raises(InvalidArgumentError):
        populated()[0].slide("r", "full", 99)


# =============================================================================================
# Fresh arenas of every preset pass every invariant


def floor_bytes(config: ArenaConfig) -> int:
    return sum(n * config.page_bytes(c) for c, n in worst_case_demand(config).items())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fresh_presets_pass(name: str) -> None:
    model = preset(name)
    probe = ArenaConfig(model, capacity=GiB)
    capacity = max(100 * GiB, 4 * floor_bytes(probe))  # every preset's worst case is < 11 GiB
    assert capacity == 100 * GiB
    for cls in (Arena, SplitPools):
        a = cls(ArenaConfig(model, capacity=capacity))
        check_all(a)
        assert a.used_bytes() == 0 and a.free_bytes() == capacity
        # and after serving one worst-case request
        ad = a.admit("worst", worst_case_demand(a.config))
        assert ad.plan.moves == ()
        check_all(a)
        a.free("worst")
        check_all(a)


@pytest.mark.parametrize("name", ["toy-tri", "toy-swa", "toy-state"])
def test_fresh_toys_pass(name: str) -> None:
    check_all(make(name))
    check_all(make(name, SplitPools, 16384))


def test_populated_split_pools_pass() -> None:
    s, _r = populated(SplitPools, 16384)
    check_all(s)
