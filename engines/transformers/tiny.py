"""Tiny random-weight configs of the hybrid families, built in code (nothing is downloaded): what the tests, the
README example and the benches run a real transformers model on.

Each has 4 layers of hidden size 64 and small windows, so a few pages per request fill, slide and free on a CPU
in well under a second per ``generate``.
"""

from __future__ import annotations

from typing import Any

_ATTN = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256)
_GDN = dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])

FAMILIES = ("gpt_oss", "gemma3", "qwen3_5", "qwen3_next", "jamba", "falcon_h1", "nemotron_h")


def tiny_config(family: str, sliding_window: int = 8) -> Any:
    """A 4-layer (Falcon-H1: 2 hybrid layers) random-weight config of ``family`` (one of ``FAMILIES``)."""
    import transformers as tf

    if family == "gpt_oss":
        return tf.GptOssConfig(**_ATTN, num_hidden_layers=4, sliding_window=sliding_window, num_local_experts=4,
                               num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"] * 2)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**_ATTN, num_hidden_layers=4, sliding_window=sliding_window,
                                   layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                "sliding_attention"])
    if family == "qwen3_5":
        return tf.Qwen3_5TextConfig(**_ATTN, **_GDN, num_hidden_layers=4)
    if family == "qwen3_next":
        return tf.Qwen3NextConfig(**_ATTN, **_GDN, num_hidden_layers=4, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    if family == "jamba":
        attn = {k: v for k, v in _ATTN.items() if k != "head_dim"}
        return tf.JambaConfig(**attn, num_hidden_layers=4, num_experts=2, num_experts_per_tok=1, expert_layer_period=2,
                              attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4,
                              mamba_expand=2, mamba_dt_rank=8)
    if family == "falcon_h1":
        return tf.FalconH1Config(**_ATTN, num_hidden_layers=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                                 mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=1)
    if family == "nemotron_h":
        return tf.NemotronHConfig(**_ATTN, num_hidden_layers=4, mamba_num_heads=4, mamba_head_dim=16, n_groups=1,
                                  ssm_state_size=8, conv_kernel=4, expand=1, hybrid_override_pattern="M*M-")
    raise ValueError(f"unknown family {family!r}; use one of {FAMILIES}")


def tiny_model(family: str, seed: int = 0, **kw: Any) -> Any:
    """``AutoModelForCausalLM`` of ``tiny_config(family)`` with seeded random weights, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(family, **kw)).eval()
