"""spec/arena.md §Integrations: every integration has its spec subsection and its committed vector, the vectors
replay on the reference and gpu/ at ``exact``, and the presets and refusals the section relies on hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvarena.conformance.machine.harness import OPS
from kvarena.conformance.vectors.integrations import INTEGRATIONS, SGLANG_EXPECTED, Integration
from kvarena.conformance.vectors.replay import VECTOR_DIR, load, replay
from kvarena.conformance.vectors.scenarios import VECTORS
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ConfigError
from kvarena.spec.layout import Kind, StateClass, entry_layout
from kvarena.spec.models import (
    PRESETS,
    REFUSED_MODELS,
    TOY_MODELS,
    ArenaConfig,
    ModelSpec,
    gated_delta_rows,
    mha_rows,
    mla_rows,
    preset,
    validate_model,
)

SPEC = Path(__file__).resolve().parents[2] / "spec" / "arena.md"


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``), or '' if there is none."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def problems(spec_text: str, vector_dir: Path, integrations: tuple[Integration, ...] = INTEGRATIONS) -> list[str]:
    """What is missing: a spec subsection, its mention of the vector, the vector file, its registration."""
    out = []
    body = section(spec_text, "Integrations")
    if not body:
        out.append("spec/arena.md has no '## Integrations' section")
    registered = {v.name for v in VECTORS}
    for i in integrations:
        sub = re.search(rf"^### {re.escape(i.heading)}\n(.*?)(?=^### |\Z)", body, re.S | re.M)
        if sub is None:
            out.append(f"{i.name}: no '### {i.heading}' under §Integrations")
        elif f"{i.vector}.jsonl" not in sub.group(1):
            out.append(f"{i.name}: §Integrations / {i.heading} does not name {i.vector}.jsonl")
        if not (vector_dir / f"{i.vector}.jsonl").exists():
            out.append(f"{i.name}: {i.vector}.jsonl is not committed in {vector_dir}")
        if i.vector not in registered:
            out.append(f"{i.name}: {i.vector} is not in scenarios.VECTORS")
    return out


def test_every_integration_has_its_subsection_and_its_vector() -> None:
    assert problems(SPEC.read_text(), VECTOR_DIR) == []
    assert len({i.name for i in INTEGRATIONS}) == len({i.heading for i in INTEGRATIONS}) == len(INTEGRATIONS)
    wanted = {"overlap", "radix", "hicache", "pd", "spec-decode", "dsa", "cuda-graph", "preemption", "unsupported"}
    assert {i.name for i in INTEGRATIONS} == wanted


def test_a_missing_subsection_or_vector_is_reported(tmp_path: Path) -> None:
    text = SPEC.read_text()
    i = INTEGRATIONS[1]
    cut = text.replace(f"### {i.heading}\n", "### Something else\n")
    assert any(i.name in p and "no '###" in p for p in problems(cut, VECTOR_DIR))
    renamed = text.replace(f"{i.vector}.jsonl", "elsewhere.jsonl")
    assert any("does not name" in p for p in problems(renamed, VECTOR_DIR))
    assert problems(text.replace("## Integrations\n", "## Elsewhere\n"), VECTOR_DIR)[0].startswith("spec/arena.md")
    missing = problems(text, tmp_path)  # an empty directory: every vector is missing
    assert sum("is not committed" in p for p in missing) == len(INTEGRATIONS)
    ghost = Integration("ghost", i.heading, "", "toy-tri", 3360, 2, None, 0)
    assert any("not in scenarios.VECTORS" in p for p in problems(text, VECTOR_DIR, (ghost,)))


def test_padding_lanes_section_gives_the_formula_and_the_reasons() -> None:
    body = section(SPEC.read_text(), "Padding lanes")
    assert "pad_entry(c) = ceil(capacity / E[c])" in body and "foreign id" in body
    assert "Why not a masked sentinel" in body and "Why not" in body and "PAD-OUTSIDE-PAGES" in body


FILES = [VECTOR_DIR / f"{i.vector}.jsonl" for i in INTEGRATIONS]


@pytest.mark.parametrize("path", FILES, ids=[i.name for i in INTEGRATIONS])
def test_integration_vector_replays_at_exact(path: Path) -> None:
    vec = load(path)
    assert 50 <= len(vec.steps) <= 300
    assert replay(vec, Arena, "exact").status == "passed"
    torch = pytest.importorskip("torch")
    assert torch is not None
    from kvarena.gpu.allocator import make

    r = replay(vec, make, "exact")
    assert r.status == "passed", r.message


def test_integration_vectors_issue_the_operations_they_are_about() -> None:
    ops = {}
    for i, f in zip(INTEGRATIONS, FILES):
        steps = [json.loads(line) for line in f.read_text().splitlines()[1:]]
        ops[i.name] = {(s["op"], s["args"].get("kind")) for s in steps}
    assert {("acquire", "forward_write"), ("acquire", "forward_read"), ("free", None)} <= ops["overlap"]
    assert {("share", None), ("drop", None)} <= ops["radix"]
    assert ("copy_state" in OPS) == (("copy_state", None) in ops["radix"])  # state is copied, never shared
    assert {("acquire", "host_save"), ("acquire", "host_load")} <= ops["hicache"]
    assert {("acquire", "net_send"), ("acquire", "net_recv")} <= ops["pd"]
    assert ("drop", None) in ops["spec-decode"] and ("acquire", "host_save") in ops["preemption"]
    assert ("construct", None) in ops["unsupported"]


def test_sglang_expected_outcomes_name_committed_vectors_with_a_reason() -> None:
    names = {v.name for v in VECTORS}
    for name, (text, why) in SGLANG_EXPECTED.items():
        assert name in names and (VECTOR_DIR / f"{name}.jsonl").exists() and text and len(why) > 40, name


# ---------------------------------------------------------------------------------------------
# The presets of §Integrations


def test_eagle3_draft_rows_are_fused_into_the_full_entries_in_bf16() -> None:
    m = preset("gpt-oss-20b-eagle3")
    full, window = m.cls("full"), m.cls("window")
    target = [r for r in full.rows if not r.part.startswith("draft_")]
    draft = [r for r in full.rows if r.part.startswith("draft_")]
    assert len(target) == 24 and all(r.dtype == "fp8" and r.shape == (8, 64) for r in target)
    assert [(r.layer, r.part, r.dtype, r.shape) for r in draft] == [(24, "draft_k", "bf16", (8, 64)),
                                                                   (24, "draft_v", "bf16", (8, 64))]
    assert list(full.rows[-2:]) == draft, "the draft's rows follow the target's (SGLang's fused layout)"
    assert all(r.dtype == "fp8" for r in window.rows) and window.window == 128
    lay = entry_layout(full)
    assert lay.entry_bytes == 14336 and lay.padding_bytes == 0 and entry_layout(window).entry_bytes == 12288
    text = " ".join(m.assumptions) + m.source
    for words in ("fp8", "bf16", "topk 1", "SpecForge", "sglang-unified-memory.md"):
        assert words in text, words


def test_toy_dsa_has_kimi_k3s_entry_shape() -> None:
    toy, k3 = preset("toy-dsa").cls("full"), preset("kimi-k3").cls("full")
    assert [r.part for r in toy.rows] == ["latent"] * 2 + ["index_k", "index_scale"] * 2
    assert [r.part for r in k3.rows] == ["latent"] * 24 + ["index_k", "index_scale"] * 24
    assert {(r.part, r.dtype) for r in toy.rows} == {(r.part, r.dtype) for r in k3.rows}


def _mla_window(name: str = "m") -> ModelSpec:
    return ModelSpec(name, (StateClass("full", Kind.FULL, mla_rows([1], 16, 8)),
                            StateClass("window", Kind.WINDOW, mha_rows([0], 1, 16), window=8)), max_context_len=16)


def test_mla_beside_a_window_is_refused_with_the_reason() -> None:
    for m in (_mla_window(), preset("toy-mla-swa")):
        with pytest.raises(ConfigError, match=r"MLA latent rows .* sliding-window layers .* split pools"):
            validate_model(m)
    window_mla = ModelSpec("w", (StateClass("full", Kind.FULL, mha_rows([1], 1, 8)),
                                 StateClass("window", Kind.WINDOW, mla_rows([0], 16, 8), window=8)), 16)
    with pytest.raises(ConfigError, match="MLA"):
        validate_model(window_mla)
    validate_model(ModelSpec("mla-state", (StateClass("full", Kind.FULL, mla_rows([1], 16, 8)), StateClass(
        "state", Kind.RECURRENT, gated_delta_rows([0], 8, 2, 1, 2, 4))), 16))  # MLA + recurrent: served
    validate_model(preset("kimi-k3"))


def test_deepseek_v4_is_a_named_preset_that_refuses_when_built() -> None:
    m = preset("deepseek-v4")
    assert "deepseek-v4" not in PRESETS and "deepseek-v4" in REFUSED_MODELS and m.refusal
    with pytest.raises(ConfigError, match="DeepSeek-V4 excluded") as e:
        Arena(ArenaConfig(m, 1 << 30))
    assert type(e.value) is ConfigError and "kv_cache_configurator.py:633-643" in str(e.value)
    with pytest.raises(ConfigError, match="deepseek-v4"):
        preset("deepseek-v5")  # the unknown-preset message lists the refused names too


def test_full_attention_only_is_refused() -> None:
    with pytest.raises(ConfigError, match="plain paged pool"):
        Arena(ArenaConfig(preset("toy-full-only"), 1 << 16, page_size=2))
    assert not set(REFUSED_MODELS) & (set(PRESETS) | set(TOY_MODELS))


def test_the_cli_names_the_reason_for_a_refused_model() -> None:
    from kvarena.text import UsageError, check_model

    for name, words in (("deepseek-v4", "DeepSeek-V4 excluded"), ("toy-mla-swa", "MLA latent rows"),
                        ("toy-full-only", "plain paged pool")):
        with pytest.raises(UsageError, match=words):
            check_model(name, toys=True)
    check_model("gpt-oss-20b-eagle3")
    check_model("toy-dsa", toys=True)


def test_sglangs_fused_draft_entry_is_byte_identical_to_the_eagle3_preset() -> None:
    """The preset's assumption, checked against SGLang 0.5.23's own layout (skipped without sglang): an
    ``MHASubPoolSpec`` for the 12 fp8 target layers with a bf16 ``DenseDraftRegion`` of one lane puts every part
    where kvarena's ``entry_layout`` puts its rows, in an entry of the same bytes."""
    import importlib
    import sys

    from kvarena.engines.sglang import adapter as sga

    try:
        sg = sga.load_sglang()
    except sga.SGLangUnavailable as e:
        pytest.skip(f"sglang is not installed: {e}")
    import torch

    fd = sys.modules.get("sglang.srt.mem_cache.layout.fused_draft") or importlib.import_module(
        "sglang.srt.mem_cache.layout.fused_draft")
    region = fd.DenseDraftRegion(lane_num=1, head_num=8, head_dim=64, store_dtype=torch.bfloat16)
    spec = sg.pool.MHASubPoolSpec(name="full", layer_num=12, head_num=8, head_dim=64, store_dtype=torch.uint8,
                                  grow_direction="down", draft_region=region)
    lay = entry_layout(preset("gpt-oss-20b-eagle3").cls("full"))
    assert spec.entry_bytes() == lay.entry_bytes == 14336
    theirs = {(p.name, i): p.offset_bytes + i * p.layer_stride_bytes
              for p in spec.layout().parts for i in range(p.layer_num)}
    ours = {}
    for s in lay.slots:
        n = sum(1 for t in lay.slots if t.row.part == s.row.part and t.offset < s.offset)
        ours[(s.row.part, n)] = s.offset
    assert ours == theirs


# planted bugs each integration exists to rule out, and the vectors that must catch them on their own
CATCHES = {"reuse-withheld-page": ("overlap", "hicache", "pd"), "move-page-with-writer": ("hicache", "pd"),
           "withheld-freed-by-first-release": ("overlap", "hicache", "pd"),
           "partial-layer-move": ("spec-decode", "dsa"), "hand-out-keeps-freed-content": ("hicache",)}


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_integration_vectors_catch_the_bugs_they_are_about(name: str) -> None:
    from tests.quality.mutants import MUTANTS, isolated

    factory = isolated(next(m for m in MUTANTS if m.name == name))
    caught = [i for i in CATCHES[name]
              if replay(load(VECTOR_DIR / f"integration-{i}.jsonl"), factory, "safety", deep=False).status == "failed"]
    assert caught, f"none of {CATCHES[name]} catches {name}"
