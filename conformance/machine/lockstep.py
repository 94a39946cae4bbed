"""Lockstep conformance: the reference and an implementation driven by one Hypothesis state machine.

Every rule draws an operation in handle terms (harness.py) from the reference's state, runs it on
both allocators through the :class:`~kvarena.conformance.machine.harness.Conductor`, and after every step
the level's checks run on the implementation:

``safety``     its observation satisfies the invariants (checks.py; plus
               ``kvarena.reference.invariants`` when it is Arena-like), every written row reads back,
               freed pages and error classes agree, a refused step leaves it unchanged
``decisions``  + the same admit / extend / relayout outcomes and shortfalls
``exact``      + the same virtual ids, v->p, spans, holes, withheld (and plans, if it returns them)

The operation alphabet (:data:`RULES`) is the one of ``conformance/machine/arena.py`` plus every error path,
and it is shared with the vector scenarios (scenarios.py), which draw from it with a seeded
``random.Random`` instead of Hypothesis.

    lockstep_for(factory, "decisions")           # a RuleBasedStateMachine class
    run_lockstep(factory, "exact", settings)     # raises Divergence (an AssertionError) on failure
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from kvarena.conformance.adapter.protocol import LEVELS
from kvarena.conformance.machine.below import bad_below, offers_below, random_below
from kvarena.conformance.machine.checks import Geometry
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import (
    CACHE,
    Divergence,
    LiveReference,
    Side,
    build,
    config_to_json,
    construct_pair,
)
from kvarena.spec.errors import ArenaError, CapacityTooSmallError
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

TOYS = ["toy-tri", "toy-tri", "toy-swa", "toy-state"]  # floats only exist in toy-tri: weight it
# Chains with two floats, or a window low end beside a window float: the machine's ``chains`` variant draws them
# (``lockstep_for(..., chains=True)`` / ``machine_for(..., chains=True)``); TOYS stays as it is, so the derandomized
# examples every budget in tests/ was measured on stay the same.
CHAIN_TOYS = ["toy-two-float", "toy-win-float"]
BAD_IDS = ({"vid": -1}, {"vid": -7}, {"vid": 2**31 - 1})  # never bound by any implementation
KINDS = [k.value for k in UserKind]


class Chooser(Protocol):
    """Where a rule's choices come from: Hypothesis (lockstep) or a seeded Random (vectors)."""

    def integer(self, lo: int, hi: int, label: str) -> int: ...
    def choice(self, seq: Sequence[Any], label: str) -> Any: ...
    def subset(self, seq: Sequence[Any], lo: int, hi: int, label: str) -> list: ...
    def boolean(self, label: str) -> bool: ...


class HypothesisChooser:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.data.draw(st.integers(lo, hi), label=label)

    def choice(self, seq: Sequence[Any], label: str) -> Any:
        return self.data.draw(st.sampled_from(list(seq)), label=label)

    def subset(self, seq: Sequence[Any], lo: int, hi: int, label: str) -> list:
        hi = min(hi, len(seq))
        if hi == 0:
            return []
        return self.data.draw(st.lists(st.sampled_from(list(seq)), min_size=min(lo, hi), max_size=hi, unique=True),
                              label=label)

    def boolean(self, label: str) -> bool:
        return self.data.draw(st.booleans(), label=label)


