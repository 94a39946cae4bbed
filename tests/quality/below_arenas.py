"""Reference arenas that get the placement limit ``below`` wrong (or lack it): the vectors, the lockstep rules and
the machine must refuse or catch each (tests/fast/test_vectors.py, tests/fast/test_conform_below.py)."""

from __future__ import annotations

from kvarena.reference.arena import Arena


class NoBelow(Arena):
    """The reference without the optional placement limit (an adapter that predates it)."""

    def admit(self, owner, demand, shared=()):  # type: ignore[override]
        return super().admit(owner, demand, shared)

    def extend(self, owner, demand):  # type: ignore[override]
        return super().extend(owner, demand)


class IgnoresBelow(Arena):
    """Takes `below` and drops it (no validation, nearest-the-anchor holes whatever the limit)."""

    def admit(self, owner, demand, shared=(), below=None):  # type: ignore[override]
        return super().admit(owner, demand, shared)

    def extend(self, owner, demand, below=None):  # type: ignore[override]
        return super().extend(owner, demand)
