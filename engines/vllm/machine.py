"""The ``block-pool`` machine: vLLM's scheduler operations on the real manager in any order, every check of
checks.py after each (the checks are the level; this module drives them), and the planted bugs it must kill."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from kvarena.engines.vllm.driver import Driver, Plan, build
from kvarena.engines.vllm.load import load_vllm

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
