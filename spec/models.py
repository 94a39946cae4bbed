"""Model geometries and arena configuration (spec/arena.md §Layouts, §Configuration and refusals).

Presets carry the exact per-layer rows of each hybrid model.  Numbers come from
the published configs listed in ../shared/anchors/peers-and-models.md §5;
``assumptions`` on each preset names every number that is not read from a
config (state dtypes, DSA index-key geometry, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvarena.spec.errors import ConfigError
from kvarena.spec.guards import check_config_int, check_config_ratio, is_int
from kvarena.spec.layout import Kind, Row, StateClass, entries_per_page, entry_layout, page_bytes

# ---------------------------------------------------------------------------------------------
# Row builders: one function per layer family, so a preset reads like its config.json.


def mha_rows(layers: range | list[int], kv_heads: int, head_dim: int, dtype: str = "bf16",
             v_head_dim: int | None = None, prefix: str = "") -> tuple[Row, ...]:
    """K and V rows of standard (GQA) attention layers."""
    vd = head_dim if v_head_dim is None else v_head_dim
    rows: list[Row] = []
    for layer in layers:
        rows.append(Row(layer, prefix + "k", (kv_heads, head_dim), dtype))
        rows.append(Row(layer, prefix + "v", (kv_heads, vd), dtype))
    return tuple(rows)


def mla_rows(layers: range | list[int], kv_lora_rank: int, qk_rope_head_dim: int,
             dtype: str = "bf16") -> tuple[Row, ...]:
    """One compressed latent row (c_kv + k_rope) per MLA layer."""
    return tuple(Row(layer, "latent", (1, kv_lora_rank + qk_rope_head_dim), dtype) for layer in layers)


def dsa_index_rows(layers: range | list[int], index_head_dim: int = 128) -> tuple[Row, ...]:
    """DeepSeek-sparse-attention indexer keys: fp8 key plus an fp32 scale (padded to 16 B) per layer."""
    rows: list[Row] = []
    for layer in layers:
        rows.append(Row(layer, "index_k", (index_head_dim,), "fp8"))
        rows.append(Row(layer, "index_scale", (4,), "fp32"))  # 1 scale + 3 pad lanes = 16 B
    return tuple(rows)


def gated_delta_rows(layers: range | list[int], conv_dim: int, conv_kernel: int, v_heads: int,
                     k_dim: int, v_dim: int, ssm_dtype: str = "fp32",
                     conv_dtype: str = "bf16") -> tuple[Row, ...]:
    """Gated-DeltaNet / KDA state: short-conv window plus the recurrent (heads, d_k, d_v) matrix."""
    rows: list[Row] = []
    for layer in layers:
        rows.append(Row(layer, "conv", (conv_dim, conv_kernel - 1), conv_dtype))
        rows.append(Row(layer, "ssm", (v_heads, k_dim, v_dim), ssm_dtype))
    return tuple(rows)


def mamba1_rows(layers: range | list[int], d_inner: int, d_conv: int, d_state: int,
                ssm_dtype: str = "fp32", conv_dtype: str = "bf16") -> tuple[Row, ...]:
    rows: list[Row] = []
    for layer in layers:
        rows.append(Row(layer, "conv", (d_inner, d_conv - 1), conv_dtype))
        rows.append(Row(layer, "ssm", (d_inner, d_state), ssm_dtype))
    return tuple(rows)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A hybrid model as the arena sees it: its state classes and context limit."""

    name: str
    classes: tuple[StateClass, ...]
    max_context_len: int
    source: str = ""
    assumptions: tuple[str, ...] = ()
    refusal: str = ""  # a named model the arena refuses to serve: why, and what to do instead (validate_model)

    def cls(self, name: str) -> StateClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise ConfigError(f"model {self.name} has no state class {name!r}; use one of "
                          f"{[c.name for c in self.classes]}")

    def bytes_per_token(self, kind: Kind) -> int:
        return sum(entry_layout(c).entry_bytes for c in self.classes if c.kind is kind)


def chain(model: ModelSpec) -> tuple[StateClass, ...]:
    """Band order from byte 0 up: recurrent state, windows (longest first), full attention.

    The first class is the low end band (grows up from 0), the last the high end
    band (grows down from the top), the rest are float bands between them.
    """
    def rank(c: StateClass) -> tuple[int, int]:
        order = {Kind.RECURRENT: 0, Kind.WINDOW: 1, Kind.FULL: 2}[c.kind]
        return (order, -c.window)

    return tuple(sorted(model.classes, key=rank))


