"""SGLang 0.5.23's scheduler rules (kvarena/simulator/rules.py): the values against the installed wheel's
source, and each rule's effect on the scheduler model (switching it off changes what the model does)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.split import SplitPools
from kvarena.simulator import rules
from kvarena.simulator.arrivals import Arrival, ClosedLoop, TraceSource
from kvarena.simulator.costmodel import CostModel
from kvarena.simulator.pager import Pager
from kvarena.simulator.scheduler import SIMPLE, SchedulerModel, run
from kvarena.simulator.simulation import running_cap
from kvarena.spec.models import ArenaConfig, preset
from tests.wheels import sglang_source

GiB = 1 << 30


@pytest.mark.parametrize(("rel", "pattern", "value"), [
    ("srt/environ.py", r"SGLANG_INIT_NEW_TOKEN_RATIO = EnvFloat\(([\d.]+)\)", rules.INIT_NEW_TOKEN_RATIO),
    ("srt/environ.py", r"SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = EnvFloat\(([\d.]+)\)", rules.MIN_NEW_TOKEN_RATIO_FACTOR),
    ("srt/environ.py", r"SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = EnvInt\((\d+)\)", rules.NEW_TOKEN_RATIO_DECAY_STEPS),
    ("srt/environ.py", r"SGLANG_RETRACT_DECODE_STEPS = EnvInt\((\d+)\)", rules.RETRACT_DECODE_STEPS),
    ("srt/environ.py", r"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION = EnvInt\((\d+)\)", rules.CLIP_MAX_NEW_TOKENS),
    ("srt/environ.py", r"SGLANG_SWA_EVICTION_INTERVAL = EnvInt\((\d+)\)", rules.SWA_EVICTION_INTERVAL),
    ("srt/mem_cache/kv_cache_configurator.py", r"MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = (\d+)",
     rules.MAMBA_BASE_SLOTS_RATIO),
    ("srt/arg_groups/memory_hook.py", r"# H20, H200[\s\S]{0,300}?chunked_prefill_size=(\d+)",
     rules.CHUNKED_PREFILL_SIZE_H200),
])
def test_constants_match_the_installed_sglang(rel: str, pattern: str, value: float) -> None:
    m = re.search(pattern, sglang_source(rel))
    assert m, f"{pattern} not found in {rel}"
    assert float(m.group(1)) == value


@pytest.mark.parametrize(("rel", "text"), [
    ("srt/arg_groups/fields/schedule.py", '"Enabling mixing prefill and decode in a batch when using chunked '
     'prefill.",\n    ] = False'),
    ("srt/managers/schedule_policy.py", "ratio = 1.0 if req.sampling_params.ignore_eos else self.new_token_ratio"),
    ("srt/managers/schedule_batch.py", "return (len(req.output_ids), -len(req.origin_input_ids))"),
    ("srt/managers/schedule_batch.py", "# Always keep at least one request"),
    ("srt/managers/scheduler_components/new_token_ratio_tracker.py",
     "total_decoded_tokens + envs.SGLANG_RETRACT_DECODE_STEPS.get() * len(reqs)"),
    ("srt/managers/scheduler_components/new_token_ratio_tracker.py", "decay = (init - min_ratio) / envs"),
    ("srt/mem_cache/allocation_sizing.py", "return 2 if overlap else 1"),
    ("srt/mem_cache/kv_cache_configurator.py", "mamba_cap = get_schedule().max_mamba_cache_size // ratio"),
    ("srt/mem_cache/kv_cache_configurator.py", "estimated = max(min(estimated, 4096), 2048)"),
    ("srt/mem_cache/kv_cache_configurator.py", 'slack_gb = pre_model_load_memory * (1 - get_schedule().mem_fraction'),
    ("srt/managers/schedule_batch.py", ">= req.kv.get_evicted_seqlen(ComponentType.SWA) + eviction_interval"),
    ("srt/arg_groups/overrides.py", 'return {"page_size": 1}'),
    ("srt/mem_cache/prefill_budget.py", "allocated_tail = max(allocated - sliding_window_size, 0)"),
    ("srt/mem_cache/prefill_budget.py", "+ min(extend_input_len + max_new_tokens, sliding_window_size)"),
    ("srt/mem_cache/allocation.py", '"""\n\n    batch.maybe_evict_swa()\n\n    seq_lens_gpu = batch.seq_lens'),
])
def test_rule_text_is_in_the_installed_sglang(rel: str, text: str) -> None:
    assert text in sglang_source(rel)


