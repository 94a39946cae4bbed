"""The vLLM column: kvarena's vLLM-style model (simulator/vllm_model.py) against vLLM 0.33.0's real manager
(simulator/vllm_real.py) on binding traces, and the vLLM rules each follows (cited in the modules): window
blocks freed when the scheduler trims (the next ``allocate_slots``' ``remove_skipped_blocks``), mamba "align"
mode's per-crossing state block, a request freed while a forward reads it withheld whole, the null block.
Each new check is shown to fail on a corrupted state."""

from __future__ import annotations

import pytest

from kvarena.simulator import engines
from kvarena.simulator.arrivals import Arrival
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.vllm_model import VllmPool
from kvarena.simulator.workloads import Workload
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

GiB = 1 << 30


def _cfg(model: str, gib: float, context: int) -> ArenaConfig:
    return ArenaConfig(preset(model), int(gib * GiB), 64, max_context_len=context)


def _real(cfg: ArenaConfig, prefix_caching: bool = True):
    why = engines.ENGINES["vllm-real"].missing()
    if why:
        pytest.skip(why)
    from kvarena.simulator.vllm_real import VllmReal

    return VllmReal(cfg, prefix_caching)


def _drive(alloc, model: str, n: int, inp: int, out: int):
    w = Workload("t", model, "", arrivals=tuple(Arrival(0.0, inp, out) for _ in range(n)))
    rules = SchedulerModel(check_every=25, **engines.ENGINES["vllm"].scheduler_overrides)
    return run(alloc, w.source(), "t", rules)


CASES = [("gpt-oss-20b", 0.5, 40, 900, 300, True), ("qwen3.5-4b", 0.6, 14, 1500, 1200, True),
         ("qwen3.5-4b", 0.6, 14, 1500, 1200, False)]


@pytest.mark.vllm
@pytest.mark.parametrize(("model", "gib", "n", "inp", "out", "prefix"), CASES)
def test_model_decides_as_the_real_manager(model: str, gib: float, n: int, inp: int, out: int, prefix: bool) -> None:
    """At a budget that binds (requests wait and retract) the model admits, retracts and holds exactly what
    vLLM's KVCacheManager does, window and (align or none) state blocks included."""
    cfg = _cfg(model, gib, inp + out)
    real = _real(cfg, prefix)
    a = _drive(VllmPool(cfg, prefix), model, n, inp, out)
    b = _drive(real, model, n, inp, out)
    assert b.completed == n and b.retractions > 0 and b.peak_utilization > 0.9  # the budget binds
    assert (a.max_active, a.retractions, a.steps, a.peak_utilization) == (
        b.max_active, b.retractions, b.steps, b.peak_utilization)
    assert real.free_blocks() == real.num_blocks - 1  # every block back, the null block aside


@pytest.mark.vllm
def test_the_pools_are_the_same_size() -> None:
    cfg = _cfg("qwen3.5-4b", 10, 4096)
    real, model = _real(cfg), VllmPool(cfg)
    assert (model.page_tokens, model.page_bytes, model.total_pages) == (real.page_tokens, real.page_bytes,
                                                                        real.num_blocks - 1)


@pytest.mark.vllm
def test_real_trim_frees_vllms_out_of_window_blocks() -> None:
    """A 1,024-token prefill holds all 16 window blocks while its forward runs; the trim the scheduler issues
    next step is vLLM's remove_skipped_blocks: 3 remain (a window of 128 on 64-token blocks, plus the block
    being written) and the scheduler's count is vLLM's."""
    real = _real(_cfg("gpt-oss-20b", 1, 2048))
    real.describe("a", 1024, 64)
    got = real.admit("a", {"full": 16, "window": 16}).pages
    gid = real.first_group["window"]
    assert len(got["window"]) == real._live(gid, "a") == 16
    real.slide("a", "window", 13)
    assert real._live(gid, "a") == 3
    real.check_invariants()
    real.owners["a"]["window"].append(10**9)  # the scheduler now counts a block vLLM does not hold
    with pytest.raises(InvariantViolation, match="window class"):
        real.check_invariants()


