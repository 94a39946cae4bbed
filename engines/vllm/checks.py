"""The ``block-pool`` conformance level: invariants of vLLM's block pool, decided on the real manager's state.

A block pool has no byte arena, so kvarena's byte invariants (no overlap, band order, conservation) have no
object here.  What a block pool promises instead, each with a stable ID and the kvarena invariant it refines
(``REFINES``; spec/arena.md §Invariants, and conformance/README.md §Which level fits my allocator for the same
IDs decided on a pool's byte ranges at ``--level pool``), checked after every step of
:class:`BlockPoolMachine` (engines/vllm/driver.py says how the steps map onto the manager's calls):

``VLLM-FREE-QUEUE``       the free queue is a well-formed doubly linked list from the fake head to the fake
                          tail (every ``prev`` mirrors a ``next``, no block twice, never the null block) whose
                          length is ``num_free_blocks``; a block outside it has no links.  Refines
                          INV-NO-OVERLAP (a block queued twice is handed out twice) and INV-BYTE-CONSERVATION
                          (the free count a scheduler reads).
``VLLM-FREE-IFF-UNREF``   a block is in the free queue exactly when its ref count is 0: a queued block with
                          holders would be handed out while referenced (INV-NO-OVERLAP), an unqueued one
                          without holders leaks (INV-BYTE-CONSERVATION).
``VLLM-REFCOUNT``         every block's ``ref_cnt`` equals its holders: its entries in every group's block
                          tables, in the CoW copies not yet taken, and in the caller's deferred frees
                          (popped for free but still used by an in-flight step: withheld).  Refines
                          INV-VMAP-BIJECTIVE (references are the holders) and INV-LEDGER-SAFETY (withheld).
``VLLM-ONE-GROUP``        a block is in the tables of one KV cache group only (groups share one pool): refines
                          INV-NO-OVERLAP (two groups' pages in one block's bytes).
``VLLM-PREFIX-MAP``       the prefix-cache map and the blocks agree: every entry names a pooled, non-null block
                          that carries that hash (its primary or an extra one) under the group that holds
                          it; every hash a block carries is in the map; a table block's hash covers tokens
                          of that table's position and equals the request's own block hash there.  Refines
                          INV-CONTENT-FOLLOWS-VID (a hit reads the tokens its hash names).
``VLLM-EXCLUSIVE-WRITE``  the blocks a step writes (its new tokens' positions in every attention group) are
                          held by no other request's table and by no request's deferred free (a CoW copy's
                          retention of its source is a read queued earlier in stream order, not a holder).
                          Refines INV-LEDGER-SAFETY (a written page has one user) and INV-STATE-PRIVATE.
``VLLM-INFLIGHT-READ``    a block an in-flight step reads (its attention span: all earlier tokens for full
                          attention, the window for sliding window) is not handed out again before that step
                          completes: refines INV-LEDGER-SAFETY (held bytes stay the page's, or withheld).
``VLLM-NULL``             the null block (id 0) is never queued, never hashed, never counted: refines
                          INV-VMAP-BIJECTIVE (the placeholder is no page: never bound, never free).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvarena.engines.vllm.driver import Driver, Plan, build
from kvarena.engines.vllm.load import load_vllm
from kvarena.spec.errors import InvariantViolation

INVARIANTS = ("VLLM-FREE-QUEUE", "VLLM-FREE-IFF-UNREF", "VLLM-REFCOUNT", "VLLM-ONE-GROUP", "VLLM-PREFIX-MAP",
              "VLLM-EXCLUSIVE-WRITE", "VLLM-INFLIGHT-READ", "VLLM-NULL")
# VLLM-* ID -> the kvarena invariants it refines (spec/arena.md §Invariants): the first is the one it decides
REFINES = {
    "VLLM-FREE-QUEUE": ("INV-NO-OVERLAP", "INV-BYTE-CONSERVATION"),
    "VLLM-FREE-IFF-UNREF": ("INV-NO-OVERLAP", "INV-BYTE-CONSERVATION"),
    "VLLM-REFCOUNT": ("INV-VMAP-BIJECTIVE", "INV-LEDGER-SAFETY"),
    "VLLM-ONE-GROUP": ("INV-NO-OVERLAP",),
    "VLLM-PREFIX-MAP": ("INV-CONTENT-FOLLOWS-VID",),
    "VLLM-EXCLUSIVE-WRITE": ("INV-LEDGER-SAFETY", "INV-STATE-PRIVATE"),
    "VLLM-INFLIGHT-READ": ("INV-LEDGER-SAFETY",),
    "VLLM-NULL": ("INV-VMAP-BIJECTIVE",),
}


def _fail(inv: str, msg: str) -> None:
    raise InvariantViolation(inv, msg)


def free_queue(pool: Any) -> list[Any]:
    """The free queue walked from the fake head; VLLM-FREE-QUEUE if it is not a well-formed list."""
    q = pool.free_block_queue
    head, tail = q.fake_free_list_head, q.fake_free_list_tail
    if head.prev_free_block is not None or tail.next_free_block is not None:
        _fail("VLLM-FREE-QUEUE", "the fake head has a predecessor or the fake tail a successor")
    seen: set[int] = set()
    out: list[Any] = []
    prev, cur = head, head.next_free_block
    limit = len(pool.blocks) + 1
    while cur is not tail:
        if cur is None:
            _fail("VLLM-FREE-QUEUE", f"the list breaks after block {prev.block_id}: no next and not the tail")
        if cur.prev_free_block is not prev:
            back = cur.prev_free_block.block_id if cur.prev_free_block is not None else None
            _fail("VLLM-FREE-QUEUE", f"block {cur.block_id} follows {prev.block_id} but its prev is {back}")
        if id(cur) in seen or len(out) >= limit:
            _fail("VLLM-FREE-QUEUE", f"block {cur.block_id} is in the free queue twice")
        if cur.block_id < 0 or cur.block_id >= len(pool.blocks) or pool.blocks[cur.block_id] is not cur:
            _fail("VLLM-FREE-QUEUE", f"a queued block ({cur.block_id}) is not one of the pool's blocks")
        seen.add(id(cur))
        out.append(cur)
        prev, cur = cur, cur.next_free_block
    if tail.prev_free_block is not prev:
        _fail("VLLM-FREE-QUEUE", "the fake tail's prev is not the last queued block")
    if len(out) != q.num_free_blocks:
        _fail("VLLM-FREE-QUEUE", f"the free queue holds {len(out)} blocks but num_free_blocks is {q.num_free_blocks}")
    for b in pool.blocks:
        if id(b) not in seen and (b.prev_free_block is not None or b.next_free_block is not None):
            _fail("VLLM-FREE-QUEUE", f"block {b.block_id} is not in the free queue but still has links")
    return out


def holders(driver: Any) -> tuple[Counter, dict[int, set[int]], Counter]:
    """(refs per block id, groups per block id, withheld per block id) from the tables and the caller."""
    refs: Counter = Counter()
    groups: dict[int, set[int]] = {}
    withheld: Counter = Counter()
    for gid, _rid, blocks in driver.tables():
        for b in blocks:
            if not b.is_null:
                refs[b.block_id] += 1
                groups.setdefault(b.block_id, set()).add(gid)
    for mgr in driver.manager.coordinator.single_type_managers:
        for src, cow in mgr._pending_cow_copies:
            refs[src.block_id] += 1
            refs[cow.block_id] += 1
    for b in driver.withheld():
        if not b.is_null:
            refs[b.block_id] += 1
            withheld[b.block_id] += 1
    return refs, groups, withheld


def _cache_entries(pool: Any) -> Iterable[tuple[Any, Any]]:
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        if isinstance(blocks, dict):
            for bid, b in blocks.items():
                if b.block_id != bid:
                    _fail("VLLM-PREFIX-MAP", f"the map files block {b.block_id} under id {bid}")
                yield key, b
        else:
            yield key, blocks


def check_prefix_map(driver: Any, groups: dict[int, set[int]]) -> None:
    V = driver.V
    pool = driver.pool
    mapped: set[tuple[bytes, int]] = set()
    for key, b in _cache_entries(pool):
        if b.is_null or pool.blocks[b.block_id] is not b:
            _fail("VLLM-PREFIX-MAP", f"a prefix-cache entry names block {b.block_id}, not a pooled non-null block")
        extra = pool.cached_block_hashes_by_block.get(b.block_id, set())
        if b.block_hash != key and key not in extra:
            _fail("VLLM-PREFIX-MAP", f"a prefix-cache entry points at block {b.block_id}, which no longer carries "
                  f"that hash (it carries {b.block_hash!r:.40}): a hit would hand out another prefix's KV")
        g = V.utils.get_group_id(key)
        held_by = groups.get(b.block_id, set())
        if held_by and held_by != {g}:
            _fail("VLLM-PREFIX-MAP", f"block {b.block_id} is cached under group {g} but held by group(s) "
                  f"{sorted(held_by)}")
        mapped.add((key, b.block_id))
    for b in pool.blocks:
        for key in ([b.block_hash] if b.block_hash is not None else []) + sorted(
                pool.cached_block_hashes_by_block.get(b.block_id, ())):
            if (key, b.block_id) not in mapped:
                _fail("VLLM-PREFIX-MAP", f"block {b.block_id} carries a hash the prefix-cache map does not list")
    hbs = driver.plan.hash_block_size
    for gid, rid, blocks in driver.tables():
        req = driver.requests.get(rid)
        mgr = driver.manager.coordinator.single_type_managers[gid]
        attention = not isinstance(mgr.kv_cache_spec, V.iface.MambaSpec)
        for idx, b in enumerate(blocks):
            if b.is_null or b.block_hash is None or req is None:
                continue
            n = b.block_hash_num_tokens or (idx + 1) * mgr.block_size
            if attention and not idx * mgr.block_size < n <= (idx + 1) * mgr.block_size:
                _fail("VLLM-PREFIX-MAP", f"{rid}'s block {b.block_id} at position {idx} of group {gid} is cached "
                      f"for the prefix of {n} tokens, outside that position")
            if n % hbs or n // hbs > len(req.block_hashes):
                continue  # a hash of tokens the request has not hashed yet (cannot be compared)
            if V.utils.get_block_hash(b.block_hash) != req.block_hashes[n // hbs - 1]:
                _fail("VLLM-PREFIX-MAP", f"{rid}'s block {b.block_id} (group {gid}, position {idx}) is cached "
                      f"under a hash that is not {rid}'s own for its first {n} tokens")


def check_pool(driver: Any) -> None:
    """Every invariant of this module on the driver's current state; InvariantViolation on the first broken."""
    pool = driver.pool
    null = pool.null_block
    if not null.is_null or null.block_id != 0 or null.block_hash is not None:
        _fail("VLLM-NULL", "the null block is not block 0, or it carries a hash")
    if any(b.is_null for b in pool.blocks[1:]):
        _fail("VLLM-NULL", "a block other than 0 is marked null")
    queued = free_queue(pool)
    if any(b.is_null for b in queued):
        _fail("VLLM-NULL", "the null block is in the free queue")
    refs, groups, withheld = holders(driver)
    queued_ids = {b.block_id for b in queued}
    for b in pool.blocks[1:]:
        if b.block_id in queued_ids and b.ref_cnt != 0:
            _fail("VLLM-FREE-IFF-UNREF", f"block {b.block_id} is in the free queue with ref_cnt {b.ref_cnt}: "
                  "the next allocation would hand out a block in use")
        if b.block_id not in queued_ids and b.ref_cnt == 0:
            _fail("VLLM-FREE-IFF-UNREF", f"block {b.block_id} has no references but is not in the free queue "
                  "(leaked)")
        if b.ref_cnt != refs[b.block_id]:
            _fail("VLLM-REFCOUNT", f"block {b.block_id} has ref_cnt {b.ref_cnt} but {refs[b.block_id]} holder(s) "
                  f"(tables of group(s) {sorted(groups.get(b.block_id, ()))}, withheld {withheld[b.block_id]})")
    for bid, gs in groups.items():
        if len(gs) > 1:
            _fail("VLLM-ONE-GROUP", f"block {bid} is in the block tables of groups {sorted(gs)}")
    check_prefix_map(driver, groups)
    check_in_flight(driver)


