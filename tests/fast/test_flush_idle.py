"""``flush_idle`` (spec/arena.md §flush_idle) on every implementation that offers it: gpu/ in lockstep with the
reference at ``exact`` (the flush-idle vector and the machine's flush_idle rule), and planted bugs in gpu/'s flush
caught: the budget read as moves instead of bytes, the writer barrier ignored."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

from pathlib import Path

import pytest
from hypothesis import Phase, settings

import kvarena.gpu.allocator as gpu_allocator
from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.conformance.machine.harness import Divergence
from kvarena.conformance.machine.lockstep import RULES, run_lockstep
from kvarena.conformance.runner.conform import conform
from kvarena.gpu.kernels import use_interpreter
from kvarena.gpu.planner import Ladder
from kvarena.reference.arena import Arena
from kvarena.spec.errors import InvalidArgumentError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Rung

use_interpreter()

VECTOR = Path(__file__).resolve().parents[2] / "conformance" / "vectors" / "flush-idle.jsonl"
KILL = settings(settings.get_profile("ci"), max_examples=150, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def _holey(make: type) -> object:
    a = make(ArenaConfig(preset("toy-tri"), 6144, page_size=4, max_context_len=16))
    for i in range(6):
        a.admit(f"r{i}", {"state": 1, "full": 2})
    for i in (0, 2, 4):
        a.free(f"r{i}")
    return a


@pytest.mark.parametrize("budget", [0, 63, 64, 300, 1 << 20])
def test_gpu_flush_idle_equals_the_reference(budget: int) -> None:
    ref, gpu = _holey(Arena), _holey(gpu_allocator.make)
    assert gpu.flush_idle(budget) == ref.flush_idle(budget)
    assert gpu.observe() == observe_reference(ref)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64", None])
def test_gpu_flush_idle_refuses_a_bad_budget_unchanged(bad: object) -> None:
    gpu = _holey(gpu_allocator.make)
    before = gpu.observe()
    with pytest.raises(InvalidArgumentError, match="budget_bytes must be an int >= 0"):
        gpu.flush_idle(bad)  # type: ignore[arg-type]
    assert gpu.observe() == before


def test_the_vector_passes_on_gpu_and_the_machine_draws_flush_idle() -> None:
    report = conform(gpu_allocator.make, "exact", vectors=str(VECTOR), examples=40)
    assert report.exit_code == 0, report.format()
    assert report.vector_counts() == (1, 0, 0)
    assert report.coverage.ops["flush_idle"] > 20, report.coverage.to_json()
    assert RULES["flush_idle"][2] == 0  # weight 0: the committed random walks stay as they were


def _moves_not_bytes(real):  # planted: the byte budget read as a number of moves
    def planted(self, views, budget, budget_bytes=None):
        return real(self, views, budget_bytes if budget is None else budget)
    return planted


def test_budget_in_moves_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ladder, "compact_ends", _moves_not_bytes(Ladder.compact_ends))
    with pytest.raises(Divergence, match="flush_idle"):
        run_lockstep(gpu_allocator.make, "exact", KILL)


def test_flush_ignoring_the_writer_barrier_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpu_allocator.GpuArena.flush_idle

    def planted(self, budget_bytes):  # planted: writers do not pin their pages during the idle flush
        writers, self.ledger.writers = self.ledger.writers, type(self.ledger.writers)()
        try:
            return real(self, budget_bytes)
        finally:
            self.ledger.writers = writers

    monkeypatch.setattr(gpu_allocator.GpuArena, "flush_idle", planted)
    report = conform(gpu_allocator.make, "safety", vectors=str(VECTOR), examples=0)  # its "flush under a writer"
    assert report.exit_code == 1 and "INV-LEDGER-SAFETY" in report.format(), report.format()


def test_reference_flush_idle_plan_is_compact_or_none() -> None:
    a = _holey(Arena)
    assert a.flush_idle(0).rung is Rung.NONE and a.flush_idle(1 << 20).rung is Rung.COMPACT