def validate_model(model: ModelSpec) -> None:
    """Refuse models the unified arena cannot serve well, saying why."""
    if model.refusal:
        raise ConfigError(f"model {model.name} is not supported by the unified arena: {model.refusal}")
    names = [c.name for c in model.classes]
    if len(set(names)) != len(names):
        raise ConfigError(f"model {model.name}: duplicate state class names {names}; names must be unique")
    kinds = {c.kind for c in model.classes}
    if len(model.classes) < 2:
        only = model.classes[0].kind.value if model.classes else "no"
        raise ConfigError(
            f"model {model.name} has {only} layers only: one kind of page needs no shared arena "
            "(nothing to trade between bands); serve it with a plain paged pool")
    if Kind.FULL not in kinds:
        raise ConfigError(f"model {model.name} has no full-attention class; the high end band holds "
                          "full-attention KV, so add one or use a plain slot pool")
    if sum(1 for c in model.classes if c.kind is Kind.FULL) > 1:
        raise ConfigError(f"model {model.name} has more than one full-attention class; merge their rows "
                          "into one class (one entry holds every full-attention layer)")
    if sum(1 for c in model.classes if c.kind is Kind.RECURRENT) > 1:
        raise ConfigError(f"model {model.name} has more than one recurrent class; merge their rows into "
                          "one class (one slot holds every recurrent layer)")
    check_config_int(model.max_context_len, f"model {model.name}: max_context_len", 1, "an int > 0 (tokens)")
    mla = [c.name for c in model.classes if any(r.part == "latent" for r in c.rows)]
    windows = [c.name for c in model.classes if c.kind is Kind.WINDOW]
    if mla and windows:
        raise ConfigError(
            f"model {model.name} pairs MLA latent rows (class {mla[0]!r}) with sliding-window layers (class "
            f"{windows[0]!r}): {MLA_SWA_REASON}")


# Why an MLA latent class never pairs with a window class (validate_model), and why DeepSeek-V4 is refused.
MLA_SWA_REASON = (
    "the contract specifies no such pair: SGLang 0.5.23's unified pool refuses it too (\"does not support MLA-SWA "
    "hybrid yet\", kv_cache_configurator.py:1476-1478), so no engine it is checked against serves one, and no vector, "
    "proof or adapter covers it; the models that pair them (DeepSeek-V4) also keep per-request compressor state that "
    "is neither a window page nor one recurrent slot. Serve this model with split pools, not the unified arena")
DEEPSEEK_V4_REASON = (
    "SGLang 0.5.23 excludes it from unified memory (\"only supports hybrid Mamba and hybrid sliding-window-attention "
    "models (DeepSeek-V4 excluded)\", kv_cache_configurator.py:633-643); its layers pair DeepSeek's compressed "
    "(MLA-style) KV with sliding-window layers (the kvcache-ai fork sizes a window pool for it at "
    "--swa-full-tokens-ratio 0.1), the pair refused for every model, and keep tiny-window compressor state per "
    "request (vLLM #54703), which none of the arena's kinds (full, window, recurrent) describes; no geometry of it "
    "is pinned here. Serve it with its engine's own pools")


# Sizing hints SGLang uses for split pools; in the arena they only place float bands.
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass(frozen=True)
class ArenaConfig:
    """Everything fixed at construction."""

    model: ModelSpec
    capacity: int  # bytes of the arena
    page_size: int = 64  # tokens per page of token classes
    swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_full_memory_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    max_context_len: int | None = None  # defaults to the model's
    # recurrent pages one owner may hold (spec/arena.md §INV-STATE-PRIVATE): 1, one state per request; SGLang's
    # extra_buffer mode holds 1 + 2 tracking slots per running request (3). The floor stays one admission of
    # the model's shape (one state): further slots are extensions, refused like any growth when they do not fit
    recurrent_slots: int = 1

    @property
    def context_len(self) -> int:
        return self.max_context_len if self.max_context_len is not None else self.model.max_context_len

    def page_bytes(self, cls_name: str) -> int:
        return page_bytes(self.model.cls(cls_name), self.page_size)

    def validate(self) -> None:
        validate_model(self.model)
        # Types first, in each field's own check: a float or a str would fail later as a bare TypeError (page_size
        # & ...), a float capacity or context length is rounded nowhere, and a bool is never a size (True is 1).
        if not is_int(self.page_size) or self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise ConfigError(f"page_size {self.page_size!r} must be an int power of two > 0 (e.g. 16, 64)")
        check_config_int(self.capacity, "capacity", 1, "an int > 0 (bytes of the arena)")
        check_config_ratio(self.swa_full_tokens_ratio, "swa_full_tokens_ratio", 1, "a number in (0, 1] (e.g. 0.8)")
        check_config_ratio(self.mamba_full_memory_ratio, "mamba_full_memory_ratio", None,
                           "a finite number > 0 (e.g. 0.9)")
        if self.max_context_len is not None:  # else the model's, checked by validate_model
            check_config_int(self.max_context_len, "max_context_len", 1, "None (the model's) or an int > 0 (tokens)")
        if not isinstance(self.recurrent_slots, int) or isinstance(self.recurrent_slots, bool) \
                or self.recurrent_slots < 1:
            raise ConfigError(f"recurrent_slots {self.recurrent_slots!r} must be an int >= 1 (recurrent pages one "
                              "owner may hold: 1, or 3 for SGLang's extra_buffer mode)")


