"""transformers 5.23.0's own paged KV cache, driven on CPU as its continuous-batching engine drives it.

What runs is transformers' code: ``PagedAttentionCache`` (built by its own constructor from a tiny config, no
weights), the ``FullAttentionCacheAllocator`` / ``SlidingAttentionCacheAllocator`` it picks, their ``CachePool`` and
``BlockLedger``, the real ``FIFOScheduler`` (``schedule_batch``: safety margin, ``try_to_free_sectors``,
``evict_cached_blocks``, ``search_prefix_match``, ``can_store_request_tokens``, ``count_new_complete_blocks``), the
real ``OffloadingManager`` without a CPU pool (``offload_requests``: ``evict_cached_blocks``,
``count_storable_requests``, ``free_blocks(no_cache=True)``, soft resets) and the real ``RequestState``.  The one
stand-in: ``PagedAttentionMemoryHandler.get_available_memory`` (a memory probe, irrelevant once ``num_blocks`` fixes
the size) answers 1 TiB while the cache is built.

What the driver re-does, line for line, is the engine glue around them (``continuous_api.py``):
``prepare_next_batch`` (``clear_cancelled_requests``, ``schedule_batch``, offloading while nothing fits) and
``prepare_batch_tensors`` (``input_outputs.py:385-412``: advance ``position_offset``, then
``extend_read_and_write_indices``); ``update_batch`` (``continuous_api.py:538-604``: the async skip of finished and
reset requests, ``update_and_check_completion``, ``mark_complete_blocks``, ``finish_request``, then the forks:
``try_to_free_sectors``, ``prepare_fork_request``, ``perform_cache_copy`` on the compute stream).

The GPU is a FIFO: the compute stream.  A launched batch and a fork's copies are queued; a batch runs when its
update starts (the engine waits for its outputs there), after everything queued before it.  Running a batch calls
the real ``allocator.update`` for every layer with the batch's real indices and, as K and V, a tag of (token,
position, layer, K/V) per row: the tags ``update`` hands back are what attention would read (TF-CONTENT,
TF-INFLIGHT).  The engine's async mode is the default: up to two batches are launched and not yet updated
(PR N+1, launch N+1, UP N); ``sync=True`` allows one.

A model for the tokens: greedy and deterministic, the next token a function of the request's tokens (and of the
child index for a fork's children), so equal prompts generate equal blocks (de-duplication) and children diverge.

Checked after every call (:mod:`paged_checks`, which states each; kvarena IDs from spec/arena.md):

=====================  ==========================================  ====================================
TF-FREE-IS-UNHELD      INV-LEDGER-SAFETY (hole-has-no-user)        after every rule
TF-NO-OVERLAP          INV-NO-OVERLAP                              after every rule (bytes of the tensor)
TF-PREFIX-MAP          INV-VMAP-BIJECTIVE, INV-CONTENT-FOLLOWS-VID after every rule
TF-REFCOUNT            INV-VMAP-BIJECTIVE (refs, no-leak)          after every rule
TF-SECTORS             INV-BYTE-CONSERVATION                       after every rule
TF-WINDOW              INV-LEDGER-SAFETY                           after every rule and every prepare
TF-EXCLUSIVE-WRITE     INV-LEDGER-SAFETY (one writer)              every prepared batch
TF-INFLIGHT            INV-LEDGER-SAFETY (withheld until release)  every batch run, in stream order
TF-CONTENT             INV-CONTENT-FOLLOWS-VID                     every batch run
TF-REFUSAL             INV-REFUSAL-IS-NOOP                         every admission call, every probe
TF-LEAK                INV-BYTE-CONSERVATION, INV-VMAP-BIJECTIVE   teardown
TF-DANGLING            INV-VMAP-BIJECTIVE (owned-bound)            after every rule when ``faithful``
TF-FLOOR               INV-FEASIBILITY-FLOOR                       when stuck, if ``floor`` (default:
                                                                   ``faithful``)
TF-WITHHOLD            INV-LEDGER-SAFETY (strict)                  after every rule if ``strict_withhold``
=====================  ==========================================  ====================================

``faithful=False`` steps around finding 2 of docs/transformers-findings.md and ``floor=False`` around finding 3,
the way a fix would (a request no longer live is not forked or marked; a stuck prepare schedules nothing), and
counts them.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from transformers import Gemma3TextConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import cache as tf_cache
from transformers.generation.continuous_batching import utils as tf_utils
from transformers.generation.continuous_batching.distributed import DistributedHelper
from transformers.generation.continuous_batching.offloading_manager import OffloadingManager
from transformers.generation.continuous_batching.requests import TMP_TOKEN_ID, RequestState, RequestStatus
from transformers.generation.continuous_batching.scheduler import FIFOScheduler

from kvarena.engines.transformers import paged_checks as pc
from kvarena.spec.errors import InvariantViolation

__all__ = ["LAYOUTS", "Driver", "Layout", "build_cache", "machine_for", "prompt", "run_example"]


@dataclass(frozen=True)
class Layout:
    """A tiny Gemma3 text config: ``page_size``-token pages, ``num_blocks`` whole-model blocks of capacity."""

    name: str
    layer_types: tuple[str, ...]
    head_dim: int
    num_blocks: int
    page_size: int = 2
    sliding_window: int = 6
    max_prompt: int = 12
    max_new: int = 4

    def config(self) -> Gemma3TextConfig:
        return Gemma3TextConfig(vocab_size=32, hidden_size=64, intermediate_size=64, num_attention_heads=2,
                                num_key_value_heads=1, head_dim=self.head_dim, num_hidden_layers=len(self.layer_types),
                                layer_types=list(self.layer_types), sliding_window=self.sliding_window)


# fp32 cache; a page is 2 tokens x K,V x 1 head x head_dim: both layouts cut a 128 B sector into two blocks.
LAYOUTS = {
    # 2 sliding + 2 full layers: two allocators, no prefix sharing (sliding groups cannot share); forks share
    # the full group's complete blocks and copy the rest. 6 sectors: 12 blocks between the two groups.
    "hybrid": Layout("hybrid", ("sliding_attention", "full_attention") * 2, head_dim=2, num_blocks=6),
    # 4 full layers: prefix sharing on (hash chains, cached blocks, de-duplication, eviction). 6 sectors.
    "full": Layout("full", ("full_attention",) * 4, head_dim=1, num_blocks=12),
}


def build_cache(layout: Layout) -> Any:
    cb = ContinuousBatchingConfig(page_size=layout.page_size, num_blocks=layout.num_blocks, max_batch_tokens=16,
                                  max_blocks_per_request=0, allow_block_sharing=True, use_async_batching=False)
    with mock.patch.object(tf_cache.PagedAttentionMemoryHandler, "get_available_memory", return_value=1 << 40):
        return tf_cache.PagedAttentionCache(layout.config(), cb, "cpu", DistributedHelper(None, None),
                                            dtype=torch.float32)


@contextmanager
def _quiet() -> Iterator[None]:
    level = tf_utils.logger.level
    tf_utils.logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tf_utils.logger.setLevel(level)


def tag(token: int, pos: int, layer: int, kv: int) -> float:
    """The K (kv=0) or V (kv=1) value a token at a position writes in a layer: exact in fp32, unique per tuple."""
    assert 0 <= token < 32 and 0 <= pos < 64
    return float(1 + pos + 64 * (token + 32 * (2 * layer + kv)))


def next_token(tokens: list[int], salt: int) -> int:
    return 24 + (sum((i + 1) * t for i, t in enumerate(tokens)) + 3 * salt) % 8


@dataclass
class Entry:
    """One request's share of a batch: its state object and the real indices prepared for it."""

    state: RequestState
    past: int
    q: int
    reads: list[list[int]]
    writes: list[list[int]]