class RandomChooser:
    """Deterministic across Python versions: only randrange / random are used."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str) -> int:
        return lo + self.rng.randrange(hi - lo + 1)

    def choice(self, seq: Sequence[Any], label: str) -> Any:
        seq = list(seq)
        return seq[self.rng.randrange(len(seq))]

    def subset(self, seq: Sequence[Any], lo: int, hi: int, label: str) -> list:
        pool = list(seq)
        hi = min(hi, len(pool))
        k = self.integer(min(lo, hi), hi, label)
        return [pool.pop(self.rng.randrange(len(pool))) for _ in range(k)]

    def boolean(self, label: str) -> bool:
        return self.rng.random() < 0.5


# ---------------------------------------------------------------------------------------------
# Views of the state the rules draw from (the reference's, in handle terms)


def requests(c: Conductor) -> list[str]:
    return [o for o in c.oracle.owners() if o != CACHE]


def held_flat(c: Conductor, owner: str) -> list[int]:
    return [h for hs in c.oracle.held(owner).values() for h in hs]


def live(c: Conductor) -> list[int]:
    return c.oracle.live()


def bad_ids(c: Conductor) -> list[Any]:
    """Ids bound on neither side: never-bound raw ids, and (lockstep only) ids of freed handles."""
    out: list[Any] = list(BAD_IDS)
    if getattr(c, "allow_dead", True):
        ref_bound = c.oracle.arena.v2p
        imp_bound = c._obs.v2p if c.impl is not None and c._obs is not None else {}
        for h, v in sorted(c.oracle.h.dead_vid.items())[-4:]:
            if v in ref_bound:
                continue
            if c.impl is not None and (h not in c.impl.h.dead_vid or c.impl.h.dead_vid[h] in imp_bound):
                continue  # never bound there (an admission undone at safety), or its id is taken again
            out.append({"dead": h})
    return out


def is_state(c: Conductor, cls: str) -> bool:
    return c.oracle.arena.classes[cls].kind is Kind.RECURRENT


def room(c: Conductor, cls: str, hi: int, owner: str | None = None) -> int:
    """At most ``hi`` pages; of the recurrent class at most what ``owner`` may still hold (recurrent_slots)."""
    if not is_state(c, cls):
        return hi
    have = len(c.oracle.held(owner)[cls]) if owner is not None and owner in c.oracle.owners() else 0
    return max(0, min(hi, c.oracle.arena.config.recurrent_slots - have))


def shareable(c: Conductor) -> list[int]:
    """Live token pages: recurrent state is one owner's, copied (copy_state), never shared."""
    return [h for h in live(c) if not is_state(c, c.oracle.cls_of(h))]


def states(c: Conductor) -> list[int]:
    return [h for h in live(c) if is_state(c, c.oracle.cls_of(h))]


def _demand(c: Conductor, ch: Chooser, hi: int, owner: str | None = None) -> dict[str, int]:
    return {k: ch.integer(0, room(c, k, hi, owner), f"pages[{k}]") for k in c.order}


def _tag(c: Conductor) -> int:
    c.serial += 1
    return c.serial  # unique per write: differs per layer, row and page


# ---------------------------------------------------------------------------------------------
# The alphabet: each rule issues one or more steps through c.run


def r_admit(c: Conductor, ch: Chooser) -> None:
    demand = _demand(c, ch, 3)
    pages = shareable(c)
    shared = ch.subset(pages, 0, 2, "shared") if pages else []
    c.run("admit", owner=c.fresh("r"), demand=demand, shared=shared)


def r_churn(c: Conductor, ch: Chooser) -> None:
    """Admit k small requests, then free every other one: holes in every band (feeds rungs 2-3)."""
    k = ch.integer(2, 6, "k")
    pages = ch.integer(1, 2, "pages")
    made = []
    for _ in range(k):
        owner = c.fresh("c")
        if not c.run("admit", owner=owner, demand={k: room(c, k, pages) for k in c.order}, shared=[]).ok:
            break
        made.append(owner)
    for owner in made[::2]:
        c.run("free", owner=owner)


def r_squeeze(c: Conductor, ch: Chooser) -> None:
    """Fill one end with single pages, free every other, then grow the other end until it no longer fits:
    the holes left behind are only reachable by compaction (rung 2) or by moving a float (rung 3)."""
    first, second = (c.order[0], c.order[-1]) if ch.boolean("low_first") else (c.order[-1], c.order[0])
    made = []
    for _ in range(12):
        owner = c.fresh("q")
        if not c.run("admit", owner=owner, demand={first: 1}, shared=[]).ok:
            break
        made.append(owner)
    for owner in made[::2]:
        c.run("free", owner=owner)
    pages = room(c, second, ch.integer(1, 2, "pages"))
    for _ in range(12):
        if not c.run("admit", owner=c.fresh("q"), demand={second: pages}, shared=[]).ok:
            break


