"""The radix tree's per-chunk state checkpoints (kvarena/simulator/checkpoints.py, rules.mamba_chunk_checkpoints):
each prefill chunk of a Qwen3.5 request leaves a checkpoint, the earlier ones unlocked above KV the request still
locks. Checked against the installed SGLang 0.5.23 wheel's source, by their effect (a unified arena pays for them
in bytes, split pools with a state slot to spare do not) and against planted bugs."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.split import SplitPools
from kvarena.simulator import rules
from kvarena.simulator.arrivals import Arrival, TraceSource
from kvarena.simulator.checkpoints import StateCheckpoints
from kvarena.simulator.pager import Pager
from kvarena.simulator.scheduler import SIMPLE, Scheduler, SchedulerModel, run
from kvarena.spec.models import ArenaConfig, preset
from tests.wheels import sglang_source

GiB = 1 << 30


def _body(src: str, name: str) -> str:
    """The source of method ``name`` (up to the next ``def`` at the same indent)."""
    m = re.search(rf"\n( +)def {name}\(.*?(?=\n\1def |\Z)", src, re.S)
    assert m, f"def {name} not found"
    return m.group(0)


@pytest.mark.parametrize(("rel", "text"), [
    # every chunk >= the grid tracks a state relative to the request's prefix, and every chunk is checkpointed
    ("srt/managers/schedule_batch.py", "Without DCP, keep tracking snapshots relative to\n"
     "            # that request prefix so later chunks can continue donating states."),
    ("srt/managers/scheduler.py", "    def stash_chunked_request(self, req: Req):\n"
     "        if self.disaggregation_mode == DisaggregationMode.PREFILL:\n"
     "            self.checkpoint_disagg_prefill(req)\n        else:\n"
     "            checkpoint_kv_cache(req, self.tree_cache)"),
    # the request's lock moves to the node the insert ended on
    ("srt/mem_cache/unified_radix_cache.py", "        self.unlock(req.lock)\n"),
    ("srt/mem_cache/unified_radix_cache.py", "        req.lock = self.lock(\n            new_last_node,"),
    # a state allocation evicts states (interior ones too); the full side counts full-evictable tokens only
    ("srt/mem_cache/unified_cache/components/mamba.py",
     "self.cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))"),
    ("srt/mem_cache/allocation.py", "EvictParams(num_tokens=0, mamba_num=needed - available)"),
    ("srt/mem_cache/prefill_budget.py", "self.tree_cache.full_evictable_size()\n"
     "            if self.tree_cache.supports_mamba()"),
    ("srt/mem_cache/allocator/unified_mamba.py", "    def available_size(self) -> int:\n"
     "        return self.full_attn_allocator.schedulable_available_size()"),
    # no path cap by default
    ("srt/arg_groups/fields/exec_.py", "Tail, fork, and locked nodes are preserved. Must be -1 or a positive "
     "integer.\",\n    ] = -1"),
])
def test_rule_text_is_in_the_installed_sglang(rel: str, text: str) -> None:
    assert text in sglang_source(rel)


def test_the_state_lock_is_the_node_the_kv_lock_the_path() -> None:
    """The mamba component locks only the node it is given; the full component walks the path to the root; a
    full-attention eviction takes evictable leaves only. So an earlier chunk's state stays, unlocked, under KV
    the request locks, and only a state eviction (which tombstones interior states) reclaims it."""
    mamba = sglang_source("srt/mem_cache/unified_cache/components/mamba.py")
    full = sglang_source("srt/mem_cache/unified_cache/components/full.py")
    lock_m, lock_f = _body(mamba, "acquire_component_lock"), _body(full, "acquire_component_lock")
    assert ".parent" not in lock_m and "cd.lock_ref += 1" in lock_m
    assert ".parent" in lock_f and "root = self.tree_core.root_node" in lock_f
    assert "if x not in self.tree_core.evictable_device_leaves:" in _body(full, "_evict_device_next_node")
    assert "_evict_component_and_detach_lru" in _body(mamba, "_evict_device_next_node")  # interior tombstones


def test_rule_values() -> None:
    assert rules.mamba_chunk_checkpoints() and not rules.mamba_chunk_checkpoints(dcp=True)
    assert not rules.mamba_chunk_checkpoints(extra_buffer=False)
    assert SchedulerModel().chunk_checkpoints and SIMPLE.radix_state_slots == 0  # replay never checkpoints


def _held_after_prefill(model: SchedulerModel) -> tuple[list[str], int, Scheduler]:
    cfg = ArenaConfig(preset("qwen3.5-4b"), 6 * GiB, max_context_len=24_000, recurrent_slots=3)
    s = Scheduler(Arena(cfg), TraceSource([Arrival(0.0, 20_000, 200, ignore_eos=True)]), "t",
                  replace(model, check_every=0), 0, None, None, None, None, 0)
    while not s.decoding:
        s.one_step()
        s.step += 1
    owners = sorted(o for o in s.alloc.owners if o.startswith("ckpt:"))
    return owners, sum(len(h["state"]) for h in s.alloc.owners.values()), s


def test_each_chunk_leaves_a_checkpoint_held_while_the_request_runs() -> None:
    """A 20,000-token prompt at 8,192-token chunks runs 3 chunks: the tree holds 3 checkpoints beside the
    request's 1 + 2 slots (6 state slots), all freed when it completes; switched off (the planted bug: the
    first chunk's only, as before this rule) it holds 4."""
    owners, slots, s = _held_after_prefill(SchedulerModel())
    assert owners == ["ckpt:r0", "ckpt:r0:1", "ckpt:r0:2"] and slots == 6
    assert list(s.ckpt.interior) == ["ckpt:r0", "ckpt:r0:1"]  # the newest is the locked one
    res = s.run()
    assert res.completed == 1 and not s.alloc.owners and res.admitted == 1
    off, slots_off, _ = _held_after_prefill(replace(SchedulerModel(), chunk_checkpoints=False))
    assert off == ["ckpt:r0"] and slots_off == 4


