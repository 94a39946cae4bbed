"""simulator/consistency.py: whether one budget reproduces a published (split, unified) pair.

What must hold: the fit bisects inside the bracket nearest the split fit (a stepped metric crosses more than
once) and lands within its tolerance; a pair whose two figures need budgets far apart is reported as not
reproduced, and one whose figures meet at a budget as reproduced; a grid point counts only when the split
value *and* the ratio are near the published ones. Runs on stand-in curves (no simulation), each check shown
to fail on a planted bug."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from kvarena.simulator import consistency as C
from kvarena.simulator import engines
from kvarena.simulator.workloads import Calibration, Published, workload

W = workload("qwen3.5-4b-512-16k")


def _curves(monkeypatch: pytest.MonkeyPatch, split, unified) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(C, "_value", lambda w, g, kind: (split if kind == "split" else unified)(g))


def test_a_stepped_curve_is_fitted_in_the_bracket_nearest_the_split_fit() -> None:
    f = lambda g: 300 - 10 * g if g < 5 or g > 8 else 260.0  # noqa: E731  falls, plateaus, falls
    pts = [(g, f(g)) for g in (2, 4, 6, 8, 10, 12)]
    near_low = C.fit_in_bracket(f, 265, pts, near=3, falling=True, tol=0.01)
    near_high = C.fit_in_bracket(f, 215, pts, near=11, falling=True, tol=0.01)
    assert near_low == pytest.approx(3.5, abs=0.02) and near_high == pytest.approx(8.5, abs=0.02)
    assert C.fit_in_bracket(f, 500, pts, near=3, falling=True) is None  # never crossed: no fit, not an end


def test_a_pair_needing_two_budgets_is_not_reproduced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 512/16K shape: the split fit gives a unified value far below the published one; the unified fit
    lies many GiB lower, where the split value is far above its figure."""
    _curves(monkeypatch, lambda g: 294 + 10 * (30.6 - g), lambda g: 118 + 10 * (30.6 - g))
    w = replace(W, calibration=Calibration(30.6, "stand-in"), published=Published("retractions_per_1k", 233, 294, ""))
    r = C.check(w, points=9, jobs=1)
    assert r.fitted["split"] == 30.6 and r.fitted["unified"] == pytest.approx(30.6 - 11.5, abs=0.06)
    s = r.at(30.6)
    assert s.split == pytest.approx(294) and s.ratio == pytest.approx(118 / 294)
    assert not r.consistent and "no budget on this grid" in C.markdown(r)
    # planted bug: a point counted on its split value alone reproduces the pair at the split fit
    src = inspect.getsource(C.Report)
    loose = src.replace("\n                and abs(p.ratio / self.published_ratio - 1) <= RATIO_TOL", "")
    assert loose != src
    ns = dict(vars(C))
    exec(loose, ns)
    assert ns["Report"](r.workload, r.metric, r.published_split, r.published_unified, r.points, r.fitted).consistent


def test_a_pair_that_meets_at_a_budget_is_reproduced(monkeypatch: pytest.MonkeyPatch) -> None:
    _curves(monkeypatch, lambda g: 294 + 10 * (30.6 - g), lambda g: 0.8 * (294 + 10 * (30.6 - g)))
    w = replace(W, calibration=Calibration(30.6, "stand-in"), published=Published("retractions_per_1k", 233, 294, ""))
    r = C.check(w, points=9, jobs=1)
    assert r.consistent and r.reproduces(r.at(30.6))
    odd = C.check(replace(w, calibration=Calibration(30.6049, "three decimals")), points=3, jobs=1)
    assert odd.at(odd.fitted["split"]).gib == 30.6  # the preset's budget is a point of its own grid
    assert "reproduces the pair" in C.markdown(r) and "yes, at" in C.markdown(r)


def test_only_budget_fitted_memory_metrics_take_part() -> None:
    with pytest.raises(ValueError, match="not fitted on a memory metric"):
        C.check(workload("gpt-oss-20b-c1000"), jobs=1)  # a latency metric: the cost model's fit
    assert C.grid(10.0, 5) == [5.0, 6.88, 8.75, 10.0, 10.62, 12.5]


def test_a_figure_the_unified_column_never_reaches_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unified count plateaus below the published figure (as 512/16K's does at ~220 of 233)."""
    _curves(monkeypatch, lambda g: 294 + 10 * (30.6 - g), lambda g: min(220.0, 118 + 10 * (30.6 - g)))
    w = replace(W, calibration=Calibration(30.6, "stand-in"), published=Published("retractions_per_1k", 233, 294, ""))
    r = C.check(w, points=9, jobs=1)
    assert "unified" not in r.fitted and not r.consistent
    text = C.markdown(r)
    assert "never reaches 233 on this grid (nearest: 220.0 at" in text and "no budget on this grid" in text


def test_the_columns_are_named_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own allocators can stand in for kvarena's columns; an unknown column is refused up front."""
    with pytest.raises(ValueError, match="column 'arena': choose one of split, unified"):
        C.check(W, jobs=1, columns=("split", "arena"))
    _curves(monkeypatch, lambda g: 294.0, lambda g: 233.0)
    installed = {k: replace(v, missing=lambda: None) for k, v in engines.ENGINES.items()}  # as if the extra were
    monkeypatch.setattr(engines, "ENGINES", installed)
    r = C.check(W, points=3, jobs=1, columns=("sglang-split", "sglang-unified"))
    assert "| budget (GiB) | SGLang split pools | SGLang unified |" in C.markdown(r)


def test_the_command_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert C.main(["no-such-preset"]) == 2
    assert C.main(["gpt-oss-20b-c1000"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("consistency: unknown workload 'no-such-preset'; choose one of")
    assert "not fitted on a memory metric" in err[1]
