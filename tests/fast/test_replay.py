"""`kvarena replay`: the built-in trace through the unified arena and the split pools, small scale."""

from __future__ import annotations

import io
import json
import os
import random
from dataclasses import asdict

import pytest

from kvarena import replay
from kvarena.cli import main
from kvarena.reference.arena import Arena
from kvarena.reference.split import SplitPools
from kvarena.simulator.arrivals import Arrival
from kvarena.simulator.budget import GiB
from kvarena.simulator.mixed_trace import build_trace, kv_budget
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset

SMALL = ["--capacity-gib", "6", "--scale", "0.5", "--check-every", "25", "--quiet"]


def _small(model: str = "gpt-oss-20b", gib: float = 6, seed: int = 0):
    return replay.compare(ArenaConfig(preset(model), int(gib * GiB)), seed=seed, scale=0.5, check_every=25)


@pytest.mark.parametrize(("model", "gib"), [("gpt-oss-20b", 6), ("qwen3.5-4b", 16)])
def test_both_configurations_complete_with_invariants_checked(model: str, gib: float) -> None:
    trace, results = _small(model, gib)
    assert [m.config for m in results] == ["unified arena", "split pools"]
    assert {a.phase for a in trace} == {"long", "short", "mixed"}
    for m in results:
        assert m.completed == m.requests == len(trace)
        assert m.admitted >= m.completed  # re-admissions after retraction count again
        assert m.invariant_checks >= 3
        assert 0 < m.peak_utilization <= 1
        assert 0 < m.max_active <= len(trace)
        assert m.steps >= max(a.step for a in trace)
        assert all(m.bytes_moved[r] >= 0 for r in (2, 3))
    split = results[1]
    assert split.moves == {2: 0, 3: 0}  # fixed pools never move a page


@pytest.mark.parametrize("seed", [0, 1])
def test_unified_arena_queues_less_than_split_pools(seed: int) -> None:
    """Holds by a wide margin (3-8x) on every seed tried; max_active is not compared (backlog effects)."""
    _, (unified, split) = _small(seed=seed)
    waited = [m.rejected_headroom + m.rejected_ladder for m in (unified, split)]
    assert waited[0] <= waited[1]
    assert unified.mean_wait_steps <= split.mean_wait_steps
    assert unified.peak_utilization > split.peak_utilization  # the split window pool sits idle on GPT-OSS


def test_trace_is_deterministic_and_sized_to_the_budget() -> None:
    config = ArenaConfig(preset("gpt-oss-20b"), 6 * GiB)
    assert build_trace(config, 3) == build_trace(config, 3)
    assert build_trace(config, 3) != build_trace(config, 4)
    bigger = build_trace(ArenaConfig(preset("gpt-oss-20b"), 12 * GiB), 3)
    assert 1.6 < len(bigger) / len(build_trace(config, 3)) < 2.4
    assert all(a.input_tokens + a.output_tokens <= config.context_len for a in bigger)


def test_default_budget_is_the_h200_arithmetic() -> None:
    capacity, line = kv_budget("gpt-oss-20b")
    assert 108 * GiB < capacity < 110 * GiB  # 139 x 0.9 - 13 GB - 4 GiB
    assert "139" in line and "13 GB" in line


def test_main_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", *SMALL]) == 0
    out = capsys.readouterr().out
    for row in ("max active requests", "admission rejections", "retractions", "rung 2: pages / bytes moved",
                "rung 3: pages / bytes moved", "peak utilization", "unified arena", "split pools"):
        assert row in out


