"""``kvarena simulate --matrix`` (simulator/matrix.py): every allocator under every rule set, and the gap
decomposed by rule group. Small runs (a few dozen requests); the presets at full size are a benchmark
(bench/results/matrix-*.md), not a test."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvarena.cli import main
from kvarena.simulator import matrix as mx
from kvarena.simulator import rules
from kvarena.simulator.workloads import workload
from kvarena.spec.models import ArenaConfig, preset

GiB = 1 << 30
QWEN = workload("qwen3.5-4b-16k-4k")


def test_rule_sets_per_model() -> None:
    """A model without recurrent state has no mamba strategy: its no_buffer column would repeat extra_buffer."""
    assert mx.rule_sets_for("gpt-oss-20b") == ["sglang", "vllm"]
    assert mx.rule_sets_for("qwen3.5-4b") == ["sglang", "sglang-no_buffer", "vllm"]
    assert mx.groups_for("gpt-oss-20b") == ["running cap", "decode reserve", "window eviction", "batch_is_full",
                                            "mixed batches", "preemption"]
    assert "window eviction" not in mx.groups_for("qwen3.5-4b") and "state slots" in mx.groups_for("qwen3.5-4b")


def test_cell_model_takes_the_rule_sets_cap_then_what_the_allocator_imposes() -> None:
    cfg = ArenaConfig(preset("qwen3.5-4b"), 8 * GiB, 64, max_context_len=20_480)
    sg = mx.cell_model("kvarena arena", rules.RULE_SETS["sglang"], cfg)
    vm = mx.cell_model("vLLM manager", rules.RULE_SETS["sglang"], cfg)
    assert mx.cell_model("kvarena arena, vLLM's accounting", rules.RULE_SETS["sglang"], cfg) == vm
    vl = rules.RULE_SETS["vllm"]  # vLLM's own rules already account as its manager does: the two arena rows agree
    assert mx.cell_model("kvarena arena, vLLM's accounting", vl, cfg) == mx.cell_model("kvarena arena", vl, cfg)
    assert sg.max_running == vm.max_running  # the cap is the rule set's (// 5 with extra_buffer), not INHERENT's
    assert (sg.state_slots, sg.radix_state_slots, vm.state_slots, vm.radix_state_slots) == (3, 1, 1, 0)
    assert vm.swa_eviction_interval is None and sg.swa_eviction_interval == rules.SWA_EVICTION_INTERVAL
    nb = mx.cell_model("kvarena arena", rules.RULE_SETS["sglang-no_buffer"], cfg)
    assert nb.max_running > sg.max_running  # no_buffer: // 3
    assert mx.cell_model("kvarena arena", rules.RULE_SETS["vllm"], cfg).max_running == rules.VLLM_MAX_NUM_SEQS


def test_switching_every_group_is_the_vllm_rule_set() -> None:
    """The decomposition's last cumulative step is exactly the matrix's vLLM column (so the parts add up)."""
    for model in ("gpt-oss-20b", "qwen3.5-4b", "hymba-1.5b"):
        w = replace(QWEN, model=model)
        assert mx.base_model(w, mx.switched(mx.groups_for(model))) == mx.base_model(w, rules.RULE_SETS["vllm"])
    assert mx.switched([]) == rules.RULE_SETS["sglang"]


@pytest.fixture(scope="module")
def small() -> tuple[mx.Matrix, mx.Decomposition]:
    # transformers after vLLM in one process: vLLM's loader leaves psutil stand-ins that transformers must not see
    alloc = ["kvarena arena", mx.ACCOUNTING, "SGLang split", "vLLM manager", "transformers pool"]
    m = mx.matrix(QWEN, 6 * GiB, "test", scale=0.05, allocators=alloc)
    d = mx.decompose(QWEN, 6 * GiB, scale=0.05, start=m.cells[("kvarena arena", "sglang")])
    return m, d


def test_small_matrix(small: tuple[mx.Matrix, mx.Decomposition]) -> None:
    m, d = small
    assert set(m.cells) == {(a, s) for a in ("kvarena arena", mx.ACCOUNTING, "SGLang split", "vLLM manager",
                                             "transformers pool")
                            for s in ("sglang", "sglang-no_buffer", "vllm")} - set(m.skipped)
    assert all(o.completed == o.requests for o in m.cells.values())
    # under vLLM's rules the arena with vLLM's accounting is the arena's own run (run once, labelled per row)
    acc, arena = m.cells[(mx.ACCOUNTING, "vllm")], m.cells[("kvarena arena", "vllm")]
    assert acc.config == mx.ACCOUNTING and arena.config == "kvarena arena"
    assert (acc.mean_active, acc.retractions, acc.wall_s) == (arena.mean_active, arena.retractions, arena.wall_s)
    best = m.best()
    for k in m.cells:
        assert not mx.better(m.get(*k), m.get(*best), m.metric)
    # the parts add up: the cumulative path ends at the matrix's arena / vLLM cell
    assert d.path[-1][1] == m.get("kvarena arena", "vllm") == d.end
    assert d.start == m.get("kvarena arena", "sglang")
    assert set(d.alone) == set(mx.groups_for("qwen3.5-4b"))
    text = "\n".join(mx.format_matrix(m) + mx.format_decomposition(m, d))
    assert "SGLang (no_buffer)" in text and "cumulative:" in text and "*" in text
    assert mx.verdict(100.0, 100.4, "mean_active") == "ties"
    assert mx.verdict(100.0, 110.0, "mean_active") == "loses to (-9.1 %)"
    assert mx.verdict(5.0, 10.0, "retractions_per_1k") == "beats (-50.0 %)"
    j = mx.matrix_json(m, d)
    assert j["best"]["allocator"] == best[0] and len(j["cells"]) == len(m.cells)
    assert j["decomposition"]["arena_vllm_rules"] == d.end


def test_the_matrix_separates_the_allocator_from_the_rules(small: tuple[mx.Matrix, mx.Decomposition]) -> None:
    """The point of the matrix: under one rule set, the allocators differ only in what they are. The split
    pools hold fewer requests than the arena under every rule set at this budget (the state pool idles)."""
    m, _ = small
    for s in m.rule_sets:
        assert m.get("kvarena arena", s) > m.get("SGLang split", s)


def test_cli_matrix_json(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("matplotlib")
    argv = ["simulate", "--quiet", "--matrix", "--workload", "qwen3.5-4b-1k-256", "--scale", "0.05",
            "--capacity-gib", "4", "--allocators", "kvarena arena,vLLM manager", "--json", "--plots", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    (m,) = data["matrix"]
    assert m["workload"] == "qwen3.5-4b-1k-256" and m["metric"] == "throughput"
    assert {(c["allocator"], c["rule_set"]) for c in m["cells"]} == {
        (a, s) for a in ("kvarena arena", "vLLM manager") for s in ("sglang", "sglang-no_buffer", "vllm")}
    assert (tmp_path / "matrix.png").stat().st_size > 10_000


@pytest.mark.parametrize(("argv", "says"), [
    (["--decompose", "--workload", "gpt-oss-20b-max"], "--decompose goes with --matrix"),
    (["--matrix", "--rule", "mixed_chunk=true"], "--rule does not go with --matrix"),
    (["--matrix", "--allocators", "nope"], "--allocators: unknown nope"),
])
def test_cli_matrix_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    assert main(["simulate", "--quiet", *argv]) == 2
    assert says in capsys.readouterr().err


def test_a_missing_engine_is_a_skipped_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvarena.simulator import engines

    monkeypatch.setitem(engines.ENGINES, "transformers", replace(engines.ENGINES["transformers"],
                                                                 missing=lambda: "transformers is not installed"))
    m = mx.matrix(workload("qwen3.5-4b-1k-256"), 4 * GiB, "test", scale=0.02,
                  allocators=["kvarena arena", "transformers pool"], rule_set_names=["vllm"])
    assert m.allocators == ["kvarena arena"] and m.skipped == {"transformers pool": "transformers is not installed"}
    assert "transformers pool: skipped: transformers is not installed" in "\n".join(mx.format_matrix(m))