def r_extend(c: Conductor, ch: Chooser) -> None:
    owner = ch.choice(requests(c), "owner")
    c.run("extend", owner=owner, demand=_demand(c, ch, 2, owner))


def r_slide(c: Conductor, ch: Chooser) -> None:
    owner = ch.choice(requests(c), "owner")
    cls = ch.choice(c.order, "cls")
    c.run("slide", owner=owner, cls=cls, n=ch.integer(0, len(c.oracle.held(owner)[cls]), "n"))


def r_free(c: Conductor, ch: Chooser) -> None:
    c.run("free", owner=ch.choice(requests(c), "owner"))


def r_drop_some(c: Conductor, ch: Chooser) -> None:
    owner = ch.choice(requests(c), "owner")
    mine = held_flat(c, owner)
    if mine:
        c.run("drop", owner=owner, pages=ch.subset(mine, 1, 2, "pages"))


def r_cache_insert(c: Conductor, ch: Chooser) -> None:
    cached = set(held_flat(c, CACHE)) if CACHE in c.oracle.owners() else set()
    fresh = [h for h in shareable(c) if h not in cached]
    if fresh:
        c.run("share", owner=CACHE, pages=ch.subset(fresh, 1, 3, "pages"))


def r_cache_evict(c: Conductor, ch: Chooser) -> None:
    cached = held_flat(c, CACHE)
    if cached:
        c.run("drop", owner=CACHE, pages=ch.subset(cached, 1, len(cached), "pages"))


def r_acquire(c: Conductor, ch: Chooser) -> None:
    # class first, then its pages: small bands (a float) get users as often as big ones
    by_cls: dict[str, list[int]] = {}
    for h in live(c):
        by_cls.setdefault(c.oracle.cls_of(h), []).append(h)
    cls = ch.choice(sorted(by_cls), "cls")
    c.run("acquire", user=c.fresh("u"), kind=ch.choice(KINDS, "kind"), pages=ch.subset(by_cls[cls], 1, 3, "pages"))


def r_release(c: Conductor, ch: Chooser) -> None:
    c.run("release", user=ch.choice(list(c.users), "user"))


def r_moves_under_users(c: Conductor, ch: Chooser) -> None:
    """A ledger user of any kind (a forward pass, a host-cache save or load, a network send or receive) holds
    one request's pages while the arena compacts or relayouts (the races SGLang guards with move gates,
    sglang #39982, and that transfers hit, #37507)."""
    owner = ch.choice(requests(c), "owner")
    kind = ch.choice(KINDS, "kind")
    relayout = ch.boolean("relayout")
    release = ch.boolean("release")
    pages = held_flat(c, owner)
    if not pages:
        return
    user = c.fresh("fwd")
    c.run("acquire", user=user, kind=kind, pages=pages)
    if relayout:
        c.run("relayout", demand=_demand(c, ch, 2))
    else:
        c.run("compact", max_moves=None)
    if release:
        c.run("release", user=user)


def r_shared_withheld(c: Conductor, ch: Chooser) -> None:
    """Two users hold one page, its owner lets go, one user releases: the slot stays withheld until the
    last user releases (a first release must not free a slot another user still holds)."""
    owner = ch.choice(requests(c), "owner")
    mine = held_flat(c, owner)
    if not mine:
        return
    h = ch.choice(mine, "page")
    first, second = c.fresh("u"), c.fresh("u")
    c.run("acquire", user=first, kind=ch.choice(KINDS, "kind"), pages=[h])
    c.run("acquire", user=second, kind=UserKind.FORWARD_READ.value, pages=[h])
    c.run("drop", owner=owner, pages=[h])
    c.run("release", user=first)


