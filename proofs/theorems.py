"""The arithmetic theorems ``kvarena prove`` prints after the obligations, in one list.

The ladder's (ladder.py), shortfall-sized rung 2 and the default rung 3's span (ladder_sized.py, which builds on
ladder.py's model), the padding lanes (padding.py) and band order on chains of any length (chain.py). Collected
here so that no module of them imports another one back.
"""

from __future__ import annotations

from kvarena.proofs import chain, ladder, ladder_sized, padding
from kvarena.proofs.ladder import LADDER_BOUNDS, Bound, Theorem


def run(timeout_ms: int = 30_000, bounds: tuple[Bound, ...] = LADDER_BOUNDS, jobs: int = 2,
        with_padding: bool = True) -> list[Theorem]:
    """Every theorem, the exhaustive ladder sweep (``bounds``, over ``jobs`` processes) last but padding."""
    out = [ladder.theorem_span_valid(timeout_ms), ladder.theorem_exact(timeout_ms), ladder.theorem_room(timeout_ms),
           ladder.theorem_then_place(timeout_ms), ladder.theorem_ends_only(timeout_ms),
           ladder.theorem_naive(timeout_ms), *ladder_sized.run(max(timeout_ms, 60_000)),
           ladder.theorem_sweep(bounds, jobs)]
    return out + (padding.run(timeout_ms) if with_padding else []) + chain.run(timeout_ms)
