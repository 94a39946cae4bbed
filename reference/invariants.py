"""§Invariants: predicates callable on any state (spec/arena.md §Invariants).

Each predicate recomputes from scratch (O(arena): these are checks, not
operations) and raises ``InvariantViolation`` naming its ID and the pages
involved.  ``INVARIANTS`` maps every ID to its predicate; the spec's
traceability table must list exactly these IDs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvarena.reference.arena import Arena
from kvarena.reference.bands import BandView, Role
from kvarena.reference.ladder import place
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.layout import entries_per_page
from kvarena.spec.models import worst_case_demand
from kvarena.spec.types import Mode


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


def check_conservation(a: Arena) -> None:
    """INV-BYTE-CONSERVATION: capacity = live + withheld + holes + gaps + padding, every term >= 0."""
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
    if a.used_bytes() != live + withheld:
        _fail("INV-BYTE-CONSERVATION", f"used_bytes() {a.used_bytes()} != live + withheld {live + withheld}")


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


INVARIANTS: dict[str, Callable[[Arena], None]] = {
    "INV-NO-OVERLAP": check_no_overlap,
    "INV-BAND-ORDER": check_band_order,
    "INV-LEDGER-SAFETY": check_ledger,
    "INV-PAGE-ATOMIC": check_page_atomic,
    "INV-VMAP-BIJECTIVE": check_vmap,
    "INV-BYTE-CONSERVATION": check_conservation,
    "INV-FEASIBILITY-FLOOR": check_feasibility_floor,
}


def check_all(a: Arena) -> None:
    for check in INVARIANTS.values():
        check(a)
