"""transformers 5.23.0's real sector pool under ``kvarena conform --level pool``.

    kvarena conform --impl kvarena.engines.transformers.pool_adapter:make --level pool

What runs for real (transformers' ``cache_allocators/cache_pool.py``): ``CachePool`` and its ``RegularTrees``. One
allocator index per kvarena class, each cutting whole sectors into blocks of its own size, as
``PagedAttentionCache`` sets them up (``cache.py:173``: a sector is the lcm of every group's block bytes and 128;
``set_blocks_per_sector``). An admission is the one transformers makes for a fork (``cache.py`` ``fork_request``):
count the blocks each class misses beyond its free leaves, refuse unless that many new sectors are free
(``num_free_sectors``), ``allocate_sector`` for each, then ``get_free_blocks``. A free is ``free_blocks`` followed
by ``try_to_free_sectors`` (the engine calls it after every step, ``continuous_api.py`` ``update_batch``), so a
sector whose blocks are all free goes back to the shared list. No trash sectors: transformers reserves two only
on a GPU (``CachePool`` docstring).

What is the adapter's (``PoolAdapter``): argument checks, virtual ids, owners and the ledger (transformers' engine
frees a request's blocks only after its last batch ran, which is the withheld state here), and the bytes: the
pool holds none, so row tags are stored per block and a block reads 0 when handed out. Block ``b`` of class ``c``
is bytes ``[s * S + (b % k) * P, ... + P)`` with ``s = b // k`` its sector, ``S`` the sector's bytes, ``k`` the
class's blocks per sector and ``P`` its page bytes: a block is contiguous in its sector (the paged cache's own K/V
views agree: engines/transformers/paged_checks.py ``block_extent``).

Its own engine-level machine (paged_machine.py, the TF-* IDs, each refining a kvarena invariant) checks the rest:
the scheduler, prefix sharing, forks and offloading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import ceil, lcm

from transformers.generation.continuous_batching.cache_allocators.cache_pool import CachePool

from kvarena.conformance.adapter.base import PoolAdapter
from kvarena.conformance.adapter.protocol import PoolObservation
from kvarena.reference.arena import Arena
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand

SECTOR_ALIGN = 128  # cache.py:173: lcm(*(bytes_per_block), 128)


class TransformersPoolAdapter(PoolAdapter):
    """A page is one block of its class's allocator index; its slot is transformers' block id."""

    def __init__(self, config: ArenaConfig) -> None:
        super().__init__(config)
        Arena(config)  # refuse every configuration the reference refuses (the feasibility floor)
        self.index = {c: i for i, c in enumerate(self.order)}
        self.sector = lcm(*self.page_bytes.values(), SECTOR_ALIGN)
        self.per_sector = {c: self.sector // p for c, p in self.page_bytes.items()}
        n = config.capacity // self.sector
        worst = worst_case_demand(config)
        need = sum(ceil(k / self.per_sector[c]) for c, k in worst.items())
        if need > n:  # stricter than the reference (whole sectors per class): allowed below decisions
            raise CapacityTooSmallError(f"{n} sectors of {self.sector} B cannot hold one worst-case request "
                                        f"{worst} ({need} sectors); raise capacity")
        self.pool = CachePool(n, len(self.order), num_reserved_sectors=0)
        for c, i in self.index.items():
            self.pool.set_blocks_per_sector(i, self.per_sector[c])
        self.layouts = {c.name: entry_layout(c) for c in chain(config.model)}
        self.mem: dict[tuple[str, int], dict[int, int]] = {}  # (class, block) -> byte offset in it -> tag

    def place(self, demand: Mapping[str, int]) -> dict[str, list[int]] | None:
        sectors = {c: ceil(max(0, n - self.pool.count_free_blocks(self.index[c])) / self.per_sector[c])
                   for c, n in demand.items()}
        if sum(sectors.values()) > self.pool.num_free_sectors:
            return None
        out = {}
        for c in self.order:
            if not demand.get(c):
                continue
            for _ in range(sectors[c]):
                self.pool.allocate_sector(self.index[c])
            out[c] = self.pool.get_free_blocks(self.index[c], demand[c])
            for b in out[c]:
                self.mem.pop((c, b), None)  # handed out: reads 0
        return out

    def release_slots(self, cls: str, slots: Sequence[int]) -> None:
        self.pool.free_blocks(self.index[cls], list(slots))
        self.pool.try_to_free_sectors()

    def _offset(self, cls: str, entry: int, row: int) -> int:
        lay = self.layouts[cls]
        return entry * lay.entry_bytes + lay.slots[row].offset

    def write_row(self, cls: str, slot: int, entry: int, row: int, tag: int) -> None:
        self.mem.setdefault((cls, slot), {})[self._offset(cls, entry, row)] = tag

    def read_row(self, cls: str, slot: int, entry: int, row: int) -> int:
        return self.mem.get((cls, slot), {}).get(self._offset(cls, entry, row), 0)

    def extent(self, cls: str, block: int) -> tuple[int, int]:
        """(offset, nbytes) of ``block`` of ``cls`` in the pool's bytes."""
        k = self.per_sector[cls]
        return (block // k) * self.sector + (block % k) * self.page_bytes[cls], self.page_bytes[cls]

    def observe(self) -> PoolObservation:
        free = [(s * self.sector, self.sector) for s in self.pool.free_sectors]
        for c, i in self.index.items():  # the free leaves of each class's cut sectors
            free += [self.extent(c, b) for tree in self.pool._free_blocks[i].trees.values() for b in tree]
        return PoolObservation({v: (c, *self.extent(c, s)) for v, (c, s) in self.v2p.items()},
                               tuple(self.extent(c, s) for c, s in self.withheld), tuple(free),
                               self.pool.num_sectors * self.sector)


def make(config: ArenaConfig) -> TransformersPoolAdapter:
    """``--impl kvarena.engines.transformers.pool_adapter:make --level pool``."""
    return TransformersPoolAdapter(config)