def r_copy_state(c: Conductor, ch: Chooser) -> None:
    """Prefix caching of recurrent state: a copy for a new cache node or for a request with a free slot; the copy
    reads back the source's rows (SGLang's mamba-pool fork)."""
    src = ch.choice(states(c), "src")
    cls = c.oracle.cls_of(src)
    roomy = [o for o in requests(c) if room(c, cls, 1, o)]
    owner = c.fresh("node") if ch.boolean("new_owner") or not roomy else ch.choice(roomy, "owner")
    c.run("copy_state", owner=owner, page=src)


def r_state_refusals(c: Conductor, ch: Chooser) -> None:
    """Recurrent state is never shared and no owner holds more than recurrent_slots of it; only recurrent pages
    are copied (InvalidArgument, nothing changes)."""
    src = ch.choice(states(c), "src")
    cls = c.oracle.cls_of(src)
    cap = c.oracle.arena.config.recurrent_slots
    full = [o for o in requests(c) if not room(c, cls, 1, o)]
    cases = ["share", "admit-shared", "admit-over-cap"] + (["extend-over-cap", "copy-over-cap"] if full else [])
    cases += ["copy-token-page"] if shareable(c) else []
    case = ch.choice(cases, "case")
    if case == "share":
        c.run("share", owner=CACHE, pages=[src])
    elif case == "admit-shared":
        c.run("admit", owner=c.fresh("r"), demand={}, shared=[src])
    elif case == "admit-over-cap":
        c.run("admit", owner=c.fresh("r"), demand={cls: cap + 1}, shared=[])
    elif case == "extend-over-cap":
        c.run("extend", owner=ch.choice(full, "owner"), demand={cls: 1})
    elif case == "copy-over-cap":
        c.run("copy_state", owner=ch.choice(full, "owner"), page=src)
    else:
        c.run("copy_state", owner=c.fresh("node"), page=ch.choice(shareable(c), "page"))


def r_acquire_nothing(c: Conductor, ch: Chooser) -> None:
    """A ledger user holds at least one page: acquire([]) is refused."""
    c.run("acquire", user=c.fresh("u"), kind=ch.choice(KINDS, "kind"), pages=[])


def r_compact(c: Conductor, ch: Chooser) -> None:
    c.run("compact", max_moves=ch.choice([None, 0, 1, 2, 3], "max_moves"))


def r_flush_idle(c: Conductor, ch: Chooser) -> None:
    """The idle-time flush under a byte budget: none, part of a page, a few pages, everything; now and then a
    malformed budget (refused)."""
    pb = sorted(c.geo.page_bytes.values())
    bad = ch.integer(0, 9, "bad") == 0
    budget = ch.choice([-1, -pb[0], 1.5 * pb[0]], "budget") if bad else \
        ch.choice([0, pb[0] - 1, pb[0], pb[-1], 3 * pb[-1] + pb[0], c.geo.capacity], "budget")
    c.run("flush_idle", budget_bytes=budget)


def _offers_flush(c: Conductor) -> bool:
    """The implementation (if any) offers flush_idle (optional in the adapter protocol, version 9)."""
    return c.impl is None or callable(getattr(c.impl.alloc, "flush_idle", None))


def r_relayout(c: Conductor, ch: Chooser) -> None:
    # mostly end-band demand: that is what pushes a float band around
    demand = _demand(c, ch, 2)
    if ch.boolean("ends_only"):
        ends = (c.order[0], c.order[-1])
        demand = {k: (ch.integer(1, 4, "end_pages") if k in ends else 0) for k in c.order}
    c.run("relayout", demand=demand)


def r_write(c: Conductor, ch: Chooser) -> None:
    """Write one to three rows of one page (a different tag each)."""
    h = ch.choice(live(c), "page")
    cls = c.oracle.cls_of(h)
    for _ in range(ch.integer(1, 3, "rows")):
        c.run("write", page=h, entry=ch.integer(0, c.geo.entries[cls] - 1, "entry"),
              row=ch.integer(0, c.geo.rows[cls] - 1, "row"), tag=_tag(c))


def r_write_page(c: Conductor, ch: Chooser) -> None:
    """Write every row of every entry of one page: a different tag per layer, row and page."""
    h = ch.choice(live(c), "page")
    cls = c.oracle.cls_of(h)
    for entry in range(c.geo.entries[cls]):
        for row in range(c.geo.rows[cls]):
            c.run("write", page=h, entry=entry, row=row, tag=_tag(c))


