"""The installed engine wheels' source, for tests that check a simulator rule against the code it cites."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest


def sglang_source(rel: str) -> str:
    """The text of ``rel`` (relative to the ``sglang/`` package) in the installed sglang 0.5.23 wheel; skips the
    test when it is not installed. The wheel on the path, not ``sys.modules["sglang"]``: the SGLang adapter's
    tests may have put a stand-in there in the same worker."""
    spec = importlib.machinery.PathFinder.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang 0.5.23 is not installed (make test installs it --no-deps)")
    return (Path(next(iter(spec.submodule_search_locations))) / rel).read_text(encoding="utf-8")


def vllm_source(rel: str) -> str:
    """The text of ``rel`` (relative to the ``vllm/`` package) in the installed vllm 0.33.0 wheel; skips the test
    when it is not installed (found on the path, as ``sglang_source``: a stand-in may sit in ``sys.modules``)."""
    spec = importlib.machinery.PathFinder.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm 0.33.0 is not installed (make test installs it --no-deps)")
    return (Path(next(iter(spec.submodule_search_locations))) / rel).read_text(encoding="utf-8")