@dataclass
class Batch:
    seq: int
    futures: list[Any]
    entries: list[Entry]
    touched: set[tuple[int, int]] = field(default_factory=set)  # (allocator index, block) read or written
    ran: bool = False


def _poisons(method: Any) -> Any:
    """After an exception the driver's state is half-updated: its teardown must not run on it (Hypothesis calls
    teardown after a failing rule, and a second error would replace the first)."""
    def wrapper(self: Driver, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.broken = True
            raise
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


class Driver:
    """The real cache, scheduler and offloader, and the engine's glue around them (module docstring)."""

    broken = False

    def __init__(self, layout: Layout, *, sync: bool = False, faithful: bool = False, floor: bool | None = None,
                 strict_withhold: bool = False) -> None:
        self.layout, self.sync, self.faithful, self.strict_withhold = layout, sync, faithful, strict_withhold
        self.floor = faithful if floor is None else floor  # TF-FLOOR when stuck (finding 3)
        self.cache = build_cache(layout)
        self.scheduler = FIFOScheduler(self.cache, safety_margin=0.2, max_requests_per_batch=4)
        with _quiet():  # no CPU pool (0 GiB): its psutil warning says nothing here
            self.offloader = OffloadingManager(self.cache, self.scheduler, 0.0, 0.8, None,
                                               DistributedHelper(None, None))
        self.allocs = list(self.cache.cache_allocators.values())
        self.in_flight: deque[Batch] = deque()  # launched, not yet updated (oldest first)
        self.stream: deque[Batch | dict] = deque()  # the compute stream: batches and fork copies not yet run
        self.seq = 0  # batches prepared so far
        self.handed_at: dict[tuple[int, int], int] = {}  # (allocator index, block) -> the batch it was handed to
        self.counts: Counter = Counter()
        self._extents: dict[tuple[int, int], tuple[int, int]] = {}
        self._n = 0
        self._wrap()

    # -- instrumentation: instance attributes over the real methods (a planted bug patches the class)

    def _wrap(self) -> None:
        cache, pool = self.cache, self.cache.pool
        cls, pool_cls = type(cache), type(pool)

        def can_store(state: RequestState, request_len: int, dry_run: bool = False) -> bool:
            before = pc.snapshot(cache)
            ok = cls.can_store_request_tokens(cache, state, request_len, dry_run)
            if (dry_run or not ok) and pc.snapshot(cache) != before:
                pc._fail("TF-REFUSAL", f"can_store_request_tokens({state.request_id}, {request_len}, dry_run="
                         f"{dry_run}) -> {ok} changed the allocation state")
            self.counts["refused" if not ok else "dry runs" if dry_run else "allocations"] += 1
            return ok

        def search(request_id: str, prompt_ids: list[int]) -> int:
            n = cls.search_prefix_match(cache, request_id, prompt_ids)
            self.counts["prefix hits"] += n > 0
            return n

        def get_free_blocks(index: int, num_blocks: int) -> list[int]:
            blocks = pool_cls.get_free_blocks(pool, index, num_blocks)
            for b in blocks:  # first used by the batch prepared next (or later)
                self.handed_at[(index, b)] = self.seq + 1
                self.counts["in-flight reuse"] += any((index, b) in f.touched for f in self.in_flight)
            return blocks

        cache.can_store_request_tokens = can_store
        cache.search_prefix_match = search
        pool.get_free_blocks = get_free_blocks

    def extent(self, alloc: Any, block: int) -> tuple[int, int]:
        key = (alloc.index, block)
        if key not in self._extents:
            self._extents[key] = pc.block_extent(alloc, block, self.cache.cache_tensor.data_ptr())
        return self._extents[key]

    def live(self) -> dict[str, RequestState]:
        return self.scheduler.active_requests

    @_poisons
    def check(self, pending: dict[str, int] | None = None) -> None:
        pc.check_state(self, pending)
        if self.faithful:
            pc.check_dangling(self)
        if self.strict_withhold:
            pc.check_withhold(self)

    # -- the engine's calls

    def add(self, tokens: list[int], max_new: int, children: int = 0) -> str:
        rid = f"r{self._n}"
        self._n += 1
        self.scheduler.add_waiting_request(RequestState(request_id=rid, initial_tokens=tokens, max_new_tokens=max_new,
                                                        num_children=children))
        return rid

    def cancel(self, rid: str) -> None:
        """``cancel_request``: queued, applied by the next ``prepare_next_batch``."""
        self.scheduler.set_request_cancellation(rid)

    @_poisons
    def step(self, token_budget: int) -> Batch | None:
        """``prepare_next_batch`` + ``prepare_batch_tensors`` + the launch of the batch."""
        for state in self.scheduler.clear_cancelled_requests():
            self.offloader.free_request_cpu_cache(state)
            self.counts["cancelled"] += 1
        self.check()
        if not self.scheduler.has_pending_requests():
            return None
        futures, *_ = self.scheduler.schedule_batch(token_budget, self.cache.max_tokens_read)
        while futures is None:  # the cache is full: offload (soft reset) until something fits
            if not self.offloader.offload_requests():
                self.counts["stuck"] += 1  # the engine raises "No requests can be scheduled ..." here
                if self.floor:
                    pc.check_floor(self, token_budget)
                return None
            self.counts["offload rounds"] += 1
            futures, *_ = self.scheduler.schedule_batch(token_budget, self.cache.max_tokens_read)
        self.check({fs.state.request_id: fs.query_length for fs in futures})
        if not futures:
            return None
        if self.scheduler.starved_requests:
            self.counts["offloads"] += self.offloader.offload_requests()
        self.seq += 1
        batch = Batch(self.seq, futures, [])
        for fs in futures:
            st = fs.state
            past, q = st.position_offset, fs.query_length
            st.position_offset += q
            reads: list[list[int]] = [[] for _ in self.allocs]
            writes: list[list[int]] = [[] for _ in self.allocs]
            self.cache.extend_read_and_write_indices(st.request_id, past, q, reads, writes)
            if fs.has_new_token:
                st.tokens_to_process = [TMP_TOKEN_ID]
            batch.entries.append(Entry(st, past, q, reads, writes))
            for a, r, w in zip(self.allocs, reads, writes, strict=True):
                batch.touched |= {(a.index, t // a.block_physical_stride) for t in r + w}
                self.counts["trash writes"] += w.count(a.write_trash_index)
        pc.check_batch_indices(self.cache, batch.entries)
        self.in_flight.append(batch)
        self.stream.append(batch)
        self.counts["batches"] += 1
        return batch

    def iterate(self, token_budget: int, n: int = 1) -> None:
        """``n`` turns of the engine's loop (``_run_generation_loop``): prepare and launch a batch, then update
        the one launched before it (async), or this one (sync)."""
        for _ in range(n):
            if not self.can_launch():
                self.update()
            self.step(token_budget)
            if len(self.in_flight) > (0 if self.sync else 1):
                self.update()
            self.check()

    def can_launch(self) -> bool:
        return len(self.in_flight) < (1 if self.sync else 2)

    @_poisons
    def update(self) -> None:
        """``update_batch`` for the oldest launched batch, after the stream ran it."""
        batch = self.in_flight.popleft()
        while not batch.ran:
            self._run(self.stream.popleft())
        sched = self.scheduler
        for fs in batch.futures:
            st = fs.state
            if st.status in (RequestStatus.FINISHED, RequestStatus.PENDING):
                self.counts["skipped at update"] += 1  # async: finished or reset after it was scheduled
                continue
            if not self.faithful and self.live().get(st.request_id) is not st and fs.complete_blocks:
                self.counts["dangling marks skipped"] += 1  # finding 2: the engine's update raises KeyError here
                fs.complete_blocks = {}
            if fs.has_new_token:
                if st.generated_len() == 0:
                    st.status = RequestStatus.DECODING
                salt = int(st.request_id.rsplit("#", 1)[1]) + 1 if "#" in st.request_id else 0
                done = st.update_and_check_completion(next_token(st.initial_tokens + st.generated_tokens, salt), None)
                self.cache.mark_complete_blocks(st, fs.complete_blocks)
                if done:
                    sched.finish_request(st.request_id)
                    sched.block_new_requests = False
                    self.counts["finished"] += 1
            elif st.status == RequestStatus.PREFILLING:
                self.cache.mark_complete_blocks(st, fs.complete_blocks)
        if sched._requests_to_fork:
            self.cache.pool.try_to_free_sectors()
            pairs: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in self.cache.cache_allocators}
            while sched._requests_to_fork:
                parent = sched._requests_to_fork.pop()
                if not self.faithful and self.live().get(parent.request_id) is not parent:
                    self.counts["dangling forks skipped"] += 1  # finding 2: prepare_fork_request raises KeyError
                    continue
                n, parent.num_children = parent.num_children, 0
                ids = [f"{parent.request_id}__child#{i}" for i in range(n)]
                forked = self.cache.prepare_fork_request(parent, ids, pairs)
                for cid in forked:
                    sched.active_requests[cid] = parent.fork(cid)
                for cid in ids[len(forked):]:
                    child = parent.create_equivalent_initial_request()
                    child.request_id = cid
                    sched.add_waiting_request(child)
                self.counts["forked"] += len(forked)
                self.counts["fork refused"] += len(ids) - len(forked)
            self.stream.append(pairs)  # perform_cache_copy on the compute stream

    def _run(self, work: Batch | dict) -> None:
        if isinstance(work, dict):
            self.cache.perform_cache_copy(work)
            self.counts["copies run"] += 1
            return
        for e in work.entries:
            self._run_entry(e)
        work.ran = True

    def _run_entry(self, e: Entry) -> None:
        tokens = e.state.initial_tokens + e.state.generated_tokens
        rid = e.state.request_id
        if len(tokens) < e.past + e.q:
            raise AssertionError(f"{rid}: batch runs positions up to {e.past + e.q} with {len(tokens)} known tokens")
        alive = self.live().get(rid) is e.state
        for gi, a in enumerate(self.allocs):
            if pc.is_sliding(a) and e.past >= a.sliding_window:
                seen = list(range(e.past - a.sliding_window + 1, e.past + e.q))
            else:
                seen = list(range(e.past + e.q))
            read_idx = torch.tensor(e.reads[gi], dtype=torch.long)
            write_idx = torch.tensor(e.writes[gi], dtype=torch.long)
            for layer in a.layer_indices:
                new = [torch.tensor([tag(tokens[p], p, layer, kv) for p in range(e.past, e.past + e.q)],
                                    dtype=torch.float32).view(-1, 1, 1).expand(-1, 1, a.head_dim).contiguous()
                       for kv in (0, 1)]
                got = a.update(new[0], new[1], layer, read_idx, write_idx)
                for kv in (0, 1):
                    rows = got[kv][:, 0, 0].tolist()
                    want = [tag(tokens[p], p, layer, kv) for p in seen]
                    if rows != want:
                        self._content_failure(e, a, kv, layer, seen, rows, want, alive)

    def _content_failure(self, e: Entry, a: Any, kv: int, layer: int, seen: list[int], rows: list[float],
                         want: list[float], alive: bool) -> None:
        i = next(i for i, (x, y) in enumerate(zip(rows, want, strict=True)) if x != y)
        rid, pos = e.state.request_id, seen[i]
        cached = i < len(e.reads[a.index]) and e.reads[a.index][i] != a.sentinel_index
        block = e.reads[a.index][i] // a.block_physical_stride if cached else None
        table = a.block_table.get(rid, []) if alive else []
        inv = "TF-CONTENT" if block is None or block in table else "TF-INFLIGHT"
        why = "" if inv == "TF-CONTENT" else f" (block {block} left {rid}'s table while the batch was in flight)"
        pc._fail(inv, f"batch {e.past}+{e.q} of {rid}: layer {layer} {'KV'[kv]} at position {pos} reads "
                 f"{rows[i]:.0f}, not its own tag {want[i]:.0f}{why}")

    # -- other calls the engine makes

    @_poisons
    def evict(self) -> None:
        self.counts["evictions"] += self.cache.evict_cached_blocks()
        self.cache.pool.try_to_free_sectors()

    @_poisons
    def probe(self, states: list[RequestState], lengths: list[int]) -> None:
        """Admission: ``count_storable_requests`` on the blocks ``needs_new_blocks`` reports, the dry run, and the
        real ``can_store_request_tokens`` one by one (undone: a what-if, as ``offload_requests`` asks it)."""
        cache = self.cache
        needs = [{name: a.needs_new_blocks(s.request_id, s.current_len(), n) for name, a in
                  cache.cache_allocators.items()} for s, n in zip(states, lengths, strict=True)]
        said = cache.count_storable_requests(needs)
        dry = cache.can_store_request_tokens(states[0], lengths[0], dry_run=True)
        saved = copy.deepcopy((cache.pool.free_sectors, cache.pool._free_blocks,
                               [(a.block_table, a.ledger) for a in self.allocs]))
        before = pc.snapshot(cache)
        fit = 0
        for s, n in zip(states, lengths, strict=True):
            if not cache.can_store_request_tokens(s, n):
                break
            fit += 1
        cache.pool.free_sectors, cache.pool._free_blocks, groups = saved
        for a, (table, ledger) in zip(self.allocs, groups, strict=True):
            a.block_table, a.ledger = table, ledger
        assert pc.snapshot(cache) == before
        if said != fit or dry != (fit > 0):
            pc._fail("TF-REFUSAL", f"count_storable_requests says {said} of {lengths} fit, the dry run says "
                     f"{dry} for the first, the real calls admitted {fit}")
        self.counts["probes"] += 1

    @_poisons
    def teardown(self) -> None:
        """Every batch updated and run, every request finished, the cached blocks evicted: nothing is left."""
        self.check()
        while self.in_flight:
            self.update()
        while self.stream:
            self._run(self.stream.popleft())
        for rid in list(self.scheduler.active_requests):
            self.scheduler.finish_request(rid)
        self.evict()
        self.check()
        pc.check_teardown(self.cache)


# ---------------------------------------------------------------------------------------------
# The state machine


# three families of prompts (the first repeats one page: equal pages under different prefixes)
FAMILIES = ([5, 6] * 8, [(3 * i) % 23 + 1 for i in range(16)], [(7 * i + 2) % 23 + 1 for i in range(16)])


def prompt(family: int, length: int, split: int, variant: int) -> list[int]:
    """A family's first ``split`` tokens (shared pages: prefix hits), then the variant's own (tokens 1..23)."""
    tokens = FAMILIES[family][:min(split, length)]
    return tokens + [(9 + 4 * variant + i) % 23 + 1 for i in range(length - len(tokens))]


def machine_for(layout: Layout, *, sync: bool = False, faithful: bool = False, floor: bool | None = None,
                strict_withhold: bool = False) -> type:
    """A ``RuleBasedStateMachine`` over a fresh :class:`Driver` per example; every invariant after every rule."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule


    class PagedCacheMachine(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            self.d = Driver(layout, sync=sync, faithful=faithful, floor=floor, strict_withhold=strict_withhold)

        @rule(family=st.integers(0, 2), length=st.integers(1, layout.max_prompt), split=st.integers(0, 16),
              variant=st.integers(0, 3), max_new=st.integers(1, layout.max_new),
              children=st.sampled_from([0, 0, 0, 1, 2]))
        def add(self, family: int, length: int, split: int, variant: int, max_new: int, children: int) -> None:
            """A new request: a family's prefix up to ``split`` (shared pages: prefix hits), then its own tokens."""
            if len(self.d.scheduler.active_requests) + len(self.d.scheduler.waiting_requests) >= 6:
                return
            self.d.add(prompt(family, length, split, variant), max_new, children if length > 1 else 0)

        def _step(self, budget: int) -> None:
            if self.d.can_launch():
                self.d.step(budget)
                self.d.check()

        # Preparing and updating batches are most of an engine's life: two rules' weight each.
        @rule(budget=st.sampled_from([1, 2, 3, 5, 8, 16]))
        def step(self, budget: int) -> None:
            self._step(budget)

        @rule(budget=st.sampled_from([1, 2, 4, 16]))
        def step_more(self, budget: int) -> None:
            self._step(budget)

        @rule(budget=st.sampled_from([2, 4, 8, 16]), n=st.integers(1, 6))
        def iterate(self, budget: int, n: int) -> None:
            self.d.iterate(budget, n)

        @precondition(lambda self: self.d.in_flight)
        @rule()
        def update(self) -> None:
            self.d.update()
            self.d.check()

        @precondition(lambda self: self.d.in_flight)
        @rule()
        def update_more(self) -> None:
            self.d.update()
            self.d.check()

        @rule(pick=st.integers(0, 9))
        def cancel(self, pick: int) -> None:
            """``cancel_request``."""
            rids = sorted(set(self.d.scheduler.active_requests) | set(self.d.scheduler.waiting_requests))
            if rids:
                self.d.cancel(rids[pick % len(rids)])

        @rule()
        def evict(self) -> None:
            self.d.evict()
            self.d.check()

        @rule(picks=st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True),
              lengths=st.lists(st.integers(1, 8), min_size=3, max_size=3))
        def probe(self, picks: list[int], lengths: list[int]) -> None:
            states = list(self.d.scheduler.active_requests.values()) + list(self.d.scheduler.waiting_requests.values())
            chosen = list({id(s): s for s in (states[p % len(states)] for p in picks)}.values()) if states else []
            if chosen:
                self.d.probe(chosen, lengths[:len(chosen)])
                self.d.check()

        def teardown(self) -> None:
            d = getattr(self, "d", None)
            if d is not None and not d.broken:
                d.teardown()
                STATS.update(d.counts)

    PagedCacheMachine.__name__ = f"PagedCacheMachine_{layout.name}" + ("_sync" if sync else "")
    return PagedCacheMachine


STATS: Counter = Counter()  # what the machines of this process did (the tests print it)


def run_example(layout: Layout, calls: list[tuple[str, tuple]], **kw: Any) -> Driver:
    """A fixed call sequence (the findings' reproducers): ``("add", (tokens, max_new, children))``, ``("step",
    (budget,))``, ``("update", ())``, ``("cancel", (rid,))``; the structural checks after each call."""
    d = Driver(layout, **kw)
    for name, args in calls:
        getattr(d, name)(*args)
        d.check()
    return d


def violation(fn: Any, *args: Any) -> str | None:
    try:
        fn(*args)
    except InvariantViolation as e:
        return e.inv
    return None
