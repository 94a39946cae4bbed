"""The KV budget of one H200: the arithmetic ``replay`` prints, and SGLang's ``_profile_available_bytes``.

Both start from the same machine: ~139 GiB of an H200's 141 GB HBM3e usable (peers-and-models.md §5)
and the weight bytes of each preset.

- :func:`replay_budget` (``kvarena replay``): usable x 0.9 - weights - a 4 GiB activation reserve.
- :func:`sglang_budget` (``kvarena simulate``): usable x mem_fraction - weights, as SGLang profiles it
  (rules.kv_budget_bytes; no further reserve: the activations are what 1 - mem_fraction leaves).
"""

from __future__ import annotations

from kvarena.simulator import rules
from kvarena.spec.errors import ConfigError

GiB = 1 << 30

H200_USABLE_GIB = 139.0  # 141 GB HBM3e listed; about 139 GiB usable in practice
MEM_FRACTION = 0.9  # share of usable memory the engine claims (SGLang --mem-fraction-static)
# SGLang's own default on an H200 is (gpu_mem - reserved_mem) / gpu_mem with reserved_mem >= 512 MiB +
# 1.5 x 8,192 chunk tokens + graphs (srt/arg_groups/memory_hook.py _handle_gpu_memory_settings): ~0.907.
ACTIVATION_RESERVE_GIB = 4.0  # replay only: activations, CUDA graphs, workspace
# Weight bytes per preset, decimal GB as published (§5); None: does not fit one H200.
WEIGHTS_GB: dict[str, float | None] = {
    "gpt-oss-20b": 13.0,  # MXFP4
    "gpt-oss-120b": 65.0,  # MXFP4; assumption, not in the anchors
    "qwen3.5-4b": 10.0,
    "qwen3-next-80b-a3b": 80.0,  # FP8 (bf16 is ~160 GB and does not fit)
    "kimi-linear-48b-a3b": 96.0,
    "jamba-1.5-mini": 104.0,
    "gemma-3-27b": 54.0,
    "hymba-1.5b": 3.04,  # 1.52B parameters (model card) x 2 B bf16; assumption: bf16 checkpoint
    "kimi-k3": None,
}


def _weights(model: str) -> float:
    w = WEIGHTS_GB.get(model)
    if w is None:
        raise ConfigError(f"{model}: weights do not fit one H200 (or are not tabulated); pass --capacity-gib")
    return w


def replay_budget(model: str) -> tuple[int, str]:
    """``kvarena replay``'s arena bytes at an H200's budget, and the arithmetic as one printable line."""
    w = _weights(model)
    gib = H200_USABLE_GIB * MEM_FRACTION - w * 1e9 / GiB - ACTIVATION_RESERVE_GIB
    line = (f"KV budget: {H200_USABLE_GIB:g} GiB usable x {MEM_FRACTION:g} - {w:g} GB weights "
            f"({w * 1e9 / GiB:.2f} GiB) - {ACTIVATION_RESERVE_GIB:g} GiB activations = {gib:.2f} GiB")
    return int(gib * GiB), line


def sglang_budget(model: str, mem_fraction: float = MEM_FRACTION) -> tuple[int, str]:
    """KV bytes SGLang would profile on one H200 at ``mem_fraction``, and the arithmetic as one line."""
    w = _weights(model)
    if not 0 < mem_fraction <= 1:
        raise ConfigError(f"--mem-fraction {mem_fraction:g} must be in (0, 1]")
    nbytes = rules.kv_budget_bytes(H200_USABLE_GIB * GiB, mem_fraction, w * 1e9)
    if nbytes <= 0:
        raise ConfigError(f"{model}: at --mem-fraction {mem_fraction:g} the {w:g} GB of weights leave nothing for "
                          f"KV ({nbytes / GiB:.1f} GiB); raise --mem-fraction or pass --capacity-gib")
    line = (f"{H200_USABLE_GIB:g} GiB usable x {mem_fraction:g} - {w:g} GB weights ({w * 1e9 / GiB:.2f} GiB) "
            f"= {nbytes / GiB:.2f} GiB (SGLang's _profile_available_bytes)")
    return nbytes, line