def _forward(pool, uid: str, owner: str) -> None:
    pool.acquire(uid, UserKind.FORWARD_READ, [v for vs in pool.owners[owner].values() for v in vs][:1])


@pytest.mark.parametrize("prefix", [True, False])
def test_model_align_mode_moves_the_state_per_crossing(prefix: bool) -> None:
    """Mamba "align" mode (prefix caching on): a crossing writes the state into fresh blocks (one per state
    group) and frees the old ones after the next forward; mode "none" keeps one state block per group."""
    pool = VllmPool(_cfg("qwen3.5-4b", 2, 4096), prefix)
    groups = pool.geometry.groups["state"]
    state = pool.admit("a", {"full": 2, "state": 1}).pages["state"][0]
    before, free = pool.v2p[state], len(pool._free)
    crossings = free // (1 + groups) + 1  # fit only if a crossing takes no state block
    assert pool.fits({"full": crossings}, 0) is not prefix
    pool.extend("a", {"full": 1})
    moved = pool.v2p[state] != before
    assert moved is prefix
    assert len(pool._free) == free - 1 - (groups if prefix else 0)
    _forward(pool, "f1", "a")  # the forward after the crossing reads the old state ...
    pool.check_invariants()
    pool.release("f1")  # ... and once it has run, the old blocks are free
    assert len(pool._free) == free - 1
    pool.check_invariants()
    pool.free("a")
    assert len(pool._free) == pool.total_pages


def test_model_check_catches_a_lost_superseded_state_page() -> None:
    pool = VllmPool(_cfg("qwen3.5-4b", 2, 4096))
    pool.admit("a", {"full": 2, "state": 1})
    pool.extend("a", {"full": 1})
    pool.check_invariants()
    pool._superseded["a"].pop()  # an old state page vanishes from the books while still live
    with pytest.raises(InvariantViolation):
        pool.check_invariants()


def test_model_withholds_a_freed_request_whole_while_a_forward_reads_it() -> None:
    """_free_request_blocks with defer_block_free: pop_blocks_for_free takes the whole request, freed when
    the forward ends (not only the page the forward reads)."""
    pool = VllmPool(_cfg("gpt-oss-20b", 1, 2048))
    got = pool.admit("a", {"full": 4, "window": 3}).pages
    pool.acquire("f", UserKind.FORWARD_READ, [got["full"][0]])
    free = len(pool._free)
    pool.free("a")
    assert len(pool._free) == free  # all 7 pages withheld
    pool.check_invariants()
    pool.release("f")
    assert len(pool._free) == free + 7 and len(pool._free) == pool.total_pages


@pytest.mark.vllm
def test_ci_runs_a_preset_with_the_real_vllm_column(capsys: pytest.CaptureFixture[str]) -> None:
    """A published preset (Qwen3.5-4B 16K / 4K, align mode, 5 % of its requests) through `kvarena simulate`
    with vLLM's manager as a column: its implementation is named, and the model's column decides alike."""
    import json

    from kvarena.cli import main

    _real(_cfg("gpt-oss-20b", 1, 2048))  # skips without vllm
    assert main(["simulate", "--quiet", "--json", "--workload", "qwen3.5-4b-16k-4k", "--scale", "0.05",
                 "--engines", "vllm-real"]) == 0
    (w,) = json.loads(capsys.readouterr().out)["workloads"]
    real, model = w["results"]["vLLM v1"], w["results"]["vLLM-style pool"]
    assert real["implementation"] == "vllm-0.33.0" and model["implementation"] == "kvarena vLLM-style model"
    assert real["completed"] == real["requests"] > 0
    keys = ("max_active", "mean_active", "retractions", "steps", "throughput_tok_s", "ttft_p50_s")
    assert {k: real[k] for k in keys} == {k: model[k] for k in keys}
