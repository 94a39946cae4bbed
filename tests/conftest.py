"""Loads the Hypothesis profile named by HYPOTHESIS_PROFILE (ci / nightly / dev)."""

from kvarena.conformance.profiles import register_profiles

PROFILE = register_profiles()


def pytest_report_header(config):
    return f"hypothesis profile: {PROFILE}"
