"""§Split-pool sizing (spec/arena.md §Split-pool baseline): the bytes SGLang's ratio flags give each class.

The arena uses the same sizing for one thing only: where an empty float band reopens (``float_hints``, §State);
the split-pool baseline (reference/split.py) sizes its fixed regions with it. Both implementations call it (gpu/ too: it
is spec, not reference logic).
"""

from __future__ import annotations

from fractions import Fraction

from kvarena.spec.guards import ceil_div
from kvarena.spec.layout import Kind, entry_layout
from kvarena.spec.models import ArenaConfig, chain


def exact_ratio(r: float | int | Fraction) -> Fraction:
    """A ratio hint as an exact rational: the decimal it is written as (``0.8`` is 4/5, on the command line or in a
    vector's JSON), not its binary floating-point value; ints and Fractions as they are."""
    return Fraction(r) if isinstance(r, int | Fraction) else Fraction(repr(float(r)))


def split_bytes(config: ArenaConfig) -> dict[str, int]:
    """Bytes per class as SGLang sizes fixed pools, in exact integer arithmetic (spec/arena.md §Split-pool baseline).

    Recurrent state takes ``floor(C * r / (1 + r))`` of the capacity ``C`` (mamba_mem / kv_mem = r); the rest is
    split so that each window class holds ``swa_full_tokens_ratio`` times the full class's tokens:
    ``full_tokens = floor(rest / (F + r * sum(S)))``. Every ratio is an exact rational (``exact_ratio``), so no
    rounding of binary floating point decides a byte.
    """
    classes = chain(config.model)
    out: dict[str, int] = {}
    rest = config.capacity
    for c in classes:
        if c.kind is Kind.RECURRENT:
            r = exact_ratio(config.mamba_full_memory_ratio)
            out[c.name] = config.capacity * r.numerator // (r.denominator + r.numerator)
            rest -= out[c.name]
    full = next(c for c in classes if c.kind is Kind.FULL)
    windows = [c for c in classes if c.kind is Kind.WINDOW]
    r = exact_ratio(config.swa_full_tokens_ratio)
    per_full_token = entry_layout(full).entry_bytes + r * sum(entry_layout(w).entry_bytes for w in windows)
    full_tokens = rest // per_full_token
    for w in windows:
        out[w.name] = (full_tokens * r.numerator // r.denominator) * entry_layout(w).entry_bytes
    out[full.name] = rest - sum(out[w.name] for w in windows)
    return out


def split_regions(config: ArenaConfig) -> dict[str, tuple[int, int]]:
    """Byte region per class, laid out in chain order from byte 0, each on its own page grid."""
    out: dict[str, tuple[int, int]] = {}
    cursor = 0
    sizes = split_bytes(config)
    for c in chain(config.model):
        p = config.page_bytes(c.name)
        lo = ceil_div(cursor, p) * p
        pages = max(0, min(sizes[c.name], config.capacity - lo) // p)
        out[c.name] = (lo, lo + pages * p)
        cursor = lo + pages * p
    return out


def float_hints(config: ArenaConfig) -> dict[str, int]:
    """Where each float band starts when empty: the byte its split-pool region starts at (exact, as above)."""
    floats = {c.name for c in chain(config.model)[1:-1]}
    return {name: lo for name, (lo, _hi) in split_regions(config).items() if name in floats}
