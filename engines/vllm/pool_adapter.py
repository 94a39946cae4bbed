"""vLLM 0.33.0's real ``BlockPool`` under ``kvarena conform --level pool``.

    kvarena conform --impl kvarena.engines.vllm.pool_adapter:make --level pool

What runs for real (from the installed wheel, through engines/vllm/load.py's stand-ins): ``BlockPool``
(v1/core/block_pool.py) and its ``FreeKVCacheBlockQueue``: ``get_new_blocks`` for every admission (one pool, one
block size for every class, as vLLM's hybrid manager does), ``touch`` when a second owner shares a block (a prefix
hit), ``free_blocks`` when an owner lets go (the reference count drops; at 0 the block is prepended to the free
queue), the null block 0 that is never handed out.  The observation reads vLLM's free queue itself.

What is the adapter's (PoolAdapter): argument checks, virtual ids, owners and the ledger — a block freed while a
ledger user still holds it keeps its reference until the release, as the scheduler's deferred frees do
(``pop_blocks_for_free``, then ``free_blocks`` when the step completes) — and the bytes: vLLM's pool has none, so
the adapter stores row tags per block and zeroes a block when it is handed out. vLLM does not zero (its kernels
read only the tokens written since); kvarena's contract does (INV-CONTENT-FOLLOWS-VID).

Why not the ``KVCacheManager``: it takes tokens per request and answers in blocks per KV cache group, not pages
per class, so kvarena's operations reach only a slice of it; its own machine (engines/vllm/machine.py) checks it
with the VLLM-* IDs, each refining a kvarena invariant (engines/vllm/checks.py ``REFINES``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvarena.conformance.adapter.base import PoolAdapter
from kvarena.conformance.adapter.protocol import PoolObservation
from kvarena.engines.vllm.load import load_vllm
from kvarena.reference.arena import Arena
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand


class VLLMBlockPoolAdapter(PoolAdapter):
    """A page is one block of vLLM's pool (the largest page of any class: every class fits any block)."""

    def __init__(self, config: ArenaConfig) -> None:
        super().__init__(config)
        Arena(config)  # refuse every configuration the reference refuses (the feasibility floor)
        self.block = max(self.page_bytes.values())
        n = config.capacity // self.block
        worst = worst_case_demand(config)
        if n - 1 < sum(worst.values()):  # block 0 is vLLM's null block
            raise CapacityTooSmallError(f"{n - 1} blocks cannot hold one worst-case request {worst}")
        self.pool = load_vllm().pool.BlockPool(n, enable_caching=True, hash_block_size=config.page_size)
        self.layouts = {c.name: entry_layout(c) for c in chain(config.model)}
        self.mem: dict[int, dict[int, int]] = {}  # block id -> byte offset in it -> tag (only written bytes)

    def place(self, demand: Mapping[str, int]) -> dict[str, list[int]] | None:
        try:
            got = self.pool.get_new_blocks(sum(demand.values()))
        except ValueError:  # "Cannot get n free blocks from the pool": nothing was taken
            return None
        for b in got:
            self.mem.pop(b.block_id, None)
        ids = iter(b.block_id for b in got)
        return {c: [next(ids) for _ in range(demand[c])] for c in self.order if demand.get(c)}

    def release_slots(self, cls: str, slots: Sequence[int]) -> None:
        self.pool.free_blocks([self.pool.blocks[s] for s in slots])

    def _blocks(self, vids: Sequence[int]) -> list[Any]:
        return [self.pool.blocks[self.v2p[v][1]] for v in vids]

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Any:
        out = super().admit(owner, demand, shared)
        self.pool.touch(self._blocks(shared))  # a prefix hit: one more reference per shared block
        return out

    def share(self, owner: str, vids: Sequence[int]) -> None:
        super().share(owner, vids)
        self.pool.touch(self._blocks(vids))

    def _unref(self, vids: Sequence[int]) -> list[int]:
        kept = [b for v, b in zip(vids, self._blocks(vids)) if self.refs[v] > 1]  # another owner still holds it
        freed = super()._unref(vids)  # the last reference: release_slots, now or at the last user's release
        self.pool.free_blocks(kept)  # one reference less; never 0 here, so never queued
        return freed

    def _offset(self, cls: str, entry: int, row: int) -> int:
        lay = self.layouts[cls]
        return entry * lay.entry_bytes + lay.slots[row].offset

    def write_row(self, cls: str, slot: int, entry: int, row: int, tag: int) -> None:
        self.mem.setdefault(slot, {})[self._offset(cls, entry, row)] = tag

    def read_row(self, cls: str, slot: int, entry: int, row: int) -> int:
        return self.mem.get(slot, {}).get(self._offset(cls, entry, row), 0)

    def free_ids(self) -> list[int]:
        """vLLM's free queue from its fake head (bounded: a malformed list shows as what it reaches)."""
        q, out = self.pool.free_block_queue, []
        node = q.fake_free_list_head.next_free_block
        while node is not None and node is not q.fake_free_list_tail and len(out) <= len(self.pool.blocks):
            out.append(node.block_id)
            node = node.next_free_block
        return out

    def observe(self) -> PoolObservation:  # block b is bytes [b * block, (b + 1) * block); block 0 is no page
        b = self.block
        return PoolObservation({v: (c, s * b, b) for v, (c, s) in self.v2p.items()},
                               tuple((s * b, b) for _c, s in self.withheld),
                               tuple((s * b, b) for s in self.free_ids()), (len(self.pool.blocks) - 1) * b)


def make(config: ArenaConfig) -> VLLMBlockPoolAdapter:
    """``--impl kvarena.engines.vllm.pool_adapter:make --level pool``."""
    return VLLMBlockPoolAdapter(config)
