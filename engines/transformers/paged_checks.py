"""Invariants of transformers' paged KV cache, decided on the real objects after every call of the machine.

transformers 5.23.0's continuous-batching cache (``generation/continuous_batching/cache.py``,
``cache_allocators/``) keeps one flat ``uint8`` tensor cut into sectors (the first two are trash); each attention
type's allocator takes whole sectors from the ``CachePool`` and cuts them into blocks, one block = one page of
``page_size`` tokens for every layer of the group; a ``BlockLedger`` per allocator keeps the shared reference
counts, the content hashes of complete blocks and the unreferenced blocks kept cached for prefix reuse.
:mod:`paged_machine` drives it as the engine does; these are the promises checked, each with the kvarena ID
(spec/arena.md) it refines:

``TF-FREE-IS-UNHELD``   (INV-LEDGER-SAFETY, hole-has-no-user) no free block of the pool, and no block of a free
                        sector, is in a block table or kept cached: the next hand-out would alias a live block.
``TF-SECTORS``          (INV-BYTE-CONSERVATION) every data sector is exactly one of free or one group's; every
                        block of a group's sector is exactly one of free, held by tables, or cached (none leaks);
                        free lists hold no duplicates and agree with their counts and ``compute_free_capacity``;
                        the two trash sectors are never handed out.
``TF-NO-OVERLAP``       (INV-NO-OVERLAP) the byte extents of all blocks (held, cached, free) and free sectors,
                        computed from the allocators' own K/V token views of the flat tensor, are pairwise
                        disjoint and lie outside the trash sectors.
``TF-PREFIX-MAP``       (INV-VMAP-BIJECTIVE, INV-CONTENT-FOLLOWS-VID) ``hash_to_block`` and ``block_to_hash`` are
                        mutual inverses; a hashed block is held or cached; a cached block is hashed, unheld and not
                        ref-counted; a hashed block in a table carries that request's own chained hash there.
``TF-REFCOUNT``         (INV-VMAP-BIJECTIVE, refs = holders, no-leak) the ledger's reference counts equal the
                        number of tables holding each block (1 implicit); no table holds a block twice; only live
                        requests have tables; a group without block sharing (sliding) never shares.
``TF-WINDOW``           (INV-LEDGER-SAFETY: what a reader reads is held) every live request's table covers what
                        its attention still reads: ``ceil(L / page)`` blocks for full attention, ``ceil(min(L, W) /
                        page)`` for a sliding group's ring (freed only with the request); a prepared batch reads only
                        its own blocks (and the read trash / sentinel).
``TF-EXCLUSIVE-WRITE``  (INV-LEDGER-SAFETY, a written page has one writer) every write index of a prepared batch
                        lands in its request's own block, held by no other table, not shared, not hashed, or in the
                        write trash.
``TF-INFLIGHT``         (INV-LEDGER-SAFETY, withheld until release) when a launched batch runs on the compute
                        stream, a block it reads that was released while the batch was in flight still holds the
                        request's own KV: nothing reused it ahead of the batch in stream order.
``TF-CONTENT``          (INV-CONTENT-FOLLOWS-VID) the K and V a batch's attention gets back from
                        ``allocator.update`` are, row by row, the tags of that request's own tokens at those
                        positions (prefix hits, forks' shares and copies, ring wrap-around included).
``TF-REFUSAL``          (INV-REFUSAL-IS-NOOP) a refused ``can_store_request_tokens`` or a dry run changes nothing;
                        the dry run, ``count_storable_requests`` and the real calls agree on what fits.
``TF-LEAK``             (INV-BYTE-CONSERVATION, INV-VMAP-BIJECTIVE no-leak) once every request is freed, every
                        step ran and the cached blocks are evicted, all sectors are free and the ledgers empty.
``TF-DANGLING``          (INV-VMAP-BIJECTIVE, owned-bound) every request the engine will still hand to the cache (a
                        parent queued to fork, a request whose launched batch's update marks complete blocks) still
                        has its block tables.  transformers breaks it in async mode (finding 2); the machine steps
                        around it unless ``faithful`` (a strict xfail runs it faithful).
``TF-FLOOR``            (INV-FEASIBILITY-FLOOR) when nothing can be scheduled and offloading frees nothing more (the
                        engine then raises ``RuntimeError`` and fails every request), the request it could not
                        place needs more sectors than an empty cache has.  transformers breaks it through sector
                        fragmentation (finding 3); checked when the driver's ``floor`` is on.
``TF-WITHHOLD``         (INV-LEDGER-SAFETY as kvarena states it, strict) a block a launched batch reads or writes is
                        not handed out again before the batch retires.  Off in the machine: transformers relies on
                        its single compute stream instead (docs/transformers-findings.md, finding 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from transformers.generation.continuous_batching import cache as tf_cache
from transformers.generation.continuous_batching.cache_allocators import cache_allocator as tf_alloc
from transformers.generation.continuous_batching.cache_allocators import cache_pool as tf_pool
from transformers.generation.continuous_batching.cache_allocators import sliding_attention as tf_sliding
from transformers.generation.continuous_batching.cache_allocators.cache_allocator import compute_block_hash
from transformers.generation.continuous_batching.requests import RequestStatus

from kvarena.spec.errors import InvariantViolation

INVARIANTS = ("TF-FREE-IS-UNHELD", "TF-SECTORS", "TF-NO-OVERLAP", "TF-PREFIX-MAP", "TF-REFCOUNT", "TF-WINDOW",
              "TF-EXCLUSIVE-WRITE", "TF-INFLIGHT", "TF-CONTENT", "TF-REFUSAL", "TF-LEAK", "TF-DANGLING", "TF-FLOOR",
              "TF-WITHHOLD")


def _fail(inv: str, msg: str) -> None:
    raise InvariantViolation(inv, msg)


def is_sliding(alloc: Any) -> bool:
    return hasattr(alloc, "sliding_window")


def held_counts(alloc: Any) -> Counter:
    """How many block tables of the allocator hold each block."""
    return Counter(b for table in alloc.block_table.values() for b in table)


def free_leaves(cache: Any, alloc: Any) -> list[int]:
    return [leaf for tree in cache.pool._free_blocks[alloc.index].trees.values() for leaf in tree]


def block_extent(alloc: Any, block: int, base: int) -> tuple[int, int]:
    """[lo, hi) bytes of ``block`` in the flat cache tensor, from the allocator's own per-layer K and V token views
    (the rows ``update`` writes for the block's first and last token of each layer)."""
    lo, hi = None, None
    first = block * alloc.block_physical_stride
    for layer in alloc.layer_indices:
        for view in alloc._kv_token_views[layer]:
            for t in (first, first + alloc.tokens_per_page - 1):
                row = view[t]
                p = row.data_ptr() - base
                lo = p if lo is None else min(lo, p)
                hi = p + row.nbytes if hi is None else max(hi, p + row.nbytes)
    assert lo is not None and hi is not None
    return lo, hi


def check_state(driver: Any, pending: Mapping[str, int] | None = None) -> None:
    """Every structural invariant on the driver's cache; InvariantViolation on the first broken. ``pending``:
    tokens scheduled but not yet prepared, per request (the tables already cover them)."""
    cache, live = driver.cache, driver.live()
    check_free_is_unheld(cache)
    check_no_overlap(driver)
    check_prefix_map(cache, live)
    check_refcount(cache, live)
    check_sectors(cache)
    check_window(cache, live, pending or {})


def check_free_is_unheld(cache: Any) -> None:
    free_sectors = set(cache.pool.free_sectors)
    for name, a in cache.cache_allocators.items():
        held = set(held_counts(a)) | set(a.ledger.cached_blocks)
        both = held & set(free_leaves(cache, a))
        if both:
            _fail("TF-FREE-IS-UNHELD", f"{name} block(s) {sorted(both)[:6]} are free in the pool while a block table "
                  "or the prefix cache holds them: the next allocation hands them out again")
        in_free = sorted(b for b in held if b // a.blocks_per_sector in free_sectors)
        if in_free:
            _fail("TF-FREE-IS-UNHELD", f"{name} block(s) {in_free[:6]} are held but their sector(s) "
                  f"{sorted({b // a.blocks_per_sector for b in in_free})} are free")


def check_sectors(cache: Any) -> None:
    pool = cache.pool
    lo, hi = pool.num_reserved_sectors, pool.num_sectors + pool.num_reserved_sectors
    fs = pool.free_sectors
    if len(set(fs)) != len(fs):
        _fail("TF-SECTORS", f"a sector is in the free list twice: {sorted(s for s, n in Counter(fs).items() if n > 1)}")
    if any(not lo <= s < hi for s in fs):
        _fail("TF-SECTORS", f"free sectors {sorted(fs)} leave the data sectors [{lo}, {hi})")
    owner: dict[int, str] = {}
    states: dict[str, tuple[set[int], set[int], set[int]]] = {}
    free_bytes = len(fs) * cache.bytes_per_sector
    for name, a in cache.cache_allocators.items():
        k, trees = a.blocks_per_sector, pool._free_blocks[a.index]
        leaves = free_leaves(cache, a)
        if len(set(leaves)) != len(leaves) or len(leaves) != len(trees):
            _fail("TF-SECTORS", f"{name}'s free blocks hold duplicates or disagree with their count "
                  f"({len(leaves)} listed, {len(set(leaves))} distinct, count {len(trees)})")
        if any(leaf // k != root for root, tree in trees.trees.items() for leaf in tree):
            _fail("TF-SECTORS", f"{name} lists a free block under another sector's tree")
        held, cached = set(held_counts(a)), set(a.ledger.cached_blocks)
        states[name] = (held, cached, set(leaves))
        free_bytes += len(leaves) * a.bytes_per_block
        for b in held | cached | set(leaves):
            s = b // k
            if not lo <= s < hi:
                _fail("TF-SECTORS", f"{name} block {b} lies in sector {s}, outside the data sectors [{lo}, {hi})")
            if owner.setdefault(s, name) != name:
                _fail("TF-SECTORS", f"sector {s} has blocks of both {owner[s]} and {name}")
    for s in range(lo, hi):
        if s in owner:
            if s in fs:
                _fail("TF-SECTORS", f"sector {s} is free and also cut into {owner[s]} blocks")
            a = cache.cache_allocators[owner[s]]
            held, cached, leaves = states[owner[s]]
            for b in range(s * a.blocks_per_sector, (s + 1) * a.blocks_per_sector):
                n = (b in held) + (b in cached) + (b in leaves)
                if n != 1:
                    _fail("TF-SECTORS", f"{owner[s]} block {b} is in {n} of (tables, cached, free)"
                          + (": leaked" if n == 0 else ""))
        elif s not in fs:
            _fail("TF-SECTORS", f"sector {s} is neither free nor cut into any group's blocks: leaked")
    said = cache.compute_free_capacity(relative=False)
    if said != free_bytes:
        _fail("TF-SECTORS", f"compute_free_capacity says {said} B free, the pool's lists hold {free_bytes} B")


def check_no_overlap(driver: Any) -> None:
    cache = driver.cache
    bps = cache.bytes_per_sector
    spans: list[tuple[int, int, str]] = [(s * bps, (s + 1) * bps, f"free sector {s}") for s in cache.pool.free_sectors]
    for name, a in cache.cache_allocators.items():
        blocks = set(held_counts(a)) | set(a.ledger.cached_blocks) | set(free_leaves(cache, a))
        spans += [(*driver.extent(a, b), f"{name} block {b}") for b in blocks]
    spans.sort()
    trash, size = cache.pool.num_reserved_sectors * bps, cache.cache_tensor.numel()
    for (lo, hi, what), nxt in zip(spans, [*spans[1:], (size, size, "the end of the tensor")], strict=True):
        if lo < trash:
            _fail("TF-NO-OVERLAP", f"{what} [{lo}, {hi}) reaches into the trash sectors [0, {trash})")
        if hi > nxt[0]:
            _fail("TF-NO-OVERLAP", f"{what} [{lo}, {hi}) and {nxt[2]} [{nxt[0]}, {nxt[1]}) share bytes")


def chain_hashes(tokens: list[int], page: int) -> list[int]:
    """The chained hash of every whole page of ``tokens``, as ``mark_complete_blocks`` registers them."""
    out: list[int] = []
    for i in range(len(tokens) // page):
        out.append(compute_block_hash(out[-1] if out else None, tokens[i * page:(i + 1) * page]))
    return out


def check_prefix_map(cache: Any, live: Mapping[str, Any]) -> None:
    for name, a in cache.cache_allocators.items():
        led = a.ledger
        held = held_counts(a)
        for h, b in led.hash_to_block.items():
            if led.block_to_hash.get(b) != h:
                _fail("TF-PREFIX-MAP", f"{name}: hash_to_block names block {b}, whose block_to_hash entry is "
                      f"{led.block_to_hash.get(b)} (stale entry: a hit would alias another prefix)")
        for b, h in led.block_to_hash.items():
            if led.hash_to_block.get(h) != b:
                _fail("TF-PREFIX-MAP", f"{name}: block {b} carries a hash that hash_to_block does not map to it")
            if not held[b] and b not in led.cached_blocks:
                _fail("TF-PREFIX-MAP", f"{name}: hashed block {b} is neither held nor cached: a hit would hand "
                      "out a block the pool may reuse")
        for b in led.cached_blocks:
            if b not in led.block_to_hash or held[b] or b in led.shared_ref_counts:
                _fail("TF-PREFIX-MAP", f"{name}: cached block {b} is unhashed, held by a table or ref-counted")
        for rid, table in a.block_table.items():
            st = live.get(rid)
            if st is None:
                continue  # TF-REFCOUNT names a table without a live request
            own = chain_hashes(st.initial_tokens + st.generated_tokens, a.tokens_per_page)
            for i, b in enumerate(table):
                h = led.block_to_hash.get(b)
                if h is not None and (i >= len(own) or own[i] != h):
                    _fail("TF-PREFIX-MAP", f"{name}: {rid}'s block {b} at position {i} is cached under a hash "
                          f"that is not {rid}'s own chained hash of its tokens {i * a.tokens_per_page}.."
                          f"{(i + 1) * a.tokens_per_page - 1}")


def check_refcount(cache: Any, live: Mapping[str, Any]) -> None:
    for name, a in cache.cache_allocators.items():
        led = a.ledger
        held = held_counts(a)
        for rid, table in a.block_table.items():
            if len(set(table)) != len(table):
                _fail("TF-REFCOUNT", f"{name}: {rid}'s table holds a block twice: {table}")
            if rid not in live:
                _fail("TF-REFCOUNT", f"{name}: a table for {rid}, which no live request is (its blocks leak)")
        for b, n in held.items():
            said = led.shared_ref_counts.get(b, 1)
            if said != n:
                _fail("TF-REFCOUNT", f"{name}: block {b} is in {n} table(s) but its reference count is {said}")
            if n > 1 and not a.use_block_sharing:
                _fail("TF-REFCOUNT", f"{name}: block {b} is shared by {n} tables in a group that never shares")
        for b, n in led.shared_ref_counts.items():
            if n < 2 or held[b] != n:
                _fail("TF-REFCOUNT", f"{name}: block {b} has an explicit reference count {n} but {held[b]} "
                      "table(s) hold it")


def needed_blocks(alloc: Any, length: int) -> int:
    """Blocks a request of ``length`` tokens holds: every page for full attention, the ring for a window."""
    if is_sliding(alloc):
        length = min(length, alloc.sliding_window)
    return -(-length // alloc.tokens_per_page)


def check_window(cache: Any, live: Mapping[str, Any], pending: Mapping[str, int]) -> None:
    for rid, st in live.items():
        length = st.position_offset + pending.get(rid, 0)
        for name, a in cache.cache_allocators.items():
            have, need = len(a.block_table.get(rid, [])), needed_blocks(a, length)
            if have < need:
                what = f"the last {a.sliding_window} tokens" if is_sliding(a) else "every token"
                _fail("TF-WINDOW", f"{name}: {rid} has {length} tokens and its attention reads {what}, "
                      f"{need} block(s), but its table holds {have}")


def check_batch_indices(cache: Any, entries: list[Any]) -> None:
    """TF-EXCLUSIVE-WRITE and TF-WINDOW on a batch just prepared: where its real read / write indices land."""
    for e in entries:
        rid = e.state.request_id
        for gi, (name, a) in enumerate(cache.cache_allocators.items()):
            table = a.block_table.get(rid, [])
            held = held_counts(a)
            stride = a.block_physical_stride
            for t in e.writes[gi]:
                if t == a.write_trash_index:
                    continue
                b = t // stride
                if b not in table:
                    _fail("TF-EXCLUSIVE-WRITE", f"{name}: {rid} writes index {t} (block {b}), not in its table "
                          f"{table}")
                if held[b] > 1 or b in a.ledger.block_to_hash:
                    _fail("TF-EXCLUSIVE-WRITE", f"{name}: {rid} writes block {b}, which "
                          + ("another table also holds" if held[b] > 1 else "is hashed for prefix reuse"))
            trash = (a.read_trash_index, a.sentinel_index) if is_sliding(a) else ()
            outside = sorted({t // stride for t in e.reads[gi] if t not in trash} - set(table))
            if outside:
                _fail("TF-WINDOW", f"{name}: {rid}'s batch reads block(s) {outside}, not in its table {table}")


def check_dangling(driver: Any) -> None:
    live = driver.live()
    for st in driver.scheduler._requests_to_fork:
        if live.get(st.request_id) is not st:
            _fail("TF-DANGLING", f"{st.request_id} is queued to fork but is no longer live (cancelled or reset, its "
                  "cache freed): the next update_batch forks it (prepare_fork_request reads its block table: KeyError)")
    for fs in driver.in_flight[0].futures if driver.in_flight else ():  # the next update's marks
        st = fs.state
        if st.status in (RequestStatus.FINISHED, RequestStatus.PENDING) or not fs.complete_blocks:
            continue  # skipped by update_batch, or nothing to mark
        if fs.has_new_token and st.generated_len() + 1 >= st._new_tokens_limit:
            continue  # this update finishes it first: mark_complete_blocks returns on FINISHED
        if (fs.has_new_token or st.status == RequestStatus.PREFILLING) and live.get(st.request_id) is not st:
            _fail("TF-DANGLING", f"{st.request_id}'s launched batch completes {fs.complete_blocks} block(s) but the "
                  "request was cancelled, its cache freed: the update's mark_complete_blocks reads its block table "
                  "(KeyError)")


def sectors_alone(cache: Any, length: int) -> int:
    """Sectors a request of ``length`` tokens takes on an empty cache."""
    return sum(-(-needed_blocks(a, length) // a.blocks_per_sector) for a in cache.cache_allocators.values())


def check_floor(driver: Any, token_budget: int) -> None:
    """TF-FLOOR, called when the engine is stuck: nothing fits and offload_requests frees nothing."""
    cache, sched = driver.cache, driver.scheduler
    if sched.starved_requests:
        st, n = sched.starved_requests[0]
    elif sched.waiting_requests and not sched.block_new_requests:
        st = next(iter(sched.waiting_requests.values()))
        n = min(len(st.remaining_prefill_tokens), token_budget)
    else:
        return
    length = st.current_len() + n
    need = sectors_alone(cache, length)
    if need <= cache.num_sectors:
        groups = cache.cache_allocators.items()
        held = {name: sorted(held_counts(a)) for name, a in groups}
        free = {name: free_leaves(cache, a) for name, a in groups}
        _fail("TF-FLOOR", f"{st.request_id} needs {length} tokens, {need} of an empty cache's {cache.num_sectors} "
              f"sectors, yet nothing can be scheduled and nothing offloaded ({len(sched.active_requests)} active; "
              f"held blocks {held}, free blocks {free}, free sectors {cache.pool.free_sectors}): the engine raises "
              "RuntimeError and fails every request")


def check_withhold(driver: Any) -> None:
    """TF-WITHHOLD (strict, off in the machine): no block an in-flight batch touches was handed out after the
    batch was prepared."""
    for batch in driver.in_flight:
        for key in sorted(batch.touched):
            stamp = driver.handed_at.get(key, -1)
            if stamp > batch.seq:
                _fail("TF-WITHHOLD", f"group {key[0]} block {key[1]}, touched by batch {batch.seq} (still in "
                      f"flight), was handed out again for batch {stamp}")


def check_teardown(cache: Any) -> None:
    pool = cache.pool
    first = pool.num_reserved_sectors
    if sorted(pool.free_sectors) != list(range(first, first + pool.num_sectors)):
        _fail("TF-LEAK", f"after every request was freed and the cache evicted, "
              f"{pool.num_sectors - len(pool.free_sectors)} sector(s) are not free")
    for name, a in cache.cache_allocators.items():
        led = a.ledger
        if a.block_table or led.shared_ref_counts or led.hash_to_block or led.block_to_hash or led.cached_blocks:
            _fail("TF-LEAK", f"{name} still has tables {dict(a.block_table)}, counts {led.shared_ref_counts}, "
                  f"{len(led.hash_to_block)} hash(es) or {len(led.cached_blocks)} cached block(s)")


def snapshot(cache: Any) -> tuple:
    """The allocation state of the pool and every allocator, comparable and order-sensitive."""
    pool = cache.pool
    trees = tuple((tuple((r, tuple(t)) for r, t in f.trees.items()), len(f)) for f in pool._free_blocks)
    groups = tuple((tuple((k, tuple(v)) for k, v in a.block_table.items()), tuple(a.ledger.shared_ref_counts.items()),
                    tuple(a.ledger.hash_to_block.items()), tuple(a.ledger.cached_blocks))
                   for a in cache.cache_allocators.values())
    return tuple(pool.free_sectors), trees, groups


# ---------------------------------------------------------------------------------------------
# Planted bugs: each a small change to one transformers method, applied in-process and undone on exit


def _release_skips_decrement() -> dict[tuple[Any, str], Any]:
    orig = tf_alloc.BlockLedger.release

    def release(self: Any, block_id: int, no_cache: bool = False) -> bool:
        if block_id in self.shared_ref_counts:
            return False  # a shared block keeps its count: the last holder never frees it
        return orig(self, block_id, no_cache)
    return {(tf_alloc.BlockLedger, "release"): release}


def _fork_shares_without_ref() -> dict[tuple[Any, str], Any]:
    def fork_blocks(self: Any, source_request_id: str, dest_request_id: str, past_length: int) -> tuple:
        source_table = self.block_table[source_request_id]
        num_shared = self.count_shareable_blocks(source_request_id, past_length)
        shared, to_copy = source_table[:num_shared], source_table[num_shared:]  # shared, but no acquire
        fresh = self.pool.get_free_blocks(self.index, len(to_copy))
        self.block_table[dest_request_id] = shared + fresh
        return to_copy, fresh
    return {(tf_alloc.CacheAllocator, "fork_blocks"): fork_blocks}


def _pool_frees_live_sector() -> dict[tuple[Any, str], Any]:
    def delete_full_trees(self: Any) -> list[int]:
        # a sector goes back once all but one of its blocks are free: the last one is still held
        roots = [r for r, tree in self.trees.items() if len(tree) >= max(1, self.elems_per_tree - 1)]
        for r in roots:
            self._length -= len(self.trees.pop(r))
        return roots
    return {(tf_pool.RegularTrees, "delete_full_trees"): delete_full_trees}


def _prefix_skips_parent_hash() -> dict[tuple[Any, str], Any]:
    def match_prefix_blocks(self: Any, prompt_ids: list[int]) -> list[int]:
        matched = []
        for b in range((len(prompt_ids) - 1) // self.tokens_per_page):
            tokens = prompt_ids[b * self.tokens_per_page:(b + 1) * self.tokens_per_page]
            # looked up by the page's own tokens: the hash no longer checks the prefix before it
            block_id = self.ledger.hash_to_block.get(tf_alloc.compute_block_hash(None, tokens))
            if block_id is None:
                break
            matched.append(block_id)
        return matched
    return {(tf_alloc.CacheAllocator, "match_prefix_blocks"): match_prefix_blocks}


def _window_frees_early() -> dict[tuple[Any, str], Any]:
    orig = tf_sliding.SlidingAttentionCacheAllocator.allocate_cache_to_request

    def allocate_cache_to_request(self: Any, request_id: str, past_length: int, query_length: int) -> None:
        orig(self, request_id, past_length, query_length)
        table = self.block_table[request_id]
        if past_length + query_length > self.sliding_window and len(table) > 1:
            self.pool.free_blocks(self.index, [table.pop(0)])  # the oldest page "slid out" (it is a ring)
    return {(tf_sliding.SlidingAttentionCacheAllocator, "allocate_cache_to_request"): allocate_cache_to_request}


def _eager_fork_copy() -> dict[tuple[Any, str], Any]:
    orig = tf_cache.PagedAttentionCache.prepare_fork_request

    def prepare_fork_request(self: Any, src_state: Any, dst_req_ids: list[str], copy_src_and_dst: dict) -> list:
        forked = orig(self, src_state, dst_req_ids, copy_src_and_dst)
        self.perform_cache_copy(copy_src_and_dst)  # now, on the host's order, not queued on the compute stream
        for src, dst in copy_src_and_dst.values():
            src.clear()
            dst.clear()
        return forked
    return {(tf_cache.PagedAttentionCache, "prepare_fork_request"): prepare_fork_request}


def _copy_swapped() -> dict[tuple[Any, str], Any]:
    orig = tf_alloc.CacheAllocator.copy_blocks

    def copy_blocks(self: Any, source_block_ids: list[int], dest_block_ids: list[int]) -> None:
        orig(self, dest_block_ids, source_block_ids)  # the fork's fresh blocks are copied over the parent's
    return {(tf_alloc.CacheAllocator, "copy_blocks"): copy_blocks}


def _hash_before_written() -> dict[tuple[Any, str], Any]:
    orig = tf_alloc.CacheAllocator.mark_complete_blocks

    def mark_complete_blocks(self: Any, request_id: str, token_ids: list[int], new_new_blocks: int) -> None:
        # every block full by token count, though the last token's KV is written by the next batch
        orig(self, request_id, token_ids, len(token_ids) // self.tokens_per_page)
    return {(tf_alloc.CacheAllocator, "mark_complete_blocks"): mark_complete_blocks}


def _free_scrubs_now() -> dict[tuple[Any, str], Any]:
    orig = tf_alloc.CacheAllocator.free_blocks

    def free_blocks(self: Any, request_id: str, no_cache: bool = False) -> None:
        table = self.block_table.get(request_id, [])
        orig(self, request_id, no_cache)
        free = {b for tree in self.pool._free_blocks[self.index].trees.values() for b in tree}
        self._copy_view[[b for b in table if b in free]] = 0  # zeroed now, not queued behind the batches in flight
    return {(tf_alloc.CacheAllocator, "free_blocks"): free_blocks}


def _free_drops_a_block() -> dict[tuple[Any, str], Any]:
    orig = tf_pool.CachePool.free_blocks

    def free_blocks(self: Any, index: int, block_ids: list[int]) -> None:
        orig(self, index, block_ids[1:])  # the first block of every free never reaches the free list
    return {(tf_pool.CachePool, "free_blocks"): free_blocks}


def _refusal_keeps_sectors() -> dict[tuple[Any, str], Any]:
    orig = tf_cache.PagedAttentionCache.can_store_request_tokens

    def can_store_request_tokens(self: Any, state: Any, request_len: int, dry_run: bool = False) -> bool:
        ok = orig(self, state, request_len, dry_run)
        if not ok and not dry_run and self.pool.num_free_sectors:
            alloc = next(iter(self.cache_allocators.values()))
            self.pool.allocate_sector(alloc.index)  # a refused admission keeps a sector it took
        return ok
    return {(tf_cache.PagedAttentionCache, "can_store_request_tokens"): can_store_request_tokens}


# name -> (patches, the layout that runs it, the invariant that kills it first in the ci profile, machine options)
MUTANTS: dict[str, tuple[Any, str, str, dict[str, bool]]] = {
    "release-skips-decrement": (_release_skips_decrement, "hybrid", "TF-REFCOUNT", {}),
    "fork-shares-without-ref": (_fork_shares_without_ref, "hybrid", "TF-REFCOUNT", {}),
    "pool-frees-live-sector": (_pool_frees_live_sector, "hybrid", "TF-NO-OVERLAP", {}),
    "free-drops-a-block": (_free_drops_a_block, "hybrid", "TF-SECTORS", {}),
    "prefix-skips-parent-hash": (_prefix_skips_parent_hash, "full", "TF-PREFIX-MAP", {}),
    "window-frees-early": (_window_frees_early, "hybrid", "TF-WINDOW", {}),
    "free-scrubs-now": (_free_scrubs_now, "hybrid", "TF-INFLIGHT", {}),
    "eager-fork-copy": (_eager_fork_copy, "hybrid", "TF-CONTENT", {}),
    "copy-swapped": (_copy_swapped, "hybrid", "TF-CONTENT", {}),
    "hash-before-written": (_hash_before_written, "full", "TF-EXCLUSIVE-WRITE", {"sync": True}),
    "refusal-keeps-sectors": (_refusal_keeps_sectors, "full", "TF-REFUSAL", {}),
}


@contextmanager
def planted(name: str) -> Iterator[None]:
    """The named planted bug is in transformers' class while inside; restored on exit."""
    patches = MUTANTS[name][0]()
    saved = {(owner, attr): owner.__dict__.get(attr) for owner, attr in patches}  # None: inherited
    try:
        for (owner, attr), fn in patches.items():
            setattr(owner, attr, fn)
        yield
    finally:
        for (owner, attr), fn in saved.items():
            if fn is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, fn)