# What the operation guards (spec/guards.py) need of a configuration: the same for every implementation of it.
@dataclass(frozen=True)
class Shape:
    """What the guards need of the configuration, the same for every implementation of it."""

    order: tuple[str, ...]  # classes in chain order (low end first)
    capacity: int
    top: Mapping[str, int]  # pages on each class's grid
    page_bytes: Mapping[str, int]
    state: frozenset[str]  # the recurrent classes
    entries: Mapping[str, int]  # entries per page
    rows: Mapping[str, int]  # rows per entry
    recurrent_slots: int

    @classmethod
    def of(cls, config: ArenaConfig) -> Shape:
        """The shape of ``config`` (validated)."""
        classes = chain(config.model)
        pb = {c.name: config.page_bytes(c.name) for c in classes}
        return cls(tuple(c.name for c in classes), config.capacity, {n: config.capacity // p for n, p in pb.items()},
                   pb, frozenset(c.name for c in classes if c.kind is Kind.RECURRENT),
                   {c.name: entries_per_page(c, config.page_size) for c in classes},
                   {c.name: len(entry_layout(c).slots) for c in classes}, config.recurrent_slots)

    def is_state(self, cls: str) -> bool:
        return cls in self.state

    @property
    def ends(self) -> dict[str, tuple[int, bool]]:
        """End-band class -> (page bytes, whether it is the low band): what a placement limit may name."""
        return {self.order[0]: (self.page_bytes[self.order[0]], True),
                self.order[-1]: (self.page_bytes[self.order[-1]], False)}


def request_pages(model: ModelSpec, page_size: int, tokens: int) -> dict[str, int]:
    """Pages per class that a request holding ``tokens`` tokens needs at once."""
    full_pages = -(-tokens // page_size)
    demand: dict[str, int] = {}
    for c in model.classes:
        if c.kind is Kind.FULL:
            demand[c.name] = full_pages
        elif c.kind is Kind.WINDOW:
            # a window of W tokens not aligned to a page touches ceil(W/ps)+1 pages
            demand[c.name] = min(full_pages, -(-c.window // page_size) + 1)
        else:
            demand[c.name] = 1
    return demand


def worst_case_demand(config: ArenaConfig) -> dict[str, int]:
    """Pages one request of ``context_len`` tokens needs at its peak, per class."""
    return request_pages(config.model, config.page_size, config.context_len)


# ---------------------------------------------------------------------------------------------
# Presets. Layer indices follow each config's layer_types / interval.

GiB = 1 << 30


def _gpt_oss(name: str, n_layers: int) -> ModelSpec:
    sliding = list(range(0, n_layers, 2))  # layer_types alternate, starting with sliding
    full = list(range(1, n_layers, 2))
    return ModelSpec(
        name=name,
        classes=(
            StateClass("full", Kind.FULL, mha_rows(full, kv_heads=8, head_dim=64)),
            StateClass("window", Kind.WINDOW, mha_rows(sliding, kv_heads=8, head_dim=64), window=128),
        ),
        max_context_len=131072,
        source="transformers GptOssConfig; HF config (layer_types, 8 KV heads, head_dim 64, sliding_window 128)",
        assumptions=("attention sinks are weights, not KV: no row",),
    )


def _gpt_oss_eagle3() -> ModelSpec:
    """GPT-OSS-20B served with an EAGLE3 draft layer whose KV rows are fused into the target's full-attention
    entries, in another dtype: target K/V fp8 (stored as uint8), draft K/V bf16 (spec/arena.md §Integrations,
    speculative decoding). Full entry: 12 target layers x (512 + 512) B + the draft's 1,024 + 1,024 B = 14,336 B;
    window entry: 12 x 1,024 B = 12,288 B. The rows are declared target first, then draft, as SGLang's fused draft
    lays them out (``MHASubPoolSpec.layout``: ``[K_0|V_0|...|dK_0|dV_0|pad]``), so one allocation, one free and one
    whole-page move carry both."""
    sliding = list(range(0, 24, 2))
    full = list(range(1, 24, 2))
    return ModelSpec(
        name="gpt-oss-20b-eagle3",
        classes=(
            StateClass("full", Kind.FULL, mha_rows(full, kv_heads=8, head_dim=64, dtype="fp8")
                       + mha_rows([24], kv_heads=8, head_dim=64, dtype="bf16", prefix="draft_")),
            StateClass("window", Kind.WINDOW, mha_rows(sliding, kv_heads=8, head_dim=64, dtype="fp8"), window=128),
        ),
        max_context_len=131072,
        source="gpt-oss-20b as above; EAGLE3 draft: SpecForge configs/gpt-oss-20B-eagle3.json (copy at "
               "zyksir/SpecForgeLocalDev @a44d97d: 1-layer LlamaForCausalLMEagle3, 8 KV heads, head_dim 64, "
               "bfloat16); fused draft placement: SGLang 0.5.23 layout/fused_draft.py, MHASubPoolSpec "
               "(../shared/anchors/sglang-unified-memory.md §2.8); gpt-oss + EAGLE3 pool sizing: sglang PR #17630 "
               "(peers-and-models.md §4)",
        assumptions=("target KV fp8 (--kv-cache-dtype fp8_e4m3) in every target layer, full and sliding, stored as "
                     "uint8 (SGLang's _store_dtype_for); the draft's KV stays bf16 (its torch_dtype): a fused entry "
                     "holds rows of two dtypes",
                     "the draft layer is full attention (it attends to the whole context), so its rows join the "
                     "full class and the window class has none; it is numbered layer 24, after the target's 24",
                     "speculative_eagle_topk 1 (SGLang's unified memory refuses tree verify): accepted draft tokens "
                     "stay where they were written; a step's rejected tokens are given back by the caller "
                     "(drop/slide of whole pages), never relocated",
                     "entry bytes equal SGLang's align32(align16(host) + draft) = 12,288 + 2,048 = 14,336 B",
                     "attention sinks are weights, not KV: no row"),
    )


def _qwen_gdn(name: str, n_layers: int, kv_heads: int, ctx: int, source: str) -> ModelSpec:
    full = list(range(3, n_layers, 4))  # full_attention_interval 4: [3 GDN -> 1 attn]
    gdn = [i for i in range(n_layers) if i not in full]
    # conv_dim = 2 * (16 QK heads * 128) + 32 V heads * 128
    return ModelSpec(
        name=name,
        classes=(
            StateClass("full", Kind.FULL, mha_rows(full, kv_heads=kv_heads, head_dim=256)),
            StateClass("state", Kind.RECURRENT,
                       gated_delta_rows(gdn, conv_dim=8192, conv_kernel=4, v_heads=32, k_dim=128, v_dim=128)),
        ),
        max_context_len=ctx,
        source=source,
        assumptions=("SSM state fp32 (SGLang default --mamba-ssm-dtype float32); conv state bf16",),
    )


def _kimi_linear() -> ModelSpec:
    mla = [3, 7, 11, 15, 19, 23, 26]  # full_attn_layers [4, 8, ..., 27], 1-indexed
    kda = [i for i in range(27) if i not in mla]
    return ModelSpec(
        name="kimi-linear-48b-a3b",
        classes=(
            StateClass("full", Kind.FULL, mla_rows(mla, kv_lora_rank=512, qk_rope_head_dim=64)),
            # KDA: short conv on q, k and v (3 * 32 heads * 128) and a 32 x 128 x 128 state
            StateClass("state", Kind.RECURRENT,
                       gated_delta_rows(kda, conv_dim=3 * 32 * 128, conv_kernel=4, v_heads=32, k_dim=128,
                                        v_dim=128)),
        ),
        max_context_len=1048576,
        source="moonshotai/Kimi-Linear-48B-A3B-Instruct config @e1df551; transformers KimiLinearConfig",
        assumptions=("KDA state fp32, conv bf16",
                     "short conv on q, k, v each of 32 heads x 128 (conv_dim 12288)"),
    )


def _kimi_k3() -> ModelSpec:
    n_layers = 93
    mla = [i for i in range(n_layers) if i % 4 == 3 or i == n_layers - 1]  # 3:1 KDA:MLA, last layer full
    kda = [i for i in range(n_layers) if i not in mla]
    return ModelSpec(
        name="kimi-k3",
        classes=(
            StateClass("full", Kind.FULL,
                       mla_rows(mla, kv_lora_rank=512, qk_rope_head_dim=64) + dsa_index_rows(mla)),
            StateClass("state", Kind.RECURRENT,
                       gated_delta_rows(kda, conv_dim=3 * 96 * 128, conv_kernel=4, v_heads=96, k_dim=128,
                                        v_dim=128)),
        ),
        max_context_len=262144,
        source="moonshotai/Kimi-K3 config @9f62e4e (93 layers, 24 gated-MLA, kv_lora 512, rope 64, 96 heads)",
        assumptions=("DSA index keys: 128-dim fp8 key + fp32 scale per MLA layer (DeepSeek-V3.2 indexer "
                     "geometry; not in the pinned config)",
                     "KDA head_dim 128 and conv over q, k, v as in Kimi Linear",
                     "max_context_len 262144 (not verified)"),
    )


def _jamba_mini() -> ModelSpec:
    attn = list(range(4, 32, 8))  # attn_layer_period 8, offset 4
    mamba = [i for i in range(32) if i not in attn]
    return ModelSpec(
        name="jamba-1.5-mini",
        classes=(
            StateClass("full", Kind.FULL, mha_rows(attn, kv_heads=8, head_dim=128)),
            StateClass("state", Kind.RECURRENT, mamba1_rows(mamba, d_inner=8192, d_conv=4, d_state=16)),
        ),
        max_context_len=262144,
        source="transformers JambaConfig (= Jamba v0.1 geometry); HF config copies",
        assumptions=("Jamba-1.5-Mini geometry equals Jamba v0.1", "Mamba state fp32, conv bf16"),
    )


def _gemma3_27b() -> ModelSpec:
    full = list(range(5, 62, 6))  # sliding_window_pattern 6: every 6th layer is global
    local = [i for i in range(62) if i not in full]
    return ModelSpec(
        name="gemma-3-27b",
        classes=(
            StateClass("full", Kind.FULL, mha_rows(full, kv_heads=16, head_dim=128)),
            StateClass("window", Kind.WINDOW, mha_rows(local, kv_heads=16, head_dim=128), window=1024),
        ),
        max_context_len=131072,
        source="unsloth/gemma-3-27b-it config @7a5a305 (62 layers, 16 KV heads, head_dim 128, window 1024)",
    )


def _hymba_1_5b() -> ModelSpec:
    """Hybrid-head layers: every layer runs attention heads and a Mamba head in parallel, so every layer has
    a state row, and its attention is full (3 layers) or a sliding window (the other 29)."""
    full = [0, 15, 31]  # global_attn_idx
    # kv_reuse_group [[1, 2], [3, 4], ..., [13, 14], [16, 17, 18], [19, 20], ..., [29, 30]]: the first layer
    # of a group computes K/V, the rest read it; a consumer layer has no KV rows of its own, so only the 14
    # producers carry rows.
    groups = [[i, i + 1] for i in range(1, 15, 2)] + [[16, 17, 18]] + [[i, i + 1] for i in range(19, 31, 2)]
    producers = [g[0] for g in groups]
    return ModelSpec(
        name="hymba-1.5b",
        classes=(
            StateClass("full", Kind.FULL, mha_rows(full, kv_heads=5, head_dim=64)),
            # 128 meta tokens stay in every SWA layer's cache beside the 1,024-token window: 1,024 + 128
            StateClass("window", Kind.WINDOW, mha_rows(producers, kv_heads=5, head_dim=64), window=1024 + 128),
            # d_inner = mamba_expand 2 x hidden 1600 = 3200 (the config's conv_dim), d_conv 4, d_state 16
            StateClass("state", Kind.RECURRENT, mamba1_rows(range(32), d_inner=3200, d_conv=4, d_state=16)),
        ),
        max_context_len=8192,
        source="nvidia/Hymba-1.5B-Base config.json (hidden 1600, 32 layers, global_attn_idx [0, 15, 31], "
               "kv_reuse_group, conv_dim 3200, mamba_d_state 16, d_conv 4, expand 2; Hymba-1.5B-Instruct config "
               "@beddbb2 the same); model card (25 heads, 16 SSM states, 3 full-attention layers); arXiv 2411.13676",
        assumptions=("num_key_value_heads 5, sliding_window 1024, num_memory_tokens 128: read from a third-party "
                     "copy of the config, not the pinned config itself",
                     "head_dim = hidden 1600 / 25 heads = 64 (kq_head_dim -1: the default)",
                     "one Mamba head per layer (num_mamba 1, the HymbaConfig default)",
                     "max_context_len 8192 (max_position_embeddings not verified)",
                     "KV bf16; Mamba SSM state fp32, conv state bf16 (SGLang's defaults; torch_dtype not verified)",
                     "cross-layer KV sharing: consumer layers of each kv_reuse_group hold no rows (14 window "
                     "layers with rows of 29); the 3 global layers share nothing",
                     "meta tokens: their 128 KV entries in each SWA layer are modelled as 128 more window tokens "
                     "(same pages per request: ceil(1024/64) + 1 + 128/64 = 19 at page 64); in full layers "
                     "they are prompt tokens the caller counts"),
    )


PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "gpt-oss-20b": lambda: _gpt_oss("gpt-oss-20b", 24),
    "gpt-oss-120b": lambda: _gpt_oss("gpt-oss-120b", 36),
    "gpt-oss-20b-eagle3": _gpt_oss_eagle3,
    "qwen3.5-4b": lambda: _qwen_gdn("qwen3.5-4b", 32, kv_heads=4, ctx=262144,
                                    source="transformers Qwen3_5TextConfig; sglang PR #39851 (~51 MB state)"),
    "qwen3-next-80b-a3b": lambda: _qwen_gdn("qwen3-next-80b-a3b", 48, kv_heads=2, ctx=262144,
                                            source="Qwen/Qwen3-Next-80B-A3B-Instruct config @9c7f2fb"),
    "kimi-linear-48b-a3b": _kimi_linear,
    "kimi-k3": _kimi_k3,
    "jamba-1.5-mini": _jamba_mini,
    "gemma-3-27b": _gemma3_27b,
    "hymba-1.5b": _hymba_1_5b,
}


def _tiny(name: str, with_state: bool, with_window: bool) -> ModelSpec:
    """Toy geometries for tests and vectors: small pages, every band kind, odd page sizes."""
    classes = [StateClass("full", Kind.FULL, mha_rows([1, 3], kv_heads=1, head_dim=8))]  # 64 B entries
    if with_window:
        classes.append(StateClass("window", Kind.WINDOW, mha_rows([0, 2], kv_heads=1, head_dim=16), window=8))
    if with_state:
        classes.append(StateClass("state", Kind.RECURRENT,
                                  gated_delta_rows([0], conv_dim=8, conv_kernel=2, v_heads=1, k_dim=2,
                                                   v_dim=4)))  # 16 + 32 B -> 64 B slot
    return ModelSpec(name, tuple(classes), max_context_len=32, source="toy geometry for tests")


def _toy_dsa() -> ModelSpec:
    """Kimi K3's entry shape at toy size: per MLA layer a latent row, and DSA index keys (fp8 key + fp32 scale)
    beside it in the same full-attention entry (latent rows first, then the index rows, as in kimi-k3)."""
    mla = [1, 3]
    return ModelSpec("toy-dsa", (
        StateClass("full", Kind.FULL, mla_rows(mla, kv_lora_rank=16, qk_rope_head_dim=8)  # 2 x 48 B latent
                   + dsa_index_rows(mla, index_head_dim=16)),  # 2 x (16 B key + 16 B scale): 160 B entries
        StateClass("state", Kind.RECURRENT, gated_delta_rows([0, 2], conv_dim=8, conv_kernel=2, v_heads=1, k_dim=2,
                                                             v_dim=4)),  # 2 x (16 + 32) B: 96 B slots
    ), max_context_len=32, source="toy geometry for tests: kimi-k3's MLA latent + DSA index rows, KDA state")


def _toy_floats(name: str, with_state: bool) -> ModelSpec:
    """Two window classes of different width: with state, two float bands between the ends; without, a chain whose
    low end and only float are both windows (every shipped preset has at most one float band)."""
    classes = [StateClass("full", Kind.FULL, mha_rows([3], kv_heads=1, head_dim=8)),  # 32 B entries
               StateClass("long", Kind.WINDOW, mha_rows([1], kv_heads=1, head_dim=16), window=16),  # 64 B
               StateClass("short", Kind.WINDOW, mha_rows([2], kv_heads=3, head_dim=8), window=8)]  # 96 B
    if with_state:
        classes.append(StateClass("state", Kind.RECURRENT, gated_delta_rows([0], conv_dim=8, conv_kernel=2, v_heads=1,
                                                                            k_dim=2, v_dim=4)))  # 64 B slot
    return ModelSpec(name, tuple(classes), max_context_len=32, source="toy geometry for tests: two window widths")


TOY_MODELS: dict[str, Callable[[], ModelSpec]] = {
    "toy-tri": lambda: _tiny("toy-tri", True, True),  # state (low) | window (float) | full (high)
    "toy-swa": lambda: _tiny("toy-swa", False, True),  # window (low) | full (high)
    "toy-state": lambda: _tiny("toy-state", True, False),  # state (low) | full (high)
    "toy-dsa": _toy_dsa,  # state (low) | MLA latent + DSA index keys (high)
    "toy-two-float": lambda: _toy_floats("toy-two-float", True),  # state | long window | short window | full
    "toy-win-float": lambda: _toy_floats("toy-win-float", False),  # long window (low) | short window | full
}

# Named configurations the arena refuses when an arena is built (ArenaConfig.validate), each with its reason:
# reachable by name (``preset``) so a refusal can be a vector step, never listed among the servable presets.
REFUSED_MODELS: dict[str, Callable[[], ModelSpec]] = {
    "deepseek-v4": lambda: ModelSpec("deepseek-v4", (), max_context_len=1, refusal=DEEPSEEK_V4_REASON,
                                     source="../shared/anchors/sglang-unified-memory.md §6; peers-and-models.md §4"),
    "toy-mla-swa": lambda: ModelSpec("toy-mla-swa", (
        StateClass("full", Kind.FULL, mla_rows([1, 3], kv_lora_rank=16, qk_rope_head_dim=8)),
        StateClass("window", Kind.WINDOW, mha_rows([0, 2], kv_heads=1, head_dim=16), window=8),
    ), max_context_len=32, source="toy: an MLA full class beside a sliding-window class"),
    "toy-full-only": lambda: ModelSpec("toy-full-only", (
        StateClass("full", Kind.FULL, mha_rows([0, 1], kv_heads=1, head_dim=8)),), max_context_len=32,
        source="toy: full-attention layers only"),
}


def preset(name: str) -> ModelSpec:
    try:
        return {**PRESETS, **TOY_MODELS, **REFUSED_MODELS}[name]()
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)} "
                          f"(toys for tests: {sorted(TOY_MODELS)}; refused, with the reason: "
                          f"{sorted(REFUSED_MODELS)})") from None


