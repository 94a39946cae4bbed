"""The proofs (proofs/README.md): every obligation proven, never vacuous, every planted bug refuted by Z3
and confirmed by the reference; the ladder theorems; ``kvarena prove``.

The spec's traceability table links here and to ``proofs/``.
"""

from __future__ import annotations

import pytest

from kvarena.cli import main
from kvarena.proofs import harness as H
from kvarena.proofs import ladder as LD
from kvarena.proofs import model as M
from kvarena.proofs import replay as R
from kvarena.proofs import transitions as T
from kvarena.reference.invariants import INVARIANTS
from tests.quality.mutants import MUTANTS as QUALITY_MUTANTS

TRANSITION_NAMES = [H.INIT, *[t.name for t in T.TRANSITIONS]]


@pytest.fixture(scope="module")
def obligations() -> list[H.Obligation]:
    return H.run(jobs=2)


def test_every_obligation_proven(obligations: list[H.Obligation]) -> None:
    """Init ⇒ ID and Inv ∧ T ⇒ ID' for every ID and transition: every query unsat (no CTI, no unknown)."""
    bad = [(ob.name, [(q.case, q.conjunct, q.status, q.reason) for q in ob.queries if q.status != "unsat"])
           for ob in obligations if not ob.proven]
    assert not bad, bad
    for ob in obligations:
        assert len(ob.queries) == len(M.conjuncts(ob.inv)) * len({q.case for q in ob.queries})


def test_table_covers_every_id_and_transition(obligations: list[H.Obligation]) -> None:
    have = {(ob.inv, ob.transition) for ob in obligations}
    assert have == {(inv, t) for inv in INVARIANTS if inv not in H.NOT_MODELLED for t in TRANSITION_NAMES}
    assert set(H.NOT_MODELLED) <= set(INVARIANTS) and all(len(why) > 80 for why in H.NOT_MODELLED.values())
    for ob in obligations:
        assert ob.mutants or ob.no_mutant, f"{ob.name}: neither a mutant nor a documented reason for none"


def test_every_transition_is_non_vacuous(obligations: list[H.Obligation]) -> None:
    """Inv ∧ T is satisfiable with live pages in every case, and the witness replays in the reference."""
    for ob in obligations:
        if ob.transition != H.INIT:
            assert ob.nonvacuity.startswith("sat+replayed"), (ob.name, ob.nonvacuity)


def test_every_mutant_refuted_and_replayed(obligations: list[H.Obligation]) -> None:
    """Each planted bug: Z3 finds the counterexample and the reference's predicate fails with the same ID."""
    seen = set()
    for ob in obligations:
        for m in ob.mutants:
            assert m.status == "refuted", (ob.name, m.mutant, m.status)
            assert m.replay.startswith(("INV-", *TRANSITION_NAMES, "admit", "extend", "o", "u", "_", "state",
                                        "slide", "free", "release", "write", "compact", "share", "acquire")), m
            assert ob.inv + ":" in m.replay, (ob.name, m.replay)
            seen.add((ob.transition, m.mutant, ob.inv))
    planned = {(m.transition, m.name, inv) for m in (*T.MUTANTS, *T.INIT_MUTANTS) for inv in m.breaks}
    assert seen == planned


def test_frame_reasons_are_checked(obligations: list[H.Obligation]) -> None:
    """A 'frame' N/A is claimed only where the transition writes nothing the invariant reads."""
    for ob in obligations:
        if ob.no_mutant.startswith("frame"):
            assert not (H.writes_of(T.BY_NAME[ob.transition]) & H.reads_of(ob.inv)), ob.name
        elif ob.no_mutant and ob.transition != H.INIT:
            assert (ob.transition, ob.inv) in T.NO_MUTANT, ob.name


def test_replay_edits_are_the_quality_mutants() -> None:
    """Where a proof mutant mirrors a planted bug of tests/quality/mutants.py, the reference edit is the same."""
    quality = {m.name: m for m in QUALITY_MUTANTS}
    for m in T.MUTANTS:
        if m.reference:
            assert m.reference in quality, m
        q = quality.get(m.reference)
        if q is not None and m.name in R.EDITS and not q.also and R._MODULES[R.EDITS[m.name][0]] is q.module:
            _which, original, replacement = R.EDITS[m.name]
            assert (original.strip(), replacement.strip()) == (q.original.strip(), q.replacement.strip()), m.name
    for name in R.EDITS:
        R.mutated(name)  # every snippet still occurs exactly once in the reference


def test_a_buggy_transition_is_a_cti() -> None:
    """The harness does fail: the write transition without its range check is a counterexample to induction."""
    buggy = T.Transition("write", "", lambda c, st, tag, mutant=None: T.write(c, st, tag, "write-unchecked-row"))
    out = H.prove_transition(buggy, ["INV-PAGE-ATOMIC"], 3_000)  # unbounded: unknown at the timeout, then
    # the witness instance finds the counterexample: rows-at-live holds, rows-in-layout does not
    assert [q.status for q in out["INV-PAGE-ATOMIC"]] == ["unsat", "sat"]


