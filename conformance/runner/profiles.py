"""Hypothesis profiles for the conformance machine.

``ci``      derandomized and bounded: the same examples every run, what CI runs.
``nightly`` random, more and longer runs, with the example database to replay failures.
``dev``     the default on a workstation: random, moderate.

Select one with ``HYPOTHESIS_PROFILE=<name>`` (the test suite's conftest loads it).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
# The explain phase re-runs failures under coverage tracing: as slow as the whole shrink, and the
# shrunk trace already says what happened.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]

PROFILES = {
    "ci": dict(derandomize=True, database=None, deadline=None, print_blob=True, max_examples=200,
               stateful_step_count=50, suppress_health_check=_SUPPRESS, phases=_PHASES),
    "nightly": dict(deadline=None, max_examples=1500, stateful_step_count=120,
                    suppress_health_check=_SUPPRESS),  # keeps the explain phase: nightly has the time
    "dev": dict(deadline=None, max_examples=60, stateful_step_count=40, suppress_health_check=_SUPPRESS,
                phases=_PHASES),
}


def register_profiles() -> str:
    """Register every profile and load the one ``HYPOTHESIS_PROFILE`` names (default ``dev``)."""
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, **kwargs)
    name = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if name not in PROFILES:
        raise SystemExit(f"HYPOTHESIS_PROFILE={name!r} is not one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name
