"""kvarena's model layout from a transformers config: which layers hold what, in which class, in which shape.

transformers names each decoder layer's cache kind in ``layer_types`` (``get_layer_types_and_kwargs`` infers it
where a config has none): ``full_attention`` and ``sliding_attention`` keep K/V per token, ``linear_attention``
and ``conv`` a fixed conv (+ recurrent) state per request, ``hybrid`` both (Falcon-H1), ``dummy`` nothing. The
arena's classes follow (spec/arena.md §Layouts): one ``full`` class with a K and a V row per full-attention
layer, one window class per sliding-window size with the sliding layers' rows, one recurrent ``state`` class with
a ``conv`` and an ``ssm`` row per linear layer. The state shapes are the ones transformers' own
``LinearAttentionLayer`` keeps (a conv state of the whole kernel width, ``conv_state="transformers"``); SGLang and
the presets keep ``kernel - 1`` columns (``conv_state="sglang"``), which is how the presets are checked.

A family is supported when its state geometry is written below (``STATE_GEOMETRY``); anything else is refused
with the reason, as ``validate_model`` refuses what the arena cannot serve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvarena.spec.errors import ConfigError
from kvarena.spec.layout import Kind, Row, StateClass
from kvarena.spec.models import DEEPSEEK_V4_REASON, ModelSpec, validate_model

# torch dtype names (config.dtype as a string or a torch.dtype) -> the spec's row dtypes
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8", "uint8": "uint8"}
TOKEN_TYPES = ("full_attention", "sliding_attention", "hybrid")  # layers with K/V rows per token
STATE_TYPES = ("linear_attention", "conv", "hybrid")  # layers with a per-request state
REFUSED_TYPES = {
    "chunked_attention": "chunked attention keeps a restarting block of tokens, neither a suffix window nor the "
                         "whole context; no arena class describes it. Serve it with the engine's own cache",
    "heavily_compressed_attention": DEEPSEEK_V4_REASON,
    "compressed_sparse_attention": DEEPSEEK_V4_REASON,
}


def _attr(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    if default is not None:
        return default
    raise ConfigError(f"{type(cfg).__name__} has none of {names}; the layout needs one of them")


def dtype_name(dtype: Any) -> str:
    """The spec's dtype name for a torch dtype or a config's dtype string (None: torch's default, float32)."""
    name = "float32" if dtype is None else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} has no arena row type; use one of {sorted(DTYPES)}")
    return DTYPES[name]


# ---- per-request state geometry: (conv channels, conv kernel width, ssm shape) per family ----------------------

def _gated_delta(cfg: Any) -> tuple[int, int, tuple[int, ...]]:  # qwen3_5, qwen3_next: Gated DeltaNet
    nk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
    nv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    return 2 * nk * dk + nv * dv, cfg.linear_conv_kernel_dim, (nv, dk, dv)


def _mamba1(cfg: Any) -> tuple[int, int, tuple[int, ...]]:  # jamba
    inner = cfg.mamba_expand * cfg.hidden_size
    return inner, cfg.mamba_d_conv, (inner, cfg.mamba_d_state)


def _falcon_h1(cfg: Any) -> tuple[int, int, tuple[int, ...]]:  # mamba2 heads beside attention in every layer
    d_ssm = cfg.mamba_d_ssm if cfg.mamba_d_ssm is not None else cfg.mamba_expand * cfg.hidden_size
    return (d_ssm + 2 * cfg.mamba_n_groups * cfg.mamba_d_state, cfg.mamba_d_conv,
            (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state))


def _nemotron_h(cfg: Any) -> tuple[int, int, tuple[int, ...]]:  # mamba2
    inner = cfg.mamba_num_heads * cfg.mamba_head_dim
    return (inner + 2 * cfg.n_groups * cfg.ssm_state_size, cfg.conv_kernel,
            (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size))


def _bamba(cfg: Any) -> tuple[int, int, tuple[int, ...]]:  # mamba2
    inner = cfg.mamba_expand * cfg.hidden_size
    return (inner + 2 * cfg.mamba_n_groups * cfg.mamba_d_state, cfg.mamba_d_conv,
            (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state))


STATE_GEOMETRY: dict[str, Callable[[Any], tuple[int, int, tuple[int, ...]]]] = {
    "qwen3_5_text": _gated_delta, "qwen3_5": _gated_delta, "qwen3_next": _gated_delta,
    "jamba": _mamba1, "falcon_h1": _falcon_h1, "nemotron_h": _nemotron_h, "bamba": _bamba,
}
SSM_DTYPE = "fp32"  # every family above keeps its recurrent state in float32 (transformers' torch paths)