def r_read(c: Conductor, ch: Chooser) -> None:
    h = ch.choice(live(c), "page")
    cls = c.oracle.cls_of(h)
    c.run("read", page=h, entry=ch.integer(0, c.geo.entries[cls] - 1, "entry"),
          row=ch.integer(0, c.geo.rows[cls] - 1, "row"))


def r_translate(c: Conductor, ch: Chooser) -> None:
    c.run("translate", page=ch.choice(live(c), "page"))


# -- error paths (the reference says which error; the harness compares) ------------------------


def r_double_free(c: Conductor, ch: Chooser) -> None:
    """Drop a page the owner does not hold: another owner's, a freed one, or a never-bound id (sglang §8.4)."""
    owner = ch.choice(requests(c), "owner")
    mine = set(held_flat(c, owner))
    others: list[Any] = [h for h in live(c) if h not in mine]
    c.run("drop", owner=owner, pages=[ch.choice(others + bad_ids(c), "not_held")])


def r_release_unknown(c: Conductor, ch: Chooser) -> None:
    released = [s["args"]["user"] for s in c.steps[-200:] if s.get("op") == "release"
                and "returns" in s["expect"] and s["args"]["user"] not in c.users]
    c.run("release", user=ch.choice(["never-acquired", *released[-3:]], "user"))


def r_unknown_page(c: Conductor, ch: Chooser) -> None:
    """An unbound id anywhere an id is taken: an error, never the shared sink page (sglang §8.8)."""
    bad = ch.choice(bad_ids(c), "bad")
    op = ch.choice(["acquire", "share", "write", "read", "translate", "admit"], "op")
    if op == "acquire":
        c.run("acquire", user=c.fresh("u"), kind=ch.choice(KINDS, "kind"), pages=[bad])
    elif op == "share":
        c.run("share", owner=CACHE, pages=[bad])
    elif op == "write":
        c.run("write", page=bad, entry=0, row=0, tag=_tag(c))
    elif op == "read":
        c.run("read", page=bad, entry=0, row=0)
    elif op == "translate":
        c.run("translate", page=bad)
    else:
        c.run("admit", owner=c.fresh("r"), demand={c.order[-1]: 1}, shared=[bad])


def r_bad_demand(c: Conductor, ch: Chooser) -> None:
    """Malformed demands: negative, an unknown class, more pages or bytes than the whole arena."""
    how = ch.choice(["negative", "unknown-class", "too-many-pages", "too-many-bytes"], "how")
    low, high = c.order[0], c.order[-1]
    demand: dict[str, Any] = {
        "negative": {low: -ch.integer(1, 3, "n")},
        "unknown-class": {"nope": 1},
        "too-many-pages": {high: c.geo.top[high] + 1},
        "too-many-bytes": {low: c.geo.top[low], high: c.geo.top[high]},
    }[how]
    ops = ["admit", "relayout"] + (["extend"] if requests(c) else [])
    op = ch.choice(ops, "op")
    if op == "admit":
        c.run("admit", owner=c.fresh("r"), demand=demand, shared=[])
    elif op == "extend":
        c.run("extend", owner=ch.choice(requests(c), "owner"), demand=demand)
    else:
        c.run("relayout", demand=demand)


def r_duplicate_owner(c: Conductor, ch: Chooser) -> None:
    c.run("admit", owner=ch.choice(c.oracle.owners(), "owner"), demand={c.order[-1]: 1}, shared=[])


def r_unknown_owner(c: Conductor, ch: Chooser) -> None:
    op = ch.choice(["extend", "drop", "slide", "free"], "op")
    args: dict[str, Any] = {"extend": {"demand": {c.order[-1]: 1}}, "drop": {"pages": []},
                            "slide": {"cls": c.order[0], "n": 0}, "free": {}}[op]
    c.run(op, owner="ghost", **args)


