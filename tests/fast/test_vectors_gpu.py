"""The committed vectors replayed against kvarena's own gpu/ at ``exact`` (the machine runs it in
test_gpu_lockstep.py; this is the same check an engine's CI makes with ``kvarena conform``)."""

from __future__ import annotations

import pytest

from kvarena.conformance.runner.conform import conform
from kvarena.conformance.vectors.replay import VECTOR_DIR, discover

pytest.importorskip("torch")


def test_every_committed_vector_replays_on_gpu_at_exact() -> None:
    from kvarena.gpu.allocator import make

    report = conform(make, level="exact", vectors=VECTOR_DIR, examples=0, impl="kvarena.gpu.allocator:make")
    assert len(report.vectors) == len(discover(VECTOR_DIR))
    bad = [(v.path.name, v.status, v.summary or v.message) for v in report.vectors if v.status != "passed"]
    assert not bad, bad
    assert report.exit_code == 0 and report.coverage.pages_moved > 0


def test_gpu_offers_below_and_replays_its_vectors_at_exact() -> None:
    """gpu/ takes the placement limit (adapter.features), so the vectors that require it are replayed, not skipped."""
    from kvarena.conformance.adapter.protocol import features
    from kvarena.conformance.vectors.replay import load, replay
    from kvarena.gpu.allocator import make

    for name in ("rung1-below", "rung1-below-tri"):
        vec = load(VECTOR_DIR / f"{name}.jsonl")
        assert vec.header["requires"] == ["below"]
        assert "below" in features(make(vec.config))
        r = replay(vec, make, "exact")
        assert (r.status, r.steps_run) == ("passed", len(vec.steps)), r.message
