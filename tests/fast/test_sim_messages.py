"""`kvarena replay` and `kvarena simulate` refuse bad input with one line in the user's units (exit 2),
naming the flag to change; wide tables wrap to the terminal (100 columns in CI)."""

from __future__ import annotations

import pytest

from kvarena.cli import main
from kvarena.simulator.report import format_table
from kvarena.simulator.simulation import simulate
from kvarena.simulator.workloads import workload

GiB = 1 << 30


def _err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"kvarena {argv[0]}: "), err
    return err


def test_replay_capacity_too_small_answers_in_gib(capsys: pytest.CaptureFixture[str]) -> None:
    err = _err(capsys, ["replay", "--capacity-gib", "0.001"])
    assert "--capacity-gib 0.001 cannot hold" in err and "131,072 tokens" in err
    assert "unified arena 3.0" in err and "GiB" in err and "pass --capacity-gib 5.41 or more" in err
    assert "max_context_len" not in err and "ratio flags" not in err and " B " not in err  # no flag replay lacks


def test_replay_smallest_capacity_it_names_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from kvarena.reference.arena import Arena
    from kvarena.reference.split import SplitPools
    from kvarena.spec.models import ArenaConfig, preset

    err = _err(capsys, ["replay", "--capacity-gib", "1"])
    least = float(err.split("pass --capacity-gib ")[1].split()[0])
    cfg = ArenaConfig(preset("gpt-oss-20b"), int(least * GiB))
    Arena(cfg), SplitPools(cfg)  # the number it names is enough


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_replay_nonpositive_capacity(capsys: pytest.CaptureFixture[str], value: str) -> None:
    err = _err(capsys, ["replay", "--capacity-gib", value])
    assert f"--capacity-gib {value} must be a number of GiB > 0" in err


@pytest.mark.parametrize("cmd", ["replay", "simulate"])
def test_page_size_not_a_power_of_two(capsys: pytest.CaptureFixture[str], cmd: str) -> None:
    extra = ["--workload", "gpt-oss-20b-max"] if cmd == "simulate" else []
    err = _err(capsys, [cmd, *extra, "--page-size", "3"])
    assert "--page-size 3 must be a power of two" in err


def test_simulate_capacity_too_small_answers_in_gib(capsys: pytest.CaptureFixture[str]) -> None:
    err = _err(capsys, ["simulate", "--workload", "gpt-oss-20b-max", "--capacity-gib", "0.001"])
    assert "a KV budget of 0.001 GiB cannot hold one request of 2,048 tokens" in err
    assert "pass --capacity-gib 0.09 or more" in err
    assert "ratio flags" not in err and "max_context_len" not in err  # simulate has neither flag


def test_simulate_negative_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    err = _err(capsys, ["simulate", "--workload", "gpt-oss-20b-max", "--capacity-gib", "-2"])
    assert "--capacity-gib -2 must be a number of GiB > 0" in err


def test_simulate_mem_fraction_leaving_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    err = _err(capsys, ["simulate", "--workload", "gpt-oss-20b-max", "--mem-fraction", "0.05"])
    assert "leave nothing for KV" in err and "GiB" in err and "--mem-fraction" in err
    err = _err(capsys, ["simulate", "--workload", "gpt-oss-20b-max", "--mem-fraction", "1.5"])
    assert "--mem-fraction 1.5 must be in (0, 1]" in err


@pytest.mark.parametrize(("argv", "text"), [
    (["--concurrency", "0"], "--concurrency '0': give clients as whole numbers >= 1"),
    (["--concurrency", "a,b"], "--concurrency 'a,b'"),
    (["--request-rate", "-3"], "--request-rate -3 must be > 0 requests per second"),
    (["--request-rate", "2", "--concurrency", "4"], "two arrival processes; pass one"),
    (["--requests", "0", "--concurrency", "4"], "--requests 0 must be >= 1"),
    (["--rule", "nosuch=1"], "--rule nosuch: no such rule; the rules are"),
    (["--rule", "mixed_chunk=maybe"], "--rule mixed_chunk=maybe: expected a value like False"),
    (["--rule", "retraction=oldest"], "choose one of fewest_decoded, newest"),
    (["--rule", "mixed_chunk"], "write NAME=VALUE"),
    (["--output-lengths", "gauss"], "--output-lengths 'gauss': use fixed, uniform[:LO] or trace:FILE"),
    (["--output-lengths", "uniform:5000"], "the low end must be a whole number of tokens in 1..1,024"),
    (["--policies", "nope"], "--policies: unknown nope"),
    (["--scale", "0"], "--scale 0 must be > 0"),
])
def test_simulate_bad_flags(capsys: pytest.CaptureFixture[str], argv: list[str], text: str) -> None:
    assert text in _err(capsys, ["simulate", "--workload", "gpt-oss-20b-max", *argv])


def test_simulate_without_a_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert "name a workload: --workload NAME" in _err(capsys, ["simulate"])


def test_wide_tables_wrap(capsys: pytest.CaptureFixture[str]) -> None:
    w = workload("gpt-oss-20b-max")
    rep = simulate(w, 2 * GiB, "test", scale=0.01)
    wide = format_table(rep.main(), width=1000)
    assert max(len(line) for line in wide.splitlines()) > 60  # three columns do not fit 60
    for width in (60, 56):  # one column: the label and a 3-percentile cell of seconds (~54 characters)
        lines = format_table(rep.main(), width=width).splitlines()
        assert max(len(line) for line in lines) <= width
        assert sum(line.startswith("max active requests") for line in lines) >= 2  # the row label repeats
    assert main(["simulate", "--quiet", "--engines", "none", "--workload", "qwen3.5-4b-1k-256", "--scale", "0.02"]) == 0
    out = capsys.readouterr().out
    table_lines = [line for line in out.splitlines() if not line.startswith(("  ", "==", "kvarena", "   "))]
    assert table_lines and max(len(line) for line in table_lines) <= 100  # capsys is no terminal: CI width


@pytest.mark.parametrize("cmd", ["simulate", "replay"])
def test_help_needs_only_the_core_dependency(cmd: str) -> None:
    """`--help` with every optional dependency made unimportable (the command modules import nothing heavy)."""
    import subprocess
    import sys

    blocked = ("matplotlib", "numpy", "torch", "triton", "hypothesis", "z3", "crosshair", "sglang")
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            f"from kvarena.cli import main\nmain([{cmd!r}, '--help'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "examples:" in out.stdout


def test_slo_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    w = ["simulate", "--workload", "gpt-oss-20b-max"]
    assert "--slo-ttft -1 must be > 0" in _err(capsys, [*w, "--slo-ttft", "-1"])
    assert "--jobs 0 must be >= 1" in _err(capsys, [*w, "--jobs", "0"])
