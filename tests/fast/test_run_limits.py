"""``replay`` and ``simulate`` refuse, in one line naming the limit and the flag, input that would run for minutes
or gigabytes before the first line of progress (kvarena/text.py MAX_SLOTS, MAX_REQUESTS), and a binary trace file;
each refusal comes back within a second or two, before anything is built."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvarena.cli import main
from kvarena.simulator.mixed_trace import build_trace, phase_sizes
from kvarena.spec.models import ArenaConfig, preset
from kvarena.text import MAX_REQUESTS, MAX_SLOTS, UsageError, check_arena_size

GiB = 1 << 30


def _refused(capsys: pytest.CaptureFixture, *argv: str) -> str:
    t0 = time.perf_counter()
    code = main(list(argv))
    seconds = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith(f"kvarena {argv[0]}: ") and "Traceback" not in err, err
    assert seconds < 10, f"refused after {seconds:.1f} s: the check must come before the work"
    return line


@pytest.mark.parametrize(("argv", "words"), [
    (["replay", "--capacity-gib", "1e9"], ["--capacity-gib 1e+09 is ", f"the limit of {MAX_SLOTS:,} pages",
                                           "pass --capacity-gib 1380 or less"]),
    (["replay", "--capacity-gib", "100000"], ["--capacity-gib 100000", f"the limit of {MAX_SLOTS:,} pages"]),
    (["replay", "--scale", "100"], ["--scale 100 at the H200 budget", f"the limit of {MAX_REQUESTS:,} per run",
                                    "pass --scale 12.7 or less"]),
    (["replay", "--scale", "1e6"], ["--scale 1e+06", f"the limit of {MAX_REQUESTS:,} per run"]),
    (["replay", "--capacity-gib", "2000"], ["--scale 1 at --capacity-gib 2000 makes", "or --capacity-gib 1380"]),
    (["replay", "--model", "hymba-1.5b", "--page-size", "1"], ["the H200 budget of", "--page-size 1",
                                                               "or a larger --page-size"]),
    (["simulate", "--workload", "gpt-oss-20b-max", "--capacity-gib", "1e9"], ["--capacity-gib 1e+09 is ",
                                                                              f"{MAX_SLOTS:,} pages"]),
    (["simulate", "--workload", "gpt-oss-20b-max", "--scale", "100"], ["gpt-oss-20b-max at --scale 100 makes 600,000",
                                                                       "pass --scale 16.6 or less"]),
    (["simulate", "--workload", "gpt-oss-20b-max", "--scale", "1e6"], ["6,000,000,000 requests"]),
    (["simulate", "--workload", "gpt-oss-20b-max", "--concurrency", "100000000"],
     ["--concurrency 100000000", "pass --concurrency 25000 or fewer"]),
    (["simulate", "--workload", "gpt-oss-20b-max", "--concurrency", "64", "--requests", "1000000"],
     ["--requests 1000000", "pass --requests 100000 or fewer"]),
    (["simulate", "--workload", "gpt-oss-20b-max", "--workload", "hymba-1.5b-6k-2k", "--scale", "40"],
     ["gpt-oss-20b-max at --scale 40"]),  # every workload is checked before the first one runs
])
def test_a_run_past_the_limits_is_refused_in_one_line(capsys: pytest.CaptureFixture, argv: list[str],
                                                      words: list[str]) -> None:
    line = _refused(capsys, *argv, "--quiet")
    for w in words:
        assert w in line, line


def test_a_binary_trace_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(b"arrival,input,output\n" + bytes(range(128, 256)) * 8)
    line = _refused(capsys, "simulate", "--trace", str(trace), "--quiet")
    assert f"{trace}: not a text file (byte 21 is not UTF-8)" in line, line
    line = _refused(capsys, "simulate", "--workload", "gpt-oss-20b-max", "--output-lengths", f"trace:{trace}",
                    "--quiet")
    assert "not a text file" in line


def test_phase_sizes_are_the_trace_build_trace_draws() -> None:
    """replay's request limit counts the trace before drawing it: the count must be the trace's."""
    for model, gib, scale, seed in (("gpt-oss-20b", 6, 0.3, 0), ("qwen3.5-4b", 4, 0.5, 3), ("hymba-1.5b", 3, 0.1, 1)):
        config = ArenaConfig(preset(model), gib * GiB, page_size=64)
        assert len(build_trace(config, seed, scale)) == sum(n for _, n in phase_sizes(config, seed, scale))


def test_the_suggested_values_pass_the_limits() -> None:
    """A refusal's suggestion must itself be accepted (rounded down, never up)."""
    config = ArenaConfig(preset("gpt-oss-20b"), 109 * GiB, page_size=64)
    assert sum(n for _, n in phase_sizes(config, 0, 12.7)) <= MAX_REQUESTS
    check_arena_size("gpt-oss-20b", int(12200 * GiB), 64, "x")  # the slot bound alone (12,200 GiB) is accepted
    with pytest.raises(UsageError, match="pass --capacity-gib 12200 or less"):
        check_arena_size("gpt-oss-20b", int(12300 * GiB), 64, "x")


def test_the_defaults_are_well_inside_the_limits() -> None:
    """make run and every preset's default replay stay runnable: the limits refuse only what is far past them."""
    from kvarena.simulator.mixed_trace import kv_budget

    for model in ("gpt-oss-20b", "qwen3.5-4b", "hymba-1.5b"):
        capacity, _ = kv_budget(model)
        check_arena_size(model, capacity, 64, "default")
        assert sum(n for _, n in phase_sizes(ArenaConfig(preset(model), capacity, page_size=64))) * 4 < MAX_REQUESTS
