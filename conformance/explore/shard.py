"""Past one machine: a level's frontier sharded by state hash across Ray actors.

Each actor holds an :class:`~kvarena.conformance.explore.search.Expander` (the bounds, and the digests it has
sent, so it sends each successor once); the frontier's state ``i`` goes to actor ``digest % workers``. The
coordinator (search.py) merges the expansions in frontier order and keeps each state's first occurrence, so the
states, transitions, successors kept and violations are those of one process (tests/fast/test_explore_ray.py).
Ray schedules the actors; nothing here is a scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvarena.conformance.explore.search import Bounds, Expander, Expansion, Node, Result, explore


class RayUnavailable(RuntimeError):
    """--ray needs the ray extra (tested with 2.60.0): pip install 'kvarena[ray]'."""


class _Actor:
    def __init__(self, bounds: Bounds) -> None:
        self.ex = Expander(bounds)

    def expand_many(self, nodes: Sequence[tuple[int, bytes]], depth: int, grow: bool) -> list[tuple[int, Expansion]]:
        return self.ex.expand_many(nodes, depth, grow)


class RayBackend:
    """``workers`` actors on the Ray cluster at ``address`` (``auto``, ``ray://host:10001``, or ``local``)."""

    def __init__(self, bounds: Bounds, address: str, workers: int) -> None:
        try:
            import ray
        except ModuleNotFoundError:
            raise RayUnavailable("--ray needs the ray extra (tested with 2.60.0): pip install 'kvarena[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.ray = ray
        actor = ray.remote(_Actor)
        self.actors: list[Any] = [actor.remote(bounds) for _ in range(workers)]

    def expand_level(self, frontier: Sequence[tuple[bytes, Node]], depth: int,
                     grow: bool) -> list[tuple[int, Expansion]]:
        w = len(self.actors)
        shards: list[list[tuple[int, bytes]]] = [[] for _ in range(w)]
        for i, (d, node) in enumerate(frontier):
            shards[int.from_bytes(d[:8], "little") % w].append((i, node))
        pending = [a.expand_many.remote(s, depth, grow) for a, s in zip(self.actors, shards) if s]
        return [x for part in self.ray.get(pending) for x in part]

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


def explore_on_ray(bounds: Bounds, address: str, workers: int = 2,
                   progress: Callable[[str], None] | None = None) -> Result:
    """:func:`~kvarena.conformance.explore.search.explore` with each level on ``workers`` Ray actors."""
    return explore(bounds, progress=progress, sharded=lambda b: RayBackend(b, address, workers), workers=workers)
