"""§Baseline: fixed split pools sized by SGLang's ratio flags (spec/arena.md §Split-pool baseline).

The same API as the arena, but each class owns a fixed region for the whole
run: allocation takes free slots of the class's own region, nothing grows,
nothing moves.  This is what ``--swa-full-tokens-ratio`` and
``--mamba-full-memory-ratio`` give an engine without unified memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvarena.reference.arena import Arena
from kvarena.reference.bands import Band, BandView
from kvarena.reference.ladder import Placement
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.models import ArenaConfig, worst_case_demand
from kvarena.spec.pools import split_regions
from kvarena.spec.types import Plan, Rung


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
