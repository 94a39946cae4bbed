"""A PASS that means something: coverage, vacuity (exit 3), checks before a safety undo, refusals that change
state, JUnit, the adapter base class and its worked example with a planted bug."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvarena.cli import main
from kvarena.conformance.adapter.protocol import default_level
from kvarena.conformance.adapter.renumbered import Renumbered
from kvarena.conformance.runner.conform import EXIT_VACUOUS, conform
from kvarena.conformance.vectors.replay import VECTOR_DIR
from kvarena.spec.errors import (
    AdmissionRejectedError,
    DoubleFreeError,
    DuplicateOwnerError,
    ReleaseWithoutAcquireError,
)
from kvarena.spec.models import ArenaConfig

ME = __name__
EXAMPLE = "kvarena.conformance.example.adapter"
REPO = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- adapters with defects --------------------------------------------------------------------------


def refuses_everything(config: ArenaConfig) -> Any:
    """Checks its arguments like the reference, then refuses every admission: every invariant holds trivially
    and nothing is exercised."""
    a = Renumbered(config)
    inner = a.inner

    def admit(owner: str, demand: Any, shared: Any = ()) -> Any:
        if owner in inner.owners:
            raise DuplicateOwnerError(f"owner {owner!r} is already admitted")
        inner._check_demand(demand)
        inner._check_vids(a._ins(shared), "admit")
        raise AdmissionRejectedError("never", {}, 0)

    def extend(owner: str, demand: Any) -> Any:
        inner._owner(owner)
        inner._check_demand(demand)
        raise AdmissionRejectedError("never", {}, 0)

    a.admit = admit  # type: ignore[method-assign]
    a.extend = extend  # type: ignore[method-assign]
    return a


def frees_then_refuses(config: ArenaConfig) -> Any:
    """A double free it refuses only after freeing the pages it does hold."""
    a = Renumbered(config)
    inner_drop = a.inner.drop

    def drop(owner: str, vids: list[int]) -> list[int]:
        try:
            return [a.out(v) for v in inner_drop(owner, a._ins(vids))]
        except DoubleFreeError:
            held = [v for vs in a.inner.owners.get(owner, {}).values() for v in vs]
            if held:
                inner_drop(owner, held)
            raise

    a.drop = drop  # type: ignore[method-assign]
    return a


def compacts_then_refuses(config: ArenaConfig) -> Any:
    """An unknown release it refuses after compacting: the state it leaves is valid, but a refusal changed it."""
    a = Renumbered(config)
    inner_release = a.inner.release

    def release(user: str) -> None:
        if user not in a.inner.users:
            a.inner.compact()
            raise ReleaseWithoutAcquireError(f"no user {user!r}")
        inner_release(user)

    a.release = release  # type: ignore[method-assign]
    return a


def builds_anything(config: ArenaConfig) -> Any:
    """Skips configuration validation (a pool that accepts configs the spec refuses)."""
    from kvarena.reference.arena import Arena

    try:
        return Renumbered(config)
    except Exception:
        ok = ArenaConfig(config.model, 1 << 20, page_size=4, max_context_len=16)
        r = Renumbered(ok)
        r.inner = Arena(ok)
        return r


# -- vacuity ----------------------------------------------------------------------------------------


def test_an_always_refusing_adapter_is_vacuous(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", f"{ME}:refuses_everything", "--examples", "20", "-q")
    assert code == EXIT_VACUOUS == 3, out
    assert "VACUOUS: the implementation accepted no admission" in out and "result: VACUOUS at level safety" in out
    assert "coverage (what the implementation was made to do):" in out
    code, out, _ = _run(capsys, "conform", "--impl", f"{ME}:refuses_everything", "--examples", "5", "-q", "--json")
    data = json.loads(out)
    assert code == 3 and data["result"] == "VACUOUS" and data["coverage"]["admissions_accepted"] == 0
    assert data["coverage"]["admissions"]["refused"] > 0


def test_vacuity_without_the_machine_when_no_vector_gets_anywhere(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", f"{ME}:refuses_everything", "--examples", "0", "-q")
    n = len(list(VECTOR_DIR.glob("*.jsonl")))
    assert code == 3 and f"{n} stopped early" in out, out


def test_the_reference_covers_every_invariant() -> None:
    from kvarena.reference.arena import Arena

    report = conform(Arena, level="exact", examples=20)
    assert report.exit_code == 0 and report.vacuous is None
    cov = report.coverage
    assert cov.accepted > 0 and cov.pages_moved > 0 and cov.moved_under_reader > 0
    assert cov.frees_deferred > 0 and cov.withheld_released > 0 and cov.rows_after_move > 0
    assert {"rung 1", "rung 2", "rung 3"} <= set(cov.admissions)
    assert all(cov.exposure[inv] > 0 for inv in cov.to_json()["invariant_exposure"]), cov.exposure


# -- the adapter base class and its worked example ------------------------------------------------------


def test_an_honest_third_party_pool_passes_with_coverage(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", f"{EXAMPLE}:make", "--examples", "60", "-q")
    assert code == 0, out
    assert "result: PASS at level safety" in out  # the default level for a third-party factory
    assert "INV-NO-OVERLAP" in out and "frees deferred" in out


def test_the_worked_examples_planted_bug_is_caught(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", f"{EXAMPLE}:make_buggy", "--examples", "60", "-q")
    assert code == 1, out
    assert "[INV-NO-OVERLAP]" in out and "result: FAIL at level safety" in out


def test_a_state_reached_only_by_the_implementation_is_checked_before_the_undo(
        capsys: pytest.CaptureFixture) -> None:
    """The buggy pool admits where the reference refuses (its frontier crosses into the neighbour): the harness
    used to undo that admission before checking anything, and passed."""
    vec = str(VECTOR_DIR / "mixed-toy-swa.jsonl")
    code, out, _ = _run(capsys, "conform", "--impl", f"{EXAMPLE}:make_buggy", "--vectors", vec, "--examples", "0",
                        "-q")
    assert code == 1, out
    assert "fits on the implementation only" in out and "breaks INV-NO-OVERLAP" in out


def test_the_example_adapter_is_small() -> None:
    lines = (REPO / "conformance" / "example" / "adapter.py").read_text().splitlines()
    assert len(lines) <= 110, len(lines)


def test_the_docs_count_the_example_adapter_as_it_is() -> None:
    """README.md, conformance/README.md and the base's docstring once said ~65 and ~100 lines for the same file."""
    import re

    lines = len((REPO / "conformance" / "example" / "adapter.py").read_text().splitlines())
    for doc in ("README.md", "conformance/README.md", "conformance/adapter/base.py"):  # each sizes it once
        (n,) = re.findall(r"~(\d+)[- ]lines?\b", (REPO / doc).read_text())
        assert abs(int(n) - lines) <= 5, f"{doc} says ~{n} lines; conformance/example/adapter.py has {lines}"


