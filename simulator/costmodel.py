"""The cost model of one forward pass on one H200: *modeled*, not measured.

One scheduler step is one forward pass over a mixed batch (every decoding request's next token plus
the prefill chunks of the step). Its time is the larger of the memory time and the compute time:

    step_s = max(bytes / (HBM_PEAK_BYTES_PER_S x HBM_EFFICIENCY), flops / COMPUTE_FLOPS_PER_S)

    bytes  = weights                                (every step reads all of them, experts included)
           + full-attention KV each decode token reads  (context tokens x full entry bytes)
           + window KV each decode token reads          (min(context, window) x window entry bytes)
           + recurrent state, read and written back     (per decoding / prefilling request)
           + prefix KV each prefill chunk reads once, and the KV every new token writes
           + 2 x bytes the allocator moved this step     (each move reads and writes a page)
    flops  = 2 x active parameters per token (decode and prefill tokens)
           + 4 x query heads x head_dim per (query token, context token) pair per attention layer
           + 4 flops per recurrent-state element per token (decay, rank-1 update, read-out)

One constant is FITTED, not taken from a datasheet: ``HBM_EFFICIENCY``, the share of the HBM bandwidth
the memory-bound steps (decode) achieve (memory-bandwidth utilization, MBU). It stands for everything
the byte count leaves out of a decode step: MoE and attention kernels below the roofline, kernel launch,
sampling, the scheduler's per-request work. It was fitted once, by ``python -m kvarena.simulator.calibrate
hbm-efficiency`` (bisection), so that the split pools reproduce the published split TTFT p50 of
``gpt-oss-20b-c1000`` (43 s), and is applied to every preset and configuration. Compute-bound steps
(prefill chunks) stay at ``COMPUTE_EFFICIENCY`` of the dense peak (an assumption, not fitted), so the
unified TTFT of that preset, which is prefill-bound, is a prediction. Use the model to compare
configurations with each other; its absolute seconds rest on that one fit.

Two other one-constant forms were set by hand near the same split TTFT and not taken (2026-12-01; unified /
split TTFT of c1000 against the published 0.14, and gpt-oss-20b-ratio's throughput 0.1 / 0.8 against 0.88):
a fixed overhead per step (25.5 ms, split 42.8 s: 0.152 and 0.692; it also slows every prefill chunk) and an
overhead per decode token (42 us, split 41.1 s: 0.119 and 0.822). The bandwidth share gives 0.114 and 0.844
and keeps the roofline's form.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvarena.spec.errors import ConfigError
from kvarena.spec.layout import Kind, entry_layout
from kvarena.spec.models import ModelSpec


@dataclass(frozen=True)
class StepWork:
    """What one forward pass did: the scheduler's report to the cost model."""

    decode_requests: int  # requests that wrote one token
    decode_context: int  # sum of their context lengths (tokens whose KV they read)
    prefill_tokens: int  # prompt tokens processed
    prefill_attention: int  # sum over chunk tokens of the context each attends to
    prefill_requests: int  # requests with a chunk in this step
    prefill_prefix: int  # sum over those chunks of the prompt tokens before them (KV read once)
    moved_bytes: int  # bytes the allocator moved (compaction, relayout) this step


# ---- the machine (NVIDIA H200 SXM datasheet) ------------------------------------------------------
HBM_PEAK_BYTES_PER_S = 4.8e12  # 4.8 TB/s HBM3e (datasheet)
# FITTED (module docstring): split TTFT p50 of gpt-oss-20b-c1000 = 42.96 s at 0.2235 (published 43 s)
HBM_EFFICIENCY = 0.2235
HBM_BYTES_PER_S = HBM_PEAK_BYTES_PER_S * HBM_EFFICIENCY  # achieved bandwidth of memory-bound steps
BF16_DENSE_PEAK_FLOPS = 989e12  # 1,979 TFLOP/s bf16 "with sparsity" in the datasheet = 989 dense
COMPUTE_EFFICIENCY = 0.8  # assumption: large GEMMs reach ~80% of dense peak
COMPUTE_FLOPS_PER_S = BF16_DENSE_PEAK_FLOPS * COMPUTE_EFFICIENCY  # ~791 TFLOP/s
RECURRENT_FLOPS_PER_ELEMENT = 4  # assumption: decay, rank-1 update and read-out per fp32 state element


@dataclass(frozen=True)
class ModelCost:
    """What the roofline needs beyond the KV geometry of the preset."""

    weight_bytes: float  # bytes read per forward (all weights; at these batch sizes every expert is hit)
    active_params: float  # parameters one token multiplies through (MoE: active experts only)
    q_heads: int  # attention query heads (attention flops scale with heads x head_dim)
    head_dim: int
    source: str