def test_rule_values() -> None:
    init, lo, decay = rules.new_token_ratio_schedule()
    assert (init, lo) == (0.7, pytest.approx(0.098)) and decay == pytest.approx(0.602 / 600)
    assert rules.running_reserve_ratio(True, 0.2) == 1.0 and rules.running_reserve_ratio(False, 0.2) == 0.2
    assert rules.new_request_reserve_tokens(10_000, 64) == 4096 + 64
    assert rules.ratio_after_retract(100, 1000, 2) == pytest.approx(140 / 1001)
    assert rules.ratio_after_retract(10_000, 100, 1) == 1.0
    assert min([(5, 100), (3, 10), (3, 900)], key=lambda t: rules.retraction_key(*t)) == (3, 900)
    assert rules.mamba_tracking_slots() == 2 and rules.mamba_tracking_slots(False) == 0
    assert rules.mamba_max_running(1000) == 200
    assert rules.max_running_requests(10**7, 131_072) == 4096 and rules.max_running_requests(3000, 131_072) == 1500
    assert rules.swa_eviction_due(128 + 128 + 1, 128, 0) and not rules.swa_eviction_due(128 + 127 + 1, 128, 0)
    assert rules.kv_budget_bytes(100, 0.9, 20) == 70
    assert rules.page_size_on_hopper("gpt-oss-20b") == 1
    assert rules.swa_admission_tokens(1024, 1024, 128, 64, 8192) == 896 + 128 + 64
    assert rules.swa_admission_tokens(1024, 1024, 128, 64, 512) == 384 + 128 + 64
    assert rules.swa_admission_tokens(50, 10, 128, 1, None) == 61


# ---- each rule changes what the model does ---------------------------------------------------------

QWEN = ArenaConfig(preset("qwen3.5-4b"), 6 * GiB, max_context_len=8192, recurrent_slots=3)  # extra_buffer: 1 + 2
GPT = ArenaConfig(preset("gpt-oss-20b"), 2 * GiB, max_context_len=4096)


def _run(cfg: ArenaConfig, arrivals, model: SchedulerModel, kind=Arena):
    return run(kind(cfg), TraceSource(arrivals), "t", replace(model, check_every=0), cost=CostModel(cfg.model))


def test_ignore_eos_is_reserved_at_ratio_one() -> None:
    """Fixed-length requests reserve their whole remaining output: fewer run at once than at the ratio."""
    reqs = [Arrival(0.0, 512, 2000, ignore_eos=True) for _ in range(60)]
    on, off = _run(GPT, reqs, SchedulerModel()), _run(GPT, reqs, SchedulerModel(ignore_eos_at_one=False))
    assert on.max_active < off.max_active
    assert on.retractions <= off.retractions


def _scheduler(cfg: ArenaConfig, arrivals, model: SchedulerModel, cost: bool = True):
    from kvarena.simulator.scheduler import Scheduler

    return Scheduler(Arena(cfg), TraceSource(arrivals), "t", replace(model, check_every=0), 0,
                     CostModel(cfg.model) if cost else None, None, None, None, 0)


def test_new_request_output_in_full() -> None:
    """Within one admission pass each admitted request's output counts in full (``add_one_req``)."""
    reqs = [Arrival(0.0, 256, 3000) for _ in range(40)]
    first = {}
    for full in (True, False):
        s = _scheduler(GPT, reqs, SchedulerModel(new_request_in_full=full))
        s.one_step()
        first[full] = len(s.active)
    assert first[True] < first[False] == 8192 // 256  # the ratio alone lets the whole chunk budget in


def test_retraction_victim_is_the_fewest_decoded() -> None:
    """Staggered starts, then memory runs out: every victim has the fewest decoded tokens of the batch
    (ties: the longest prompt), and one request is always kept."""
    reqs = [Arrival(float(20 * i), 200 + 37 * (i % 5), 1500) for i in range(40)]
    model = SchedulerModel(new_request_in_full=False, new_token_ratio=(0.02, 0.02, 0.0), prefill_chunk=None)
    tight = ArenaConfig(preset("gpt-oss-20b"), 1 * GiB, max_context_len=4096)
    def checked_run(mutant: bool):
        s = _scheduler(tight, reqs, model, cost=False)
        retract, victims = s.retract, []
        if mutant:  # a planted bug: retract the request with the MOST decoded tokens
            s.victim = lambda: max(s.decoding.values(), key=lambda x: s.decoded(x)) if len(s.decoding) > 1 else None

        def checked(r) -> None:
            if r.rid in s.decoding:
                best = min(rules.retraction_key(s.decoded(x), x.orig_in) for x in s.decoding.values())
                assert rules.retraction_key(s.decoded(r), r.orig_in) == best, "not the fewest-decoded victim"
                assert len(s.decoding) > 1
                victims.append(r.rid)
            retract(r)

        s.retract = checked
        return s.run(), victims

    res, victims = checked_run(False)
    assert res.completed == 40 and len(victims) >= 5 and res.retractions >= len(victims)
    with pytest.raises(AssertionError, match="fewest-decoded"):
        checked_run(True)