def check_in_flight(driver: Any) -> None:
    """VLLM-INFLIGHT-READ: no block an in-flight step reads was handed out after that step was scheduled."""
    for step in driver.in_flight:
        for b in step.reads:
            if driver.epoch.get(b.block_id, 0) > step.seq:
                _fail("VLLM-INFLIGHT-READ", f"block {b.block_id}, read by {step.rid}'s step {step.seq} (still in "
                      f"flight), was handed out again at step {driver.epoch[b.block_id]}")


def check_writes(driver: Any, rid: str, start: int, stop: int) -> list[Any]:
    """VLLM-EXCLUSIVE-WRITE for a step of ``rid`` computing tokens [start, stop); returns the blocks it reads."""
    V = driver.V
    reads: list[Any] = []
    others: Counter = Counter()
    for _gid, other, blocks in driver.tables():
        if other != rid:
            others.update(b.block_id for b in blocks if not b.is_null)
    # CoW retentions are reads by a copy queued in this or an earlier step: in stream order it runs before
    # this step's writes, so only a request's popped blocks count here
    withheld = Counter(b.block_id for _f, blocks, why, _r in driver.deferred if why == "request" for b in blocks)
    for mgr in driver.manager.coordinator.single_type_managers:
        spec = mgr.kv_cache_spec
        if isinstance(spec, V.iface.MambaSpec):
            continue
        table = mgr.req_to_blocks.get(rid, [])
        bs = mgr.block_size
        for idx in range(start // bs, -(-stop // bs)):
            b = table[idx] if idx < len(table) else None
            if b is None or b.is_null:
                _fail("VLLM-EXCLUSIVE-WRITE", f"{rid}'s step writes tokens [{start}, {stop}) but group "
                      f"{mgr.kv_cache_group_id} has no block at position {idx}")
            if others[b.block_id] or withheld[b.block_id]:
                who = "another request's table" if others[b.block_id] else "a deferred free"
                _fail("VLLM-EXCLUSIVE-WRITE", f"{rid}'s step writes block {b.block_id} (group "
                      f"{mgr.kv_cache_group_id}, position {idx}) which {who} still holds")
        lo = 0
        if isinstance(spec, V.iface.SlidingWindowSpec):
            lo = max(0, start - spec.sliding_window + 1)
        for idx in range(lo // bs, -(-stop // bs)):
            b = table[idx] if idx < len(table) else None
            if b is None or b.is_null:
                _fail("VLLM-INFLIGHT-READ", f"{rid}'s step reads tokens [{lo}, {stop}) in group "
                      f"{mgr.kv_cache_group_id}, but position {idx} was already released")
            reads.append(b)
    return reads


# ---------------------------------------------------------------------------------------------
# The state machine: the scheduler's operations in any order, every invariant after each


@dataclass(frozen=True)
class Setup:
    """A model and the knobs the machine runs it with (toys: 4-token kernel blocks, 32-token context)."""

    model: str
    num_blocks: int = 48
    block_size: int = 4
    max_model_len: int = 32
    prefix_match_unit: int | None = None  # CacheConfig.prefix_match_unit: hash finer than a block (partial hits)

    def plan(self) -> Plan:
        return build(self.model, num_blocks=self.num_blocks, block_size=self.block_size,
                     max_model_len=self.max_model_len, prefix_match_unit=self.prefix_match_unit)


SETUPS = {
    "toy-full": Setup("toy-full", num_blocks=16),  # one group: UnitaryKVCacheCoordinator, FullAttentionManager
    "toy-swa": Setup("toy-swa", num_blocks=20),  # full (8-token blocks) + window (4): two block sizes, 4-token hash
    "toy-state": Setup("toy-state", num_blocks=96),  # full + GDN state (mamba "align"): three groups
    "toy-tri": Setup("toy-tri", num_blocks=96),  # full + window + state: five groups over one pool
    "gpt-oss-20b": Setup("gpt-oss-20b", num_blocks=40, block_size=16, max_model_len=512),
    "qwen3.5-4b": Setup("qwen3.5-4b", num_blocks=40, block_size=16, max_model_len=4 * 528),
    # 16-token hashes under 528-token blocks: sub-block prefix hits, served by copy-on-write of a state block
    "qwen3.5-4b-fine": Setup("qwen3.5-4b", num_blocks=40, block_size=16, max_model_len=4 * 528, prefix_match_unit=16),
    "toy-state-fine": Setup("toy-state", num_blocks=96, prefix_match_unit=2),
}


def machine_for(setup: Setup, make_driver: Any = None) -> type:
    """A ``RuleBasedStateMachine`` class over a fresh :class:`Driver` per example."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

    plan = setup.plan()
    L = setup.max_model_len
    unit = plan.hash_block_size  # chunks are whole hash blocks (a scheduler block is a multiple of one)
    per_block = plan.scheduler_block_size // unit
    chunk_sizes = st.sampled_from(sorted({1, 2, 3, 4, per_block, 2 * per_block}))
    families = [[f * 10_000 + i for i in range(L)] for f in range(3)]  # three shared prefixes

    class BlockPoolMachine(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            self.d = (make_driver or Driver)(plan)

        @rule(family=st.integers(0, 2), length=st.integers(1, L - 1),
              split=st.one_of(st.sampled_from([L, L, L // 2, unit]), st.integers(0, L)),
              variant=st.integers(0, 3), max_tokens=st.integers(1, 8))
        def admit(self, family: int, length: int, split: int, variant: int, max_tokens: int) -> None:
            """A new request: a family's prefix up to ``split``, then its own tokens."""
            if len(self.d.requests) >= 6:
                return
            tokens = families[family][:min(split, length)]
            tokens += [(family + 1) * 100_000 + variant * 1000 + i for i in range(length - len(tokens))]
            self.d.add(tokens, max_tokens)

        @precondition(lambda self: self.d.requests)
        @rule(pick=st.integers(0, 9), extra=st.integers(0, 8), max_tokens=st.integers(1, 8))
        def follow_up(self, pick: int, extra: int, max_tokens: int) -> None:
            """The next turn of a conversation: a request's tokens so far (prompt and output) and ``extra``
            new ones, so the prefix cache has its blocks to hit."""
            if len(self.d.requests) >= 6:
                return
            rids = sorted(self.d.requests)
            prev = list(self.d.requests[rids[pick % len(rids)]].all_token_ids)
            tokens = (prev + [900_000 + len(prev) + i for i in range(extra)])[:L - 1]
            self.d.add(tokens, max_tokens)

        def _schedule(self, pick: int, chunks: int) -> None:
            rids = sorted(self.d.requests)
            if rids:
                self.d.schedule(rids[pick % len(rids)], chunks * unit)

        # Scheduling and completing steps are most of a server's life: three and two rules' weight.
        @rule(pick=st.integers(0, 9), chunks=chunk_sizes)
        def schedule(self, pick: int, chunks: int) -> None:
            self._schedule(pick, chunks)

        @rule(pick=st.integers(0, 9), chunks=chunk_sizes)
        def schedule_more(self, pick: int, chunks: int) -> None:
            self._schedule(pick, chunks)

        @rule(chunks=chunk_sizes, complete=st.booleans())
        def iterate(self, chunks: int, complete: bool) -> None:
            """One scheduler iteration: every request gets a step (running first, then waiting, oldest
            first); when the pool refuses a running request, the newest running one is preempted
            (``Scheduler.schedule``'s policy), then the step completes or stays in flight."""
            order = sorted(self.d.running, key=_age) + sorted(self.d.waiting(), key=_age)
            self.d.new_step()
            for rid in order:
                if (rid in self.d.requests and self.d.schedule(rid, chunks * unit, same_step=True) is None
                        and rid in self.d.running):
                    victims = sorted(self.d.running - {rid}, key=_age)
                    if victims:
                        self.d.finish(victims[-1], preempt=True)
            if complete:
                self.d.idle()

        @precondition(lambda self: self.d.in_flight)
        @rule()
        def complete(self) -> None:
            self.d.complete()

        @precondition(lambda self: self.d.in_flight)
        @rule()
        def complete_more(self) -> None:
            self.d.complete()

        @precondition(lambda self: self.d.running)
        @rule(pick=st.integers(0, 9), preempt=st.booleans())
        def finish(self, pick: int, preempt: bool) -> None:
            rids = sorted(self.d.running)
            self.d.finish(rids[pick % len(rids)], preempt=preempt)

        @precondition(lambda self: any(r not in self.d.running for r in self.d.requests))
        @rule(pick=st.integers(0, 9))
        def drop_waiting(self, pick: int) -> None:
            """A waiting (or preempted) request is aborted."""
            rids = sorted(r for r in self.d.requests if r not in self.d.running)
            self.d.finish(rids[pick % len(rids)])

        @rule(ids=st.sets(st.integers(1, plan.num_blocks - 1), max_size=3), reset=st.booleans())
        def invalidate(self, ids: set[int], reset: bool) -> None:
            """``evict_blocks`` (a KV connector's invalid blocks) or ``reset_prefix_cache`` (new weights; it
            refuses while any block is in use)."""
            if reset:
                self.d.reset()
            else:
                self.d.evict(ids)

        def teardown(self) -> None:
            d = getattr(self, "d", None)
            if d is None:
                return
            d.idle()
            for rid in sorted(d.requests):
                d.finish(rid)
            d.idle()
            if d.pool.get_num_free_blocks() != plan.num_blocks - 1:  # all but the null block
                raise AssertionError(f"after every request finished and every step completed, "
                                     f"{plan.num_blocks - 1 - d.pool.get_num_free_blocks()} block(s) are not free")
            STATS.update(d.counts)

    BlockPoolMachine.__name__ = f"BlockPoolMachine_{setup.model.replace('-', '_').replace('.', '_')}"
    return BlockPoolMachine


def _age(rid: str) -> int:
    return int(rid[1:])


STATS: Counter = Counter()  # what the machines of this process did (tests/vllm prints it)


# ---------------------------------------------------------------------------------------------
# Planted bugs: each a small change to one vLLM method, applied in-process and undone on exit


def _mutant_free_forgets_decrement(V: Any) -> dict[tuple[Any, str], Any]:
    orig = V.pool.BlockPool.free_blocks

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        orig(self, [b for b in blocks if b.ref_cnt <= 1])  # a shared block's decrement is forgotten
    return {(V.pool.BlockPool, "free_blocks"): free_blocks}


def _mutant_double_push(V: Any) -> dict[tuple[Any, str], Any]:
    orig = V.pool.BlockPool.free_blocks

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        orig(self, blocks)
        freed = [b for b in blocks if not b.is_null and b.ref_cnt == 0]
        if len(freed) > 1:  # the first freed block is pushed onto the free queue a second time
            self.free_block_queue.append(freed[0])
    return {(V.pool.BlockPool, "free_blocks"): free_blocks}


def _mutant_stale_prefix_entry(V: Any) -> dict[tuple[Any, str], Any]:
    def _maybe_evict_cached_block(self: Any, block: Any) -> bool:
        if block.block_hash is None:
            return False
        self.cached_block_hashes_by_block.pop(block.block_id, None)
        block.reset_hash()  # ... but the map entry still points at the block being reused
        return True
    return {(V.pool.BlockPool, "_maybe_evict_cached_block"): _maybe_evict_cached_block}


def _mutant_touch_keeps_queued(V: Any) -> dict[tuple[Any, str], Any]:
    def touch(self: Any, blocks: Any) -> None:
        for block in blocks:
            if not block.is_null:
                block.ref_cnt += 1  # a cache hit on a free block leaves it in the free queue
    return {(V.pool.BlockPool, "touch"): touch}


def _mutant_pop_returns_to_pool(V: Any) -> dict[tuple[Any, str], Any]:
    orig = V.manager.KVCacheManager.pop_blocks_for_free

    def pop_blocks_for_free(self: Any, request: Any) -> list[Any]:
        blocks = orig(self, request)
        self.block_pool.free_blocks(reversed(blocks))  # returned now, though an in-flight step still uses them
        for b in blocks:
            b.ref_cnt += 0
        return blocks
    return {(V.manager.KVCacheManager, "pop_blocks_for_free"): pop_blocks_for_free}


def _mutant_window_off_by_one(V: Any) -> dict[tuple[Any, str], Any]:
    orig = V.single.SlidingWindowManager.get_num_skipped_tokens

    def get_num_skipped_tokens(self: Any, num_computed_tokens: int) -> int:
        return orig(self, num_computed_tokens + self.block_size)  # releases one block of the window early
    return {(V.single.SlidingWindowManager, "get_num_skipped_tokens"): get_num_skipped_tokens}


MUTANTS = {
    "free-forgets-decrement": (_mutant_free_forgets_decrement, "toy-tri"),
    "double-push": (_mutant_double_push, "toy-swa"),
    "stale-prefix-entry": (_mutant_stale_prefix_entry, "toy-swa"),
    "touch-keeps-queued": (_mutant_touch_keeps_queued, "toy-state"),
    "pop-returns-to-pool": (_mutant_pop_returns_to_pool, "toy-tri"),
    "window-off-by-one": (_mutant_window_off_by_one, "toy-swa"),
}


class planted:  # used as ``with planted("double-push"):``
    """Context manager: the named planted bug is in vLLM's class while inside."""

    def __init__(self, name: str) -> None:
        self.patches = MUTANTS[name][0](load_vllm())
        self.saved: dict[tuple[Any, str], Any] = {}

    def __enter__(self) -> planted:
        for (owner, attr), fn in self.patches.items():
            self.saved[(owner, attr)] = owner.__dict__[attr]
            setattr(owner, attr, fn)
        return self

    def __exit__(self, *_exc: Any) -> None:
        for (owner, attr), fn in self.saved.items():
            setattr(owner, attr, fn)