# Weight bytes match kvarena.simulator.budget.WEIGHTS_GB (the H200 budget); parameter counts are the
# model cards' (rounded). Heads and head_dim are the configs' (peers-and-models.md §5).
MODEL_COSTS: dict[str, ModelCost] = {
    "gpt-oss-20b": ModelCost(13e9, 3.6e9, 64, 64, "OpenAI gpt-oss model card: 21B total, 3.6B active; MXFP4"),
    "gpt-oss-120b": ModelCost(65e9, 5.1e9, 64, 64, "OpenAI gpt-oss model card: 117B total, 5.1B active"),
    "qwen3.5-4b": ModelCost(10e9, 4.0e9, 16, 256, "dense ~4B text parameters (the vision tower idles on text)"),
    "qwen3-next-80b-a3b": ModelCost(80e9, 3.0e9, 16, 256, "80B total, 3B active (A3B); FP8 weights"),
    "kimi-linear-48b-a3b": ModelCost(96e9, 3.0e9, 32, 544, "48B total, 3B active; MLA absorbed: "
                                     "(576 QK + 512 PV) / 2 per head (approximate)"),
    "jamba-1.5-mini": ModelCost(104e9, 12e9, 32, 128, "52B total, 12B active (AI21 model card)"),
    "gemma-3-27b": ModelCost(54e9, 27e9, 32, 128, "27B dense"),
    "hymba-1.5b": ModelCost(3.04e9, 1.52e9, 25, 64, "1.52B dense (model card), bf16; the Mamba heads' scan "
                            "is not costed"),
}


class CostModel:
    """Step time of one forward pass for one model preset (callable on a StepWork)."""

    def __init__(self, model: ModelSpec, hbm_efficiency: float = HBM_EFFICIENCY) -> None:
        if not 0 < hbm_efficiency <= 1:
            raise ConfigError(f"hbm_efficiency {hbm_efficiency:g} must be in (0, 1]: the share of the "
                              f"{HBM_PEAK_BYTES_PER_S / 1e12:g} TB/s HBM bandwidth a memory-bound step achieves")
        self.hbm_efficiency = hbm_efficiency
        self.hbm_bytes_per_s = HBM_PEAK_BYTES_PER_S * hbm_efficiency
        try:
            self.cost = cost = MODEL_COSTS[model.name]
        except KeyError:
            raise ConfigError(f"no roofline parameters for model {model.name!r}; the cost model knows "
                              f"{sorted(MODEL_COSTS)}") from None
        self.full_entry = 0
        self.window_read = 0  # bytes one decode token reads from every window class (window x entry)
        self.window_entry = 0
        self.state_bytes = 0
        self.attn_full = 0  # flops per (query, context token) pair over the full-attention layers
        self.attn_window = 0  # ... over the window layers, times the window (context >= window assumed)
        per_pair = 4 * cost.q_heads * cost.head_dim
        for c in model.classes:
            e = entry_layout(c).entry_bytes
            layers = len({r.layer for r in c.rows})
            if c.kind is Kind.FULL:
                self.full_entry, self.attn_full = e, per_pair * layers
            elif c.kind is Kind.WINDOW:
                self.window_entry += e
                self.window_read += c.window * e
                self.attn_window += per_pair * layers * c.window
            else:
                self.state_bytes += e
        self.state_flops = RECURRENT_FLOPS_PER_ELEMENT * self.state_bytes // 4

    def bytes_and_flops(self, w: StepWork) -> tuple[float, float]:
        c = self.cost
        tokens = w.decode_requests + w.prefill_tokens
        if not tokens and not w.moved_bytes:
            return 0.0, 0.0
        nbytes = (c.weight_bytes if tokens else 0.0)
        nbytes += w.decode_context * self.full_entry + w.decode_requests * self.window_read
        nbytes += 2 * self.state_bytes * (w.decode_requests + w.prefill_requests)
        # a chunk reads the KV of its prefix once (flash attention streams it per query tile: counted once)
        nbytes += w.prefill_prefix * self.full_entry + w.prefill_requests * self.window_read
        nbytes += tokens * (self.full_entry + self.window_entry)
        nbytes += 2 * w.moved_bytes
        flops = 2 * c.active_params * tokens
        flops += self.attn_full * (w.decode_context + w.prefill_attention)
        flops += self.attn_window * tokens
        flops += self.state_flops * tokens
        return nbytes, flops

    def __call__(self, w: StepWork) -> float:
        nbytes, flops = self.bytes_and_flops(w)
        return max(nbytes / self.hbm_bytes_per_s, flops / COMPUTE_FLOPS_PER_S)

    def describe(self) -> list[str]:
        c = self.cost
        return [f"roofline: step = max(bytes / {self.hbm_bytes_per_s / 1e12:.2f} TB/s ({self.hbm_efficiency:.2%} of "
                f"{HBM_PEAK_BYTES_PER_S / 1e12:g} TB/s, fitted on gpt-oss-20b-c1000's split TTFT), flops / "
                f"{COMPUTE_FLOPS_PER_S / 1e12:.0f} TFLOP/s ({COMPUTE_EFFICIENCY:.0%} of "
                f"{BF16_DENSE_PEAK_FLOPS / 1e12:g} bf16 dense))",
                f"model: {c.weight_bytes / 1e9:g} GB weights read per step, {c.active_params / 1e9:g}B active "
                f"params, {c.q_heads} query heads x {c.head_dim} ({c.source})",
                "overheads only through the fitted bandwidth share; perfect overlap of memory and compute"]