def test_json_output_parses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", *SMALL, "--json", "--model", "jamba-1.5-mini", "--capacity-gib", "8",
                 "--scale", "0.25"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["results"]) == {"unified arena", "split pools"}
    assert data["results"]["split pools"]["completed"] == sum(data["phases"].values())


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--help"])
    assert exc.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_invariant_violation_exits_one(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    def broken(_arena) -> None:
        raise InvariantViolation("INV-NO-OVERLAP", "planted")

    monkeypatch.setattr(replay, "check_all", broken)
    assert main(["replay", *SMALL]) == 1
    assert "INV-NO-OVERLAP" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--model", "kimi-k3"], ["--page-size", "48"], ["--capacity-gib", "1"]])
def test_bad_configuration_exits_two(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--quiet", *argv]) == 2
    assert "kvarena replay:" in capsys.readouterr().err


def test_progress_without_a_tty_prints_quarters() -> None:
    stream = io.StringIO()
    progress = replay.Progress(stream)
    for done in range(101):
        progress("unified arena", done, 100, done, 1)
    lines = stream.getvalue().splitlines()
    assert [line.split(":")[1].split("%")[0].strip() for line in lines] == ["25", "50", "75"]


def test_three_band_toy_exercises_every_rung_with_invariants_each_step() -> None:
    """toy-tri has a float band, so rung 3 (relayout) runs; the ledger pins pages while it does."""
    rng = random.Random(0)
    trace = sorted((Arrival(rng.randrange(200), rng.randint(2, 24), rng.randint(1, 8), "toy")
                    for _ in range(300)), key=lambda a: a.step)
    m = replay.replay(Arena(ArenaConfig(preset("toy-tri"), 12_000, page_size=4)), trace, "toy", check_every=1)
    assert m.completed == 300
    assert m.invariant_checks >= m.steps
    assert m.rung_used[2] > 0 and m.rung_used[3] > 0 and m.moves[3] > 0
    assert m.forward_waits > 0  # a refused allocation waited for the forward pass to let go


def _without_wall(results: list) -> list[dict]:
    return [{k: v for k, v in asdict(m).items() if k != "wall_s"} for m in results]


def test_two_processes_give_the_numbers_of_one() -> None:
    config = ArenaConfig(preset("gpt-oss-20b"), 6 * GiB)
    one = replay.compare(config, seed=2, scale=0.25, check_every=25, jobs=1)
    two = replay.compare(config, seed=2, scale=0.25, check_every=25, jobs=2)
    assert one[0] == two[0]
    assert _without_wall(one[1]) == _without_wall(two[1])
    assert [m.config for m in two[1]] == ["unified arena", "split pools"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_violation_on_the_split_side_exits_one_with_its_message(
        jobs: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With --jobs 2 the split side runs in a child process; its violation reaches this one, word for word."""
    real = replay.check_all

    def broken(arena) -> None:
        if isinstance(arena, SplitPools):
            raise InvariantViolation("INV-NO-OVERLAP", "planted in the split pools")
        real(arena)

    monkeypatch.setattr(replay, "check_all", broken)
    assert main(["replay", *SMALL, "--jobs", jobs]) == 1
    err = capsys.readouterr().err
    assert "invariant violated in split pools" in err and "INV-NO-OVERLAP: planted in the split pools" in err


def test_an_error_that_does_not_pickle_still_reaches_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    real = replay.replay

    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:  # pickles as Odd("...") and fails to unpickle
            super().__init__(f"odd {a} {b}")
            self.hook = lambda: None  # a lambda: does not pickle at all

    def failing(alloc, trace, label, *args, **kw):
        if label == "split pools":
            raise Odd(1, 2)
        return real(alloc, trace, label, *args, **kw)

    monkeypatch.setattr(replay, "replay", failing)
    with pytest.raises(RuntimeError, match="split pools: Odd: odd 1 2"):
        replay.compare(ArenaConfig(preset("gpt-oss-20b"), 6 * GiB), scale=0.1, check_every=0, jobs=2)


def test_a_child_that_dies_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay, "_side", lambda *a: os._exit(3))
    with pytest.raises(RuntimeError, match=r"exit code 3.*--jobs 1"):
        replay.compare(ArenaConfig(preset("gpt-oss-20b"), 6 * GiB), scale=0.1, check_every=0, jobs=2)


def test_jobs_below_one_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", *SMALL, "--jobs", "0"]) == 2
    assert "--jobs 0 must be >= 1" in capsys.readouterr().err


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_tty_shows_both_sides_on_one_line_until_both_finish() -> None:
    stream = _Tty()
    progress = replay.Progress(stream)
    progress("unified arena", 10, 100, 5, 3)
    progress("split pools", 100, 100, 9, 0)
    assert "\n" not in stream.getvalue()  # one side still runs
    progress("unified arena", 100, 100, 20, 0)
    last = stream.getvalue().split("\r")[-1]
    assert last.endswith("\n") and "unified arena 100%" in last and "split pools 100%" in last
