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
from typing import Any

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
