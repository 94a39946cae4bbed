"""The real engines as simulator columns: SGLang 0.5.23's split and unified allocators, vLLM 0.33.0's
KVCacheManager (kvarena/simulator/sglang_real.py, vllm_real.py), each on a short trace; their invariant
checks catch a planted fault; a missing extra is one skipped line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvarena.cli import main
from kvarena.simulator import engines, simulation
from kvarena.simulator.arrivals import Arrival
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.workloads import Workload
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset

GiB = 1 << 30


def _need(kind: str) -> None:
    why = engines.ENGINES[kind].missing()
    if why:
        pytest.skip(why)


def _run(kind: str, model: str, capacity_gib: float, n: int = 40, inp: int = 900, out: int = 300,
         slots: int = 1) -> tuple:
    """One engine on ``n`` requests at t = 0 at a budget that binds: retractions and refusals happen."""
    _need(kind)
    cfg = ArenaConfig(preset(model), int(capacity_gib * GiB), 64, max_context_len=inp + out, recurrent_slots=slots)
    alloc = engines.ENGINES[kind].build(cfg, "default")
    w = Workload("t", model, "", arrivals=tuple(Arrival(0.0, inp, out) for _ in range(n)))
    m = SchedulerModel(state_slots=slots, check_every=50)
    return run(alloc, w.source(), kind, m), alloc


@pytest.mark.sglang
@pytest.mark.parametrize(("ours", "theirs"), [("split", "sglang-split"), ("unified", "sglang-unified")])
def test_sglang_decides_as_kvarena_on_a_binding_gpt_oss_trace(ours: str, theirs: str) -> None:
    """GPT-OSS-20B at 0.5 GiB (every request waits or retracts): SGLang's real allocator admits, refuses and
    retracts exactly where kvarena's does (split: both free lists; unified: the ladder vs SGLang's ENDs)."""
    a, _ = _run(ours, "gpt-oss-20b", 0.5)
    b, alloc = _run(theirs, "gpt-oss-20b", 0.5)
    assert b.completed == b.requests == 40
    assert a.retractions > 0  # the budget binds
    assert (b.max_active, b.retractions, b.steps) == (a.max_active, a.retractions, a.steps)
    alloc.check_invariants()


@pytest.mark.sglang
def test_sglang_unified_on_qwen_holds_three_state_slots() -> None:
    """Qwen3.5-4B (state | full) with extra_buffer's 3 slots per request through SGLang's mamba END."""
    r, alloc = _run("sglang-unified", "qwen3.5-4b", 1.0, n=12, slots=3)
    assert r.completed == 12 and r.max_active >= 2
    assert alloc.allocs["state"].__class__.__name__ == "MultiEndedAllocator"
    assert alloc.pool._raw.device.type == "meta"  # the arena's bytes take no memory


@pytest.mark.vllm
def test_vllm_real_runs_qwen_with_vllms_528_token_blocks() -> None:
    r, alloc = _run("vllm-real", "qwen3.5-4b", 1.0, n=12)
    assert r.completed == 12
    assert alloc.page_tokens == 528  # vLLM's _align_hybrid_block_size on Qwen3.5-4B
    assert alloc.plan.groups == {"full": 1, "state": 3}  # get_kv_cache_groups: 8 attention + 24 GDN layers
    assert type(alloc.manager.coordinator).__name__ == "HybridKVCacheCoordinator"
    alloc.check_invariants()


@pytest.mark.vllm
def test_vllm_real_windows_are_freed_by_vllm() -> None:
    """GPT-OSS-20B: vLLM's SlidingWindowManager frees out-of-window blocks itself; every request completes."""
    r, alloc = _run("vllm-real", "gpt-oss-20b", 0.5)
    assert r.completed == 40 and r.peak_utilization > 0.9  # the budget binds
    assert alloc.free_blocks() == alloc.num_blocks - 1  # all returned


@pytest.mark.sglang
def test_split_check_catches_a_slot_freed_twice() -> None:
    _, alloc = _run("sglang-split", "gpt-oss-20b", 0.5, n=2)
    import torch

    alloc.allocs["full"].free(torch.tensor([1]))  # a slot SGLang already has free, handed back again
    with pytest.raises(InvariantViolation):
        alloc.check_invariants()


@pytest.mark.sglang
def test_unified_check_catches_a_miscount() -> None:
    _, alloc = _run("sglang-unified", "gpt-oss-20b", 0.5, n=2)
    alloc._used["full"] += 1
    with pytest.raises(InvariantViolation):
        alloc.check_invariants()


@pytest.mark.vllm
def test_vllm_check_catches_a_lost_block() -> None:
    _, alloc = _run("vllm-real", "gpt-oss-20b", 0.5, n=2)
    alloc.manager.block_pool.get_new_blocks(1)  # taken from the pool, in no block table
    with pytest.raises(InvariantViolation):
        alloc.check_invariants()


def test_missing_extra_is_one_skipped_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    from dataclasses import replace

    monkeypatch.setitem(engines.ENGINES, "vllm-real", replace(engines.ENGINES["vllm-real"],
                                                                missing=lambda: "vllm is not installed: pip ..."))
    real, skipped = simulation.real_engines()
    assert "vllm-real" not in real
    assert skipped == ["vllm-0.33.0 column skipped: vllm is not installed: pip ..."]
    assert main(["simulate", "--quiet", "--workload", "qwen3.5-4b-1k-256", "--scale", "0.05",
                 "--engines", "vllm-real"]) == 0
    out = capsys.readouterr().out
    assert "vllm-0.33.0 column skipped: vllm is not installed" in out and "vLLM v1" not in out


@pytest.mark.sglang
@pytest.mark.vllm
def test_json_names_each_columns_implementation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CI runs a preset with every real engine (short: 1 % of its requests, at 1 GiB)."""
    for k in ("sglang-split", "sglang-unified", "vllm-real"):
        _need(k)
    assert main(["simulate", "--quiet", "--json", "--workload", "gpt-oss-20b-max", "--scale", "0.01",
                 "--capacity-gib", "1"]) == 0
    (w,) = json.loads(capsys.readouterr().out)["workloads"]
    impl = {name: r["implementation"] for name, r in w["results"].items()}
    assert {"sglang-0.5.23", "sglang-0.5.23 (split pools)", "vllm-0.33.0", "kvarena-reference"} <= set(impl.values())
    assert w["published"]["by_configuration"]["SGLang unified"] == w["published"]["unified"]


def test_engines_flag_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "gpt-oss-20b-max", "--engines", "trt"]) == 2
    assert "--engines: unknown trt" in capsys.readouterr().err