def text_config(config: Any) -> Any:
    """The decoder's config (multimodal configs nest it)."""
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def layer_types(config: Any) -> list[str]:
    """Each decoder layer's cache kind, as transformers' ``DynamicCache(config=...)`` decides it."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, _ = get_layer_types_and_kwargs(text_config(config))
    return list(types)


def model_layout(config: Any, conv_state: str = "transformers", max_context_len: int | None = None) -> ModelSpec:
    """kvarena's :class:`ModelSpec` of a transformers config: its classes, rows (shapes, dtypes), window and
    context length. Refuses (``ConfigError``, with the reason) what the arena does not serve: a layer kind with no
    arena class, a linear family whose state geometry is not written here, one kind of page only."""
    if conv_state not in ("transformers", "sglang"):
        raise ConfigError(f"conv_state {conv_state!r}: use 'transformers' (the kernel width, what transformers "
                          "keeps) or 'sglang' (kernel - 1 columns, what SGLang and the presets keep)")
    cfg = text_config(config)
    kind = getattr(cfg, "model_type", type(cfg).__name__)
    types = layer_types(cfg)
    for t in sorted(set(types) & set(REFUSED_TYPES)):
        raise ConfigError(f"{kind}: {t} layers are not supported by the unified arena: {REFUSED_TYPES[t]}")
    unknown = sorted(set(types) - {*TOKEN_TYPES, *STATE_TYPES, "dummy"})
    if unknown:
        raise ConfigError(f"{kind}: layer kinds {unknown} have no arena class (known: full_attention, "
                          "sliding_attention, linear_attention, conv, hybrid, dummy)")
    dt = dtype_name(getattr(cfg, "dtype", None))
    heads = _attr(cfg, "num_key_value_heads", "num_attention_heads")
    head_dim = _attr(cfg, "head_dim", default=cfg.hidden_size // cfg.num_attention_heads)
    full: list[Row] = []
    windows: dict[int, list[Row]] = {}
    state: list[Row] = []
    for i, t in enumerate(types):
        kv = [Row(i, "k", (heads, head_dim), dt), Row(i, "v", (heads, head_dim), dt)]
        if t in ("full_attention", "hybrid"):
            full += kv
        elif t == "sliding_attention":
            windows.setdefault(int(_attr(cfg, "sliding_window")), []).extend(kv)
        if t in STATE_TYPES:
            if kind not in STATE_GEOMETRY:
                raise ConfigError(f"{kind}: its {t} layers keep a per-request state whose geometry kvarena does not "
                                  f"know yet (families with one: {sorted(set(STATE_GEOMETRY))}); add it to "
                                  "kvarena.engines.transformers.layout.STATE_GEOMETRY")
            channels, kernel, ssm = STATE_GEOMETRY[kind](cfg)
            width = kernel if conv_state == "transformers" else kernel - 1
            state += [Row(i, "conv", (channels, width), dt), Row(i, "ssm", ssm, SSM_DTYPE)]
    classes: list[StateClass] = []
    if full:
        classes.append(StateClass("full", Kind.FULL, tuple(full)))
    for w, rows in sorted(windows.items(), reverse=True):
        name = "window" if len(windows) == 1 else f"window{w}"
        classes.append(StateClass(name, Kind.WINDOW, tuple(rows), window=w))
    if state:
        classes.append(StateClass("state", Kind.RECURRENT, tuple(state)))
    width_is_kernel = conv_state == "transformers"
    ctx = max_context_len or int(_attr(cfg, "max_position_embeddings", default=131072))
    model = ModelSpec(name=getattr(config, "name_or_path", "") or kind, classes=tuple(classes), max_context_len=ctx,
                      source=f"transformers {type(cfg).__name__} ({_summary(types)})",
                      assumptions=(f"token rows {dt} (the config's dtype)",) + ((
                          f"conv state of {'the kernel width' if width_is_kernel else 'kernel - 1'} columns "
                          f"({'as transformers keeps it' if width_is_kernel else 'as SGLang keeps it'}); SSM state "
                          "fp32",) if state else ()))
    validate_model(model)
    return model


def _summary(types: list[str]) -> str:
    """``24 layers: 12 full_attention, 12 sliding_attention (window 128)``-style counts, in first-seen order."""
    counts = {t: types.count(t) for t in dict.fromkeys(types)}
    return f"{len(types)} layers: " + ", ".join(f"{n} {t}" for t, n in counts.items())


def load_config(path: str) -> Any:
    """A transformers config from a ``config.json`` (or a folder holding one); nothing is downloaded."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror}; pass a config.json or a folder holding one") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{p} is not a JSON config ({e}); pass a transformers config.json") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{p} has no model_type; pass a transformers config.json")
    kind = data.pop("model_type")
    try:
        return AutoConfig.for_model(kind, **data)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{p}: transformers 5.23.0 does not know model_type {kind!r} ({e})") from None
