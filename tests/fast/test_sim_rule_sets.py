"""The rule sets of ``kvarena simulate --matrix`` (simulator/rules.py): vLLM 0.33.0's scheduler rules and SGLang's
mamba strategies against the installed wheels' source, the rule groups against the two sets, and each new rule's
effect on the scheduler model (switching it changes what the model does)."""

from __future__ import annotations

import re
from dataclasses import fields, replace

import pytest

from kvarena.reference.arena import Arena
from kvarena.simulator import rules
from kvarena.simulator.arrivals import Arrival, TraceSource
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.spec.models import ArenaConfig, preset
from tests.wheels import sglang_source, vllm_source

SCHED = "v1/core/sched/scheduler.py"


@pytest.mark.parametrize(("rel", "text"), [
    # the H100 / H200 server defaults: >= 70 GiB, not an A100
    ("engine/arg_utils.py", 'device_memory >= 70 * GiB_bytes\n            and "a100" not in device_name'),
    ("engine/arg_utils.py", "UsageContext.OPENAI_API_SERVER: 8192,\n            }\n"
     "            default_max_num_seqs = {\n"
     "                UsageContext.LLM_CLASS: 1024,\n                UsageContext.OPENAI_API_SERVER: 1024,"),
    ("config/scheduler.py", "scheduler_reserve_full_isl: bool = True"),
    ("config/scheduler.py", "watermark: float = Field(default=0.0"),
    ("v1/core/kv_cache_manager.py", "full_num_tokens = min(request.num_tokens, self.max_model_len)"),
    (SCHED, "# First, schedule the RUNNING requests."),
    (SCHED, "preempted_req = self.running[-1]"),
    (SCHED, "preempted_req = self.running.pop()"),
    (SCHED, "if not preempted_reqs and self._pause_state != PauseState.PAUSED_ALL:"),
    (SCHED, "self.waiting.prepend_request(request)"),
    (SCHED, "request.num_computed_tokens = 0"),
    (SCHED, "token_budget -= num_new_tokens"),
    (SCHED, "full_sequence_must_fit=self.scheduler_reserve_full_isl,"),
    ("v1/core/kv_cache_manager.py", "self.coordinator.remove_skipped_blocks(\n            request.request_id,"),
])
def test_vllm_rule_text_is_in_the_installed_vllm(rel: str, text: str) -> None:
    assert text in vllm_source(rel)


def test_vllm_constants_match_the_installed_vllm() -> None:
    src = vllm_source("config/scheduler.py")
    assert float(re.search(r"watermark: float = Field\(default=([\d.]+)", src).group(1)) == rules.VLLM_WATERMARK
    block = vllm_source("engine/arg_utils.py").split("For GPUs like H100 and H200", 1)[1].split("else:", 1)[0]
    tokens = re.search(r"OPENAI_API_SERVER: (\d+)", block.split("default_max_num_seqs")[0]).group(1)
    seqs = re.search(r"OPENAI_API_SERVER: (\d+)", block.split("default_max_num_seqs")[1]).group(1)
    assert (int(tokens), int(seqs)) == (rules.VLLM_MAX_NUM_BATCHED_TOKENS, rules.VLLM_MAX_NUM_SEQS)


@pytest.mark.parametrize(("rel", "text"), [
    ("srt/arg_groups/overrides.py", 'declared["mamba_radix_cache_strategy"] = "no_buffer"'),
    ("srt/arg_groups/overrides.py", 'declared["mamba_radix_cache_strategy"] = "extra_buffer"'),
    ("srt/mem_cache/allocation_sizing.py", "if not extra_buffer:\n        return 0"),
    ("srt/mem_cache/unified_cache/components/mamba.py", "mamba_value_donated = self._alloc_mamba_slot(req)"),
    ("srt/mem_cache/kv_cache_configurator.py", "if get_exec().mamba.enable_mamba_extra_buffer:"),
])
def test_mamba_strategy_text_is_in_the_installed_sglang(rel: str, text: str) -> None:
    assert text in sglang_source(rel)