def test_unknown_is_a_failure() -> None:
    ob = H.Obligation("INV-NO-OVERLAP", "admit", [H.Query("at a hole", "partition", "unknown", 30.0, "timeout")],
                      nonvacuity="sat+replayed (1 case(s))", no_mutant="x")
    assert not ob.proven and not ob.ok and ob.result == "UNKNOWN"


def test_ladder_theorems() -> None:
    """Rung discipline, plan validity and rung-3 completeness; the naive statement has a counterexample."""
    from kvarena.proofs import theorems

    ths = {th.name: th for th in theorems.run(with_padding=False)}
    assert all(th.ok for th in ths.values()), {n: th.status for n, th in ths.items() if not th.ok}
    assert ths["NAIVE-IS-FALSE"].status == "counterexample (expected)"
    assert "Arena.ladder rejects" in ths["NAIVE-IS-FALSE"].detail
    # the reproducer proofs/README.md quotes: an empty low band demanding 4 pages, a written window page
    # at slot 0, the full band at [4, 8): the aligned room [1, 2) holds K = 1 page but not the pinned slot
    assert "room [1, 2) holds 1 >= K = 1" in LD.replay_naive(low_hi=0, high_lo=4, low_demand=4, omin=0, omax=0)
    for name in ("R3-SPAN-VALID", "R3-EXACT", "R3-ROOM", "R3-THEN-PLACE", "ENDS-ONLY-PLACE", "LADDER-EXHAUSTIVE",
                 "SIZED-MODEL-AGREES", "COMPACT-SIZED-COMPLETE", "COMPACT-SIZED-NONVACUOUS", "R3F-SPAN-VALID",
                 "R3F-EXACT", "R3F-FEWEST", "R3F-THEN-PLACE"):
        assert ths[name].status == "proven"
    # shortfall-sized rung 2: the naive sizing (holes as if all retractable, barrier ignored) is refuted and its
    # counterexample replays as a rejection in the reference; the non-vacuity witness moves fewer pages
    assert ths["NAIVE-SIZED-IS-FALSE"].status == "counterexample (expected)"
    assert "Arena.ladder rejects" in ths["NAIVE-SIZED-IS-FALSE"].detail
    assert "default" in ths["COMPACT-SIZED-NONVACUOUS"].detail
    detail = ths["LADDER-EXHAUSTIVE"].detail
    assert "COMPACT" in detail and "RELAYOUT" in detail and "REUSE" in detail  # every rung exercised


@pytest.mark.slow
def test_ladder_nightly_bound() -> None:
    th = LD.theorem_sweep((LD.NIGHTLY_BOUND,))
    assert th.status == "proven", th.status


def test_cli_prove_only(capsys: pytest.CaptureFixture) -> None:
    code = main(["prove", "--only", "INV-PAGE-ATOMIC", "--transition", "write", "--transition", "slide"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Inv ∧ write ⇒ PAGE-ATOMIC'" in out and "write-unchecked-row: refuted+replayed" in out
    assert "ladder theorem" not in out and "OK: 0 failure(s)" in out


def test_cli_prove_fails_on_failure(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = H.Obligation("INV-NO-OVERLAP", "admit", [H.Query("at a hole", "partition", "sat", 0.1)],
                       nonvacuity="sat+replayed (1 case(s))", no_mutant="x")
    assert main(["prove", "--only", "INV-NOPE"]) == 2  # an unknown ID is a usage error
    monkeypatch.setattr(H, "run", lambda *a, **k: [bad])
    assert main(["prove", "--no-ladder"]) == 1
    assert "CTI" in capsys.readouterr().out


def test_cli_help_teaches(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["prove", "--help"])
    out = capsys.readouterr().out
    assert "--only" in out and "reading a failure" in out and "CTI" in out


def test_content_transport_lemmas() -> None:
    """INV-CONTENT-FOLLOWS-VID's Z3 lemmas: a hand-out zeroes its slot, a move carries every row; the planted
    partial-layer move breaks the second (the lemma can fail)."""
    assert H.prove_content_transport() == {"hand-out zeroes": "unsat", "move carries every row": "unsat"}
    assert H.prove_content_transport("partial-layer-move")["move carries every row"] == "sat"


def test_an_unknown_under_every_seed_stays_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed retries can turn unknown into a proof, never into a pass: a query Z3 cannot settle in 1 ms
    is tried under every seed and comes back unknown, with no model."""
    import z3

    from kvarena.proofs import ladder_sized as LS

    seeds: list[int] = []
    real_set = z3.Solver.set
    monkeypatch.setattr(z3.Solver, "set", lambda s, **kw: (seeds.append(kw["random_seed"]), real_set(s, **kw)))
    x, y, z = z3.Ints("x y z")
    hard = [x > 0, y > 0, z > 0, x * x * x + y * y * y == z * z * z]  # Fermat n = 3: beyond a 1 ms search
    r, model = LS._solve(hard, 1)
    assert r == z3.unknown and model is None and seeds == list(LS.RETRY_SEEDS)
    assert LS._solve([x > 0, x < 0], 1_000)[0] == z3.unsat  # a settled query stops at the first seed
