"""The shortfall search of rung 2 (spec/arena.md §Rung 2: shortfall-sized compaction).

Which move counts are probed decides the answer wherever the oracle ("does the demand fit after k moves?") is
not monotone, so the probe order is part of the contract. It lives here, once, for every implementation: the
reference's lazily generated ``EndPack`` and gpu/'s numpy ``EndSeq`` are both a :class:`Moves`. How the oracle
is computed is free: the reference places once per probe; gpu/ answers a whole line (one end's every move count,
the other's fixed) as one array (``along``) and the search reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class _Band(Protocol):
    page_bytes: int


class Moves(Protocol):
    """One end band's move sequence: ``extend(k)`` makes sure the first ``k`` moves exist (all, if None) and
    returns how many there are (fewer when the sequence ends)."""

    band: _Band

    def extend(self, k: int | None = None) -> int: ...


def along(fit: Callable[[int, int], bool], end: int, other: int) -> Callable[[int], bool]:
    """``fit`` along one line: the ``end`` band's move count free (0: the low band, 1: the high band), the
    other's fixed at ``other``. An oracle with its own ``along`` answers the line its way (gpu/: one array over
    every move count); pointwise the values must be the same."""
    line = getattr(fit, "along", None)
    if line is not None:
        return line(end, other)
    return (lambda k: fit(k, other)) if end == 0 else (lambda k: fit(other, k))


def least(ok: Callable[[int], bool], seq: Moves, first: int = 1, cap: int | None = None) -> int | None:
    """The smallest move count ``k >= first`` of ``seq`` (and ``<= cap``) with ``ok(k)``, or None.  Galloping
    (1, 2, 4, ...) then bisection: O(k) moves generated, O(log k) probes.  Every count it returns was probed, so
    it returns a count where ``ok`` holds even if ``ok`` were not monotone; it is the smallest when it is."""
    if first == 0:
        if ok(0):
            return 0
        first = 1
    bad, k = first - 1, first
    while True:
        if cap is not None:
            k = min(k, cap)
        k = min(k, seq.extend(k))
        if k <= bad:  # the sequence (or the cap) ended below anything untried
            return None
        if ok(k):
            good = k
            while good - bad > 1:
                mid = (bad + good) // 2
                if ok(mid):
                    good = mid
                else:
                    bad = mid
            return good
        bad, k = k, 2 * k


def size_ends(fit: Callable[[int, int], bool], low: Moves, high: Moves) -> tuple[int, int] | None:
    """Shortfall-sized rung 2: how many moves of each end band's sequence, ``(k_low, k_high)``, make ``fit``
    true (``fit(0, 0)`` is false: rung 1 failed).  One band alone if it can, the one moving fewer bytes (ties:
    the low band); else the low band's whole sequence and the fewest high moves, then the fewest low moves
    that still fit.  None when even both whole sequences do not fit."""
    p_low, p_high = low.band.page_bytes, high.band.page_bytes
    k_low = least(along(fit, 0, 0), low)
    cap = None if k_low is None else (k_low * p_low - 1) // p_high  # the high band must move fewer bytes
    k_high = least(along(fit, 1, 0), high, cap=cap) if cap is None or cap >= 1 else None
    if k_high is not None:
        return 0, k_high
    if k_low is not None:
        return k_low, 0
    n_low = low.extend()
    k_high = least(along(fit, 1, n_low), high)
    if k_high is None:
        return None
    k_low = least(along(fit, 0, k_high), low)
    assert k_low is not None  # fit(n_low, k_high) holds and was probed
    return k_low, k_high
