"""The placement limit `below` in the lockstep rules (conformance/machine/below.py) and the reference machine
(conformance/machine/arena.py admit_below): both pass random limits, and both catch an arena that drops them."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena.conformance.machine.arena import machine_for
from kvarena.conformance.machine.below import offers_below
from kvarena.conformance.machine.harness import Divergence
from kvarena.conformance.machine.lockstep import RandomChooser, r_admit_below, r_churn, r_extend_below, r_free, start
from kvarena.reference.arena import Arena
from tests.quality.below_arenas import IgnoresBelow, NoBelow


class UnorderedBelow(Arena):
    """Validates `below` like the reference, then plans without it: only the hole order shows it."""

    def _plan_admission(self, demand, limits=None):  # type: ignore[override]
        return super()._plan_admission(demand, None)


def _walk(factory, seed: int, rounds: int = 60) -> int:
    """Churn (holes) and limited admissions / extensions at exact; returns the steps that passed a limit."""
    c = start(factory, "toy-swa", 8192, 2)
    ch = RandomChooser(random.Random(seed))
    for _ in range(rounds):
        r_churn(c, ch)
        if offers_below(c):
            r_admit_below(c, ch)
            r_extend_below(c, ch)
        r_free(c, ch)
    return sum(1 for s in c.steps if "below" in s.get("args", {}))


def test_lockstep_passes_limits_to_the_reference_and_gpu_like_ports() -> None:
    assert _walk(Arena, 1) > 50


def test_lockstep_catches_a_dropped_limit_and_spares_an_adapter_without_it() -> None:
    for bug in (IgnoresBelow, UnorderedBelow):
        with pytest.raises(Divergence, match='"below"'):
            _walk(bug, 1)
    assert _walk(NoBelow, 1) == 0  # never given a below: not a divergence


@pytest.mark.parametrize(("factory", "words"), [(IgnoresBelow, "expected InvalidArgumentError|rung 1 put"),
                                               (UnorderedBelow, r"rung 1 put \w+ at .*; the limit takes")])
def test_machine_catches_a_dropped_limit(factory, words: str) -> None:
    fast = settings(max_examples=60, stateful_step_count=20, deadline=None, database=None, derandomize=True,
                    phases=[Phase.generate], report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    with pytest.raises(AssertionError, match=words):
        run_state_machine_as_test(machine_for(factory, f"{factory.__name__}Machine"), settings=fast)


def test_vectors_list_names_the_feature_and_conform_says_why_it_skips(capsys: pytest.CaptureFixture) -> None:
    from kvarena.cli import main
    from kvarena.conformance.runner.conform import conform
    from kvarena.conformance.vectors.replay import VECTOR_DIR

    assert main(["vectors", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.count("requires: below") == 2, out
    report = conform(NoBelow, level="exact", vectors=VECTOR_DIR / "rung1-below.jsonl", examples=0)
    text = report.format()
    assert report.exit_code == 3 and "stopped rung1-below.jsonl: not replayed: the vector requires below" in text, text
