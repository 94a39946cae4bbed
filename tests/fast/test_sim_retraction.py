"""SGLang 0.5.23's retraction and state-slot rules in the scheduler model (kvarena/simulator/rules.py):
the victim among ties, where a victim re-queues, what admission charges for state, and the radix tree's
locked state checkpoint of each running request. Each rule is checked against the installed wheel's
source and by its effect, and each check is shown to fail on a planted bug (the rule switched off or
replaced by the old behaviour)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.split import SplitPools
from kvarena.simulator import rules
from kvarena.simulator.arrivals import Arrival, TraceSource
from kvarena.simulator.costmodel import CostModel
from kvarena.simulator.scheduler import SIMPLE, Scheduler, SchedulerModel, run
from kvarena.spec.models import ArenaConfig, preset
from tests.wheels import sglang_source

GiB = 1 << 30
GPT = ArenaConfig(preset("gpt-oss-20b"), 1 * GiB, max_context_len=4096)
QWEN = ArenaConfig(preset("qwen3.5-4b"), 6 * GiB, max_context_len=8192, recurrent_slots=3)


@pytest.mark.parametrize(("rel", "text"), [
    # the victim: a stable descending sort, popped from the end
    ("srt/managers/schedule_batch.py", "return (len(req.output_ids), -len(req.origin_input_ids))"),
    ("srt/managers/schedule_batch.py", "sorted_indices.sort(\n            key=lambda i: length_key(reqs[i]),\n"
     "            reverse=True,"),
    ("srt/managers/schedule_batch.py", "idx = sorted_indices.pop()"),
    # victims re-queue at the back; FCFS keeps the order
    ("srt/managers/scheduler.py", "self._add_request_to_queue(req, is_retracted=True)"),
    ("srt/managers/scheduler.py", "self.waiting_queue.append(req)\n"
     "            req.time_stats.set_wait_queue_entry_time()"),
    ("srt/arg_groups/fields/schedule.py", '"shortest-prefill-first",\n            ],\n        ),\n    ] = "fcfs"'),
    # admission charges one state slot
    ("srt/managers/schedule_policy.py", "slots = int(not req.kv.holds_mamba)"),
    ("srt/managers/schedule_policy.py", "Tracking buffers and radix CoW headroom are not included here."),
    # the prefill checkpoint: a fresh slot for the request, the tracked one donated to the tree, locked
    ("srt/mem_cache/unified_cache/components/mamba.py", "new_slot = self._alloc_mamba_slot(req)\n"
     "                mamba_value_donated = (\n"
     "                    self.cache.req_to_token_pool.donate_mamba_ping_pong"),
    ("srt/mem_cache/common.py", "tree_cache.checkpoint(req, up_to=req.extend_end)"),
    ("srt/mem_cache/unified_radix_cache.py", "if envs.SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.get()\n"
     "                else ()"),
    ("srt/environ.py", "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK = EnvBool(False)"),
    ("srt/mem_cache/kv_cache_configurator.py", "frees one resident slot"),
    ("srt/managers/schedule_batch.py", "mask = req.extend_len >= checkpoint_grid"),
    ("srt/arg_groups/overrides.py", "FLA_CHUNK_SIZE = 64"),
    # a retracted request's KV is freed, not inserted into the tree
    ("srt/managers/schedule_batch.py", "# release memory and don't insert into the tree because we need the space"),
    ("srt/managers/schedule_batch.py", "release_kv_cache(req, tree_cache, checkpoint=False)"),
])
def test_rule_text_is_in_the_installed_sglang(rel: str, text: str) -> None:
    assert text in sglang_source(rel)


def test_rule_values() -> None:
    assert rules.retraction_victim([(3, -5), (1, -5), (1, -5), (2, 0)]) == 2  # the later of the tied two
    assert rules.retraction_victim([(1, -9), (1, -5)]) == 0  # the longer prompt first
    assert rules.RETRACTED_REQUEUE == "back" and rules.ADMISSION_STATE_SLOTS == 1
    assert rules.mamba_radix_checkpoint_slots() == 1
    assert rules.mamba_radix_checkpoint_slots(radix_cache=False) == rules.mamba_radix_checkpoint_slots(
        skip_decode_lock=True) == 0
    assert rules.radix_checkpoint_taken(64) and not rules.radix_checkpoint_taken(63)
    assert SchedulerModel().requeue_retracted == "back" and SchedulerModel().radix_state_slots == 1
    assert SIMPLE.requeue_retracted == "front" and SIMPLE.radix_state_slots == 0  # kvarena replay unchanged


def _scheduler(cfg: ArenaConfig, arrivals, model: SchedulerModel, kind=Arena, cost: bool = False) -> Scheduler:
    return Scheduler(kind(cfg), TraceSource(arrivals), "t", replace(model, check_every=0), 0,
                     CostModel(cfg.model) if cost else None, None, None, None, 0)


def _old_victim(s: Scheduler):
    """The planted bug: the first of the tied requests (the batch's oldest), as before this rule."""
    if len(s.decoding) <= 1:
        return None
    return min(s.decoding.values(), key=lambda r: rules.retraction_key(s.decoded(r), r.orig_in))


def test_victim_among_ties_is_the_last_to_join_the_batch() -> None:
    """Identical requests decode in lockstep until their outputs outgrow admission's clipped reserve: every
    victim ties on (decoded, -prompt) with others, SGLang retracts the one that joined the running batch last,
    and its state checkpoint is freed with it."""
    reqs = [Arrival(0.0, 512, 8000, ignore_eos=True) for _ in range(12)]
    cfg = ArenaConfig(preset("qwen3.5-4b"), 4 * GiB, max_context_len=8512, recurrent_slots=3)

    def victims(mutant: bool) -> list[tuple[int, list[int]]]:
        s = _scheduler(cfg, reqs, SchedulerModel())
        if mutant:
            s.victim = lambda: _old_victim(s)
        retract, seen = s.retract, []

        def spy(r) -> None:
            key = rules.retraction_key(s.decoded(r), r.orig_in)
            seen.append((r.rid, [x.rid for x in s.decoding.values()
                                 if rules.retraction_key(s.decoded(x), x.orig_in) == key]))
            retract(r)
            assert f"ckpt:r{r.rid}" not in s.alloc.owners and f"r{r.rid}" not in s.alloc.owners

        s.retract = spy
        assert s.run().completed == 12
        return seen

    seen = victims(False)
    assert len(seen) >= 3 and all(len(ties) > 1 and rid == ties[-1] for rid, ties in seen)
    assert any(rid != ties[-1] for rid, ties in victims(True))  # the oldest-first bug is caught


def test_retracted_requests_requeue_at_the_back() -> None:
    """Staggered arrivals keep the queue non-empty when memory runs out: a victim goes behind the requests
    already waiting (``waiting_queue.append``); with the planted bug (front) it jumps them."""
    reqs = [Arrival(float(20 * i), 200 + 37 * (i % 5), 1500) for i in range(40)]
    model = SchedulerModel(new_request_in_full=False, new_token_ratio=(0.02, 0.02, 0.0), prefill_chunk=None)

    def positions(m: SchedulerModel) -> list[tuple[int, int]]:
        s = _scheduler(GPT, reqs, m)
        retract, out = s.retract, []

        def spy(r) -> None:
            waiting = len(s.queue)
            retract(r)
            if waiting:
                out.append((list(s.queue).index(r), len(s.queue) - 1))
        s.retract = spy
        res = s.run()
        assert res.completed == 40
        return out

    back = positions(model)
    assert back and all(i == last for i, last in back)
    front = positions(replace(model, requeue_retracted="front"))
    assert front and any(i != last for i, last in front)


def _state_pages(arena) -> dict[str, int]:
    return {o: len(h["state"]) for o, h in arena.owners.items() if h["state"]}


def test_a_running_request_holds_its_slots_and_the_trees_checkpoint() -> None:
    """After its prefill a Qwen3.5 request holds 1 + 2 state slots and the tree one more (its prompt's
    checkpoint, locked): 4 per request; admission charged one; all are gone once it completes."""
    reqs = [Arrival(0.0, 512, 300, ignore_eos=True) for _ in range(4)]

    def held(m: SchedulerModel) -> tuple[dict[str, int], dict[str, int], Scheduler]:
        s = _scheduler(QWEN, reqs, m)
        s.enqueue()
        r0 = s.queue[0]
        demand = s.admission_demand(r0, m.prefill_chunk)
        while len(s.decoding) < 4:
            s.one_step()
            s.step += 1
        return _state_pages(s.alloc), demand, s

    pages, demand, s = held(SchedulerModel())
    assert demand["state"] == 1  # SGLang's _mamba_gap_budget_for_req
    assert sorted(pages) == sorted([f"r{i}" for i in range(4)] + [f"ckpt:r{i}" for i in range(4)])
    assert sum(pages.values()) == 4 * 4
    res = s.run()
    assert res.completed == 4 and not s.alloc.owners and res.admitted == 4  # checkpoint owners not counted
    off, demand3, _ = held(replace(SchedulerModel(), radix_state_slots=0, admission_state_slots=3))
    assert sum(off.values()) == 4 * 3 and demand3["state"] == 3  # the checks above fail without the rules


@pytest.mark.parametrize("kind", [Arena, SplitPools])
def test_the_checkpoint_costs_unified_bytes_not_split_ones(kind) -> None:
    """Lockstep requests whose outputs outgrow admission's clipped reserve (4,096): in the unified arena the
    tree's checkpoints take bytes the full-attention KV needs at the end, so it retracts; the split pools'
    state pool has a slot to spare for each, so they retract exactly as without them."""
    reqs = [Arrival(0.0, 512, 8000, ignore_eos=True) for _ in range(8)]
    cfg = ArenaConfig(preset("qwen3.5-4b"), int(3.45 * GiB), max_context_len=8512, recurrent_slots=3)
    on = run(kind(cfg), TraceSource(reqs), "t", SchedulerModel(check_every=500))
    off = run(kind(cfg), TraceSource(reqs), "t", SchedulerModel(check_every=500, radix_state_slots=0))
    assert on.completed == off.completed == 8 and on.checkpoints_refused == 0
    if kind is Arena:
        assert on.retractions > off.retractions == 0
    else:
        assert on.retractions == off.retractions


def test_calibration_runs_the_split_pools_with_the_schedulers_state_slots() -> None:
    """The budget bisection (calibrate.split_value) builds the split pools as a simulate column does: with
    the state slots a request holds. Built with one (the old bug), a Qwen3.5 run refused its 3 state pages."""
    from kvarena.simulator.arrivals import Lengths
    from kvarena.simulator.calibrate import split_value
    from kvarena.simulator.workloads import Published, Workload
    from kvarena.spec.errors import InvalidArgumentError

    w = Workload("t", "qwen3.5-4b", "", Lengths("fixed", 512, 64), 4, requests=8,
                 published=Published("max_active", None, 4, "4"))
    assert split_value(w, 4.0) == 4
    from kvarena.simulator.simulation import Configuration

    old = Configuration("split pools", "split").build("qwen3.5-4b", 4 * GiB, 64, w.max_context())  # the old build
    with pytest.raises(InvalidArgumentError, match="recurrent_slots=1"):
        run(old, w.source(), "old", SchedulerModel(check_every=0))


def _attempts_while_full(model: SchedulerModel, cfg: ArenaConfig) -> tuple[int, int]:
    """From the first refusal for memory until the batch next shrinks: (admission attempts refused, steps)."""
    reqs = [Arrival(0.0, 512, 8000, ignore_eos=True) for _ in range(20)]
    s = _scheduler(cfg, reqs, model)
    while not s.res.rejected_headroom:
        s.one_step()
        s.step += 1
    shrink, refused, steps = s.res.completed + s.res.retractions, s.res.rejected_headroom, 0
    while s.res.completed + s.res.retractions == shrink:
        s.one_step()
        s.step += 1
        steps += 1
    return s.res.rejected_headroom - refused, steps


def test_a_refusal_closes_admission_until_the_batch_shrinks() -> None:
    """Qwen3.5 (no window class): after admission is refused for memory, SGLang tries no admission again until
    a request finishes or is retracted (``batch_is_full``); without the rule the model retries every step."""
    cfg = ArenaConfig(preset("qwen3.5-4b"), 4 * GiB, max_context_len=8512, recurrent_slots=3)
    tried, steps = _attempts_while_full(SchedulerModel(), cfg)
    assert steps > 100 and tried == 0
    tried_off, _ = _attempts_while_full(SchedulerModel(batch_is_full=False), cfg)
    assert tried_off > 100  # the planted bug (the flag off) retries
    assert not _scheduler(GPT, [], SchedulerModel()).full_sticks  # hybrid SWA: SGLang resets it every pass
