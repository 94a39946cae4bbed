"""CrossHair checks the PEP 316 contracts of the reference's pure helpers (proofs/README.md), and finds a
planted off-by-one in a copy of a helper."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from kvarena.proofs import contracts as C


def _function(target: str):
    mod, _, name = target.rpartition(".")
    return getattr(importlib.import_module(mod), name)


@pytest.mark.parametrize("target", C.TARGETS)
def test_helpers_carry_contracts(target: str) -> None:
    doc = _function(target).__doc__ or ""
    assert "post:" in doc, f"{target} has no PEP 316 postcondition"


def test_crosshair_finds_no_violation() -> None:
    runs = C.check_all()
    bad = [(r.targets, r.returncode, r.findings or r.output[-500:]) for r in runs if not r.clean]
    assert not bad, bad


@pytest.mark.parametrize("planted", C.PLANTED, ids=[p.name for p in C.PLANTED])
def test_planted_bug_is_reported(planted: C.Planted, tmp_path: Path) -> None:
    run = C.check_planted(planted, tmp_path)
    assert run.returncode != 0 and run.findings, run.output
    assert planted.function.split(":")[1] in run.findings[0]


def test_planted_copies_keep_the_real_contract() -> None:
    for p in C.PLANTED:
        src = C.planted_source(p)
        real = _function(p.function.replace(":", "."))
        for line in (real.__doc__ or "").splitlines():
            if line.strip().startswith(("pre:", "post:")):
                assert line.strip() in src, (p.name, line)
        assert p.replacement in src and p.original not in src


@pytest.mark.parametrize(("found_at", "calls"), [(0, 1), (1, 2), (None, 3)])
def test_a_planted_bug_gets_every_budget_until_it_is_reported(found_at: int | None, calls: int,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """A short budget that misses the bug on a loaded machine is retried longer; one missed at every budget
    comes back clean, so test_planted_bug_is_reported fails on it."""
    seen: list[float] = []

    def fake(targets, budget, cwd=None):
        seen.append(budget)
        hit = found_at is not None and len(seen) - 1 == found_at
        return C.CrossHairRun(tuple(targets), int(hit), 0.0, ["x.py:1: error: planted"] if hit else [])

    monkeypatch.setattr(C, "crosshair", fake)
    run = C.check_planted(C.PLANTED[0], tmp_path, budgets=(1.0, 4.0, 16.0))
    assert seen == [1.0, 4.0, 16.0][:calls]
    assert bool(run.findings) == (found_at is not None)
