"""Chains of any length: INV-BAND-ORDER's step obligation for N bands, N symbolic (spec/arena.md §The chain).

The symbolic model (model.py) fixes the chain to three bands, ``low | float | high``. Its per-band conjuncts
quantify over a band index and never name a neighbour, so they hold band by band whatever the chain's length;
what a longer chain adds is the order between bands: a float's neighbours may be floats. This module proves that
part for every chain length at once. A chain is ``N >= 2`` bands, ``lo[i] <= hi[i]`` their byte spans; band ``i``
is *present* when it is an end (``0`` or ``N - 1``) or non-empty, and the order is

    ORDER:  for all present i < j:  hi[i] <= lo[j]

Every step of the reference that changes a span changes one band's (a placement grows one band into the gap
beside it, relayout retargets one float at a time, absorb trims one edge) and keeps it between the band's
**adjacent present neighbours**: the previous present band ``p`` (no present band between ``p`` and ``k``) and
the next ``q``, as ``place`` does with the gaps of ``zip(present, present[1:])`` (reference/ladder.py). An empty
float may sit anywhere (it is not present).

* **CHAIN-ORDER**: for all ``N >= 2`` and every band ``k``, ORDER and the step's guard imply ORDER after the step
  (unbounded: N, k, spans and capacity are integers).
* **CHAIN-NONVACUOUS**: the guard with two present floats, the second one growing, is satisfiable.
* **CHAIN-MUTANT-LOW-GAP** (the mutant, refuted): a float bounded below by the low end band instead of its
  previous present band. On a three-band chain that is the same band, so the mutated guard still keeps ORDER
  (CHAIN-MUTANT-ONE-FLOAT, proven with ``N = 3``); with two floats Z3 finds a step that breaks it. The reference
  has the same bug planted as ``float-grows-down-into-the-low-gap`` (tests/quality/mutants.py CHAIN_MUTANTS):
  ``kvarena explore`` finds it on toy-two-float and not on toy-tri (tests/fast/test_explore.py).
"""

from __future__ import annotations

import time

import z3

from kvarena.proofs.ladder import Theorem, _prove


class Chain:
    """A symbolic chain of ``n`` bands and one step of band ``k`` to the span ``[a, b)``."""

    def __init__(self, tag: str) -> None:
        self.n, self.k, self.a, self.b, self.cap = z3.Ints(f"{tag}.N {tag}.k {tag}.a {tag}.b {tag}.C")
        self.p, self.q = z3.Ints(f"{tag}.p {tag}.q")  # k's adjacent present neighbours (when k is not an end)
        self.lo = z3.Array(f"{tag}.lo", z3.IntSort(), z3.IntSort())
        self.hi = z3.Array(f"{tag}.hi", z3.IntSort(), z3.IntSort())
        self.lo2, self.hi2 = z3.Store(self.lo, self.k, self.a), z3.Store(self.hi, self.k, self.b)
        self._i, self._j, self._m = z3.Ints(f"{tag}.i {tag}.j {tag}.m")

    def inside(self, i: z3.ArithRef) -> z3.BoolRef:
        return z3.And(i >= 0, i < self.n)

    def present(self, lo: z3.ArrayRef, hi: z3.ArrayRef, i: z3.ArithRef) -> z3.BoolRef:
        return z3.Or(i == 0, i == self.n - 1, lo[i] < hi[i])

    def spans(self, lo: z3.ArrayRef, hi: z3.ArrayRef) -> z3.BoolRef:
        i = self._i
        return z3.ForAll([i], z3.Implies(self.inside(i), z3.And(lo[i] >= 0, lo[i] <= hi[i], hi[i] <= self.cap)))

    def order(self, lo: z3.ArrayRef, hi: z3.ArrayRef) -> z3.BoolRef:
        i, j = self._i, self._j
        return z3.ForAll([i, j], z3.Implies(
            z3.And(self.inside(i), self.inside(j), i < j, self.present(lo, hi, i), self.present(lo, hi, j)),
            hi[i] <= lo[j]))

    def neighbours(self) -> z3.BoolRef:
        """``p`` is the last present band below ``k`` and ``q`` the first above it (for a band that is not an end)."""
        lo, hi, k, m = self.lo, self.hi, self.k, self._m
        below = z3.And(self.p >= 0, self.p < k, self.present(lo, hi, self.p),
                       z3.ForAll([m], z3.Implies(z3.And(self.p < m, m < k), z3.Not(self.present(lo, hi, m)))))
        above = z3.And(k < self.q, self.q < self.n, self.present(lo, hi, self.q),
                       z3.ForAll([m], z3.Implies(z3.And(k < m, m < self.q), z3.Not(self.present(lo, hi, m)))))
        return z3.And(z3.Implies(k > 0, below), z3.Implies(k < self.n - 1, above))

    def guard(self, lower: z3.ArithRef | None = None) -> z3.BoolRef:
        """The step: band ``k`` to ``[a, b)`` between its adjacent present neighbours (``lower``: the band that
        bounds it below, ``p`` unless a mutant says otherwise); an empty float anywhere."""
        lower = self.p if lower is None else lower
        k, a, b = self.k, self.a, self.b
        between = z3.And(z3.Implies(k > 0, self.hi[lower] <= a), z3.Implies(k < self.n - 1, b <= self.lo[self.q]))
        empty_float = z3.And(a == b, k > 0, k < self.n - 1)
        return z3.And(self.inside(k), a >= 0, a <= b, b <= self.cap, z3.Or(empty_float, between))

    def low_for_floats(self) -> z3.ArithRef:
        """The mutant's lower bound: the low end band for a float, ``p`` for the high end (as the planted bug:
        only the floats' loop of ``place`` is changed)."""
        return z3.If(self.k < self.n - 1, z3.IntVal(0), self.p)

    def before(self) -> list[z3.BoolRef]:
        return [self.n >= 2, self.cap >= 0, self.spans(self.lo, self.hi), self.order(self.lo, self.hi),
                self.neighbours()]

    def after(self) -> z3.BoolRef:
        return z3.And(self.spans(self.lo2, self.hi2), self.order(self.lo2, self.hi2))


