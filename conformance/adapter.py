"""The adapter protocol: what an allocator under test must offer the conformance harness.

It is the reference's public API (spec/arena.md §Operations) plus ``observe()``.
Virtual page ids are the implementation's own; the harness maps them.  Errors
must be the classes of ``kvarena.spec.errors`` (compare by class / ``code``).

Levels of agreement with the reference (what the lockstep harness compares):

``safety``     invariants of the implementation's own observation + data integrity
               (every virtual page reads back what was last written to each row)
``decisions``  + identical admit / reject outcomes and shortfall per class
``exact``      + identical placement: returned virtual ids, v->p, spans, holes, withheld
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import Plan, UserKind

LEVELS = ("safety", "decisions", "exact")


@dataclass(frozen=True)
class Observation:
    """The placement-level state an implementation exposes (all sorted, all plain ints)."""

    v2p: dict[int, tuple[str, int]]  # virtual page -> (class, slot)
    spans: dict[str, tuple[int, int]]  # class -> [lo, hi) slots
    holes: dict[str, tuple[int, ...]]
    withheld: dict[str, tuple[int, ...]]


@runtime_checkable
class Allocator(Protocol):
    """An allocator the harness can drive. ``kvarena.reference.arena.Arena`` satisfies it via ``observe``."""

    order: list[str]  # class names in chain order (low end first)

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Any: ...
    def extend(self, owner: str, demand: Mapping[str, int]) -> Any: ...
    def share(self, owner: str, vids: Sequence[int]) -> None: ...
    def drop(self, owner: str, vids: Sequence[int]) -> list[int]: ...
    def slide(self, owner: str, cls: str, n: int) -> list[int]: ...
    def free(self, owner: str) -> list[int]: ...
    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None: ...
    def release(self, user: str) -> None: ...
    def compact(self, max_moves: int | None = None) -> Plan: ...
    def relayout(self, demand: Mapping[str, int]) -> Plan: ...
    def write(self, vid: int, entry: int, row: int, tag: int) -> None: ...
    def read(self, vid: int, entry: int, row: int) -> int | None: ...
    def translate(self, vid: int) -> tuple[str, int]: ...


def observe_reference(arena: Any) -> Observation:
    """The reference's observation (also the shape every adapter's ``observe()`` returns)."""
    return Observation(
        v2p=dict(sorted(arena.v2p.items())),
        spans={n: (b.lo, b.hi) for n, b in arena.bands.items()},
        holes={n: tuple(b.holes) for n, b in arena.bands.items()},
        withheld={n: tuple(sorted(b.withheld)) for n, b in arena.bands.items()},
    )


class Factory(Protocol):
    """``package.module:factory`` for ``kvarena conform --impl``: builds an allocator for a config."""

    def __call__(self, config: ArenaConfig) -> Allocator: ...
