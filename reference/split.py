"""§Baseline: fixed split pools sized by SGLang's ratio flags (spec/arena.md §Split-pool baseline).

The same API as the arena, but each class owns a fixed region for the whole
run: allocation takes free slots of the class's own region, nothing grows,
nothing moves.  This is what ``--swa-full-tokens-ratio`` and
``--mamba-full-memory-ratio`` give an engine without unified memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Band, BandView
from kvarena.reference.ladder import Placement, ceil_div
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import Kind, entry_layout
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand
from kvarena.spec.types import Plan, Rung


def exact_ratio(r: float | int | Fraction) -> Fraction:
    """A ratio hint as an exact rational: the decimal it is written as (``0.8`` is 4/5, on the command line or in a
    vector's JSON), not its binary floating-point value; ints and Fractions as they are."""
    return Fraction(r) if isinstance(r, int | Fraction) else Fraction(repr(float(r)))


def split_bytes(config: ArenaConfig) -> dict[str, int]:
    """Bytes per class as SGLang sizes fixed pools, in exact integer arithmetic (spec/arena.md §Split-pool baseline).

    Recurrent state takes ``floor(C * r / (1 + r))`` of the capacity ``C`` (mamba_mem / kv_mem = r); the rest is
    split so that each window class holds ``swa_full_tokens_ratio`` times the full class's tokens:
    ``full_tokens = floor(rest / (F + r * sum(S)))``. Every ratio is an exact rational (``exact_ratio``), so no
    rounding of binary floating point decides a byte.
    """
    classes = chain(config.model)
    out: dict[str, int] = {}
    rest = config.capacity
    for c in classes:
        if c.kind is Kind.RECURRENT:
            r = exact_ratio(config.mamba_full_memory_ratio)
            out[c.name] = config.capacity * r.numerator // (r.denominator + r.numerator)
            rest -= out[c.name]
    full = next(c for c in classes if c.kind is Kind.FULL)
    windows = [c for c in classes if c.kind is Kind.WINDOW]
    r = exact_ratio(config.swa_full_tokens_ratio)
    per_full_token = entry_layout(full).entry_bytes + r * sum(entry_layout(w).entry_bytes for w in windows)
    full_tokens = rest // per_full_token
    for w in windows:
        out[w.name] = (full_tokens * r.numerator // r.denominator) * entry_layout(w).entry_bytes
    out[full.name] = rest - sum(out[w.name] for w in windows)
    return out


def split_regions(config: ArenaConfig) -> dict[str, tuple[int, int]]:
    """Byte region per class, laid out in chain order from byte 0, each on its own page grid."""
    out: dict[str, tuple[int, int]] = {}
    cursor = 0
    sizes = split_bytes(config)
    for c in chain(config.model):
        p = config.page_bytes(c.name)
        lo = ceil_div(cursor, p) * p
        pages = max(0, min(sizes[c.name], config.capacity - lo) // p)
        out[c.name] = (lo, lo + pages * p)
        cursor = lo + pages * p
    return out


def float_hints(config: ArenaConfig) -> dict[str, int]:
    """Where each float band starts when empty: the byte its split-pool region starts at (exact, as above)."""
    floats = {c.name for c in chain(config.model)[1:-1]}
    return {name: lo for name, (lo, _hi) in split_regions(config).items() if name in floats}


class _FixedBand(Band):
    """A split pool's region: its span never grows, shrinks or moves."""

    def absorb_boundary_holes(self) -> int:
        return 0


class SplitPools(Arena):
    """The split-pool baseline, behind the arena's API."""

    ANCHORED_ENDS = False

    def __init__(self, config: ArenaConfig) -> None:
        self._regions_cfg = config
        super().__init__(config)

    def _float_hints(self) -> dict[str, int]:
        regions = split_regions(self.config)
        for name, band in list(self.bands.items()):
            fixed = _FixedBand(name, band.role, band.page_bytes, self.capacity)
            lo, hi = regions[name]
            fixed.lo, fixed.hi = lo // band.page_bytes, hi // band.page_bytes
            fixed.holes.update(range(fixed.lo, fixed.hi))
            self.bands[name] = fixed
        return {}

    def _check_floor(self) -> None:
        worst = worst_case_demand(self.config)
        for cls, n in worst.items():
            band = self.bands[cls]
            if n > band.hi - band.lo:
                raise CapacityTooSmallError(
                    f"split pool {cls!r} holds {band.hi - band.lo} pages but one worst-case request of "
                    f"{self.config.context_len} tokens needs {n}; raise capacity or change the ratio flags")

    def _plan_admission(self, demand: dict[str, int], limits: dict[str, int] | None = None) -> Plan:
        if not demand:
            return Plan(Rung.NONE)
        fit = Placement()
        for cls in self.order:
            v = BandView.of(self.bands[cls], (limits or {}).get(cls))  # a placement limit orders the holes
            d = demand.get(cls, 0)
            fit.slots[cls] = v.first_holes(min(d, v.hole_count))
            fit.shortfall[cls] = max(0, d - v.hole_count)
        if not fit.ok:
            raise self._rejection(demand, fit)
        return self._plan(Rung.REUSE, [], fit)

    def compact(self, max_moves: int | None = None) -> Plan:
        self._check_max_moves(max_moves)  # same refusals as the arena; split pools never move
        return Plan(Rung.NONE)

    def relayout(self, demand: Mapping[str, int]) -> Plan:
        self._check_demand(demand)
        return Plan(Rung.NONE)