def r_duplicate_user(c: Conductor, ch: Chooser) -> None:
    pages = live(c)
    c.run("acquire", user=ch.choice(list(c.users), "user"), kind=ch.choice(KINDS, "kind"),
          pages=ch.subset(pages, 0, 1, "pages"))


def r_bad_arguments(c: Conductor, ch: Chooser) -> None:
    """Malformed arguments of every other kind (InvalidArgument), each only where it applies."""
    pages = live(c)
    owners = requests(c)
    cases = ["compact-negative", "acquire-bad-kind", "slide-unknown-class"]
    if pages:
        cases += ["acquire-duplicate", "share-duplicate", "write-bad-row", "read-bad-entry"]
    if owners:
        cases += ["slide-too-many"]
        if any(held_flat(c, o) for o in owners):
            cases += ["drop-duplicate"]
    if CACHE in c.oracle.owners() and held_flat(c, CACHE):
        cases += ["share-already-held"]
    case = ch.choice(cases, "case")
    if case == "compact-negative":
        c.run("compact", max_moves=-ch.integer(1, 2, "n"))
    elif case == "acquire-bad-kind":
        c.run("acquire", user=c.fresh("u"), kind="bogus", pages=ch.subset(pages, 0, 1, "pages"))
    elif case == "slide-unknown-class":
        c.run("slide", owner=ch.choice(owners or ["ghost"], "owner"), cls="nope", n=0)
    elif case == "acquire-duplicate":
        h = ch.choice(pages, "page")
        c.run("acquire", user=c.fresh("u"), kind=ch.choice(KINDS, "kind"), pages=[h, h])
    elif case == "share-duplicate":
        h = ch.choice(pages, "page")
        c.run("share", owner=c.fresh("s"), pages=[h, h])
    elif case in ("write-bad-row", "read-bad-entry"):
        h = ch.choice(pages, "page")
        cls = c.oracle.cls_of(h)
        entry, row = (0, c.geo.rows[cls]) if case == "write-bad-row" else (c.geo.entries[cls], 0)
        if ch.boolean("negative"):
            entry, row = (0, -1) if case == "write-bad-row" else (-1, 0)
        if case == "write-bad-row":
            c.run("write", page=h, entry=entry, row=row, tag=_tag(c))
        else:
            c.run("read", page=h, entry=entry, row=row)
    elif case == "slide-too-many":
        owner = ch.choice(owners, "owner")
        cls = ch.choice(c.order, "cls")
        c.run("slide", owner=owner, cls=cls, n=len(c.oracle.held(owner)[cls]) + ch.integer(1, 2, "over"))
    elif case == "drop-duplicate":
        owner = ch.choice([o for o in owners if held_flat(c, o)], "owner")
        h = ch.choice(held_flat(c, owner), "page")
        c.run("drop", owner=owner, pages=[h, h])
    else:  # share-already-held
        c.run("share", owner=CACHE, pages=[ch.choice(held_flat(c, CACHE), "page")])


def _has_requests(c: Conductor) -> bool:
    return bool(requests(c))


def _has_pages(c: Conductor) -> bool:
    return bool(c.oracle.live())


def _recurrent_contract(c: Conductor) -> bool:
    """The implementation (if any) offers copy_state (optional in the adapter protocol), and with it the rules
    that came with it (spec/arena.md §INV-STATE-PRIVATE, acquire of no pages refused); older adapters keep the
    alphabet they had."""
    return c.impl is None or callable(getattr(c.impl.alloc, "copy_state", None))


def _can_copy(c: Conductor) -> bool:
    """Some recurrent page is live, and the implementation offers copy_state."""
    return bool(states(c)) and _recurrent_contract(c)


# name -> (precondition or None, rule, weight for the vector generator)

def r_admit_below(c: Conductor, ch: Chooser) -> None:
    """An admission with a placement limit (valid mostly; now and then a malformed one, refused)."""
    demand = _demand(c, ch, 3)
    pages = shareable(c)
    shared = ch.subset(pages, 0, 2, "shared") if pages else []
    below = bad_below(c, ch) if ch.integer(0, 7, "bad") == 0 else random_below(c, ch)
    c.run("admit", owner=c.fresh("r"), demand=demand, shared=shared, below=below)


