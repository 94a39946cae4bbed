"""A worked adapter: the reference behind another virtual-id space.

An engine's allocator names its pages with its own ids; the harness follows them through logical
handles, so it conforms at ``safety`` and ``decisions`` but not at ``exact`` (where the ids must be
the reference's).  The same pattern wraps an engine allocator whose method names or return shapes
differ from the protocol: translate at the boundary, change nothing else.

    kvarena conform --impl kvarena.conformance.adapter.renumbered:renumbered --level decisions
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from kvarena.conformance.adapter.protocol import Observation, observe_reference
from kvarena.reference.arena import Arena
from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import UserKind

OFFSET, STRIDE = 1000, 3  # outer id = OFFSET + STRIDE * inner id


class Renumbered:
    """The reference arena; every virtual id crossing the boundary is renumbered."""

    def __init__(self, config: ArenaConfig) -> None:
        self.inner = Arena(config)
        self.order = list(self.inner.order)

    # -- the id maps --------------------------------------------------------------------------
    @staticmethod
    def out(v: int) -> int:
        return OFFSET + STRIDE * v

    @staticmethod
    def into(v: int) -> int:
        q, r = divmod(v - OFFSET, STRIDE)
        return q if r == 0 and q >= 0 else -1 - abs(v)  # an id the inner arena never binds

    def _outs(self, vids: Sequence[int]) -> list[int]:
        return [self.out(v) for v in vids]

    def _ins(self, vids: Sequence[int]) -> list[int]:
        return [self.into(v) for v in vids]

    # -- the protocol -------------------------------------------------------------------------
    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Any:
        got = self.inner.admit(owner, demand, self._ins(shared))
        return SimpleNamespace(pages={c: self._outs(vs) for c, vs in got.pages.items()}, plan=got.plan)

    def extend(self, owner: str, demand: Mapping[str, int]) -> Any:
        got = self.inner.extend(owner, demand)
        return SimpleNamespace(pages={c: self._outs(vs) for c, vs in got.pages.items()}, plan=got.plan)

    def share(self, owner: str, vids: Sequence[int]) -> None:
        self.inner.share(owner, self._ins(vids))

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        return self._outs(self.inner.drop(owner, self._ins(vids)))

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        return self._outs(self.inner.slide(owner, cls, n))

    def free(self, owner: str) -> list[int]:
        return self._outs(self.inner.free(owner))

    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None:
        self.inner.acquire(user, kind, self._ins(vids))

    def release(self, user: str) -> None:
        self.inner.release(user)

    def compact(self, max_moves: int | None = None) -> Any:
        return self.inner.compact(max_moves)

    def relayout(self, demand: Mapping[str, int]) -> Any:
        return self.inner.relayout(demand)

    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        self.inner.write(self.into(vid), entry, row, tag)

    def read(self, vid: int, entry: int, row: int) -> int | None:
        return self.inner.read(self.into(vid), entry, row)

    def translate(self, vid: int) -> tuple[str, int]:
        return self.inner.translate(self.into(vid))

    def held(self, owner: str) -> dict[str, list[int]]:
        return {c: self._outs(vs) for c, vs in self.inner.held(owner).items()}

    def observe(self) -> Observation:
        o = observe_reference(self.inner)
        return Observation({self.out(v): p for v, p in o.v2p.items()}, o.spans, o.holes, o.withheld)


def renumbered(config: ArenaConfig) -> Renumbered:
    """``--impl kvarena.conformance.adapter.renumbered:renumbered``."""
    return Renumbered(config)
