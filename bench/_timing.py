"""Interleaved timing the side-by-side benches share: every side takes its turn in a shuffled order each
repetition, so a busy machine slows all alike."""

from __future__ import annotations

import gc
import random
import resource
from collections.abc import Callable


def cpu_seconds() -> float:
    """CPU seconds of this process and of its reaped children (a process pool's workers, once joined)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def interleave(fns: dict[str, Callable[[], float]], reps: int, rng: random.Random,
               collector_off: bool = True) -> dict[str, list[float]]:
    """``reps`` samples of each ``fns[k]()`` (each returns its own timed seconds), after one warm-up call each.
    ``collector_off``: no garbage collection inside a call (as ``timeit`` does), every side alike; it runs
    between the calls."""
    for f in fns.values():  # warm-up
        f()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        keys = list(fns)
        rng.shuffle(keys)
        for k in keys:
            if collector_off:
                gc.disable()
            try:
                out[k].append(fns[k]())
            finally:
                gc.enable()
    return out