def r_extend_below(c: Conductor, ch: Chooser) -> None:
    """Decode growth with a placement limit (valid mostly; now and then a malformed one, refused)."""
    owner = ch.choice(requests(c), "owner")
    demand = _demand(c, ch, 2, owner)
    below = bad_below(c, ch) if ch.integer(0, 7, "bad") == 0 else random_below(c, ch)
    c.run("extend", owner=owner, demand=demand, below=below)

RULES: dict[str, tuple[Callable[[Conductor], bool] | None, Callable[[Conductor, Chooser], None], int]] = {
    "admit": (None, r_admit, 8),
    "churn": (None, r_churn, 3),
    "squeeze": (None, r_squeeze, 2),
    "extend": (_has_requests, r_extend, 5),
    "slide": (_has_requests, r_slide, 3),
    "free": (_has_requests, r_free, 4),
    "drop_some": (_has_requests, r_drop_some, 3),
    "cache_insert": (_has_pages, r_cache_insert, 3),
    "cache_evict": (lambda c: CACHE in c.oracle.owners(), r_cache_evict, 2),
    "acquire": (_has_pages, r_acquire, 4),
    "release": (lambda c: bool(c.users), r_release, 4),
    "moves_under_users": (_has_requests, r_moves_under_users, 3),
    "compact": (None, r_compact, 3),
    "relayout": (None, r_relayout, 3),
    "write": (_has_pages, r_write, 4),
    "write_page": (_has_pages, r_write_page, 2),
    "read": (_has_pages, r_read, 3),
    "translate": (_has_pages, r_translate, 2),
    "double_free": (_has_requests, r_double_free, 1),
    "release_unknown": (None, r_release_unknown, 1),
    "unknown_page": (None, r_unknown_page, 1),
    "bad_demand": (None, r_bad_demand, 1),
    "duplicate_owner": (lambda c: bool(c.oracle.owners()), r_duplicate_owner, 1),
    "unknown_owner": (None, r_unknown_owner, 1),
    "duplicate_user": (lambda c: bool(c.users), r_duplicate_user, 1),
    "bad_arguments": (None, r_bad_arguments, 1),
    # weight 0: the machine explores it, the committed vectors' generator does not (so they stay as they are)
    "shared_withheld": (_has_requests, r_shared_withheld, 0),
    "copy_state": (_can_copy, r_copy_state, 0),
    "state_refusals": (_can_copy, r_state_refusals, 0),
    "acquire_nothing": (_recurrent_contract, r_acquire_nothing, 0),
    "admit_below": (offers_below, r_admit_below, 0),  # the optional placement limit (below.py)
    "extend_below": (lambda c: offers_below(c) and _has_requests(c), r_extend_below, 0),
    "flush_idle": (_offers_flush, r_flush_idle, 0),
}


# ---------------------------------------------------------------------------------------------
# Starting a pair


def start(factory: Callable[[ArenaConfig], Any] | None, model: str, capacity: int, page_size: int,
          level: str = "exact", deep: bool = True, max_context_len: int | None = 16, step: int = 256,
          fallback: str | None = "toy-tri", **config_kwargs: Any) -> Conductor:
    """A conductor on the smallest capacity >= ``capacity`` (in ``step`` increments) that both sides build;
    the implementation must refuse exactly the configurations the reference refuses (below ``exact``,
    at ``safety``, it may refuse more: a model geometry it does not serve, ``ConfigError``, runs ``fallback``)."""
    spec = preset(model)
    for _ in range(64):
        config = ArenaConfig(spec, capacity, page_size=page_size, max_context_len=max_context_len, **config_kwargs)
        if factory is None:
            try:
                oracle = LiveReference(config)
            except CapacityTooSmallError:  # try a larger arena
                capacity += step
                continue
            return Conductor(Geometry.of(config), oracle, config_json=config_to_json(config))
        ref, imp = construct_pair(factory, config, level)
        if ref is not None and imp is None and fallback and model != fallback:
            try:
                build(factory, config)
            except ArenaError as e:  # a geometry the implementation does not serve (stricter, at safety): the fallback
                if e.code == "ConfigError":  # (not CapacityTooSmall, a subclass: a larger arena is tried below)
                    return start(factory, fallback, capacity, page_size, level, deep, max_context_len, step,
                                 fallback=None, **config_kwargs)
        if ref is not None and imp is not None:
            geo = Geometry.of(config)
            return Conductor(geo, LiveReference(config, arena=ref), Side(imp, geo), level=level, deep=deep,
                             factory=factory, config_json=config_to_json(config))
        capacity += step
    raise Divergence(f"no capacity up to {capacity} B of {model} is built by both the reference and the "
                     "implementation (the implementation refuses them all)")


