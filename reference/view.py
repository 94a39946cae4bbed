"""What a policy and the plan validator may read of the arena (spec/arena.md §Policies): a read-only view.

``Arena`` satisfies it; policy.py and validate.py are typed against it, not against ``Arena``, so neither depends
on the module that runs them (arena.py imports both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Protocol

from kvarena.reference.bands import Band
from kvarena.spec.types import Plan, Rung

PhysPage = tuple[str, int]  # (class name, slot on the class's page grid)


class ArenaView(Protocol):
    """The arena's state as a policy plans on it: read it, never change it (the arena validates every plan)."""

    capacity: int
    order: list[str]  # class names in chain order (low end first)
    bands: dict[str, Band]
    hints: dict[str, int]  # where an empty float reopens (§Float hints)
    readers: Counter[PhysPage]  # ledger readers per physical page
    writers: Counter[PhysPage]  # ledger writers per physical page

    def ladder(self, demand: dict[str, int], below: Mapping[str, int] | None = None, *,
               max_rung: Rung = Rung.RELAYOUT, relayout_budget: int | None = None, full: bool = False) -> Plan:
        """The spec's ladder for ``demand`` (read-only; AdmissionRejectedError with the shortfall)."""
        ...

    def plan_compact(self, max_moves: int | None = None) -> Plan:
        """The full flush of the end bands ``compact`` would do (read-only)."""
        ...
