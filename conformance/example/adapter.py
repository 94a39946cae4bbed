"""The adapter for example/pool.py: PoolAdapter does the protocol, this maps the pool's primitives.

    kvarena conform --impl kvarena.conformance.example.adapter:make          # conformant at safety
    kvarena conform --impl kvarena.conformance.example.adapter:make_buggy    # its frontier bug is caught
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvarena.conformance.adapter.base import PoolAdapter
from kvarena.conformance.example.pool import PoolFull, TwoEndedPool
from kvarena.reference.arena import Arena
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand
from kvarena.spec.pools import split_regions

PROTOCOL_VERSION = 12  # the adapter protocol this was written for: conform names any change since (CHANGELOG.md)


class TwoEndedAdapter(PoolAdapter):
    pool_type: type[TwoEndedPool] = TwoEndedPool  # example/buggy.py plants bugs in subclasses of the pool

    def __init__(self, config: ArenaConfig, frontier_slack: int = 0) -> None:
        super().__init__(config)
        Arena(config)  # the spec's feasibility floor: refuse exactly what the reference refuses
        regions = split_regions(config)  # middle classes get their split-pool region, fixed
        self.pool = self.pool_type(config.capacity, self.page_bytes, self.order,
                                {c: regions[c] for c in self.order[1:-1]}, frontier_slack)
        self.layouts = {c.name: entry_layout(c) for c in chain(config.model)}
        worst = worst_case_demand(config)
        probe = self.place(worst)
        if probe is None:  # stricter than the reference (fixed middle regions): allowed at safety
            raise CapacityTooSmallError(f"the pool's fixed regions cannot hold one worst-case request {worst}")
        for c, slots in probe.items():
            self.pool.release(c, slots)

    def place(self, demand: Mapping[str, int]) -> dict[str, list[int]] | None:
        try:
            return self.pool.alloc(dict(demand))
        except PoolFull:
            return None

    def release_slots(self, cls: str, slots: Sequence[int]) -> None:
        self.pool.release(cls, list(slots))

    def layout(self) -> tuple[dict[str, tuple[int, int]], dict[str, list[int]]]:
        return self.pool.spans(), {c: sorted(s) for c, s in self.pool.free.items()}

    def _offset(self, cls: str, slot: int, entry: int, row: int) -> int:
        lay = self.layouts[cls]
        return self.pool.page_start(cls, slot) + entry * lay.entry_bytes + lay.slots[row].offset

    def write_row(self, cls: str, slot: int, entry: int, row: int, tag: int) -> None:
        self.pool.store(self._offset(cls, slot, entry, row), tag)

    def read_row(self, cls: str, slot: int, entry: int, row: int) -> int:
        return self.pool.load(self._offset(cls, slot, entry, row))


def make(config: ArenaConfig) -> TwoEndedAdapter:
    """``--impl kvarena.conformance.example.adapter:make``."""
    return TwoEndedAdapter(config)


def make_buggy(config: ArenaConfig) -> TwoEndedAdapter:
    """The planted bug: each growing end may cross into its neighbour by up to half a page."""
    return TwoEndedAdapter(config, frontier_slack=max(config.page_bytes(c.name) for c in chain(config.model)) // 2)
