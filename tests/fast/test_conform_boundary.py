"""Boundary scenarios (conformance/machine/boundary.py) and the hand-out sweep (conductor.py): every band-boundary
off-by-one planted in the worked example's pool (conformance/example/buggy.py) is caught at conform's default
budget with its invariant named; the honest pool, the reference and gpu/ pass; a page handed out with stale rows
that no later step reads is caught by the sweep and only by it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from kvarena.conformance.example import buggy
from kvarena.conformance.example.adapter import make
from kvarena.conformance.machine.boundary import FAMILIES, configs, feasibility_floor, run_boundary, scenarios
from kvarena.conformance.machine.checks import Geometry
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import REJECTED, Divergence, Expect, LiveReference, Side, config_to_json
from kvarena.conformance.runner.conform import conform
from kvarena.reference.arena import Arena
from kvarena.spec.errors import CapacityTooSmallError
from kvarena.spec.models import ArenaConfig, preset


@pytest.mark.parametrize("name", sorted(buggy.PLANTED))
def test_each_planted_boundary_bug_is_caught_at_the_default_budget(name: str) -> None:
    inv = buggy.PLANTED[name]
    report = conform(getattr(buggy, name), level="safety")  # the default budget: vectors, then 100 examples
    assert report.exit_code == 1, report.format()
    assert report.boundary_failed is not None and report.machine_inv == inv, report.machine_message
    text = report.format()
    assert f"DIVERGENCE in a boundary scenario [{inv}]" in text and "the random examples did not run" in text
    assert report.machine_runs == 0  # caught before any random example


def test_the_honest_pool_passes_at_its_default_level_with_every_family_counted() -> None:
    report = conform(make, level="safety")
    assert report.exit_code == 0, report.format()
    ran = report.coverage.boundary
    assert set(ran) == set(FAMILIES) and all(ran.values()), ran
    row = next(line for line in report.format().splitlines() if line.strip().startswith("boundary scenarios"))
    assert f"{sum(ran.values())} run before the random examples" in row, row
    assert json.loads(json.dumps(report.to_json()))["coverage"]["boundary_scenarios"] == dict(sorted(ran.items()))
    assert report.machine_runs > 0  # the random budget ran after them


@pytest.mark.parametrize("impl", ["reference", "gpu"])
def test_the_reference_and_gpu_pass_every_boundary_scenario_at_exact(impl: str) -> None:
    if impl == "gpu":
        from kvarena.gpu.allocator import make as factory
    else:
        factory = Arena
    res = run_boundary(factory, "exact")
    assert res.failed is None, res.failed
    assert res.skipped == 0 and sum(res.ran.values()) == len(list(scenarios()))  # exact builds every config
    assert set(res.ran) == set(FAMILIES)


def test_the_configs_sit_on_the_edges_they_claim() -> None:
    for label, config, floor in configs():
        Arena(floor)
        with pytest.raises(CapacityTooSmallError):
            Arena(replace(floor, capacity=floor.capacity - 1))
        if config is not floor:  # no page divides it: the page before capacity is followed by padding
            assert all(config.capacity % p for p in Geometry.of(config).page_bytes.values()), label
    assert feasibility_floor("toy-tri", 4) == 3072  # spec/arena.md §The feasibility floor, by hand


# -- the hand-out sweep ------------------------------------------------------------------------------------------


class Refusing(LiveReference):
    """The reference, made to reject the next admission: the implementation's page is then placed on its side only
    (the ``safety`` path that checks a state, then undoes it)."""

    refuse_next = False

    def apply(self, op: str, args: Mapping[str, Any]) -> Expect:
        if op == "admit" and self.refuse_next:
            self.refuse_next = False
            return Expect(code=REJECTED, shortfall=dict(args["demand"]), shortfall_bytes=0)
        return super().apply(op, args)


def _stale_trace(sweep: bool, only_implementation: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A freed page's rows left in place, its slot handed out again and never read, written or moved after."""
    monkeypatch.setattr(Conductor, "sweep_handouts", sweep)
    config = ArenaConfig(preset("toy-state"), 2431, page_size=2, max_context_len=16)
    geo = Geometry.of(config)
    c = Conductor(geo, Refusing(config), Side(buggy.make_buggy_stale_rows(config), geo), level="safety",
                  config_json=config_to_json(config))
    full = geo.high
    top = c.run("admit", owner="a", demand={full: 1}, shared=[]).pages[full][0]  # the high end's top page
    c.run("admit", owner="b", demand={full: 1}, shared=[])  # below it: freeing the top page leaves a hole
    for entry in range(geo.entries[full]):
        for row in range(geo.rows[full]):
            c.run("write", page=top, entry=entry, row=row, tag=100 + entry * geo.rows[full] + row)
    c.run("free", owner="a")
    c.oracle.refuse_next = only_implementation
    c.run("admit", owner="c", demand={full: 1}, shared=[])  # the hole, not zeroed
    c.run("admit", owner="d", demand={geo.low: 1}, shared=[])  # later steps never name the stale page


@pytest.mark.parametrize("only_implementation", [False, True], ids=["both sides", "implementation only"])
def test_a_stale_hand_out_is_caught_by_the_sweep_and_only_by_it(only_implementation: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Divergence) as e:
        _stale_trace(True, only_implementation, monkeypatch)
    assert e.value.inv == "INV-CONTENT-FOLLOWS-VID" and "was never written but reads 10" in e.value.summary
    assert ("placed on the implementation only" in e.value.summary) == only_implementation
    _stale_trace(False, only_implementation, monkeypatch)  # the sweep disabled: the same trace passes


def test_the_stale_rows_mutant_is_killed_by_the_sweep_in_the_boundary_scenarios(
        monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_boundary(buggy.make_buggy_stale_rows, "safety")
    assert res.inv == "INV-CONTENT-FOLLOWS-VID" and "was never written" in (res.failed or ""), res.failed
    monkeypatch.setattr(Conductor, "sweep_handouts", False)
    res = run_boundary(buggy.make_buggy_stale_rows, "safety")
    assert res.failed is None and sum(res.ran.values()) > 0  # nothing else in them reads the reused rows
