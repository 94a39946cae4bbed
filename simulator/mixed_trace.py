"""The built-in workload of ``kvarena replay``: a three-phase trace sized to the KV budget.

Deterministic: the same model, capacity, page size, seed and scale give the same trace.
Every phase is sized to the budget, so both allocators under comparison must queue.
"""

from __future__ import annotations

import random

from kvarena.simulator.arrivals import Arrival
from kvarena.simulator.budget import replay_budget
from kvarena.spec.models import ArenaConfig, ModelSpec, request_pages

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


kv_budget = replay_budget  # the name kvarena replay and check-policy use


def request_demand(model: ModelSpec, page_size: int, tokens: int) -> dict[str, int]:
    """Pages per class for a request of ``tokens`` prefilled tokens (the spec's per-request count)."""
    return request_pages(model, page_size, tokens)


def _draw(r: random.Random, mix, ctx: int) -> tuple[int, int]:
    u, k = r.random(), 0
    while k < len(mix) - 1 and u >= mix[k][0]:  # the last shape takes the rest
        u, k = u - mix[k][0], k + 1
    (ilo, ihi), (olo, ohi) = mix[k][1]
    out = r.randint(olo, ohi)
    return min(r.randint(ilo, ihi), ctx - out), out


def phase_sizes(config: ArenaConfig, seed: int = 0, scale: float = 1.0) -> list[tuple[int, int]]:
    """(arrival window in steps, requests) per phase of :data:`PHASES`: what :func:`build_trace` will draw, without
    drawing it (``kvarena replay`` refuses a trace too large to run before building it)."""
    est = random.Random(seed ^ 0x5EED)  # sizing draws, kept off the trace's stream
    ps, ctx = config.page_size, config.context_len

    def nbytes(tokens: int) -> int:
        return sum(n * config.page_bytes(c) for c, n in request_demand(config.model, ps, tokens).items())

    out = []
    for _name, mix, window, load in PHASES:
        steps = max(1, round(window * scale))
        # byte-steps one arrival adds to the in-flight load within the window (mid-decode size)
        held = sum(nbytes(i + o // 2) * min(o, window) for i, o in (_draw(est, mix, ctx) for _ in range(400))) / 400
        out.append((steps, max(1, round(load * config.capacity * steps / held))))
    return out


def build_trace(config: ArenaConfig, seed: int = 0, scale: float = 1.0) -> list[Arrival]:
    """Long-context burst, short high-concurrency stream, mixed stream; each sized to the budget."""
    rng = random.Random(seed)
    trace: list[Arrival] = []
    start = 0
    for (name, mix, _window, _load), (steps, n) in zip(PHASES, phase_sizes(config, seed, scale)):
        trace += [Arrival(start + rng.randrange(steps), *_draw(rng, mix, config.context_len), name) for _ in range(n)]
        start += steps + PHASE_GAP
    trace.sort(key=lambda a: a.step)  # stable: same-step arrivals keep draw order
    return trace
