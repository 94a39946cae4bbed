"""The built-in workload of ``kvarena replay``: an H200's KV budget and a three-phase trace.

Deterministic: the same model, capacity, page size, seed and scale give the same trace.
Every phase is sized to the budget, so both allocators under comparison must queue.
"""

from __future__ import annotations

import random

from kvarena.scheduler import Arrival
from kvarena.spec.errors import ConfigError
from kvarena.spec.models import ArenaConfig, ModelSpec, request_pages

GiB = 1 << 30

# ---- KV budget of one H200 (peers-and-models.md §5) -------------------------------------------
H200_USABLE_GIB = 139.0  # 141 GB HBM3e listed; about 139 GiB usable in practice
MEM_FRACTION = 0.9  # share of usable memory the engine claims (SGLang --mem-fraction-static)
ACTIVATION_RESERVE_GIB = 4.0  # activations, CUDA graphs, workspace: not KV
# Weight bytes per preset, decimal GB as published (§5); None: does not fit one H200.
WEIGHTS_GB: dict[str, float | None] = {
    "gpt-oss-20b": 13.0,  # MXFP4
    "gpt-oss-120b": 65.0,  # MXFP4; assumption, not in the anchors
    "qwen3.5-4b": 10.0,
    "qwen3-next-80b-a3b": 80.0,  # FP8 (bf16 is ~160 GB and does not fit)
    "kimi-linear-48b-a3b": 96.0,
    "jamba-1.5-mini": 104.0,
    "gemma-3-27b": 54.0,
    "kimi-k3": None,
}

# ---- the built-in trace -------------------------------------------------------------------
# Request shapes: (input tokens lo, hi), (output tokens lo, hi), drawn uniformly.
LONG = ((32_768, 100_000), (256, 1024))
MEDIUM = ((2_048, 16_384), (128, 512))
SHORT = ((768, 1280), (192, 320))
# name, mix of (weight, shape), arrival window in steps at scale 1, offered load. Load x budget is
# what the phase keeps in flight (Little's law: rate x lifetime), so both allocators must queue.
PHASES = (
    ("long", ((1.0, LONG),), 64, 1.25),
    ("short", ((1.0, SHORT),), 384, 1.3),
    ("mixed", ((0.6, SHORT), (0.35, MEDIUM), (0.05, LONG)), 512, 1.3),
)
PHASE_GAP = 256  # quiet steps between phases


def kv_budget(model: str) -> tuple[int, str]:
    """The arena's bytes at an H200's budget, and the arithmetic as one printable line."""
    w = WEIGHTS_GB.get(model)
    if w is None:
        raise ConfigError(f"{model}: weights do not fit one H200 (or are not tabulated); pass --capacity-gib")
    gib = H200_USABLE_GIB * MEM_FRACTION - w * 1e9 / GiB - ACTIVATION_RESERVE_GIB
    line = (f"KV budget: {H200_USABLE_GIB:g} GiB usable x {MEM_FRACTION:g} - {w:g} GB weights "
            f"({w * 1e9 / GiB:.2f} GiB) - {ACTIVATION_RESERVE_GIB:g} GiB activations = {gib:.2f} GiB")
    return int(gib * GiB), line


def request_demand(model: ModelSpec, page_size: int, tokens: int) -> dict[str, int]:
    """Pages per class for a request of ``tokens`` prefilled tokens (the spec's per-request count)."""
    return request_pages(model, page_size, tokens)


def build_trace(config: ArenaConfig, seed: int = 0, scale: float = 1.0) -> list[Arrival]:
    """Long-context burst, short high-concurrency stream, mixed stream; each sized to the budget."""
    rng = random.Random(seed)
    est = random.Random(seed ^ 0x5EED)  # sizing draws, kept off the trace's stream
    ps, ctx = config.page_size, config.context_len

    def draw(r: random.Random, mix) -> tuple[int, int]:
        u, k = r.random(), 0
        while k < len(mix) - 1 and u >= mix[k][0]:  # the last shape takes the rest
            u, k = u - mix[k][0], k + 1
        (ilo, ihi), (olo, ohi) = mix[k][1]
        out = r.randint(olo, ohi)
        return min(r.randint(ilo, ihi), ctx - out), out

    def nbytes(tokens: int) -> int:
        return sum(n * config.page_bytes(c) for c, n in request_demand(config.model, ps, tokens).items())

    trace: list[Arrival] = []
    start = 0
    for name, mix, window, load in PHASES:
        steps = max(1, round(window * scale))
        # byte-steps one arrival adds to the in-flight load within the window (mid-decode size)
        held = sum(nbytes(i + o // 2) * min(o, window) for i, o in (draw(est, mix) for _ in range(400))) / 400
        n = max(1, round(load * config.capacity * steps / held))
        trace += [Arrival(start + rng.randrange(steps), *draw(rng, mix), name) for _ in range(n)]
        start += steps + PHASE_GAP
    trace.sort(key=lambda a: a.step)  # stable: same-step arrivals keep draw order
    return trace