def test_ratio_decays_on_decode_steps_only_and_resets_when_idle() -> None:
    s = _scheduler(GPT, [Arrival(0.0, 300, 50) for _ in range(6)] + [Arrival(10.0, 300, 5)],
                   replace(SchedulerModel(), prefill_chunk=256))
    init, _, decay = SchedulerModel().new_token_ratio
    s.one_step()  # a prefill-only step (the chunk budget of 256 < one prompt): no decay
    assert s.res.decode_steps == 0 and s.ratio == init
    while s.res.completed < 6:
        s.one_step()
        s.step += 1
    assert s.ratio == pytest.approx(init - decay * s.res.decode_steps)
    assert s.ratio < init
    s.one_step()  # idle until t = 10: reset, then the arrival's prefill step (no decay)
    assert s.ratio == init and s.clock > 10
    off = _scheduler(GPT, [Arrival(0.0, 300, 50), Arrival(10.0, 300, 5)],
                     replace(SchedulerModel(), reset_ratio_when_idle=False))
    for _ in range(60):
        off.one_step()
        off.step += 1
    assert off.ratio < init  # without the rule the ratio keeps its decay across the idle gap


def test_mixed_chunk_off_gives_prefill_its_own_steps() -> None:
    reqs = [Arrival(0.0, 4000, 50) for _ in range(8)]
    off, on = _run(GPT, reqs, SchedulerModel()), _run(GPT, reqs, SchedulerModel(mixed_chunk=True))
    assert on.decode_steps == on.steps
    assert off.decode_steps < off.steps


def test_mamba_extra_buffer_slots_and_running_cap() -> None:
    pg = Pager(Arena(QWEN), state_slots=SchedulerModel().state_slots)
    assert pg.prompt_demand(100)["state"] == 3
    cap = running_cap(QWEN, 2)
    assert cap == rules.mamba_max_running(SplitPools(QWEN).bands["state"].hi - SplitPools(QWEN).bands["state"].lo)
    reqs = [Arrival(0.0, 128, 64) for _ in range(cap + 20)]
    r = _run(QWEN, reqs, replace(SchedulerModel(), max_running=cap), SplitPools)
    assert r.max_active == cap
    one = _run(QWEN, reqs, replace(SchedulerModel(), state_slots=1), SplitPools)
    assert one.max_active > r.max_active


def test_swa_eviction_interval_in_pages() -> None:
    pg = Pager(Arena(GPT), swa_eviction_interval=256)
    assert pg.keep == {"window": 3} and pg.slack == {"window": 4}
    assert Pager(Arena(GPT)).slack == {"window": 0}


def test_simple_model_is_replays() -> None:
    assert SIMPLE.mixed_chunk and SIMPLE.retraction == "newest" and SIMPLE.prefill_chunk is None
    assert not SchedulerModel().mixed_chunk and SchedulerModel().retraction == "fewest_decoded"


def test_closed_loop_keeps_clients_busy() -> None:
    src = ClosedLoop(4, 20, lambda i: (200, 30 + i))
    r = run(Arena(GPT), src, "t", SchedulerModel(check_every=1), cost=CostModel(GPT.model))
    assert r.completed == 20 and r.max_active == 4 and len(r.e2e) == 20 and len(r.tpot) == 20


def test_swa_rules_relieve_a_tight_window_pool() -> None:
    """At --swa-full-tokens-ratio 0.1 the window pool binds: admitting on SGLang's window estimate and
    freeing out-of-window pages before allocating each cut the retractions."""
    cfg = ArenaConfig(preset("gpt-oss-20b"), 2 * GiB, swa_full_tokens_ratio=0.1, max_context_len=4096)
    reqs = [Arrival(0.0, 1024, 600, ignore_eos=True) for _ in range(120)]
    base = _run(cfg, reqs, SchedulerModel(), SplitPools)
    late = _run(cfg, reqs, SchedulerModel(evict_before_alloc=False), SplitPools)
    blind = _run(cfg, reqs, SchedulerModel(swa_admission=False), SplitPools)
    assert base.completed == late.completed == blind.completed == 120
    assert base.retractions < late.retractions
    assert base.retractions < blind.retractions