# -- refusals that change the state -----------------------------------------------------------------------


def test_a_refusal_that_breaks_an_invariant_names_it() -> None:
    report = conform(frees_then_refuses, level="safety", vectors=None, examples=200)
    assert report.machine_status == "failed" and report.machine_inv == "INV-VMAP-BIJECTIVE", report.machine_message
    assert "was refused but changed the observable state" in report.machine_message


def test_a_refusal_that_changes_a_valid_state_is_inv_refusal_is_noop() -> None:
    report = conform(compacts_then_refuses, level="safety", vectors=None, examples=300)
    assert report.machine_status == "failed" and report.machine_inv == "INV-REFUSAL-IS-NOOP", report.machine_message


def test_a_config_the_reference_refuses_is_a_config_divergence() -> None:
    report = conform(builds_anything, level="safety", vectors=VECTOR_DIR / "config-refusals.jsonl", examples=0)
    (v,) = report.vectors
    assert v.status == "failed" and "config divergence" in v.message and v.inv != "INV-FEASIBILITY-FLOOR", v.message


# -- CI integration: JUnit, levels, imports, progress ----------------------------------------------------


def test_junit_has_a_case_per_vector_and_per_invariant(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    xml = tmp_path / "k.xml"
    code, _, _ = _run(capsys, "conform", "--impl", f"{EXAMPLE}:make_buggy", "--examples", "30", "-q",
                      "--junit-xml", str(xml))
    assert code == 1
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite is not None
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    assert sum(1 for k in cases if k[0] == "kvarena.vectors") == len(list(VECTOR_DIR.glob("*.jsonl")))
    assert ("kvarena.machine", "INV-NO-OVERLAP") in cases and ("kvarena.machine", "INV-LEDGER-SAFETY") in cases
    failed = [k for k, c in cases.items() if c.find("failure") is not None]
    assert failed and int(suite.get("failures", "0")) == len(failed)
    assert any(p.get("name") == "admissions_accepted" for p in suite.iter("property"))


def test_default_level() -> None:
    assert default_level(None) == "exact" and default_level("reference") == "exact"
    assert default_level("kvarena.gpu.allocator:make") == "exact"
    assert default_level("myengine.adapter:make") == "safety"


def test_impl_imports_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "myengine_adapter.py").write_text(
        "from kvarena.conformance.example.adapter import make\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "kvarena", "conform", "--impl", "myengine_adapter:make",
                        "--examples", "5"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result: PASS at level safety" in r.stdout
    n = len(list(VECTOR_DIR.glob("*.jsonl")))
    assert f"kvarena conform: vectors {n}/{n}" in r.stderr  # progress on stderr


def test_an_admission_only_the_implementation_makes_names_the_invariant_at_decisions() -> None:
    from kvarena.conformance.example.adapter import make_buggy

    report = conform(make_buggy, level="decisions", vectors=VECTOR_DIR / "mixed-toy-swa.jsonl", examples=0)
    (v,) = report.vectors
    assert v.status == "failed" and "the implementation's state now breaks INV-NO-OVERLAP" in v.message, v.message
    assert v.inv == "INV-NO-OVERLAP"
