"""transformers 5.23.0's real sector pool as a simulator engine, on CPU, with no tensors.

What runs is transformers' own code from the installed wheel (``generation/continuous_batching/cache_allocators/
cache_pool.py``), set up by the conformance adapter ``engines/transformers/pool_adapter.py``
(``TransformersPoolAdapter``) exactly as ``PagedAttentionCache`` does: ``CachePool`` with one allocator index per
kvarena class, a sector of ``lcm(every class's page bytes, 128)`` (``cache.py:173``) cut by each index into whole
blocks of its own size (``set_blocks_per_sector``), no reserved trash sectors (a GPU-only reserve). Every decision is
the pool's: an admission counts the blocks each class misses beyond its free leaves, refuses unless that many new
sectors are free (``num_free_sectors``), then ``allocate_sector`` and ``get_free_blocks``; a free is ``free_blocks``
then ``try_to_free_sectors``, so a sector returns to the shared list only once every block in it is free. A page is
one block of ``page_size`` tokens of its class (gpt-oss-20b: window and full blocks are both 1.5 MiB, so a sector is
one block; qwen3.5-4b: a sector is 786 MiB, 16 state slots or 393 full pages, 35 sectors in 27.33 GiB).

What is the adapter's (``PoolAdapter``, conformance/adapter/base.py): the argument checks, virtual ids, owners and
the ledger: a page freed while an in-flight forward (a ledger user) holds it is withheld, and goes back to the pool
at that user's release (transformers' engine frees a request's blocks only after its last batch ran). The adapter's
per-block row tags (``mem``) stay empty: the simulator never writes rows, so no byte of the arena is stored.

What is this module's: the allocator surface the scheduler and pager read of a pool of its own (``fits``,
``used_bytes``, ``occupancy``, ``page_bytes_of``, ``stats``) and ``check_invariants`` (block and sector
conservation over the pool's own lists), and one batching: the blocks an operation frees go to the pool in one
``free_blocks`` per class and one ``try_to_free_sectors`` (:func:`_adapter_class`). Every call costs O(pages it
touches), plus, when it frees, one scan of the sectors that hold a free block; ``check_invariants`` is O(pages +
sectors). Measured (one CPU core, 10,000 admit / extend / free cycles at a few hundred live requests): gpt-oss-20b
at 52.16 GiB ~120 us a cycle of 20 pages, qwen3.5-4b at 27.33 GiB ~570 us a cycle of 257 pages (kvarena's arena:
~320 / ~1,590 us); construction takes milliseconds once transformers is imported (~4-5 s, the first time).

Not expressed: prefix sharing. ``CachePool`` has no reference counts (transformers shares prefix blocks in its
``BlockManager``, above the pool) and no state copy, so this engine offers neither ``share`` nor ``copy_state`` and
the scheduler runs it without a prefix cache (``prefix.supported``); ``admit`` refuses ``shared`` pages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cache
from types import SimpleNamespace
from typing import Any

from kvarena.reference.arena import Stats
from kvarena.spec.errors import InvalidArgumentError, InvariantViolation
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig

MODULE = "transformers.generation.continuous_batching.cache_allocators.cache_pool"


def _import_pool() -> None:
    """Import transformers' pool with the vLLM loader's ``sys.modules`` stand-ins (psutil, zmq when not installed:
    engines/vllm/load.py) set aside: transformers asks ``importlib.util.find_spec("psutil")`` at import, which
    raises on a stand-in without a spec, so a process that ran vLLM's column first could not build this one."""
    import importlib
    import sys

    aside = {n: sys.modules.pop(n) for n in ("psutil", "zmq")
             if n in sys.modules and getattr(sys.modules[n], "__spec__", None) is None}
    try:
        importlib.import_module(MODULE)
    finally:
        sys.modules.update(aside)


def missing() -> str | None:
    """None when transformers' ``CachePool`` imports; else the one line saying how to add it."""
    try:
        _import_pool()
    except ImportError as e:
        return (f"{MODULE} does not import ({e}): pip install 'kvarena[transformers]' "
                "(transformers==5.23.0, pinned in requirements-ci.txt)")
    return None