@pytest.mark.parametrize("kind", [Arena, SplitPools])
def test_interior_checkpoints_cost_unified_bytes_not_split_ones(kind) -> None:
    """Lockstep 9,000-token prompts (two chunks each) whose outputs outgrow admission's clipped reserve: in the
    unified arena the interior checkpoints take bytes the full-attention KV needs at the end, so it retracts
    (SGLang's full side neither counts nor evicts them); the split pools have a state slot to spare for each."""
    reqs = [Arrival(0.0, 9000, 3000, ignore_eos=True) for _ in range(8)]
    cfg = ArenaConfig(preset("qwen3.5-4b"), int(3.5 * GiB), max_context_len=12_100, recurrent_slots=3)
    on = run(kind(cfg), TraceSource(reqs), "t", SchedulerModel(check_every=500))
    off = run(kind(cfg), TraceSource(reqs), "t", SchedulerModel(check_every=500, chunk_checkpoints=False))
    assert on.completed == off.completed == 8 and on.checkpoints_refused == 0
    if kind is Arena:
        assert on.retractions > off.retractions == 0
    else:
        assert on.retractions == off.retractions == 0


def _tight_split() -> tuple[SplitPools, Pager, StateCheckpoints]:
    cfg = ArenaConfig(preset("qwen3.5-4b"), 2 * GiB, max_context_len=8192, recurrent_slots=3)
    alloc = SplitPools(cfg)
    pg = Pager(alloc, state_slots=3)

    def admit(owner: str, slots: int) -> bool:
        try:
            alloc.admit(owner, {"state": slots})
        except Exception:
            return False
        return True

    return alloc, pg, StateCheckpoints(alloc, "state", pg.fits, admit)


def _any_shortfall(self: StateCheckpoints, slots: int) -> None:
    """Planted bug: interior checkpoints reclaimed for a full-attention shortfall too (counted free for KV)."""
    while self.interior and not self.fits({self.cls: slots, "full": 1}, 0):
        owner, rid = next(iter(self.interior.items()))
        del self.interior[owner]
        self.owners[rid].remove(owner)
        self.alloc.free(owner)
        self.evicted += 1


def _reclaims_as_sglang(make_room) -> bool:
    """The split state pool full of checkpoints: a state allocation frees the oldest interior ones (never a
    locked one) until it fits, so no checkpoint is refused; with the state pool free and the full pool
    exhausted, nothing is freed."""
    alloc, pg, ck = _tight_split()
    ck.make_room = make_room.__get__(ck)
    free_state = len(alloc.bands["state"].holes)
    for k in range(free_state):
        ck.take(k // 2, 1)  # requests 0, 1, ...: two checkpoints each, the first becomes interior
    assert len(ck.interior) == free_state // 2 and not pg.fits({"state": 1}, 0)
    ck.take(10_000, 1)
    ck.take(10_000, 1)  # a new request's two checkpoints: each needs a slot
    ok = ck.refused == 0 and ck.evicted == 2 and next(iter(ck.interior)) == "ckpt:r2"
    ok = ok and all(ck.owners[r] for r in ck.owners)  # every request keeps its locked checkpoint
    ck.drop(10_000)  # two slots free again
    alloc.admit("kv", {"full": len(alloc.bands["full"].holes)})  # the full pool now has nothing free
    ck.make_room(1)
    return ok and ck.evicted == 2  # a full-attention shortfall does not reach them


def test_a_state_allocation_reclaims_interior_checkpoints_a_full_shortfall_does_not() -> None:
    """SGLang's rule holds for StateCheckpoints.make_room and fails for the planted bugs: reclaiming for any
    shortfall, or never reclaiming (the state pool then refuses checkpoints)."""
    assert _reclaims_as_sglang(StateCheckpoints.make_room)
    assert not _reclaims_as_sglang(_any_shortfall)
    assert not _reclaims_as_sglang(lambda self, slots: None)
