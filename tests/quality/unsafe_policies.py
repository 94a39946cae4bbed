"""Deliberately unsafe admission policies: ``kvarena check-policy`` must catch each one."""

from __future__ import annotations

from kvarena.reference.arena import Arena
from kvarena.reference.policy import Ladder
from kvarena.spec.types import Move, Plan, Rung


class MovesWrittenPage(Ladder):
    """Compacts the high end band ignoring the ledger: moves the first page a writer holds into a hole."""

    name = "unsafe-moves-written-page"

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        plan = arena.ladder(demand)
        high = arena.bands[arena.order[-1]]
        written = sorted(s for (c, s) in arena.writers if c == high.name and s in high.live)
        if written and high.holes:
            bad = Move(high.name, written[0], high.holes[-1])
            return Plan(Rung.COMPACT, (bad, *plan.moves), plan.placements, plan.bytes_moved, plan.spans)
        return plan


class FillsWithheldHole(Ladder):
    """Reuses a withheld slot (freed, but a forward pass still reads it) as if it were a hole."""

    name = "unsafe-fills-withheld"

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        plan = arena.ladder(demand)
        for cls, slots in plan.placements.items():
            withheld = sorted(arena.bands[cls].withheld)
            if withheld and slots:
                placements = dict(plan.placements)
                placements[cls] = (withheld[0], *slots[1:])
                return Plan(plan.rung, plan.moves, placements, plan.bytes_moved, plan.spans)
        return plan


class RaisesInPlan(Ladder):
    """A policy with a bug of its own: plan() raises on a two-class demand."""

    name = "raises-in-plan"

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        if len(demand) >= 2:
            raise KeyError("policy bug: no such band")  # line checked by test_check_policy
        return arena.ladder(demand)


class NeedsArguments(Ladder):
    """Cannot be built with no arguments: a broken input, not a violation."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