def test_rule_values() -> None:
    assert rules.vllm_step_budget(100) == 8092 and rules.vllm_step_budget(9000) == 0
    assert rules.vllm_admission_tokens(1000) == 1000
    assert rules.vllm_preemption_victim(5) == 4
    assert rules.mamba_strategy("extra_buffer") == {"state_slots": 3, "radix_state_slots": 1,
                                                    "chunk_checkpoints": True}
    assert rules.mamba_strategy("no_buffer") == {"state_slots": 1, "radix_state_slots": 1,
                                                 "chunk_checkpoints": False}
    with pytest.raises(ValueError, match="extra_buffer, no_buffer"):
        rules.mamba_strategy("lazy")
    assert rules.RULE_SETS["sglang"] == SchedulerModel()


def test_rule_groups_cover_exactly_where_the_sets_differ() -> None:
    """Switching every group turns SGLang's set into vLLM's, and no group names a field the two sets agree on."""
    sg, vl = rules.RULE_SETS["sglang"], rules.RULE_SETS["vllm"]
    differ = {f.name for f in fields(SchedulerModel) if getattr(sg, f.name) != getattr(vl, f.name)}
    grouped = [f for g in rules.RULE_GROUPS.values() for f in g]
    assert len(grouped) == len(set(grouped)), "a field in two groups"
    assert set(grouped) == differ


def _burst(n: int, prompt: int, out: int) -> TraceSource:
    return TraceSource([Arrival(0, prompt, out, ignore_eos=True) for _ in range(n)])


def _arena(gib: float = 0.5) -> Arena:
    return Arena(ArenaConfig(preset("gpt-oss-20b"), int(gib * (1 << 30)), 64, max_context_len=4096))


def test_decode_in_budget_takes_prefill_tokens() -> None:
    """vLLM's decodes come out of the step's token budget: with a budget of 1,024 and running requests, fewer
    prompt tokens are prefilled per step than without."""
    m = replace(rules.RULE_SETS["vllm"], prefill_chunk=1024, max_running=None, check_every=0)
    on = run(_arena(), _burst(40, 512, 64), "on", m)
    off = run(_arena(), _burst(40, 512, 64), "off", replace(m, decode_in_budget=False))
    assert on.completed == off.completed == 40
    assert on.steps > off.steps


def test_no_admission_in_a_step_that_preempted(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM tries no admission in a step with a preemption (``if not preempted_reqs``); with the rule switched
    off the scheduler does try (a tight arena, so decode steps retract)."""
    from kvarena.simulator import scheduler

    tried: list[bool] = []  # per admission pass: whether this step retracted
    real = scheduler.Scheduler.admit

    def admit(self) -> None:
        tried.append(self.retracted_this_step)
        real(self)

    monkeypatch.setattr(scheduler.Scheduler, "admit", admit)
    m = replace(rules.RULE_SETS["vllm"], max_running=None, check_every=0)
    a = run(_arena(0.25), _burst(60, 600, 1500), "vllm", m)
    assert a.completed == 60 and a.retractions > 0
    assert tried and not any(tried)
    tried.clear()
    b = run(_arena(0.25), _burst(60, 600, 1500), "admit", replace(m, admit_after_retract=True))
    assert b.retractions > 0 and any(tried)


def test_vllm_rules_reserve_nothing_for_output() -> None:
    """No decode reserve: under vLLM's rules more requests run at once than under SGLang's on the same arena."""
    vl = run(_arena(0.25), _burst(60, 600, 1500), "vllm", replace(rules.RULE_SETS["vllm"], check_every=0))
    sg = run(_arena(0.25), _burst(60, 600, 1500), "sglang",
             replace(rules.RULE_SETS["sglang"], state_slots=1, check_every=0))
    assert vl.completed == sg.completed == 60
    assert vl.max_active > sg.max_active