def theorem_order(timeout_ms: int) -> Theorem:
    th = Theorem("CHAIN-ORDER", "for every chain length N >= 2 and every band k: bands in order, and k's new span "
                                "between its adjacent present neighbours (or an empty float), give bands in order")
    c = Chain("co")
    t0 = time.perf_counter()
    th.status, _m = _prove([*c.before(), c.guard()], c.after(), timeout_ms)
    th.seconds, th.bound = time.perf_counter() - t0, "unbounded: N, k, spans and capacity are integers"
    return th


def theorem_nonvacuous(timeout_ms: int) -> Theorem:
    th = Theorem("CHAIN-NONVACUOUS", "the step's hypotheses hold with two present floats (N = 4), the second one "
                                     "taking a larger non-empty span")
    c = Chain("cn")
    two = z3.And(c.n == 4, c.k == 2, c.lo[1] < c.hi[1], c.lo[2] < c.hi[2], c.a < c.b, c.b - c.a > c.hi[2] - c.lo[2])
    t0 = time.perf_counter()
    status, _m = _prove([*c.before(), c.guard(), two], z3.BoolVal(False), timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.status = "proven" if status == "counterexample" else f"vacuous ({status})"
    th.bound = "satisfiable: a model is the witness"
    return th


def theorem_mutant_one_float(timeout_ms: int) -> Theorem:
    th = Theorem("CHAIN-MUTANT-ONE-FLOAT", "mutant (a float bounded below by the low end, not its previous present "
                                           "band) on a three-band chain: still in order, so one float never exposes it")
    c = Chain("m3")
    t0 = time.perf_counter()
    th.status, _m = _prove([*c.before(), c.n == 3, c.guard(lower=c.low_for_floats())], c.after(), timeout_ms)
    th.seconds, th.bound = time.perf_counter() - t0, "N = 3 (toy-tri's chain); everything else unbounded"
    return th


def theorem_mutant(timeout_ms: int) -> Theorem:
    th = Theorem("CHAIN-MUTANT-LOW-GAP", "mutant: a float bounded below by the low end band breaks the order once "
                                         "another float is present below it; Z3 finds the step")
    c = Chain("mm")
    t0 = time.perf_counter()
    status, model = _prove([*c.before(), c.n == 4, c.guard(lower=c.low_for_floats())], c.after(), timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "searched at N = 4, the shortest chain with two floats; explore replays it in the reference"
    if status != "counterexample" or model is None:
        th.status = f"no counterexample ({status})"
        return th

    def val(x: z3.ExprRef) -> int:
        return model.eval(x, model_completion=True).as_long()

    n, k = val(c.n), val(c.k)
    spans = [(val(c.lo[i]), val(c.hi[i])) for i in range(n)]
    floats_present = sum(1 for i in range(1, n - 1) if spans[i][0] < spans[i][1])
    th.detail = (f"N = {n}, band {k} from {spans[k]} to [{val(c.a)}, {val(c.b)}), spans {spans}: "
                 f"{floats_present} present float(s) before the step")
    shaped = n >= 4 and floats_present >= 1
    th.status = "counterexample (expected)" if shaped else f"counterexample off shape: {th.detail}"
    return th


def run(timeout_ms: int = 30_000) -> list[Theorem]:
    return [theorem_order(timeout_ms), theorem_nonvacuous(timeout_ms), theorem_mutant_one_float(timeout_ms),
            theorem_mutant(timeout_ms)]
