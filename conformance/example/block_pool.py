"""A vLLM-style block pool, written from conformance/README.md alone, and its adapter at level ``pool``.

``BlockPool`` knows nothing of kvarena: ``num_blocks`` blocks of one size (the largest page of any class, so any
class's page fits any block), one FIFO free queue for every class (a request pops blocks from the head, a freed
block goes to the tail, so classes interleave), blocks never move, and a block is zeroed when handed out.  It
has no bands, so it cannot keep INV-BAND-ORDER: it is checked at ``--level pool``, on byte ranges.

    kvarena conform --impl kvarena.conformance.example.block_pool:make --level pool          # PASS
    kvarena conform --impl kvarena.conformance.example.block_pool:make                       # FAIL at safety
    kvarena conform --impl kvarena.conformance.example.block_pool:make_buggy_twice --level pool

The ``make_buggy_*`` factories plant one bug each (tests/fast/test_conform_pool.py: each is caught at ``pool``,
with the invariant it breaks).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import NoReturn

from kvarena.conformance.adapter.base import PoolAdapter
from kvarena.conformance.adapter.protocol import PoolObservation
from kvarena.reference.arena import Arena
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand


class NoFreeBlocks(Exception):
    """Fewer free blocks than the request asks for."""


class BlockPool:
    """Blocks of ``block_bytes``; ``bug`` plants one of the pool's bugs ("twice", "unzeroed", "leak")."""

    def __init__(self, num_blocks: int, block_bytes: int, bug: str | None = None) -> None:
        self.num_blocks, self.block_bytes, self.bug = num_blocks, block_bytes, bug
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.mem: dict[int, dict[int, int]] = {}  # block -> byte offset in it -> tag (only written bytes)

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free_queue) and self.bug != "leak":  # planted: pops until empty, losing the blocks popped
            self._full(n)
        got = [self.free_queue.popleft() if self.free_queue else self._full(n) for _ in range(n)]
        if self.bug == "twice" and n > 1:  # planted: the last block is peeked, not popped: handed out again
            self.free_queue.appendleft(got[-1])
        for b in got:
            if self.bug != "unzeroed":  # planted: a reused block keeps its last owner's bytes
                self.mem.pop(b, None)
        return got

    def _full(self, n: int) -> NoReturn:
        raise NoFreeBlocks(f"{n} blocks asked, {len(self.free_queue)} free")

    def free_blocks(self, blocks: Sequence[int]) -> None:
        self.free_queue.extend(blocks)

    def store(self, block: int, offset: int, tag: int) -> None:
        self.mem.setdefault(block, {})[offset] = tag

    def load(self, block: int, offset: int) -> int:
        return self.mem.get(block, {}).get(offset, 0)


class BlockPoolAdapter(PoolAdapter):
    """PoolAdapter does the protocol (checks, ids, owners, the ledger); a page's slot is its block id."""

    def __init__(self, config: ArenaConfig, bug: str | None = None) -> None:
        super().__init__(config)
        Arena(config)  # refuse every configuration the reference refuses (the feasibility floor)
        self.block = max(self.page_bytes.values())
        self.pool = BlockPool(config.capacity // self.block, self.block, bug)
        worst = worst_case_demand(config)
        if sum(worst.values()) > self.pool.num_blocks:  # stricter than the reference: allowed below decisions
            raise CapacityTooSmallError(f"{self.pool.num_blocks} blocks cannot hold one worst-case request {worst}")
        self.layouts = {c.name: entry_layout(c) for c in chain(config.model)}

    def place(self, demand: Mapping[str, int]) -> dict[str, list[int]] | None:
        try:
            blocks = iter(self.pool.get_new_blocks(sum(demand.values())))
        except NoFreeBlocks:
            return None
        return {c: [next(blocks) for _ in range(demand[c])] for c in self.order if demand.get(c)}

    def release_slots(self, cls: str, slots: Sequence[int]) -> None:
        self.pool.free_blocks(slots)

    def _offset(self, cls: str, entry: int, row: int) -> int:
        lay = self.layouts[cls]
        return entry * lay.entry_bytes + lay.slots[row].offset

    def write_row(self, cls: str, slot: int, entry: int, row: int, tag: int) -> None:
        self.pool.store(slot, self._offset(cls, entry, row), tag)

    def read_row(self, cls: str, slot: int, entry: int, row: int) -> int:
        return self.pool.load(slot, self._offset(cls, entry, row))

    def observe(self) -> PoolObservation:  # byte ranges: block b is [b * block, (b + 1) * block)
        b = self.block
        return PoolObservation({v: (c, s * b, b) for v, (c, s) in self.v2p.items()},
                               tuple((s * b, b) for _c, s in self.withheld),
                               tuple((s * b, b) for s in self.pool.free_queue), self.pool.num_blocks * b)


class _ForgetsUsers(BlockPoolAdapter):
    def _unref(self, vids: Sequence[int]) -> list[int]:
        holders, self.holders = self.holders, Counter()  # planted: the free does not look at the ledger
        try:
            return super()._unref(vids)
        finally:
            self.holders = holders


class _FreesShared(BlockPoolAdapter):
    def _unref(self, vids: Sequence[int]) -> list[int]:
        freed = super()._unref(vids)
        for v in vids:  # planted: a dropped page's block goes back even while another owner still holds it
            if v in self.v2p:
                cls, slot = self.v2p[v]
                self.release_slots(cls, [slot])
        return freed


def make(config: ArenaConfig) -> BlockPoolAdapter:
    """``--impl kvarena.conformance.example.block_pool:make --level pool``."""
    return BlockPoolAdapter(config)


def make_buggy_twice(config: ArenaConfig) -> BlockPoolAdapter:
    """A block handed out twice (the last block of a request stays queued): INV-NO-OVERLAP."""
    return BlockPoolAdapter(config, "twice")


def make_buggy_unzeroed(config: ArenaConfig) -> BlockPoolAdapter:
    """A reused block is not zeroed on hand-out: INV-CONTENT-FOLLOWS-VID."""
    return BlockPoolAdapter(config, "unzeroed")


def make_buggy_leak(config: ArenaConfig) -> BlockPoolAdapter:
    """A request that does not fit loses the blocks popped before the refusal: INV-BYTE-CONSERVATION."""
    return BlockPoolAdapter(config, "leak")


def make_buggy_ledger(config: ArenaConfig) -> BlockPoolAdapter:
    """A freed block goes back to the queue while a ledger user still holds it: INV-LEDGER-SAFETY."""
    return _ForgetsUsers(config)


def make_buggy_shared(config: ArenaConfig) -> BlockPoolAdapter:
    """A shared block is freed when one owner drops it, while another still holds it: INV-NO-OVERLAP."""
    return _FreesShared(config)
