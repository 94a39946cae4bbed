"""`kvarena check-policy`: shipped policies pass; a deliberately unsafe one fails with a readable trace."""

import re

import pytest

from kvarena.cli import main


def test_shipped_policy_passes_with_quality_table(capsys) -> None:
    assert main(["check-policy", "best-fit", "--examples", "10"]) == 0
    out = capsys.readouterr().out
    assert "best-fit" in out and "ok" in out
    assert "MiB moved" in out and "gpt-oss-20b" in out and "ladder" in out  # compared with the default
    assert "hymba-1.5b" in out  # the three-class trace: rung 3 (relayout) in the comparison
    assert "1 of 1 policies safe" in out
    # every obligation proven, and there are some (the count grows with the invariants: not pinned here)
    m = re.search(r"Z3 plan obligations: (\d+)/(\d+) proven", out)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 40, out


@pytest.mark.parametrize("policy, inv, rule", [
    ("tests.quality.unsafe_policies:MovesWrittenPage", "INV-LEDGER-SAFETY", "PLAN-MOVE-WRITER"),
    ("tests.quality.unsafe_policies:FillsWithheldHole", "INV-LEDGER-SAFETY", "PLAN-PLACE-FREE"),
])
def test_unsafe_policy_is_caught_with_a_shrunk_trace(capsys, policy: str, inv: str, rule: str) -> None:
    assert main(["check-policy", policy, "--no-quality", "--no-proofs"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED" in out and inv in out and rule in out
    # a runnable reproducer: the machine, its setup and at least one rule after it (which rule shrinks out varies)
    assert "state = PolicyMachine()" in out and "state.setup(" in out, out
    assert re.search(r"state\.(?!setup|all_invariants_hold|data_reads_back|teardown)\w+\(", out), out
    assert "0 of 1 policies safe" in out


def test_bad_policy_path_is_one_line_exit_2(capsys) -> None:
    for argv, words in [(["no_such_module:Policy", "--no-quality"], "cannot load 'no_such_module:Policy'"),
                        (["not-a-policy"], "neither a shipped policy"),
                        (["tests.quality.unsafe_policies:NeedsArguments"], "cannot be instantiated with no arguments")]:
        assert main(["check-policy", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kvarena check-policy: ") and words in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


def test_a_policy_that_raises_is_reported_at_its_own_frame(capsys) -> None:
    assert main(["check-policy", "tests.quality.unsafe_policies:RaisesInPlan", "--no-quality", "--no-proofs"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED" in out and "the policy raised KeyError" in out
    assert "unsafe_policies.py:" in out and "in plan: raise KeyError" in out, out


def test_without_z3_the_rest_runs_and_says_how_to_add_the_proofs() -> None:
    """z3 is the 'proofs' extra, not 'conform': check-policy runs the safety machine (and quality) and names the
    extra instead of exiting 2 after the safety run."""
    from tests.fast.test_cli import kvarena

    r = kvarena("check-policy", "best-fit", "--examples", "5", "--no-quality", block="z3")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr
    assert "best-fit" in r.stdout and "1 of 1 policies safe" in r.stdout
    assert "Z3 plan obligations: skipped (z3 is not installed); pip install 'kvarena[proofs]'" in r.stdout, r.stdout
    assert "--no-proofs skips them" in r.stdout
