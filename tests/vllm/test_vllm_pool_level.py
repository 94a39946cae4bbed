"""vLLM 0.33.0's real ``BlockPool`` at ``kvarena conform --level pool`` (engines/vllm/pool_adapter.py): it passes,
and two bugs planted in vLLM's own ``free_blocks`` are caught with the kvarena invariant each breaks.

Skipped, with one line, when vllm is not installed (``make vllm``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import Phase, settings

from kvarena.conformance.machine.harness import Divergence
from kvarena.conformance.machine.lockstep import run_lockstep
from kvarena.conformance.runner.conform import conform
from kvarena.engines.vllm import load as vllm_load

pytestmark = pytest.mark.vllm

try:
    V = vllm_load.load_vllm()
except vllm_load.VLLMUnavailable as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"vLLM is not installed ({e}); run `make vllm`", allow_module_level=True)

from kvarena.engines.vllm.pool_adapter import make  # noqa: E402 - after the skip: it needs vllm

KILL = settings(settings.get_profile("ci"), max_examples=200, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def test_vllm_block_pool_passes_pool() -> None:
    report = conform(make, "pool", examples=100)
    assert report.exit_code == 0, report.format()
    cov = report.coverage
    assert cov.ops["share"] > 0 and cov.frees_deferred > 0 and cov.diverged["the reference only"] > 0, cov.to_json()


def _forgets_decrement(free: Callable) -> Callable:
    def planted(self: Any, ordered_blocks: Iterable[Any]) -> None:  # a shared block's reference is not dropped
        free(self, [b for b in ordered_blocks if b.ref_cnt == 1])
    return planted


def _double_push(free: Callable) -> Callable:
    # a freed block is queued twice: in vLLM's doubly linked queue the second push relinks it at the tail, so the
    # blocks queued after it drop out of the queue (leaked: VLLM-FREE-QUEUE in vLLM's terms)
    def planted(self: Any, ordered_blocks: Iterable[Any]) -> None:
        blocks = list(ordered_blocks)
        free(self, blocks)
        self.free_block_queue.append_n([b for b in blocks if b.ref_cnt == 0][:1])
    return planted


@pytest.mark.parametrize(("plant", "inv"), [(_forgets_decrement, "INV-BYTE-CONSERVATION"),
                                            (_double_push, "INV-BYTE-CONSERVATION")],
                         ids=["forgets-decrement", "double-push"])
def test_a_bug_planted_in_vllm_free_blocks_is_caught(monkeypatch: pytest.MonkeyPatch, plant: Callable,
                                                      inv: str) -> None:
    monkeypatch.setattr(V.pool.BlockPool, "free_blocks", plant(V.pool.BlockPool.free_blocks))
    with pytest.raises(Divergence) as info:
        run_lockstep(make, "pool", KILL)
    assert info.value.inv == inv, info.value.summary