# Published per-token / per-sequence figures the presets must reproduce (peers-and-models.md §5; one derived).
EXPECTED_BYTES: dict[str, dict[str, int]] = {
    "gpt-oss-20b": {"full": 24576, "window": 24576},
    "gpt-oss-120b": {"full": 36864, "window": 36864},
    # derived from published figures, not published: gpt-oss-20b's rows at 1 B (fp8), plus the bf16 draft layer
    "gpt-oss-20b-eagle3": {"full": 12 * 1024 + 2 * 1024, "window": 12 * 1024},
    "qwen3.5-4b": {"full": 32768, "state": 51511296},
    "qwen3-next-80b-a3b": {"full": 24576, "state": 36 * 2146304},
    "kimi-linear-48b-a3b": {"full": 8064, "state": 20 * 2170880},
    "jamba-1.5-mini": {"full": 16384, "state": 28 * 573440},
    "gemma-3-27b": {"full": 81920, "window": 425984},
}


@dataclass(frozen=True)
class Summary:
    name: str
    per_class: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # kind, entry B, page B


def summarize(config: ArenaConfig) -> Summary:
    return Summary(config.model.name, {
        c.name: (c.kind.value, entry_layout(c).entry_bytes, page_bytes(c, config.page_size))
        for c in config.model.classes})
