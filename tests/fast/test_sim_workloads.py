"""Workloads as the published runs were driven: closed-loop clients and sweeps, Poisson arrivals, length
distributions, latency percentiles in --json and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvarena.cli import main
from kvarena.simulator.arrivals import Lengths, poisson
from kvarena.simulator.report import percentile
from kvarena.simulator.workloads import lengths_from, workload

LATENCY = [f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(["simulate", "--quiet", "--engines", "none", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_percentiles_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert [percentile(xs, q) for q in (50, 90, 99)] == [50.0, 90.0, 99.0]
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) == 0.0


def test_poisson_gaps_have_the_rate() -> None:
    src = poisson(50.0, 4000, lambda i: (10, 10), seed=1)
    times = [a.step for a in src.arrivals]
    assert times[0] == 0.0 and times == sorted(times)
    assert 4000 / times[-1] == pytest.approx(50.0, rel=0.08)


def test_length_distributions() -> None:
    w = workload("gpt-oss-20b-max")
    shape = lengths_from("uniform:100", w).shape(seed=3)
    outs = [shape(i)[1] for i in range(2000)]
    assert min(outs) >= 100 and max(outs) <= 1024 and len(set(outs)) > 500
    assert all(shape(i)[0] == 1024 for i in range(10))
    assert Lengths("fixed", 5, 7).shape()(0) == (5, 7)
    rows = ((10, 3), (20, 4))
    draw = Lengths("trace", rows=rows).shape(seed=0)
    drawn = {draw(i) for i in range(50)}
    assert drawn == set(rows)
    with pytest.raises(ValueError):
        Lengths("gauss").shape()


def test_concurrency_sweep_and_latency_fields(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, ["--workload", "qwen3.5-4b-1k-256", "--concurrency", "2,8", "--requests", "24"])
    names = [w["workload"] for w in data["workloads"]]
    assert names == ["qwen3.5-4b-1k-256@c2", "qwen3.5-4b-1k-256@c8"]
    low, high = (w["results"]["unified arena"] for w in data["workloads"])
    assert low["max_active"] == 2 and high["max_active"] == 8 and low["completed"] == high["completed"] == 24
    for r in (low, high):
        assert all(r[k] > 0 for k in LATENCY) and r["implementation"] == "kvarena-reference"
        assert r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"] <= r["e2e_p99_s"]
    assert high["throughput_tok_s"] > low["throughput_tok_s"]  # more clients, more tokens per second
    assert data["workloads"][0]["ignore_eos"] is True
    assert data["rules"]["mixed_chunk"] is False and data["rules"]["retraction"] == "fewest_decoded"


def test_poisson_and_uniform_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, ["--workload", "gpt-oss-20b-max", "--request-rate", "20", "--requests", "30",
                          "--output-lengths", "uniform:16", "--capacity-gib", "2"])
    (w,) = data["workloads"]
    assert w["workload"] == "gpt-oss-20b-max+uniform@20rps" and "Poisson arrivals at 20 req/s" in w["description"]
    assert w["ignore_eos"] is False  # drawn lengths end at their EOS
    r = w["results"]["split pools"]
    assert r["completed"] == 30 and r["e2e_p99_s"] > 0


def test_trace_lengths_redriven_by_clients(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,input,output\n" + "".join(f"{i * 0.1},{100 + i},{5 + i}\n" for i in range(10)))
    data = _json(capsys, ["--trace", str(trace), "--concurrency", "3", "--requests", "12", "--capacity-gib", "1"])
    (w,) = data["workloads"]
    assert w["workload"] == "t@c3" and w["results"]["unified arena"]["max_active"] == 3
    data = _json(capsys, ["--workload", "gpt-oss-20b-max", "--output-lengths", f"trace:{trace}", "--scale", "0.002",
                          "--capacity-gib", "1"])
    assert data["workloads"][0]["results"]["split pools"]["completed"] == 12


def test_table_shows_the_percentiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--quiet", "--engines", "none", "--workload", "qwen3.5-4b-1k-256", "--concurrency", "4",
                 "--requests", "8"]) == 0
    out = capsys.readouterr().out
    assert "TTFT p50 / p90 / p99 (s)" in out and "TPOT p50 / p99 (ms)" in out and "@c4" in out


def test_jobs_run_configurations_in_parallel_with_the_same_report(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workload", "gpt-oss-20b-ratio", "--scale", "0.004", "--capacity-gib", "2"]
    one, two = _json(capsys, argv), _json(capsys, [*argv, "--jobs", "2"])

    def strip(d: dict) -> dict:
        return {k: {c: {f: v for f, v in r.items() if f != "wall_s"} for c, r in w["results"].items()}
                for w in d["workloads"] for k in [w["workload"]]}

    assert strip(one) == strip(two) and len(one["workloads"][0]["results"]) == 5


def test_goodput_under_an_slo(capsys: pytest.CaptureFixture[str]) -> None:
    """A closed loop above what the split pools hold: their queued clients miss a tight TTFT objective."""
    argv = ["--workload", "gpt-oss-20b-max", "--concurrency", "60", "--requests", "120", "--capacity-gib", "2"]
    tight = _json(capsys, [*argv, "--slo-ttft", "0.5", "--slo-tpot", "1000"])["workloads"][0]["results"]
    split, uni = tight["split pools"], tight["unified arena"]
    assert 0 <= split["slo_attained"] < uni["slo_attained"] <= 1
    assert split["goodput_req_s"] < uni["goodput_req_s"]
    assert "slo_attained" not in _json(capsys, argv)["workloads"][0]["results"]["split pools"]
