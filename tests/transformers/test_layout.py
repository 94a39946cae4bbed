"""``model_layout``: kvarena's classes from a transformers config, checked against the presets that name a real
model, the refusals with their reasons, and ``kvarena models --hf-config``."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.transformers]

from kvarena.cli import main  # noqa: E402
from kvarena.engines.transformers.layout import load_config, model_layout  # noqa: E402
from kvarena.engines.transformers.tiny import FAMILIES, tiny_config  # noqa: E402
from kvarena.spec.errors import ConfigError  # noqa: E402
from kvarena.spec.layout import entry_layout  # noqa: E402
from kvarena.spec.models import EXPECTED_BYTES, preset  # noqa: E402


def gpt_oss_20b() -> object:  # the published geometry (spec/models.py _gpt_oss): 24 layers, 8 KV heads of 64
    return transformers.GptOssConfig(num_hidden_layers=24, num_key_value_heads=8, head_dim=64, sliding_window=128,
                                     layer_types=["sliding_attention", "full_attention"] * 12, dtype="bfloat16")


def qwen3_5_4b() -> object:  # Qwen3.5-4B: 32 layers, [3 GDN -> 1 full], 4 KV heads of 256
    return transformers.Qwen3_5TextConfig(
        num_hidden_layers=32, hidden_size=2560, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_key_head_dim=128, linear_num_value_heads=32, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, dtype="bfloat16",
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
        + (["linear_attention"] * 3 + ["full_attention"]) * 6)


def entry_bytes(model: object) -> dict[str, int]:
    return {c.name: entry_layout(c).entry_bytes for c in model.classes}


def test_gpt_oss_20b_equals_the_preset_row_for_row() -> None:
    got = model_layout(gpt_oss_20b())
    want = preset("gpt-oss-20b")
    assert entry_bytes(got) == EXPECTED_BYTES["gpt-oss-20b"]
    assert {c.name: (c.kind, c.window, c.rows) for c in got.classes} == \
        {c.name: (c.kind, c.window, c.rows) for c in want.classes}


def test_qwen3_5_4b_equals_the_preset_with_sglangs_conv_width() -> None:
    got = model_layout(qwen3_5_4b(), conv_state="sglang")
    assert entry_bytes(got) == EXPECTED_BYTES["qwen3.5-4b"]
    assert {c.name: c.rows for c in got.classes} == {c.name: c.rows for c in preset("qwen3.5-4b").classes}
    # transformers keeps the whole kernel width: one more bf16 column of 8,192 channels per linear layer
    wide = entry_bytes(model_layout(qwen3_5_4b()))
    assert wide["full"] == 32768 and wide["state"] - EXPECTED_BYTES["qwen3.5-4b"]["state"] == 24 * 8192 * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_every_tiny_family_has_a_layout(family: str) -> None:
    model = model_layout(tiny_config(family))
    kinds = {c.kind.value for c in model.classes}
    assert "full" in kinds and len(kinds) == 2, kinds


@pytest.mark.parametrize(("config", "reason"), [
    (lambda: transformers.LlamaConfig(), "full layers only"),
    (lambda: transformers.Lfm2Config(num_hidden_layers=4, full_attn_idxs=[1, 3]), "geometry kvarena does not know"),
    (lambda: transformers.Llama4TextConfig(num_hidden_layers=4), "chunked attention"),
])
def test_refusals_name_the_reason(config: object, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        model_layout(config())


def test_conv_state_argument_is_checked() -> None:
    with pytest.raises(ConfigError, match="'transformers'"):
        model_layout(tiny_config("qwen3_5"), conv_state="kernel")


def test_models_hf_config(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    gpt_oss_20b().save_pretrained(tmp_path / "gpt")
    assert main(["models", "--hf-config", str(tmp_path / "gpt")]) == 0
    out = capsys.readouterr().out
    assert "24,576" in out and "12 sliding_attention, 12 full_attention" in out
    assert load_config(str(tmp_path / "gpt" / "config.json")).num_hidden_layers == 24
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 4}))
    for path, said in ((bad, "no model_type"), (tmp_path / "none.json", "cannot read")):
        assert main(["models", "--hf-config", str(path)]) == 2
        assert said in capsys.readouterr().err
    transformers.LlamaConfig().save_pretrained(tmp_path / "llama")
    assert main(["models", "--hf-config", str(tmp_path / "llama")]) == 2
    assert "plain paged pool" in capsys.readouterr().err
