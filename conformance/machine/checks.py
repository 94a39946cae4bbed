"""The invariants of spec/arena.md §Invariants, decided on an implementation's *observation*.

``kvarena.reference.invariants`` reads the reference's internals; an implementation under test
exposes only ``observe()`` (v->p, spans, holes, withheld) and its answers.  These predicates
recompute each invariant from that observation plus what the harness knows independently of the
implementation: which logical pages are alive and of which class (from the trace), and which
physical pages each ledger user held when it acquired them.  Each raises
``InvariantViolation`` with the invariant's stable ID.

INV-PAGE-ATOMIC is decided by data integrity (every written row of every page reads back its last
tag after any moves, checked by the harness through ``read``); INV-FEASIBILITY-FLOOR by comparing
construction outcomes with the reference.

At level ``pool`` (:func:`check_pool_observation`) the same IDs are decided on a
:class:`~kvarena.conformance.adapter.protocol.PoolObservation` (byte ranges, no bands): what every
paged allocator keeps.  INV-BAND-ORDER has no object there and is not checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvarena.conformance.adapter.protocol import Observation, PoolObservation
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.layout import Kind, entries_per_page, entry_layout
from kvarena.spec.models import ArenaConfig, chain
from kvarena.spec.types import Mode


def _fail(inv: str, msg: str) -> None:
    raise InvariantViolation(inv, msg)


@dataclass(frozen=True)
class Geometry:
    """What the configuration fixes: chain order, page bytes, grid tops, entries and rows per page."""

    capacity: int
    order: tuple[str, ...]
    page_bytes: dict[str, int]
    top: dict[str, int]
    entries: dict[str, int]
    rows: dict[str, int]
    kind: dict[str, Kind]

    @classmethod
    def of(cls, config: ArenaConfig) -> Geometry:
        classes = chain(config.model)
        pb = {c.name: config.page_bytes(c.name) for c in classes}
        return cls(config.capacity, tuple(c.name for c in classes), pb,
                   {n: config.capacity // p for n, p in pb.items()},
                   {c.name: entries_per_page(c, config.page_size) for c in classes},
                   {c.name: len(entry_layout(c).slots) for c in classes},
                   {c.name: c.kind for c in classes})

    @property
    def low(self) -> str:
        return self.order[0]

    @property
    def high(self) -> str:
        return self.order[-1]

    def floats(self) -> tuple[str, ...]:
        return self.order[1:-1]


@dataclass(frozen=True)
class HeldPage:
    """One page a ledger user held when it acquired it: where it was (on the implementation)."""

    user: str
    mode: Mode
    cls: str
    slot: int  # at level pool: the byte offset
    alive_at: tuple[str, int] | None  # where the same logical page is now, None if it was freed
    nbytes: int = 0  # at level pool: the bytes the page had when the user acquired it


def check_no_overlap(obs: Observation, geo: Geometry) -> None:
    """INV-NO-OVERLAP: live, withheld and hole slots partition each span; spans lie inside the arena;
    the byte extents of non-empty bands are pairwise disjoint."""
    live: dict[str, list[int]] = {c: [] for c in geo.order}
    for v, (c, s) in obs.v2p.items():
        if c not in live:
            _fail("INV-NO-OVERLAP", f"page {v} is bound to unknown class {c!r}")
        live[c].append(s)
    extents = []
    for c in geo.order:
        lo, hi = obs.spans[c]
        if lo < 0 or lo > hi or hi * geo.page_bytes[c] > geo.capacity:
            _fail("INV-NO-OVERLAP", f"band {c} span [{lo}, {hi}) (bytes [{lo * geo.page_bytes[c]}, "
                                    f"{hi * geo.page_bytes[c]})) leaves [0, {geo.capacity})")
        counts = Counter(live[c]) + Counter(obs.holes[c]) + Counter(obs.withheld[c])
        twice = sorted(s for s, n in counts.items() if n > 1)
        if twice:
            _fail("INV-NO-OVERLAP", f"band {c}: slots {twice[:8]} are counted twice among live/hole/withheld "
                                    f"(live {sorted(live[c])[:8]}, holes {list(obs.holes[c])[:8]}, "
                                    f"withheld {list(obs.withheld[c])[:8]})")
        if set(counts) != set(range(lo, hi)):
            extra = sorted(set(counts) - set(range(lo, hi)))[:8]
            lost = sorted(set(range(lo, hi)) - set(counts))[:8]
            _fail("INV-NO-OVERLAP", f"band {c} span [{lo}, {hi}): slots outside it {extra}, slots in it with no "
                                    f"state {lost}")
        if hi > lo:
            extents.append((lo * geo.page_bytes[c], hi * geo.page_bytes[c], c))
    extents.sort()
    for (lo1, hi1, n1), (lo2, hi2, n2) in zip(extents, extents[1:]):
        if lo2 < hi1:
            _fail("INV-NO-OVERLAP", f"bands {n1} [{lo1}, {hi1}) and {n2} [{lo2}, {hi2}) overlap")


def _present(obs: Observation, geo: Geometry) -> list[str]:
    return [c for c in geo.order if c in (geo.low, geo.high) or obs.spans[c][1] > obs.spans[c][0]]


def check_band_order(obs: Observation, geo: Geometry) -> None:
    """INV-BAND-ORDER: the low band starts at slot 0, the high band ends at its top; non-empty spans
    follow the chain order."""
    if obs.spans[geo.low][0] != 0:
        _fail("INV-BAND-ORDER", f"low band {geo.low} starts at slot {obs.spans[geo.low][0]}, not 0")
    if obs.spans[geo.high][1] != geo.top[geo.high]:
        _fail("INV-BAND-ORDER", f"high band {geo.high} ends at slot {obs.spans[geo.high][1]}, not its top "
                                f"{geo.top[geo.high]}")
    present = _present(obs, geo)
    for below, above in zip(present, present[1:]):
        b_hi = obs.spans[below][1] * geo.page_bytes[below]
        a_lo = obs.spans[above][0] * geo.page_bytes[above]
        if b_hi > a_lo:
            _fail("INV-BAND-ORDER", f"{below} ends at byte {b_hi} above the start of {above} at {a_lo} "
                                    f"(chain order {list(geo.order)})")


def check_vmap(obs: Observation, live: Mapping[int, str]) -> None:
    """INV-VMAP-BIJECTIVE: the bound pages are exactly the live logical pages, each of its class, each at
    its own physical page (``live``: the implementation's id of every live logical page -> class)."""
    seen: dict[tuple[str, int], int] = {}
    for v, page in obs.v2p.items():
        if page in seen:
            _fail("INV-VMAP-BIJECTIVE", f"virtual pages {seen[page]} and {v} are both bound to {page[0]}:{page[1]}")
        seen[page] = v
    stray = sorted(set(obs.v2p) - set(live))
    if stray:
        _fail("INV-VMAP-BIJECTIVE", f"pages {stray[:6]} are bound but no live logical page is (a leak, or a "
                                    "page freed early and still mapped)")
    lost = sorted(set(live) - set(obs.v2p))
    if lost:
        _fail("INV-VMAP-BIJECTIVE", f"live pages {lost[:6]} are not bound (freed while an owner holds them)")
    wrong = [(v, c, obs.v2p[v][0]) for v, c in live.items() if obs.v2p[v][0] != c]
    if wrong:
        _fail("INV-VMAP-BIJECTIVE", f"pages bound to the wrong class (vid, allocated as, bound as): {wrong[:6]}")


def check_ledger(obs: Observation, holds: Sequence[HeldPage]) -> None:
    """INV-LEDGER-SAFETY: a held physical page still holds the same page or is withheld; a page held by a
    writer has not moved; every withheld slot has a user and no hole has one."""
    owner_of = {page: v for v, page in obs.v2p.items()}
    held: Counter = Counter()
    for h in holds:
        page = (h.cls, h.slot)
        held[page] += 1
        if h.alive_at != page and h.slot not in obs.withheld[h.cls]:
            now = owner_of.get(page)
            state = "a hole" if h.slot in obs.holes[h.cls] else (f"bound to page {now}" if now is not None
                                                                else "outside the band")
            where = "freed" if h.alive_at is None else f"now at {h.alive_at[0]}:{h.alive_at[1]}"
            _fail("INV-LEDGER-SAFETY", f"user {h.user} holds {h.cls}:{h.slot} but the slot is {state}; its page "
                                       f"is {where}")
        if h.mode is Mode.WRITE and h.alive_at is not None and h.alive_at != page:
            _fail("INV-LEDGER-SAFETY", f"page at {h.cls}:{h.slot} moved to {h.alive_at[0]}:{h.alive_at[1]} while "
                                       f"user {h.user} writes it")
    for c, slots in obs.withheld.items():
        for s in slots:
            if not held[(c, s)]:
                _fail("INV-LEDGER-SAFETY", f"{c}:{s} is withheld with no user (should be a hole)")
    for c, slots in obs.holes.items():
        for s in slots:
            if held[(c, s)]:
                _fail("INV-LEDGER-SAFETY", f"{c}:{s} is a hole but a user still holds it (it can be handed out)")


def check_conservation(obs: Observation, geo: Geometry) -> None:
    """INV-BYTE-CONSERVATION: capacity = live + withheld + holes + gaps + padding, every term >= 0."""
    live = Counter(c for c, _ in obs.v2p.values())
    total_live = sum(n * geo.page_bytes[c] for c, n in live.items())
    withheld = sum(len(obs.withheld[c]) * geo.page_bytes[c] for c in geo.order)
    holes = sum(len(obs.holes[c]) * geo.page_bytes[c] for c in geo.order)
    present = _present(obs, geo)
    gaps = [obs.spans[a][0] * geo.page_bytes[a] - obs.spans[b][1] * geo.page_bytes[b]
            for b, a in zip(present, present[1:])]
    low_pad = obs.spans[present[0]][0] * geo.page_bytes[present[0]]
    top_pad = geo.capacity - obs.spans[present[-1]][1] * geo.page_bytes[present[-1]]
    if min(gaps, default=0) < 0 or low_pad < 0 or top_pad < 0:
        _fail("INV-BYTE-CONSERVATION", f"negative gap or padding: gaps {gaps}, below {low_pad}, above {top_pad}")
    total = total_live + withheld + holes + sum(gaps) + low_pad + top_pad
    if total != geo.capacity:
        _fail("INV-BYTE-CONSERVATION", f"live {total_live} + withheld {withheld} + holes {holes} + gaps {sum(gaps)} "
                                       f"+ padding {low_pad + top_pad} = {total} != capacity {geo.capacity}")


def check_observation(obs: Observation, geo: Geometry, live: Mapping[int, str], holds: Sequence[HeldPage]) -> None:
    """Every observation-level invariant, in the order of spec/arena.md §Invariants."""
    check_no_overlap(obs, geo)
    check_band_order(obs, geo)
    check_ledger(obs, holds)
    check_vmap(obs, live)
    check_conservation(obs, geo)


# ---------------------------------------------------------------------------------------------
# Level pool: byte ranges, no bands


def _extents(obs: PoolObservation) -> list[tuple[int, int, str]]:
    """Every range the observation names, as (start, end, what)."""
    out = [(o, o + n, f"page {v} ({c})") for v, (c, o, n) in obs.pages.items()]
    out += [(o, o + n, "a withheld page") for o, n in obs.withheld]
    out += [(o, o + n, "a free extent") for o, n in obs.free]
    return out


def check_pool_no_overlap(obs: PoolObservation, geo: Geometry) -> None:
    """INV-NO-OVERLAP in bytes: every range lies in the arena, a page fits the bytes reserved for it, and no
    two ranges (live pages, withheld pages, free extents) share a byte."""
    for v, (c, o, n) in obs.pages.items():
        if c not in geo.page_bytes:
            _fail("INV-NO-OVERLAP", f"page {v} is bound to unknown class {c!r}")
        if n < geo.page_bytes[c]:
            _fail("INV-NO-OVERLAP", f"page {v} ({c}) has {n} B reserved at {o}, less than its {geo.page_bytes[c]} B: "
                                    "it spills into the next bytes")
    extents = sorted(_extents(obs))
    for lo, hi, what in extents:
        if lo < 0 or hi > geo.capacity or hi <= lo:
            _fail("INV-NO-OVERLAP", f"{what} at bytes [{lo}, {hi}) leaves [0, {geo.capacity}) or is empty")
    for (lo1, hi1, a), (lo2, hi2, b) in zip(extents, extents[1:]):
        if lo2 < hi1:
            _fail("INV-NO-OVERLAP", f"{a} [{lo1}, {hi1}) and {b} [{lo2}, {hi2}) share bytes [{lo2}, {min(hi1, hi2)})")


def check_pool_ledger(obs: PoolObservation, holds: Sequence[HeldPage]) -> None:
    """INV-LEDGER-SAFETY in bytes: the bytes a user holds are still its page's or withheld, a written page has
    not moved, every withheld range has a user and no free extent holds a user's bytes."""
    def overlaps(lo: int, hi: int, ranges: Sequence[tuple[int, int]]) -> bool:
        return any(o < hi and lo < o + n for o, n in ranges)

    spans = [(h.slot, h.nbytes) for h in holds]
    for h in holds:
        lo, hi = h.slot, h.slot + h.nbytes
        if h.alive_at != (h.cls, h.slot) and not any(o <= lo and hi <= o + n for o, n in obs.withheld):
            now = [v for v, (_c, o, n) in obs.pages.items() if o < hi and lo < o + n]
            state = ("free (the pool may hand them out)" if overlaps(lo, hi, obs.free) else
                     f"page {now[0]}'s" if now else "neither withheld nor free")
            where = "freed" if h.alive_at is None else f"now at {h.alive_at[0]} byte {h.alive_at[1]}"
            _fail("INV-LEDGER-SAFETY", f"user {h.user} holds {h.cls} bytes [{lo}, {hi}) but they are {state}; its "
                                       f"page is {where}")
        if h.mode is Mode.WRITE and h.alive_at is not None and h.alive_at != (h.cls, h.slot):
            _fail("INV-LEDGER-SAFETY", f"page at {h.cls} byte {h.slot} moved to byte {h.alive_at[1]} while user "
                                       f"{h.user} writes it")
    for o, n in obs.withheld:
        if not overlaps(o, o + n, spans):
            _fail("INV-LEDGER-SAFETY", f"bytes [{o}, {o + n}) are withheld with no user (they should be free)")
    for o, n in obs.free:
        if overlaps(o, o + n, spans):
            _fail("INV-LEDGER-SAFETY", f"bytes [{o}, {o + n}) are free but a user still holds them (they can be "
                                       "handed out)")


def check_pool_conservation(obs: PoolObservation, geo: Geometry, total: int) -> None:
    """INV-BYTE-CONSERVATION in the pool's terms: live + withheld + free = the bytes the pool manages, which
    never change and fit the arena (a block in none of the three leaked)."""
    if obs.total != total or not 0 < total <= geo.capacity:
        _fail("INV-BYTE-CONSERVATION", f"the pool manages {obs.total} B, it managed {total} B when built (the "
                                       f"arena has {geo.capacity} B)")
    live = sum(n for _c, _o, n in obs.pages.values())
    withheld = sum(n for _o, n in obs.withheld)
    free = sum(n for _o, n in obs.free)
    seen = live + withheld + free
    if seen != total:
        why = "bytes in none of them leaked" if seen < total else "bytes counted twice"
        _fail("INV-BYTE-CONSERVATION", f"live {live} + withheld {withheld} + free {free} = {seen} != the pool's "
                                       f"{total} B ({why})")


def check_pool_observation(obs: PoolObservation, geo: Geometry, live: Mapping[int, str], holds: Sequence[HeldPage],
                           total: int) -> None:
    """Every invariant level ``pool`` decides, in the order of spec/arena.md §Invariants (no INV-BAND-ORDER)."""
    check_pool_no_overlap(obs, geo)
    check_pool_ledger(obs, holds)
    check_vmap(Observation(obs.v2p, {}, {}, {}), live)
    check_pool_conservation(obs, geo, total)


def withheld_set(obs: Observation | PoolObservation) -> set:
    """The withheld pages: (class, slot) of an arena, (offset, nbytes) of a pool."""
    if isinstance(obs, PoolObservation):
        return set(obs.withheld)
    return {(c, s) for c, ss in obs.withheld.items() for s in ss}


def obs_diff(a: Observation | PoolObservation | None, b: Observation | PoolObservation, an: str = "before",
              bn: str = "after") -> str:
    if a is None:
        return "no earlier observation"
    parts = []
    pool = isinstance(b, PoolObservation)
    for f in ("pages", "withheld", "free", "total") if pool else ("v2p", "spans", "holes", "withheld"):
        x, y = getattr(a, f), getattr(b, f)
        if x == y:
            continue
        if isinstance(x, dict):
            keys = sorted(set(x) | set(y), key=str)
            d = {k: (x.get(k), y.get(k)) for k in keys if x.get(k) != y.get(k)}
            parts.append(f"{f} ({an}, {bn}): {dict(list(d.items())[:8])}")
        elif isinstance(x, tuple):
            parts.append(f"{f}: only {an} {sorted(set(x) - set(y))[:8]}, only {bn} {sorted(set(y) - set(x))[:8]}")
        else:
            parts.append(f"{f} ({an}, {bn}): ({x}, {y})")
    return "; ".join(parts)
