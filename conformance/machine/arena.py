"""The stateful conformance machine (spec/arena.md §Invariants; Hypothesis ``RuleBasedStateMachine``).

Drives an arena through admit / extend / share / drop / slide / free / ledger
acquire / release / compact / relayout / write, plus every error path, and after
every step checks each invariant predicate and that every virtual page reads
back exactly what was last written to each of its rows.  Error-path rules assert
the typed error *and* that the state is bit-identical afterwards.

``machine_for(factory)`` builds the machine over any constructor with the
reference's API, which is how planted-bug variants are run (tests/quality).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvarena.conformance.adapter.protocol import features
from kvarena.conformance.machine.below import toward
from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.policy import POLICIES, BestFit, FullCompaction
from kvarena.spec.errors import (
    AdmissionRejectedError,
    ArenaError,
    CapacityTooSmallError,
    DoubleFreeError,
    InvalidArgumentError,
    InvariantViolation,
    ReleaseWithoutAcquireError,
    UnknownPageError,
)
from kvarena.spec.layout import Kind, entries_per_page
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

TOYS = ["toy-tri", "toy-tri", "toy-swa", "toy-state"]  # floats only exist in toy-tri: weight it
# Chains with two floats, or a window low end beside a window float: the machine's ``chains`` variant draws them
# (``lockstep_for(..., chains=True)`` / ``machine_for(..., chains=True)``); TOYS stays as it is, so the derandomized
# examples every budget in tests/ was measured on stay the same.
CHAIN_TOYS = ["toy-two-float", "toy-win-float"]
CACHE = "cache"  # the prefix cache: an owner like any request
# the shipped policies that plan rung 1 through Arena.ladder's limit (exact types: full-compaction and best-fit
# ignore it, documented; a caller's own policy need not honour it, so check-policy does not hold it to the order)
HONOURS_BELOW = frozenset(type(make()) for make in POLICIES.values()) - {FullCompaction, BestFit}


class ArenaMachine(RuleBasedStateMachine):
    """One arena plus a shadow of what each page's rows must read back."""

    factory: Callable[[ArenaConfig], Arena] = Arena

    def __init__(self) -> None:
        super().__init__()
        self.arena: Arena | None = None
        self.requests: list[str] = []
        self.users: list[str] = []
        self.expected: dict[int, dict[tuple[int, int], int]] = {}  # vid -> {(entry, row): tag}
        self.serial = 0

    # -- setup --------------------------------------------------------------------------------
    @initialize(model=st.sampled_from(TOYS), extra=st.integers(0, 12), page_size=st.sampled_from([2, 4]))
    def setup(self, model: str, extra: int, page_size: int) -> None:
        spec = preset(model)
        capacity = 2400 + 128 * extra
        while True:  # the smallest capacity >= the drawn one that passes the feasibility floor
            try:
                self.arena = type(self).factory(ArenaConfig(spec, capacity, page_size=page_size,
                                                            max_context_len=16))
                break
            except CapacityTooSmallError:
                capacity += 256

    # -- helpers ------------------------------------------------------------------------------
    @property
    def a(self) -> Arena:
        assert self.arena is not None
        return self.arena

    def _name(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def _forget(self, freed: list[int]) -> None:
        for v in freed:
            self.expected.pop(v, None)

    def _state(self, cls: str) -> bool:
        return self.a.classes[cls].kind is Kind.RECURRENT

    def _room(self, cls: str, hi: int, owner: str | None = None) -> int:
        """At most ``hi`` pages; of the recurrent class, at most what the owner may still hold."""
        if not self._state(cls):
            return hi
        have = len(self.a.held(owner)[cls]) if owner is not None and owner in self.a.owners else 0
        return max(0, min(hi, self.a.config.recurrent_slots - have))

    def _demand(self, data: st.DataObject, hi: int, owner: str | None = None) -> dict[str, int]:
        return {c: data.draw(st.integers(0, self._room(c, hi, owner)), label=f"pages[{c}]") for c in self.a.order}

    def _bound(self) -> list[int]:
        return sorted(self.a.v2p)

    def _shareable(self) -> list[int]:
        """Bound token pages (recurrent state is one owner's: copied, never shared)."""
        return [v for v in self._bound() if not self._state(self.a.v2p[v][0])]

    def _rejected_unchanged(self, before: bytes, err: ArenaError) -> None:
        if pickle.dumps(self.a) != before:  # the machine's own check of the ID, on every refusal it makes
            raise InvariantViolation("INV-REFUSAL-IS-NOOP", f"{type(err).__name__} changed the state: {err}")

    # -- admission ------------------------------------------------------------------------------
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        demand = self._demand(data, 3)
        bound = self._shareable()
        shared = data.draw(st.lists(st.sampled_from(bound), max_size=2, unique=True), label="shared") \
            if bound else []
        owner = self._name("r")
        before = pickle.dumps(self.a)
        try:
            got = self.a.admit(owner, demand, shared)
        except AdmissionRejectedError as e:
            assert e.shortfall and e.shortfall_bytes > 0, f"rejection without a shortfall: {e}"
            self._rejected_unchanged(before, e)
            return
        self.requests.append(owner)
        for c, n in demand.items():
            assert len(got.pages.get(c, ())) == n, f"admit gave {got.pages} for {demand}"
        if got.plan.rung == 1:
            assert not got.plan.moves, "rung 1 (reuse in place) must move nothing"

    @rule(k=st.integers(2, 6), pages=st.integers(1, 2))
    def churn(self, k: int, pages: int) -> None:
        """Admit k small requests, then free every other one: holes in every band (feeds rungs 2-3)."""
        made = []
        for _ in range(k):
            owner = self._name("c")
            try:
                self.a.admit(owner, {c: self._room(c, pages) for c in self.a.order})
            except AdmissionRejectedError:
                break
            made.append(owner)
        for owner in made[::2]:
            self._forget(self.a.free(owner))
        self.requests.extend(made[1::2])

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        demand = self._demand(data, 2, owner)
        before = pickle.dumps(self.a)
        try:
            self.a.extend(owner, demand)
        except AdmissionRejectedError as e:
            self._rejected_unchanged(before, e)

    @precondition(lambda self: "below" in features(self.a))
    @rule(data=st.data(), grow=st.booleans())
    def admit_below(self, data: st.DataObject, grow: bool) -> None:
        """admit / extend with a placement limit (spec §Placement limit): rung 1 takes each limited band's holes
        nearest the limit on its anchor side first; a malformed limit is refused with the state unchanged."""
        grow = grow and bool(self.requests)
        owner = data.draw(st.sampled_from(self.requests), label="owner") if grow else self._name("r")
        demand = self._demand(data, 2 if grow else 3, owner if grow else None)
        low, high = self.a.order[0], self.a.order[-1]
        cap = self.a.capacity
        if data.draw(st.integers(0, 7), label="bad") == 0:
            bad = data.draw(st.sampled_from([{"nope": 0}, {low: True}, {high: -1}, {low: cap + 1}, {high: 1.5},
                                             [(low, 0)], low, *({f: 0} for f in self.a.order[1:-1])]), label="below")
            self._expect(InvalidArgumentError, lambda: self.a.extend(owner, demand, below=bad) if grow
                         else self.a.admit(owner, demand, below=bad))
            return
        below = {c: data.draw(st.integers(0, cap), label=f"below[{c}]") for c in (low, high)
                 if data.draw(st.booleans(), label=f"limit {c}")}
        holes = {c: list(self.a.bands[c].holes) for c in below}
        before = pickle.dumps(self.a)
        try:
            got = self.a.extend(owner, demand, below=below) if grow else self.a.admit(owner, demand, below=below)
        except AdmissionRejectedError as e:
            self._rejected_unchanged(before, e)
            return
        if not grow:
            self.requests.append(owner)
        if got.plan.rung == 1 and type(self.a.policy) in HONOURS_BELOW:
            for c, b in below.items():
                pb, n = self.a.bands[c].page_bytes, min(demand[c], len(holes[c]))
                want = toward(holes[c], b // pb if c == low else -(-b // pb), c == low, n)
                placed = list(got.plan.placements.get(c, ()))[:n]
                assert placed == want, f"below {below}: rung 1 put {c} at {placed}; the limit takes {want} of " \
                                       f"{holes[c]}"

    # -- ownership ------------------------------------------------------------------------------
    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def slide(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        cls = data.draw(st.sampled_from(self.a.order), label="cls")
        n = data.draw(st.integers(0, len(self.a.held(owner)[cls])), label="n")
        self._forget(self.a.slide(owner, cls, n))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        self.requests.remove(owner)
        self._forget(self.a.free(owner))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def drop_some(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        mine = [v for vs in self.a.held(owner).values() for v in vs]
        if mine:
            vids = data.draw(st.lists(st.sampled_from(mine), min_size=1, max_size=2, unique=True), label="vids")
            self._forget(self.a.drop(owner, vids))

    @precondition(lambda self: self.a.v2p)
    @rule(data=st.data())
    def cache_insert(self, data: st.DataObject) -> None:
        held = set(v for vs in self.a.held(CACHE).values() for v in vs) if CACHE in self.a.owners else set()
        fresh = [v for v in self._shareable() if v not in held]
        if fresh:
            self.a.share(CACHE, data.draw(st.lists(st.sampled_from(fresh), min_size=1, max_size=3, unique=True)))

    @precondition(lambda self: CACHE in self.a.owners)
    @rule(data=st.data())
    def cache_evict(self, data: st.DataObject) -> None:
        held = [v for vs in self.a.held(CACHE).values() for v in vs]
        if held:
            self._forget(self.a.drop(CACHE, data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True))))

    @precondition(lambda self: any(self._state(c) for c, _ in self.a.v2p.values()))
    @rule(data=st.data(), new_owner=st.booleans())
    def copy_state(self, data: st.DataObject, new_owner: bool) -> None:
        """Prefix caching of recurrent state: a copy for a cache node (a new owner) or for a request that has a
        free slot; the copy reads back every row of the source, the source keeps its own."""
        src = data.draw(st.sampled_from([v for v in self._bound() if self._state(self.a.v2p[v][0])]), label="src")
        cls = self.a.v2p[src][0]
        roomy = [o for o in self.requests if self._room(cls, 1, o)]
        owner = self._name("node") if new_owner or not roomy else data.draw(st.sampled_from(roomy), label="owner")
        before = pickle.dumps(self.a)
        try:
            vid = self.a.copy_state(owner, src)
        except AdmissionRejectedError as e:
            self._rejected_unchanged(before, e)
            return
        if owner not in self.requests:
            self.requests.append(owner)
        assert self.a.v2p[vid][0] == cls and self.a.held(owner)[cls][-1] == vid, f"copy {vid} of {src} misplaced"
        if src in self.expected:
            self.expected[vid] = dict(self.expected[src])

    # -- ledger ---------------------------------------------------------------------------------
    @precondition(lambda self: self.a.v2p)
    @rule(data=st.data(), kind=st.sampled_from(list(UserKind)))
    def acquire(self, data: st.DataObject, kind: UserKind) -> None:
        # class first, then its pages: small bands (a float) get users as often as big ones
        classes = sorted({c for c, _ in self.a.v2p.values()})
        cls = data.draw(st.sampled_from(classes), label="cls")
        pool = [v for v in self._bound() if self.a.v2p[v][0] == cls]
        vids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True), label="vids")
        user = self._name("u")
        self.a.acquire(user, kind, vids)
        self.users.append(user)

    @precondition(lambda self: self.users)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        user = data.draw(st.sampled_from(self.users), label="user")
        self.users.remove(user)
        self.a.release(user)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), kind=st.sampled_from(list(UserKind)), relayout=st.booleans(), release=st.booleans())
    def moves_under_users(self, data: st.DataObject, kind: UserKind, relayout: bool, release: bool) -> None:
        """A ledger user of any kind (forward pass, host-cache copy, network transfer) holds one request's
        pages while the arena compacts or relayouts (sglang #39982 move gates, #37507 transfers)."""
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        vids = [v for vs in self.a.held(owner).values() for v in vs]
        if not vids:
            return
        user = self._name("fwd")
        self.a.acquire(user, kind, vids)
        if relayout:
            demand = {c: data.draw(st.integers(0, 2), label=f"pages[{c}]") for c in self.a.order}
            before = pickle.dumps(self.a)
            try:
                self.a.relayout(demand)
            except (AdmissionRejectedError, InvalidArgumentError) as e:
                self._rejected_unchanged(before, e)
        else:
            self.a.compact()
        if release:
            self.a.release(user)
        else:
            self.users.append(user)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), kind=st.sampled_from(list(UserKind)))
    def shared_withheld(self, data: st.DataObject, kind: UserKind) -> None:
        """Two users hold one page, its owner lets go, one user releases: the slot stays withheld
        until the last user releases."""
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        mine = [v for vs in self.a.held(owner).values() for v in vs]
        if not mine:
            return
        vid = data.draw(st.sampled_from(mine), label="vid")
        first, second = self._name("u"), self._name("u")
        self.a.acquire(first, kind, [vid])
        self.a.acquire(second, UserKind.FORWARD_READ, [vid])
        self._forget(self.a.drop(owner, [vid]))
        self.a.release(first)
        self.users.append(second)

    # -- moves ----------------------------------------------------------------------------------
    @rule(max_moves=st.one_of(st.none(), st.integers(0, 3)))
    def compact(self, max_moves: int | None) -> None:
        plan = self.a.compact(max_moves)
        if max_moves is not None:
            assert len(plan.moves) <= max_moves, f"compact({max_moves}) moved {len(plan.moves)} pages"

    @rule(data=st.data())
    def relayout(self, data: st.DataObject) -> None:
        # mostly end-band demand: that is what pushes a float band around
        demand = self._demand(data, 2)
        if data.draw(st.booleans(), label="ends_only"):
            demand = {c: (data.draw(st.integers(1, 6), label="end_pages") if c in (self.a.order[0], self.a.order[-1])
                          else 0) for c in self.a.order}
        before = pickle.dumps(self.a)
        try:
            self.a.relayout(demand)
        except (AdmissionRejectedError, InvalidArgumentError) as e:  # no room, or more than fits at all
            self._rejected_unchanged(before, e)

    # -- data -----------------------------------------------------------------------------------
    @precondition(lambda self: self.a.v2p)
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        vid = data.draw(st.sampled_from(self._bound()), label="vid")
        cls = self.a.v2p[vid][0]
        entry = data.draw(st.integers(0, entries_per_page(self.a.classes[cls], self.a.config.page_size) - 1))
        row = data.draw(st.integers(0, len(self.a.layouts[cls].slots) - 1))
        self.serial += 1
        tag = self.serial  # unique per write: differs per layer, row and page
        self.a.write(vid, entry, row, tag)
        self.expected.setdefault(vid, {})[(entry, row)] = tag

    @precondition(lambda self: self.a.v2p)
    @rule(data=st.data())
    def write_page(self, data: st.DataObject) -> None:
        """Write every row of every entry of one page: a different tag per layer, row and page."""
        vid = data.draw(st.sampled_from(self._bound()), label="vid")
        cls = self.a.v2p[vid][0]
        for entry in range(entries_per_page(self.a.classes[cls], self.a.config.page_size)):
            for row in range(len(self.a.layouts[cls].slots)):
                self.serial += 1
                self.a.write(vid, entry, row, self.serial)
                self.expected.setdefault(vid, {})[(entry, row)] = self.serial

    # -- error paths: typed error, state bit-identical ------------------------------------------
    def _expect(self, err: type[ArenaError], fn: Callable[[], object]) -> None:
        before = pickle.dumps(self.a)
        try:
            fn()
        except err as e:
            assert e.message, "errors must say what to do"
            self._rejected_unchanged(before, e)
        except ArenaError as e:  # another refusal: the argument check it skipped is the bug (ERROR-CONTRACT)
            raise AssertionError(f"expected {err.__name__}, the operation raised {type(e).__name__}: {e}") from e
        else:
            raise AssertionError(f"expected {err.__name__}, the operation succeeded")

    @precondition(lambda self: len(self.requests) >= 1 and self.a.v2p)
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(self.requests), label="owner")
        mine = {v for vs in self.a.held(owner).values() for v in vs}
        others = [v for v in self._bound() if v not in mine]
        if others:
            vid = data.draw(st.sampled_from(others), label="not_held")
            self._expect(DoubleFreeError, lambda: self.a.drop(owner, [vid]))

    @rule()
    def release_unknown(self) -> None:
        self._expect(ReleaseWithoutAcquireError, lambda: self.a.release("never-acquired"))

    @rule(vid=st.integers(-3, 200))
    def unknown_page(self, vid: int) -> None:
        if vid not in self.a.v2p:
            self._expect(UnknownPageError, lambda: self.a.acquire("u-bad", UserKind.NET_SEND, [vid]))

    @precondition(lambda self: any(self._state(c) for c, _ in self.a.v2p.values()))
    @rule(data=st.data(), how=st.sampled_from(["share", "admit-shared", "over-cap"]))
    def state_refusals(self, data: st.DataObject, how: str) -> None:
        """Recurrent state is never shared, and no owner holds more than recurrent_slots of it."""
        src = data.draw(st.sampled_from([v for v in self._bound() if self._state(self.a.v2p[v][0])]), label="src")
        cls = self.a.v2p[src][0]
        if how == "share":
            self._expect(InvalidArgumentError, lambda: self.a.share(CACHE, [src]))
        elif how == "admit-shared":
            self._expect(InvalidArgumentError, lambda: self.a.admit("r-bad", {}, [src]))
        else:
            self._expect(InvalidArgumentError,
                         lambda: self.a.admit("r-bad", {cls: self.a.config.recurrent_slots + 1}))

    @rule(bad=st.sampled_from([True, False, 0.0, 1.0, 2.5]), op=st.sampled_from(["drop", "share", "acquire",
                                                                                 "read", "translate", "copy"]))
    def non_int_vid(self, bad: object, op: str) -> None:
        """A bool or a float is never a virtual id (True hashes like 1): refused, nothing changes."""
        owner = self.requests[0] if self.requests else "ghost"
        calls = {"drop": lambda: self.a.drop(owner, [bad]), "share": lambda: self.a.share(CACHE, [bad]),
                 "acquire": lambda: self.a.acquire("u-bad", UserKind.FORWARD_READ, [bad]),
                 "read": lambda: self.a.read(bad, 0, 0), "translate": lambda: self.a.translate(bad),
                 "copy": lambda: self.a.copy_state("node-bad", bad)}
        if op == "drop" and not self.requests:
            return  # (an unknown owner is refused first)
        self._expect(InvalidArgumentError, calls[op])

    @rule()
    def acquire_nothing(self) -> None:
        self._expect(InvalidArgumentError, lambda: self.a.acquire("u-empty", UserKind.FORWARD_READ, []))

    @rule(n=st.integers(-3, -1))
    def negative_demand(self, n: int) -> None:
        self._expect(InvalidArgumentError, lambda: self.a.admit("r-bad", {self.a.order[0]: n}))

    # -- after every step (Hypothesis runs invariants in name order: the named predicates first) ----------
    @invariant()
    def all_invariants_hold(self) -> None:
        if self.arena is not None:
            check_all(self.arena)

    @invariant()
    def data_reads_back(self) -> None:
        if self.arena is None:
            return
        for vid, rows in self.expected.items():
            assert vid in self.a.v2p, f"page {vid} has expected data but is not bound"
            for (entry, row), tag in rows.items():
                got = self.a.read(vid, entry, row)
                assert got == tag, f"page {vid} entry {entry} row {row} reads {got}, last written {tag}"
        for vid, (cls, _slot) in self.a.v2p.items():
            if self.a.classes[cls].kind is Kind.RECURRENT and vid not in self.expected:
                assert self.a.read(vid, 0, 0) == 0, f"new recurrent slot {vid} is not zeroed"


class ChainArenaMachine(ArenaMachine):
    """The same machine on the chain toys: two float bands, or a window low end beside a window float."""

    @initialize(model=st.sampled_from(CHAIN_TOYS), extra=st.integers(0, 12), page_size=st.sampled_from([2, 4]))
    def setup(self, model: str, extra: int, page_size: int) -> None:
        super().setup(model, extra, page_size)


def machine_for(factory: Callable[[ArenaConfig], Arena], name: str = "ArenaMachine",
                chains: bool = False) -> type[ArenaMachine]:
    """The machine over another constructor with the reference's API (a mutant, a wrapper); ``chains``: on the
    chain toys (CHAIN_TOYS)."""
    return type(name, (ChainArenaMachine if chains else ArenaMachine,), {"factory": staticmethod(factory)})
