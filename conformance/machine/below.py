"""The placement limit ``below`` of admit / extend (spec/arena.md §Placement limit) in the conformance layer.

``below`` maps an end-band class to a byte offset: "new pages of this class should lie on the anchor side of
this byte". It reorders only the holes rung 1 reuses, so it is an optional feature (adapter.FEATURES): the
lockstep rules here pass it only to an implementation that offers it (``adapter.features``), and a vector
that uses it says so in its header (``"requires": ["below"]``).

The draws are shared by the lockstep machine (Hypothesis) and the vector scenarios (a seeded Random); both
rules (lockstep.py r_admit_below / r_extend_below) have weight 0 in lockstep.RULES, so the committed random-walk
vectors stay as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvarena.conformance.adapter.protocol import features

if TYPE_CHECKING:
    from kvarena.conformance.machine.conductor import Conductor
    from kvarena.conformance.machine.lockstep import Chooser


def toward(holes: list[int], limit: int, low: bool, k: int) -> list[int]:
    """The first ``k`` holes rung 1 takes under a limit slot (spec §Placement limit): a low band's holes below
    the limit nearest it first, then the rest ascending; a high band's holes at or above it nearest it first,
    then the rest descending."""
    inside = sorted((h for h in holes if h < limit), reverse=True) if low else sorted(h for h in holes if h >= limit)
    rest = sorted(h for h in holes if h >= limit) if low else sorted((h for h in holes if h < limit), reverse=True)
    return (inside + rest)[:k]


def offers_below(c: Conductor) -> bool:
    """The reference and the implementation (if any) take ``below``."""
    ref = getattr(c.oracle, "arena", None)
    return (ref is None or "below" in features(ref)) and (c.impl is None or "below" in features(c.impl.alloc))


def limit_byte(c: Conductor, ch: Chooser, cls: str) -> int:
    """A byte in [0, capacity]: within a slot of the band's span (where its holes are), on the class's page grid or
    off it (floor for the low band, ceiling for the high band), anywhere, or one of the two extremes."""
    cap = c.geo.capacity
    pb = c.geo.page_bytes[cls]
    how = ch.choice(["span", "span", "span-off-grid", "anywhere", "zero", "capacity"], "below_how")
    if how == "zero":
        return 0
    if how == "capacity":
        return cap
    band = c.oracle.arena.bands[cls]  # the live reference (rules run on it)
    lo, hi = (0, cap // pb) if how == "anywhere" else (max(0, band.lo - 1), min(cap // pb, band.hi + 1))
    slot = ch.integer(lo, max(lo, hi), "below_slot")
    off = ch.integer(1, pb - 1, "below_off") if how == "span-off-grid" and pb > 1 else 0
    return min(cap, slot * pb + off)


def random_below(c: Conductor, ch: Chooser) -> dict[str, int] | None:
    """None (no limit), or a limit for one or both end bands."""
    named = [k for k in (c.geo.low, c.geo.high) if ch.boolean(f"below[{k}]")]
    if not named and ch.boolean("below_none"):
        return None
    return {k: limit_byte(c, ch, k) for k in named}


def bad_below(c: Conductor, ch: Chooser) -> Any:
    """A malformed ``below`` the reference refuses with InvalidArgument, state unchanged."""
    low, high = c.geo.low, c.geo.high
    cap = c.geo.capacity
    floats = c.geo.floats()
    cases: dict[str, Any] = {
        "unknown-class": {"nope": 0}, "bool": {low: True}, "negative": {high: -1}, "too-large": {low: cap + 1},
        "float-value": {high: 1.5}, "list": [[low, 0]], "string": low,
    }
    if floats:
        cases["float-class"] = {floats[0]: 0}
    return cases[ch.choice(sorted(cases), "bad_below")]
