"""transformers' continuous batching on kvarena's arena (engines/transformers/batching.py): the tokens equal
transformers' own paged cache (greedy, same requests, same cache bytes) with room for everything and at a
capacity too small for all requests at once (preemption happens), the arena empty afterwards; the refusals; the
bench's smoke run. Tiny random-weight models built in code (nothing downloaded); the gpu/ kernels run under the
Triton interpreter here (tests/conftest.py), so the sizes are tiny."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.transformers]
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from kvarena.engines.transformers.batching import (  # noqa: E402
    CacheStats,
    generate_batch,
    init_continuous_batching,
    paged_generate_batch,
)
from kvarena.spec.errors import CapacityTooSmallError, ConfigError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PAGE = 4  # tokens per page: a window of 8 slides a page every 4 decode steps
BLOCK = 4 * 2 * 2 * 16 * 4 * PAGE  # one page of K and V of every layer (4 layers, 2 KV heads, head_dim 16, fp32)
ATTN = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=256)
TIGHT = {"gpt_oss": 14, "gemma3": 10}  # whole-model pages: the longest request fits alone, all six do not
INPUTS = [[(7 * i + 3 * j) % 128 for j in range(5 + 9 * i)] for i in range(6)]  # prompts of 5 to 50 tokens


def tiny_model(family: str) -> torch.nn.Module:
    if family == "gpt_oss":
        cfg = transformers.GptOssConfig(**ATTN, num_hidden_layers=4, sliding_window=8, num_local_experts=4,
                                        num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"] * 2)
    else:
        cfg = transformers.Gemma3TextConfig(**ATTN, num_hidden_layers=4, sliding_window=8,
                                            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                         "sliding_attention"])
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def greedy(n: int = 12) -> transformers.GenerationConfig:
    return transformers.GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1)


def cb(blocks: int) -> ContinuousBatchingConfig:
    """transformers' cache of ``blocks`` whole-model pages: ``blocks * BLOCK`` bytes, the arena's capacity."""
    return ContinuousBatchingConfig(page_size=PAGE, num_blocks=blocks, max_batch_tokens=32)


def tokens(out: dict) -> dict[str, list[int]]:
    return {k: list(v.generated_tokens) for k, v in out.items()}


@pytest.mark.parametrize("family", ["gpt_oss", "gemma3"])
def test_tokens_equal_transformers_paged_cache(family: str) -> None:
    model = tiny_model(family)
    for blocks, tight in ((96, False), (TIGHT[family], True)):
        base, arena = CacheStats(), CacheStats()
        want = tokens(paged_generate_batch(model, INPUTS, greedy(), stats=base, continuous_batching_config=cb(blocks)))
        got = tokens(generate_batch(model, INPUTS, greedy(), blocks * BLOCK, stats=arena,
                                    continuous_batching_config=cb(blocks)))
        assert len(want) == len(INPUTS) and all(len(t) == 12 for t in want.values())
        assert got == want, f"{family} at {blocks * BLOCK} B: the arena's tokens differ from transformers' cache"
        assert arena.arena is not None and arena.arena.used_bytes() == 0  # every request freed
        assert arena.steps > 0 and arena.peak_batch > 1
        if tight:  # too small for all six at once: transformers' scheduler preempted on the arena's refusals
            assert arena.preemptions > 0, (family, arena)
        else:
            assert arena.preemptions == base.preemptions == 0, (family, arena, base)


def test_init_continuous_batching_serves_on_the_arena() -> None:
    model = tiny_model("gpt_oss")
    want = tokens(paged_generate_batch(model, INPUTS[:3], greedy(6), continuous_batching_config=cb(96)))
    stats = CacheStats()
    manager = init_continuous_batching(model, 96 * BLOCK, greedy(6), cb(96), max_context_len=64, stats=stats)
    manager.start()
    try:
        ids = manager.add_requests(INPUTS[:3])
        got = {}
        while len(got) < len(ids):
            result = manager.get_result(timeout=30)
            assert result is not None, "the generation loop stopped"
            if result.is_finished():
                got[result.request_id] = list(result.generated_tokens)
    finally:
        manager.stop(block=True, timeout=30)
        manager.destroy()
    assert got == want
    assert stats.arena is not None and stats.arena.used_bytes() == 0


def test_capacity_too_small_for_one_request_names_the_fix() -> None:
    model = tiny_model("gpt_oss")
    with pytest.raises(CapacityTooSmallError, match=r"cannot hold one request of 62 tokens.*pass capacity >= \d+ B"):
        generate_batch(model, INPUTS, greedy(), 4 * BLOCK, continuous_batching_config=cb(4))
    with pytest.raises(ConfigError, match="cpu_offload_space=0"):
        generate_batch(model, INPUTS, greedy(), 96 * BLOCK, continuous_batching_config=ContinuousBatchingConfig(
            page_size=PAGE, num_blocks=96, max_batch_tokens=32, cpu_offload_space=1.0))
    with pytest.raises(ConfigError, match="capacity"):
        generate_batch(model, INPUTS, greedy())
    assert "init_continuous_batching" not in vars(model)  # the shadow is gone after a refusal


def test_bench_smoke(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the bench runs the plain torch path
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "transformers_cb.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    runs = data["runs"]
    assert {r["side"] for r in runs} == {"transformers", "arena"}
    assert all(r["tokens_equal"] for r in runs if r["side"] == "arena")
    assert all(r["generated"] > 0 and r["steps"] > 0 for r in runs)
