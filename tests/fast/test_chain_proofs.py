"""proofs/chain.py: band order on chains of any length (N symbolic), its non-vacuity, and the two-float-only mutant:
proven harmless on a three-band chain, refuted with two floats (Z3's counterexample has a present float below the
one that moves)."""

from __future__ import annotations

import pytest

pytest.importorskip("z3", reason="z3 is the 'proofs' extra")

from kvarena.proofs import chain


def test_chain_theorems_hold_and_the_mutant_is_refuted() -> None:
    got = {t.name: t for t in chain.run(timeout_ms=20_000)}
    assert set(got) == {"CHAIN-ORDER", "CHAIN-NONVACUOUS", "CHAIN-MUTANT-ONE-FLOAT", "CHAIN-MUTANT-LOW-GAP"}
    assert all(t.ok for t in got.values()), {n: t.status for n, t in got.items()}
    assert got["CHAIN-MUTANT-LOW-GAP"].status == "counterexample (expected)"
    assert "N = 4" in got["CHAIN-MUTANT-LOW-GAP"].detail


def test_the_order_proof_fails_when_the_guard_is_dropped() -> None:
    """A check that cannot fail proves nothing: without the neighbour bounds the same query has a counterexample."""
    import z3

    from kvarena.proofs.ladder import _prove

    c = chain.Chain("t")
    loose = z3.And(c.inside(c.k), c.a >= 0, c.a <= c.b, c.b <= c.cap)
    status, _m = _prove([*c.before(), loose], c.after(), 20_000)
    assert status == "counterexample"
