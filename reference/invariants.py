"""§Invariants: predicates callable on any state (spec/arena.md §Invariants).

Each predicate recomputes from scratch (O(arena): these are checks, not
operations) and raises ``InvariantViolation`` naming its ID and the pages
involved.  ``INVARIANTS`` maps every ID to its predicate; the spec's
traceability table must list exactly these IDs.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable

from kvarena.reference.arena import Arena
from kvarena.reference.bands import BandView, Role
from kvarena.reference.ladder import place
from kvarena.spec.errors import ArenaError, InvariantViolation
from kvarena.spec.layout import Kind, entries_per_page
from kvarena.spec.models import worst_case_demand
from kvarena.spec.types import Mode, Move, Plan, Rung, UserKind


def _fail(inv: str, msg: str) -> None:
    raise InvariantViolation(inv, msg)


def check_no_overlap(a: Arena) -> None:
    """INV-NO-OVERLAP: live, withheld and hole pages partition each span; all extents are
    inside the arena and pairwise disjoint in bytes."""
    extents = []
    for b in a.bands.values():
        live, holes, wh = set(b.live), set(b.holes), set(b.withheld)
        both = (live & holes) | (live & wh) | (holes & wh)
        if both:
            _fail("INV-NO-OVERLAP", f"band {b.name}: slots {sorted(both)[:8]} are in two of live/hole/withheld")
        span = set(range(b.lo, b.hi))
        if live | holes | wh != span:
            extra = sorted((live | holes | wh) - span)[:8]
            lost = sorted(span - (live | holes | wh))[:8]
            _fail("INV-NO-OVERLAP", f"band {b.name} span [{b.lo}, {b.hi}): slots outside it {extra}, "
                                    f"slots in it with no state {lost}")
        if b.lo < 0 or b.hi_byte > a.capacity or b.lo > b.hi:
            _fail("INV-NO-OVERLAP", f"band {b.name} span bytes [{b.lo_byte}, {b.hi_byte}) leave [0, {a.capacity})")
        if not b.empty:
            extents.append((b.lo_byte, b.hi_byte, b.name))
    extents.sort()
    for (lo1, hi1, n1), (lo2, hi2, n2) in zip(extents, extents[1:]):
        if lo2 < hi1:
            _fail("INV-NO-OVERLAP", f"bands {n1} [{lo1}, {hi1}) and {n2} [{lo2}, {hi2}) overlap")


def check_band_order(a: Arena) -> None:
    """INV-BAND-ORDER: non-empty spans follow the chain order; the end bands sit on their anchors."""
    chain = [a.bands[n] for n in a.order]
    low, high = chain[0], chain[-1]
    if low.role is not Role.LOW or high.role is not Role.HIGH:
        _fail("INV-BAND-ORDER", f"chain ends are {low.role}/{high.role}, not low/high")
    if a.ANCHORED_ENDS and (low.lo != 0 or high.hi != high.top):
        _fail("INV-BAND-ORDER", f"end bands left their anchors: {low.name} starts at slot {low.lo}, "
                                f"{high.name} ends at slot {high.hi} of {high.top}")
    present = [b for b in chain if b.role is not Role.FLOAT or not b.empty]
    for below, above in zip(present, present[1:]):
        if below.hi_byte > above.lo_byte:
            _fail("INV-BAND-ORDER", f"{below.name} ends at byte {below.hi_byte} above the start of "
                                    f"{above.name} at {above.lo_byte} (chain order {a.order})")


def check_ledger(a: Arena) -> None:
    """INV-LEDGER-SAFETY: a held physical page is never handed out again (it is the same
    allocation, or withheld); a written page never moves; withheld pages have users;
    the reader/writer counts match the users."""
    readers: Counter = Counter()
    writers: Counter = Counter()
    for uid, u in a.users.items():
        for h in u.holds:
            page = (h.cls, h.slot)
            (writers if u.mode is Mode.WRITE else readers)[page] += 1
            band = a.bands[h.cls]
            now = band.live.get(h.slot)
            same = now is not None and now == h.vid and a.gen.get(now) == h.gen
            if not same and h.slot not in band.withheld:
                _fail("INV-LEDGER-SAFETY", f"user {uid} holds {h.cls}:{h.slot} (page {h.vid}) but the slot is "
                                           f"{band.state_of(h.slot)}" + (f" bound to page {now}" if now is not None
                                                                         else ""))
            if u.mode is Mode.WRITE and a.gen.get(h.vid) == h.gen and a.v2p.get(h.vid) != page:
                _fail("INV-LEDGER-SAFETY", f"page {h.vid} moved from {h.cls}:{h.slot} to {a.v2p[h.vid]} while "
                                           f"user {uid} writes it")
    if +readers != +a.readers or +writers != +a.writers:
        _fail("INV-LEDGER-SAFETY", f"use counts drifted: readers {dict(+a.readers)} vs {dict(readers)}, "
                                   f"writers {dict(+a.writers)} vs {dict(writers)}")
    for b in a.bands.values():
        for s in b.withheld:
            if readers[(b.name, s)] + writers[(b.name, s)] == 0:
                _fail("INV-LEDGER-SAFETY", f"{b.name}:{s} is withheld with no user (should be a hole)")
        for s in b.holes:
            if readers[(b.name, s)] + writers[(b.name, s)]:
                _fail("INV-LEDGER-SAFETY", f"{b.name}:{s} is a hole but a user still holds it")


def check_page_atomic(a: Arena) -> None:
    """INV-PAGE-ATOMIC: every row of every entry of a page lives, moves and dies with the page:
    content exists only at live slots, and only for rows and entries the class has."""
    for (cls, slot), rows in a.content.items():
        band = a.bands[cls]
        if slot not in band.live:
            _fail("INV-PAGE-ATOMIC", f"rows {sorted(rows)[:6]} remain at {cls}:{slot}, which is "
                                     f"{band.state_of(slot)}: part of a page was left behind")
        n_e = entries_per_page(a.classes[cls], a.config.page_size)
        n_r = len(a.layouts[cls].slots)
        bad = [k for k in rows if not (0 <= k[0] < n_e and 0 <= k[1] < n_r)]
        if bad:
            _fail("INV-PAGE-ATOMIC", f"{cls}:{slot} holds rows outside the layout: {bad[:6]}")


def check_vmap(a: Arena) -> None:
    """INV-VMAP-BIJECTIVE: v->p and p->v are mutual inverses; every owned page is bound and every
    bound page is owned; reference counts equal the number of owners."""
    p2v = {}
    for b in a.bands.values():
        for s, v in b.live.items():
            p2v[(b.name, s)] = v
    if len(set(p2v.values())) != len(p2v):
        dup = [v for v, n in Counter(p2v.values()).items() if n > 1]
        _fail("INV-VMAP-BIJECTIVE", f"virtual pages {dup[:6]} are bound to two physical pages")
    for v, page in a.v2p.items():
        if p2v.get(page) != v:
            _fail("INV-VMAP-BIJECTIVE", f"v2p[{v}] = {page} but p2v[{page}] = {p2v.get(page)} (stale map)")
    if len(p2v) != len(a.v2p):
        stray = sorted(set(p2v.values()) - set(a.v2p))[:6]
        _fail("INV-VMAP-BIJECTIVE", f"physical pages bound to ids {stray} that v2p does not know")
    if set(a.gen) != set(a.v2p):
        _fail("INV-VMAP-BIJECTIVE", "allocation serials out of step with the bound pages")
    refs: Counter = Counter()
    for owner, held in a.owners.items():
        for cls, vs in held.items():
            for v in vs:
                refs[v] += 1
                if a.v2p.get(v, (None,))[0] != cls:
                    _fail("INV-VMAP-BIJECTIVE", f"owner {owner} holds {v} as {cls} but it is "
                                                f"{'unbound' if v not in a.v2p else a.v2p[v][0]}")
    if refs != +a.refs:
        diff = {v: (refs[v], a.refs[v]) for v in set(refs) | set(a.refs) if refs[v] != a.refs[v]}
        _fail("INV-VMAP-BIJECTIVE", f"reference counts drifted (owners, counter): {dict(list(diff.items())[:6])}")
    leaked = sorted(set(a.v2p) - set(refs))
    if leaked:
        _fail("INV-VMAP-BIJECTIVE", f"pages {leaked[:6]} are bound but no owner holds them (leak)")
    if set(a._free_vids) & set(a.v2p):
        _fail("INV-VMAP-BIJECTIVE", f"ids {sorted(set(a._free_vids) & set(a.v2p))[:6]} are both free and bound")


def check_content_follows_vid(a: Arena) -> None:
    """INV-CONTENT-FOLLOWS-VID: content is kept per physical page and reached through v2p. Every page holding
    content is bound to a virtual id (so a freed slot keeps none and a hand-out starts zeroed), and ``read``
    through v2p returns that content: each written row its tag, and the corner rows of every page (first and
    last entry and row: O(1) per page, whatever the model's layer count) 0 where unwritten."""
    bound = {page: v for v, page in a.v2p.items()}
    for page, rows in a.content.items():
        if page not in bound:
            _fail("INV-CONTENT-FOLLOWS-VID", f"{page[0]}:{page[1]} holds rows {sorted(rows)[:6]} but no virtual "
                                             "page is bound there: the next hand-out would read them")
    shape = {c: (entries_per_page(a.classes[c], a.config.page_size), len(a.layouts[c].slots)) for c in a.classes}
    for page, v in bound.items():
        rows, (n_e, n_r) = a.content.get(page, {}), shape[page[0]]
        corners = {(e, r) for e in {0, n_e - 1} for r in {0, n_r - 1}}  # rows outside the page: INV-PAGE-ATOMIC's
        keys = sorted({k for k in rows if 0 <= k[0] < n_e and 0 <= k[1] < n_r} | corners) if rows else sorted(corners)
        for (e, r) in keys:
            got, want = a.read(v, e, r), rows.get((e, r), 0)
            if got != want:
                _fail("INV-CONTENT-FOLLOWS-VID", f"page {v} ({page[0]}:{page[1]}) entry {e} row {r} reads {got!r}, "
                                                 f"its content is {want}" + ("" if (e, r) in rows else
                                                                             " (never written: a fresh row is 0)"))


def check_conservation(a: Arena) -> None:
    """INV-BYTE-CONSERVATION: capacity = live + withheld + holes + gaps + padding, every term >= 0, and the
    arena's byte accounting (``used_bytes``, ``free_bytes``, ``gap_bytes``: what a scheduler reads) agrees."""
    live = sum(len(b.live) * b.page_bytes for b in a.bands.values())
    withheld = sum(len(b.withheld) * b.page_bytes for b in a.bands.values())
    holes = sum(len(b.holes) * b.page_bytes for b in a.bands.values())
    chain = [a.bands[n] for n in a.order]
    present = [b for b in chain if not b.empty or (a.ANCHORED_ENDS and b.role is not Role.FLOAT)]
    gaps = [y.lo_byte - x.hi_byte for x, y in zip(present, present[1:])]
    low_pad = present[0].lo_byte
    top_pad = a.capacity - present[-1].hi_byte
    if min(gaps, default=0) < 0 or low_pad < 0 or top_pad < 0:
        _fail("INV-BYTE-CONSERVATION", f"negative gap or padding: gaps {gaps}, below {low_pad}, above {top_pad}")
    total = live + withheld + holes + sum(gaps) + low_pad + top_pad
    if total != a.capacity:
        _fail("INV-BYTE-CONSERVATION", f"live {live} + withheld {withheld} + holes {holes} + gaps {sum(gaps)} "
                                       f"+ padding {low_pad + top_pad} = {total} != capacity {a.capacity}")
    said = {"used_bytes()": a.used_bytes(), "free_bytes()": a.free_bytes(), "gap_bytes()": a.gap_bytes()}
    counted = {"used_bytes()": live + withheld, "free_bytes()": holes + sum(gaps) + low_pad + top_pad,
               "gap_bytes()": sum(gaps)}
    if said != counted:
        bad = {k: (said[k], counted[k]) for k in said if said[k] != counted[k]}
        _fail("INV-BYTE-CONSERVATION", f"the arena's accounting disagrees with its bands (said, counted): {bad}")


def check_feasibility_floor(a: Arena) -> None:
    """INV-FEASIBILITY-FLOOR: the configuration holds one worst-case request on an empty arena."""
    if not a.ANCHORED_ENDS:
        worst = worst_case_demand(a.config)
        for cls, n in worst.items():
            b = a.bands[cls]
            if n > b.hi - b.lo:
                _fail("INV-FEASIBILITY-FLOOR", f"split pool {cls} holds {b.hi - b.lo} < {n} pages")
        return
    views = []
    for n in a.order:
        b = a.bands[n]
        lo = b.top if b.role is Role.HIGH else 0
        views.append(BandView(b.name, b.role, b.page_bytes, b.top, lo, lo, 0, lambda k: []))
    fit = place(views, worst_case_demand(a.config), a.hints)
    if not fit.ok:
        _fail("INV-FEASIBILITY-FLOOR", f"an empty arena cannot hold one worst-case request: short {fit.shortfall}")


def check_state_private(a: Arena) -> None:
    """INV-STATE-PRIVATE: a recurrent page is one owner's state (held by exactly one owner: copied with
    ``copy_state``, never shared), and no owner holds more than ``config.recurrent_slots`` of them."""
    holders: Counter = Counter()
    for owner, held in a.owners.items():
        for cls, vs in held.items():
            if a.classes[cls].kind is Kind.RECURRENT:
                holders.update(iter(vs))  # (the ids: vs maps each to None)
                if len(vs) > a.config.recurrent_slots:
                    _fail("INV-STATE-PRIVATE", f"owner {owner} holds {len(vs)} recurrent {cls} pages, more than "
                                               f"recurrent_slots={a.config.recurrent_slots}")
    shared = sorted(v for v, n in holders.items() if n > 1)
    if shared:
        _fail("INV-STATE-PRIVATE", f"recurrent pages {shared[:6]} are held by more than one owner: state is one "
                                   "owner's (copy it with copy_state, never share it)")


PROBE = "\x00refusal-probe"  # an owner and ledger-user id no caller uses
# The probes that plant a policy whose plans the validator must refuse. A harness that switches the arena's plan
# validator off (to see the state predicates catch a planted bug alone) switches these off too: they would only
# report the validator it removed.
PLAN_PROBES = True


class _RefusingPolicy:
    """Every plan it makes breaks PLAN-RUNG (a rung-1 plan that moves): the arena must refuse it unapplied."""

    name = "refusal-probe"

    def __init__(self, cls: str) -> None:
        self.bad = Plan(Rung.REUSE, (Move(cls, 0, 1),))

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        return self.bad

    def after_free(self, arena: Arena) -> Plan | None:
        return self.bad


def _refusals(a: Arena) -> list[tuple[str, Callable[[], object]]]:
    """Calls that every valid state must refuse with an ArenaError: one per kind of refusal, each built so that
    it fails late (valid arguments first), where a half-applied operation would show."""
    low, high = a.order[0], a.order[-1]
    owner = next((o for o in sorted(a.owners) if any(a.owners[o].values())), None)
    probes: list[tuple[str, Callable[[], object]]] = [
        ("admit(bad demand)", lambda: a.admit(PROBE, {low: 1, "\x00nope": 1})),
        ("extend(unknown owner)", lambda: a.extend(PROBE, {low: 1})),
        ("release(unknown user)", lambda: a.release(PROBE)),
        ("compact(-1)", lambda: a.compact(-1)),
        ("relayout(bad demand)", lambda: a.relayout({low: 1, "\x00nope": 1})),
    ]
    if a.owners:
        first = sorted(a.owners)[0]
        probes.append(("admit(existing owner)", lambda: a.admit(first, {low: 1})))
    if a.users:
        user = sorted(a.users)[0]
        probes.append(("acquire(live user)", lambda: a.acquire(user, UserKind.NET_SEND, [])))
    if owner is not None:
        held = a.owners[owner]
        cls = next(c for c in a.order if held.get(c))
        v = next(iter(held[cls]))
        probes += [
            ("drop(held + unbound)", lambda: a.drop(owner, [v, -1])),
            ("drop(repeated id)", lambda: a.drop(owner, [v, v])),
            ("slide(one too many)", lambda: a.slide(owner, cls, len(held[cls]) + 1)),
            ("share(bound + unbound)", lambda: a.share(PROBE, [v, -1])),
            ("acquire(bound + unbound)", lambda: a.acquire(PROBE, UserKind.FORWARD_WRITE, [v, -1])),
            ("write(bad entry)", lambda: a.write(v, -1, 0, 1)),
            ("drop(held + a bool id)", lambda: a.drop(owner, [v, True])),
        ]
        state = next((u for u in a.v2p if a.classes[a.v2p[u][0]].kind is Kind.RECURRENT), None)
        token = next((u for u in a.v2p if a.classes[a.v2p[u][0]].kind is not Kind.RECURRENT), None)
        if state is not None:
            probes.append(("share(a recurrent page)", lambda: a.share(PROBE, [state])))
        if token is not None:
            probes.append(("copy_state(a token page)", lambda: a.copy_state(PROBE, token)))
        full = next((o for o in sorted(a.owners) for c in a.order if a.classes[c].kind is Kind.RECURRENT
                     and len(a.owners[o][c]) >= a.config.recurrent_slots), None)
        if full is not None and state is not None:
            probes.append(("copy_state(owner with no free slot)", lambda: a.copy_state(full, state)))
        probes.append(("acquire(no pages)", lambda: a.acquire(PROBE, UserKind.FORWARD_READ, [])))
        last = next(((o, u) for o in sorted(a.owners) for c in a.order for u in a.owners[o][c]
                     if a.refs[u] == 1), None)
        if last is not None and PLAN_PROBES:  # a free whose free-time plan is refused: the page must stay bound
            probes.append(("drop(last reference) + refused free-time plan",
                           lambda: _with_policy(a, _RefusingPolicy(low), lambda: a.drop(last[0], [last[1]]))))
    short = a.free_bytes() // a.bands[high].page_bytes + 1  # more pages than are free: refused by any planner
    if short <= a.bands[high].top and PLAN_PROBES:  # (a plain rejection is the machine's own check)
        probes.append(("admit + refused plan",
                       lambda: _with_policy(a, _RefusingPolicy(low), lambda: a.admit(PROBE, {high: short}))))
    return probes


def _with_policy(a: Arena, policy: object, call: Callable[[], object]) -> object:
    kept = a.policy
    a.policy = policy  # type: ignore[assignment]
    try:
        return call()
    finally:
        a.policy = kept


def _stats(a: Arena) -> tuple:
    s = a.stats
    return s.admitted, s.pages_placed, *s.moves.values(), *s.bytes_moved.values(), *s.rung_used.values()


def _census(a: Arena) -> tuple:
    """A cheap fingerprint of the state (O(bands)); the full snapshot is compared once, at the end."""
    return (len(a.v2p), len(a.refs), len(a.owners), len(a.users), len(a.content), a._next_vid, a._next_gen,
            len(a._free_vids), _stats(a),
            *((b.lo, b.hi, len(b.live), len(b.holes), len(b.withheld)) for b in a.bands.values()))


def check_refusal_is_noop(a: Arena) -> None:
    """INV-REFUSAL-IS-NOOP: from this state, every refused operation raises an ArenaError and leaves the
    observable state (``snapshot()`` and the statistics) unchanged: refusals of every kind, each with valid
    arguments before the bad one, an admission whose plan the validator refuses, and a free whose free-time
    plan it refuses. With event users whose events have completed, a refusal is compared with the state after
    ``poll()`` (spec §Ledger, Event users), on a copy, so the check itself releases nobody."""
    if any(u.event is not None and u.event.query() for u in a.users.values()):
        a = copy.deepcopy(a)
        a.poll()
    before, census = a.snapshot(), _census(a)
    for name, call in _refusals(a):
        try:
            call()
        except ArenaError:
            pass
        except Exception as e:  # any other exception is an untyped refusal
            _fail("INV-REFUSAL-IS-NOOP", f"{name} raised {type(e).__name__}: {e}, not a typed ArenaError")
        else:
            _fail("INV-REFUSAL-IS-NOOP", f"{name} was not refused; every state must refuse it with an ArenaError")
        if _census(a) != census:
            _fail("INV-REFUSAL-IS-NOOP", f"{name} was refused but changed the state: {census} -> {_census(a)}")
    after = a.snapshot()
    if after != before:
        diff = sorted(k for k in before if before[k] != after.get(k))
        _fail("INV-REFUSAL-IS-NOOP", f"a refused call changed the observable state (fields {diff})")


INVARIANTS: dict[str, Callable[[Arena], None]] = {
    "INV-NO-OVERLAP": check_no_overlap,
    "INV-BAND-ORDER": check_band_order,
    "INV-LEDGER-SAFETY": check_ledger,
    "INV-PAGE-ATOMIC": check_page_atomic,
    "INV-VMAP-BIJECTIVE": check_vmap,
    "INV-CONTENT-FOLLOWS-VID": check_content_follows_vid,
    "INV-BYTE-CONSERVATION": check_conservation,
    "INV-FEASIBILITY-FLOOR": check_feasibility_floor,
    "INV-STATE-PRIVATE": check_state_private,
    "INV-REFUSAL-IS-NOOP": check_refusal_is_noop,
}


def check_all(a: Arena) -> None:
    for check in INVARIANTS.values():
        check(a)
