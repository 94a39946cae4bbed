"""Moved to :mod:`kvarena.simulator.mixed_trace` and :mod:`kvarena.simulator.budget`; this name stays for
``kvarena/check_policy.py``, which imports ``build_trace`` from here."""

from kvarena.simulator.arrivals import Arrival
from kvarena.simulator.budget import (
    ACTIVATION_RESERVE_GIB,
    H200_USABLE_GIB,
    MEM_FRACTION,
    WEIGHTS_GB,
    GiB,
)
from kvarena.simulator.mixed_trace import PHASES, build_trace, kv_budget, request_demand

__all__ = ["ACTIVATION_RESERVE_GIB", "H200_USABLE_GIB", "MEM_FRACTION", "PHASES", "WEIGHTS_GB", "Arrival", "GiB",
           "build_trace", "kv_budget", "request_demand"]