# ---------------------------------------------------------------------------------------------
# The Hypothesis machine


def as_rule(name: str, pre: Callable[[Conductor], bool] | None, fn: Callable[[Conductor, Chooser], None]) -> Any:
    """A Hypothesis rule (method) running ``fn`` on the machine's conductor, guarded by ``pre``."""

    def method(self: LockstepMachine, data: st.DataObject) -> None:
        fn(self.c, HypothesisChooser(data))

    method.__name__ = name
    method.__doc__ = fn.__doc__
    r = rule(data=st.data())(method)
    if pre is not None:
        r = precondition(lambda self: self.c is not None and pre(self.c))(r)
    return r


class LockstepMachine(RuleBasedStateMachine):
    """The reference and ``factory``'s allocator in lockstep, compared at ``level`` after every step."""

    factory: ClassVar[Callable[[ArenaConfig], Any] | None] = None
    level: ClassVar[str] = "exact"
    deep: ClassVar[bool] = True  # run kvarena.reference.invariants too when the implementation is Arena-like

    def __init__(self) -> None:
        super().__init__()
        self.c: Conductor | None = None

    @initialize(model=st.sampled_from(TOYS), extra=st.integers(0, 12), page_size=st.sampled_from([2, 4]))
    def setup(self, model: str, extra: int, page_size: int) -> None:
        cls = type(self)
        if cls.factory is None:
            raise TypeError("LockstepMachine needs a factory: use lockstep_for(factory, level)")
        self.c = start(cls.factory, model, 2400 + 128 * extra, page_size, cls.level, cls.deep)

    def teardown(self) -> None:
        if self.c is not None and self.c.impl is not None:
            self.c.impl.close()


for _name in RULES:
    setattr(LockstepMachine, _name, as_rule(_name, *RULES[_name][:2]))


class ChainLockstepMachine(LockstepMachine):
    """The same machine on the chain toys: two float bands, or a window low end beside a window float."""

    @initialize(model=st.sampled_from(CHAIN_TOYS), extra=st.integers(0, 12), page_size=st.sampled_from([2, 4]))
    def setup(self, model: str, extra: int, page_size: int) -> None:
        super().setup(model, extra, page_size)


def lockstep_for(factory: Callable[[ArenaConfig], Any], level: str = "exact", deep: bool = True,
                 name: str | None = None, chains: bool = False) -> type[LockstepMachine]:
    """The lockstep machine class for ``factory`` (config -> allocator) at ``level``; ``chains``: on CHAIN_TOYS."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: choose one of {LEVELS}")
    cls_name = name or f"Lockstep_{level}"
    base = ChainLockstepMachine if chains else LockstepMachine
    return type(cls_name, (base,), {"factory": staticmethod(factory), "level": level, "deep": deep})


def run_lockstep(factory: Callable[[ArenaConfig], Any], level: str = "exact", settings: Settings | None = None,
                 deep: bool = True, chains: bool = False) -> None:
    """Run the lockstep machine; raises (a Divergence, an AdapterError) on the first shrunk failure."""
    run_state_machine_as_test(lockstep_for(factory, level, deep, chains=chains), settings=settings)
