"""§Policies: plug-in admission policies (spec/arena.md §Policies).

A policy decides *how* to make room — which rung to try, which holes to fill,
which pages move where and in which order — and returns a ``Plan``.  It may not
decide anything that breaks an invariant: the arena validates every plan
(``reference/validate.py``) before applying it, so a policy is never trusted.

Policies read the arena but never mutate it.  They raise
``AdmissionRejectedError`` (with the shortfall) when they find no plan.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Protocol

from kvarena.reference.bands import Band, BandView
from kvarena.reference.ladder import place
from kvarena.reference.view import ArenaView
from kvarena.spec.types import Plan, Rung


class Policy(Protocol):
    """What a plug-in admission policy implements."""

    name: str

    def plan(self, arena: ArenaView, demand: dict[str, int], below: Mapping[str, int] | None = None) -> Plan:
        """A plan placing ``demand`` (validated, non-empty); raise AdmissionRejectedError if none. ``below``: the
        caller's placement limit as slots per end-band class (checked, spec/arena.md §Placement limit), empty
        for none; pass it on to ``arena.ladder`` or ignore it. A policy whose ``plan`` takes no ``below`` (written
        before it was an argument) is called without it and ignores the limit."""
        ...

    def after_free(self, arena: ArenaView) -> Plan | None:
        """Optional moves right after pages were freed (e.g. eager compaction); None for none.

        The plan is validated with an empty demand (it may move pages, never place one); if it is refused, or
        this hook raises, the free is undone with it and the caller gets the error."""
        ...


class Ladder:
    """The spec's ladder: reuse in place, compact the ends, relayout the floats (the default).

    Rung 2 moves only as many end-band pages as the shortfall needs, frontier side first; rung 3 moves only the
    float pages outside the room (spec/arena.md §Rung 2, §Rung 3)."""

    name = "ladder"

    def plan(self, arena: ArenaView, demand: dict[str, int], below: Mapping[str, int] | None = None) -> Plan:
        return arena.ladder(demand, below)

    def after_free(self, arena: ArenaView) -> Plan | None:
        return None


class NoRelayout(Ladder):
    """SGLang's two-pool behaviour: reuse and compaction, never a relayout of float bands."""

    name = "no-relayout"

    def plan(self, arena: ArenaView, demand: dict[str, int], below: Mapping[str, int] | None = None) -> Plan:
        return arena.ladder(demand, below, max_rung=Rung.COMPACT)


class RelayoutBudget(Ladder):
    """The ladder, but a relayout may move at most ``budget_bytes`` per admission."""

    def __init__(self, budget_bytes: int = 64 << 20) -> None:
        self.budget_bytes = budget_bytes
        self.name = f"relayout-budget-{budget_bytes >> 20}MiB"

    def plan(self, arena: ArenaView, demand: dict[str, int], below: Mapping[str, int] | None = None) -> Plan:
        return arena.ladder(demand, below, relayout_budget=self.budget_bytes)


class FullCompaction(Ladder):
    """SGLang's urgent flush: rung 2 packs both end bands whole (every move of their two-pointer sequences,
    readers or not) and rung 3 takes the span nearest the float's position; for comparison with the default."""

    name = "full-compaction"

    def plan(self, arena: ArenaView, demand: dict[str, int], below: Mapping[str, int] | None = None) -> Plan:
        return arena.ladder(demand, full=True)  # SGLang's flush takes no placement limit


class EagerCompaction(Ladder):
    """The ladder, plus a full compaction of the end bands whenever pages are freed (SGLang's eager mode)."""

    name = "eager-compaction"

    def after_free(self, arena: ArenaView) -> Plan | None:
        return arena.plan_compact(None)


class BestFit(Ladder):
    """Rung 1 takes, per band, the smallest run of consecutive holes that holds the whole demand (ties: nearest
    the anchor); if no run does, it fills the shortest runs first, keeping long runs whole.

    A long run of holes at a band's far edge is what boundary absorption gives back to
    the gap; filling short runs first keeps those runs intact.  Bounded best fit: the
    candidates are the ``4k + 64`` holes nearest the anchor for a demand of k pages, so
    an admission costs O(k log k), not O(holes).
    """

    name = "best-fit"

    def plan(self, arena: ArenaView, demand: dict[str, int], below: Mapping[str, int] | None = None) -> Plan:
        # best fit chooses its own holes: it ignores the placement limit, also when it falls back to the ladder
        views = [_best_fit_view(arena.bands[n], demand.get(n, 0)) for n in arena.order]
        fit = place(views, demand, arena.hints)
        if fit.ok:
            return Plan(Rung.REUSE, placements={c: tuple(s) for c, s in fit.slots.items() if s})
        return arena.ladder(demand)


def _best_fit_view(band: Band, k: int) -> BandView:
    view = BandView.of(band)
    if k == 0:
        return view
    candidates = band.first_holes(4 * k + 64)  # anchor order
    runs: list[list[int]] = []
    for s in candidates:
        if runs and abs(runs[-1][-1] - s) == 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    holding = [r for r in runs if len(r) >= k]
    if holding:  # the smallest run that holds the demand, nearest the anchor among equals, goes first
        best = min(holding, key=len)
        runs = [best] + [r for r in runs if r is not best]
        order = [s for r in runs for s in r]
    else:
        order = [s for _, r in sorted(enumerate(runs), key=lambda ir: (len(ir[1]), ir[0])) for s in r]
    view._first = lambda n: order[:max(0, n)]
    return view


POLICIES: dict[str, Callable[[], Policy]] = {
    "ladder": Ladder,
    "best-fit": BestFit,
    "eager-compaction": EagerCompaction,
    "full-compaction": FullCompaction,
    "no-relayout": NoRelayout,
    "relayout-budget": RelayoutBudget,
}


def takes_below(policy: object) -> bool:
    """Whether ``policy.plan`` takes the placement limit (a third argument, ``below``): policies written before it
    was an argument take two and are called with two. Decided once per plan function (this runs per admission)."""
    plan = getattr(policy, "plan", None)
    key = getattr(plan, "__func__", plan)
    got = _TAKES_BELOW.get(key)
    if got is None:
        try:
            params = inspect.signature(plan).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        got = _TAKES_BELOW[key] = "below" in params or len(positional) >= 3
    return got


_TAKES_BELOW: dict[object, bool] = {}