@cache
def _adapter_class() -> type:
    """``TransformersPoolAdapter`` freeing as transformers' engine does: one ``free_blocks`` per class with every
    block the operation frees, then one ``try_to_free_sectors`` (the engine's per-step call). The adapter calls both
    per page, and ``try_to_free_sectors`` scans every sector with a free block: half of a qwen3.5-4b free's time
    (1,280 -> 566 us a cycle). Only the order of the free-sector list may differ, and fresh sectors are
    interchangeable, so every decision is the same (two qwen3.5-4b runs: every metric equal)."""
    _import_pool()
    from kvarena.engines.transformers.pool_adapter import TransformersPoolAdapter

    class Batched(TransformersPoolAdapter):
        def __init__(self, config: ArenaConfig) -> None:
            super().__init__(config)
            self.pending: dict[str, list[int]] = {}

        def release_slots(self, cls: str, slots: Sequence[int]) -> None:
            self.pending.setdefault(cls, []).extend(slots)

        def flush(self) -> None:
            if self.pending:
                for c, blocks in self.pending.items():
                    self.pool.free_blocks(self.index[c], blocks)
                self.pending = {}
                self.pool.try_to_free_sectors()

    return Batched


class TransformersPool:
    """transformers' ``CachePool`` (through ``TransformersPoolAdapter``) behind the simulator's engine interface."""

    ANCHORED_ENDS = False

    def __init__(self, config: ArenaConfig) -> None:
        # validates the configuration, refuses what the reference refuses and a worst-case request that does not fit
        # in whole sectors per class (CapacityTooSmallError)
        self.adapter = a = _adapter_class()(config)
        # capacity is the budget; the pool holds its whole sectors only (qwen3.5-4b at 27.33 GiB: 35 x 786 MiB)
        self.config, self.capacity, self.order = config, config.capacity, list(a.order)
        self.pool, self.index, self.per_sector, self.sector = a.pool, a.index, a.per_sector, a.sector
        self.full = next(c for c in self.order if a.kind[c] is Kind.FULL)
        self.live: dict[str, int] = dict.fromkeys(self.order, 0)  # pages bound to an owner, per class
        self.stats = Stats()  # moves and bytes_moved stay 0: the pool never moves a block

    # -- sizes ----------------------------------------------------------------------------------------
    def page_bytes_of(self, cls: str) -> int:
        return self.adapter.page_bytes[cls]

    def fits(self, demand: Mapping[str, int], reserve_full_pages: int) -> bool:
        """``TransformersPoolAdapter.place``'s arithmetic, with ``reserve_full_pages`` more full-attention pages: the
        sectors the blocks missing beyond each class's free leaves need, against the free sectors."""
        pool, need = self.pool, dict(demand)
        need[self.full] = need.get(self.full, 0) + reserve_full_pages
        sectors = sum(-(-max(0, n - pool.count_free_blocks(self.index[c])) // self.per_sector[c])
                      for c, n in need.items() if n > 0)
        return sectors <= pool.num_free_sectors

    def used_bytes(self) -> int:
        """Bytes of the sectors cut into blocks. Sectors, not blocks in use: a sector's free blocks serve only its
        own class, so they are not free memory for the other classes, and it is free sectors that admission runs out
        of (``place`` refuses on ``num_free_sectors``). Blocks in use per class are ``occupancy()``."""
        return (self.pool.num_sectors - self.pool.num_free_sectors) * self.sector

    def occupancy(self) -> dict[str, int]:
        """Bytes of the pages owners hold, per class (withheld blocks not counted: no owner holds them)."""
        return {c: n * self.adapter.page_bytes[c] for c, n in self.live.items()}

    # -- requests -------------------------------------------------------------------------------------
    def _placed(self, pages: Mapping[str, Sequence[int]]) -> SimpleNamespace:
        n = 0
        for c, vs in pages.items():
            self.live[c] += len(vs)
            n += len(vs)
        if n:
            self.stats.rung_used[1] += 1  # rung 1: placed without moving anything (as vllm_real counts)
            self.stats.pages_placed += n
        return SimpleNamespace(pages={c: tuple(vs) for c, vs in pages.items() if vs})

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> SimpleNamespace:
        """A refusal raises AdmissionRejectedError before anything changes (``place`` returns None first)."""
        if shared:
            raise InvalidArgumentError(f"admit({owner!r}, shared=...): transformers' CachePool has no reference "
                                       "counts, so this engine shares no pages (it runs without a prefix cache)")
        got = self._placed(self.adapter.admit(owner, demand).pages)
        self.stats.admitted += 1
        return got

    def extend(self, owner: str, demand: Mapping[str, int]) -> SimpleNamespace:
        return self._placed(self.adapter.extend(owner, demand).pages)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        out = self.adapter.slide(owner, cls, n)
        self.adapter.flush()
        self.live[cls] -= len(out)  # nothing is shared: every page slid out is freed (or withheld)
        return out

    def free(self, owner: str) -> list[int]:
        held = self.adapter.owners.get(owner, {})
        out = self.adapter.free(owner)  # UnknownOwnerError for an owner it does not know
        self.adapter.flush()
        for c, vs in held.items():
            self.live[c] -= len(vs)
        return out

    # -- ledger ---------------------------------------------------------------------------------------
    def acquire(self, user: str, kind: Any, vids: Sequence[int]) -> None:
        self.adapter.acquire(user, kind, vids)

    def release(self, user: str) -> None:
        self.adapter.release(user)  # gives the pool the withheld blocks no other user holds
        self.adapter.flush()

    # -- invariants -----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Owners, vids and blocks are one to one; each class's held blocks, withheld blocks and free leaves
        partition the sectors cut for it; every other sector is on the free list once."""
        a, pool = self.adapter, self.pool

        def fail(inv: str, msg: str) -> None:
            raise InvariantViolation(inv, msg)

        held = [v for vs in a.owners.values() for c in self.order for v in vs[c]]
        if len(held) != len(set(held)) or set(held) != a.v2p.keys():
            twice = sorted(v for v, k in Counter(held).items() if k > 1)[:6]
            fail("INV-VMAP-BIJECTIVE", f"owners hold {len(held)} pages ({len(set(held))} distinct, twice: {twice}), "
                 f"{len(a.v2p)} are bound")
        for o, vs in a.owners.items():
            for c in self.order:
                if any(a.v2p[v][0] != c for v in vs[c]):
                    fail("INV-VMAP-BIJECTIVE", f"{o} holds a page under class {c!r} that is bound to another")
        live = Counter(c for c, _ in a.v2p.values())
        if any(live[c] != n for c, n in self.live.items()):
            fail("INV-BYTE-CONSERVATION", f"live pages {dict(live)}, counted {self.live}")
        used = list(a.v2p.values()) + list(a.withheld)
        if len(set(used)) != len(used):
            fail("INV-VMAP-BIJECTIVE", "one transformers block is bound to two pages (or bound and withheld)")
        if any(not a.holders[p] for p in a.withheld):
            fail("INV-LEDGER-SAFETY", "a withheld block has no ledger user: it never returns to the pool")
        fs = pool.free_sectors
        if len(set(fs)) != len(fs) or any(not 0 <= s < pool.num_sectors for s in fs):
            fail("INV-BYTE-CONSERVATION", "the free sector list holds a sector twice or one outside the pool")
        owner: dict[int, str] = {}
        count: Counter[int] = Counter()
        for c in self.order:
            k, trees = self.per_sector[c], pool._free_blocks[self.index[c]]
            leaves = [b for t in trees.trees.values() for b in t]
            if len(leaves) != len(set(leaves)) or len(leaves) != len(trees):
                fail("INV-BYTE-CONSERVATION", f"{c}'s free leaves hold duplicates or disagree with their count")
            blocks = [b for cls, b in used if cls == c]
            if not set(blocks).isdisjoint(leaves):
                fail("INV-LEDGER-SAFETY", f"{c} block(s) are both held and free in the pool")
            if any(b // k != root for root, t in trees.trees.items() for b in t):
                fail("INV-BYTE-CONSERVATION", f"{c} lists a free block under another sector's tree")
            for b in blocks + leaves:
                s = b // k
                if owner.setdefault(s, c) != c:
                    fail("INV-NO-OVERLAP", f"sector {s} holds blocks of both {owner[s]} and {c}")
                count[s] += 1
        fset = set(fs)
        for s, c in owner.items():
            if s in fset:
                fail("INV-NO-OVERLAP", f"sector {s} is free and also cut into {c} blocks")
            if count[s] != self.per_sector[c]:
                fail("INV-BYTE-CONSERVATION", f"sector {s} of {c}: {count[s]} blocks held, withheld or free, "
                     f"of {self.per_sector[c]}")
        if len(owner) + len(fs) != pool.num_sectors:
            fail("INV-BYTE-CONSERVATION", f"{len(owner)} cut + {len(fs)} free sectors != {pool.num_sectors}")
