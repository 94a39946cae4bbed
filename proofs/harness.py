"""The proof loop: one Z3 query per (transition case, invariant conjunct), non-vacuity, mutants, replays.

For every transition ``T`` and every invariant ID:

* **proof** (unbounded): ``config_ok ∧ Inv(pre) ∧ guard_T ∧ ¬conjunct(post)`` is ``unsat`` for every case of
  ``T`` and every conjunct of the ID, each query on one solver with push/pop and a timeout; ``sat`` is a
  counterexample to induction (CTI) and ``unknown`` a failure, never a pass. ``Init ⇒ conjunct`` likewise.
* **non-vacuity**: ``Inv(pre) ∧ guard_T`` is satisfiable with a live page before and after, for every case,
  and that witness replays in the reference: its pre-state passes every predicate, the real operation runs,
  and the post-state passes every predicate.
* **mutant**: the transition with the bug the invariant rules out (``transitions.MUTANTS``) reaches a state
  where a conjunct of the ID fails; the counterexample is rebuilt as a reference ``Arena`` (``replay``) where
  the same step, with the same bug, makes ``INVARIANTS[ID]`` raise with that ID. Obligations without a
  meaningful mutant say why (``transitions.NO_MUTANT``, or "frame": the transition writes nothing the ID reads,
  checked here from the post-state terms).

Witnesses (non-vacuity, mutants) are searched in a finite instance: the toy-tri configuration
(``WITNESS_CONFIG``) and small domains per role (``WITNESS_DOMAIN``), every quantifier instantiated over its
role's domain; the replay in the reference then checks the witness on the real code. Proofs use no bound.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import z3

from kvarena.proofs import model as M
from kvarena.proofs import transitions as T
from kvarena.proofs.witness import NOT_MODELLED, WITNESS_CONFIG, WITNESS_DOMAIN, Witness

DEFAULT_TIMEOUT_MS = 30_000
INIT = "init"
PROOF_BOUND = "chain of 3 bands (one float)"


def prove_content_transport(mutant: str | None = None, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> dict[str, str]:
    """INV-CONTENT-FOLLOWS-VID's two transport lemmas, on the model's own update terms (unbounded): a hand-out
    (``transitions.bind``, every placement's bind) leaves no row at its slot, and a move (``transitions._move_post``,
    every compaction and relayout move) puts every row of the source, and only those, at the destination. Lemma ->
    Z3 status: ``unsat`` is proven; a ``mutant`` of ``_move_post`` (e.g. "partial-layer-move") must make it ``sat``."""
    st = M.state("cfv")
    b, s, v, src, dst, e, r, uw = (z3.Int(f"cfv.{n}") for n in ("b", "s", "v", "src", "dst", "e", "r", "uw"))
    post, _args = T._move_post(st, b, src, dst, z3.Bool("cfv.iu"), uw, mutant, "cfv")
    goals = {"hand-out zeroes": z3.Not(T.bind(st, b, s, v)["content"][b, s, e, r]),
             "move carries every row": z3.Implies(src != dst, post.content[b, dst, e, r] == st.content[b, src, e, r])}
    out = {}
    for name, goal in goals.items():
        solver = z3.Solver()
        solver.set(timeout=timeout_ms)
        solver.add(z3.Not(goal))
        out[name] = str(solver.check())
    return out


WITNESS_BOUND = ("witnesses: toy-tri, capacity 2048 B, page_size 4; slots < 10, vids < 8, 3 owners, 3 users, "
                 "entries and rows < 5")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Query:
    case: str
    conjunct: str
    status: str  # "unsat" (proven), "sat" (counterexample), "unknown" (failure)
    seconds: float
    reason: str = ""


@dataclass
class MutantOutcome:
    mutant: str
    status: str  # "refuted" (Z3 found the bug and the reference confirms it) or a failure text
    case: str = ""
    seconds: float = 0.0
    replay: str = ""  # what the reference said


@dataclass
class Obligation:
    inv: str
    transition: str
    queries: list[Query] = field(default_factory=list)
    nonvacuity: str = ""  # "sat+replayed" or a failure text
    mutants: list[MutantOutcome] = field(default_factory=list)
    no_mutant: str = ""  # the documented reason when there is no mutant
    seconds: float = 0.0
    bound: str = ""

    @property
    def name(self) -> str:
        if self.transition == INIT:
            return f"Init ⇒ {self.inv}"
        return f"{self.inv} ∧ {self.transition} ⇒ {self.inv}'"

    @property
    def proven(self) -> bool:
        return bool(self.queries) and all(q.status == "unsat" for q in self.queries)

    @property
    def ok(self) -> bool:
        vac_ok = self.nonvacuity.startswith("sat") or self.transition == INIT
        mut_ok = (all(m.status == "refuted" for m in self.mutants) and bool(self.mutants)) or bool(self.no_mutant)
        return self.proven and vac_ok and mut_ok

    @property
    def result(self) -> str:
        if not self.queries:
            return "MISSING"
        bad = [q for q in self.queries if q.status != "unsat"]
        if bad:
            q = bad[0]
            return "CTI" if q.status == "sat" else "UNKNOWN"
        if not self.ok:
            return "VACUOUS?" if not (self.nonvacuity.startswith("sat") or self.transition == INIT) else "MUTANT?"
        return "proven"


# ---------------------------------------------------------------------------------------------
# Witness instances: quantifiers instantiated over finite domains


_GROUND_MEMO: dict[int, tuple[z3.ExprRef, z3.ExprRef]] = {}  # id -> (term, kept alive so ids stay unique; out)
_HAS_Q: dict[int, tuple[z3.ExprRef, bool]] = {}


def _has_quantifier(x: z3.ExprRef) -> bool:
    key = x.get_id()
    if key not in _HAS_Q:
        if z3.is_quantifier(x):
            found = not x.is_lambda() or _has_quantifier(x.body())
        else:
            found = z3.is_app(x) and any(_has_quantifier(k) for k in x.children())
        _HAS_Q[key] = (x, found)
    return _HAS_Q[key][1]


def ground(e: z3.ExprRef, domain: dict[str, range] = WITNESS_DOMAIN) -> z3.ExprRef:
    """``e`` with every ForAll / Exists (not Lambda) expanded over the domains of its variables' roles."""
    memo = _GROUND_MEMO if domain is WITNESS_DOMAIN else {}

    def go(x: z3.ExprRef) -> z3.ExprRef:
        key = x.get_id()
        if key in memo:
            return memo[key][1]
        if z3.is_quantifier(x):
            if x.is_lambda():
                out = x
            else:
                n = x.num_vars()
                roles = [x.var_name(i).split("#")[0] for i in range(n)]
                body, nested = x.body(), _has_quantifier(x.body())
                insts = []
                for vals in itertools.product(*[domain[r] for r in roles]):
                    inst = z3.substitute_vars(body, *[z3.IntVal(v) for v in reversed(vals)])
                    insts.append(go(inst) if nested else inst)
                out = z3.And(*insts) if x.is_forall() else z3.Or(*insts)
        elif not _has_quantifier(x):
            out = x
        elif z3.is_app(x) and x.num_args():
            kids = [go(k) for k in x.children()]
            out = x.decl()(*kids) if any(not a.eq(b) for a, b in zip(kids, x.children())) else x
        else:
            out = x
        memo[key] = (x, out)
        return out

    return go(e)


def pin_config(c: M.Config, w: dict = WITNESS_CONFIG) -> z3.BoolRef:
    pairs = [(c.C, w["capacity"]), (c.TOP, w["TOP"]), (c.Q, w["Q"]), (c.REC, w["REC"]), (c.R, w["R"])]
    for key in ("P", "NE", "NR", "D"):
        pairs += list(zip(getattr(c, key), w[key]))
    return z3.And(*[term == value for term, value in pairs])


def in_domain(st: M.State, args: dict, domain: dict[str, range] = WITNESS_DOMAIN) -> z3.BoolRef:
    """The pre-state and the step's integer arguments lie in the witness domain."""
    slots, vids = domain["slot"], domain["vid"]
    b, s = M.qb, M.qs
    out = [st.hi[k] <= slots.stop - 1 for k in M.BANDS]
    out += [st.next_vid <= vids.stop - 1, st.next_gen <= 60,
            z3.ForAll([b, s], z3.Implies(st.live[b, s], z3.And(st.p2v[b, s] >= vids.start,
                                                               st.p2v[b, s] < vids.stop))),
            z3.ForAll([M.qv], z3.Implies(st.bound[M.qv], z3.And(st.vslot[M.qv] >= slots.start,
                                                                st.vslot[M.qv] < slots.stop)))]
    roles = {"o": "owner", "u": "user", "v": "vid", "e": "entry", "r": "row", "e0": "entry", "r0": "row",
             "src": "slot", "dst": "slot", "s": "slot", "t": "slot", "t_end": "slot", "b": "band",
             "other": "owner", "user": "user", "sv": "vid", "ab": "band", "aslot": "slot"}
    for name, a in args.items():
        if name in roles and z3.is_int(a):
            rng = domain[roles[name]]
            top = rng.stop if name == "t_end" else rng.stop - 1
            out.append(z3.And(a >= rng.start, a <= top))
    return z3.And(*out)


def witness_state(tag: str, domain: dict[str, range] = WITNESS_DOMAIN) -> M.State:
    """A symbolic state whose owners and users lie in the witness domain by definition, so that no witness (a
    ghost's value, another owner, another user) can point outside what the replay rebuilds."""
    st = M.state(tag)
    o, u = M.qo, M.qu
    own, use = domain["owner"], domain["user"]
    return st.update(owner=z3.Lambda([o], z3.And(o >= own.start, o < own.stop, st.owner[o])),
                     user=z3.Lambda([u], z3.And(u >= use.start, u < use.stop, st.user[u])))


def settled(st: M.State) -> z3.BoolRef:
    """What every operation leaves: no hole on an edge a band grows from; an empty float parked at (0, 0)."""
    lo, hi, h = st.lo, st.hi, st.holes
    return z3.And(
        z3.Implies(hi[M.LOW] > lo[M.LOW], z3.Not(h[M.LOW, hi[M.LOW] - 1])),
        z3.Implies(hi[M.HIGH] > lo[M.HIGH], z3.Not(h[M.HIGH, lo[M.HIGH]])),
        z3.If(M.float_present(st), z3.And(z3.Not(h[M.FLOAT, lo[M.FLOAT]]), z3.Not(h[M.FLOAT, hi[M.FLOAT] - 1])),
              z3.And(lo[M.FLOAT] == 0, hi[M.FLOAT] == 0)))


# ---------------------------------------------------------------------------------------------
# The loop


def _check(s: z3.Solver, *extra: z3.BoolRef) -> tuple[str, float, str]:
    t0 = time.perf_counter()
    r = s.check(*extra)
    dt = time.perf_counter() - t0
    return str(r), dt, (s.reason_unknown() if r == z3.unknown else "")


def frame(step_post: M.State, pre: M.State) -> frozenset[str]:
    """The fields a step writes (its post-state term differs from the pre-state's)."""
    out = set()
    for f in M.FIELDS:
        a, b = getattr(step_post, f), getattr(pre, f)
        same = all(x.eq(y) for x, y in zip(a, b)) if isinstance(a, tuple) else a.eq(b)
        if not same:
            out.add(f)
    return frozenset(out)


def writes_of(tr: T.Transition) -> frozenset[str]:
    c, pre = M.config("w"), M.state("w")
    out: set[str] = set()
    for st in tr.build(c, pre, "w"):
        out |= frame(st.post, pre)
    return frozenset(out)


def reads_of(inv: str) -> frozenset[str]:
    return frozenset().union(*[k.reads for k in M.conjuncts(inv)])


def _prove(c: M.Config, hypotheses: list[z3.BoolRef], goal: z3.BoolRef, timeout_ms: int) -> tuple[str, float, str]:
    """``hypotheses ⇒ goal`` on a fresh solver. (One solver per query: with push/pop the instantiations of
    earlier queries made one obligation time out; fresh solvers take about 6 s for all of them.)"""
    s = z3.Solver()
    s.set(timeout=timeout_ms)
    s.add(*hypotheses, z3.Not(goal))
    return _check(s)


def prove_transition(tr: T.Transition, invs: Iterable[str], timeout_ms: int) -> dict[str, list[Query]]:
    c, pre = M.config(), M.state("pre")
    out: dict[str, list[Query]] = {inv: [] for inv in invs}
    inv_pre = M.invariant(c, pre)
    for st in tr.build(c, pre, tr.name):
        for inv in out:
            for k in M.conjuncts(inv):
                status, dt, why = _prove(c, [M.config_ok(c), inv_pre, st.guard], k.formula(c, st.post), timeout_ms)
                if status != "unsat":  # a counterexample is easier to find (and to read) in the witness instance
                    found, dt2 = find_cti(tr, st.case, k, timeout_ms)
                    if found:
                        status, why = "sat", f"counterexample to induction in the witness instance ({why or 'sat'})"
                    dt += dt2
                out[inv].append(Query(st.case, k.name, status, dt, why))
    return out


def find_cti(tr: T.Transition, case: str, k: M.Conjunct, timeout_ms: int) -> tuple[bool, float]:
    """``Inv ∧ T ∧ ¬conjunct'`` in the finite witness instance: sat is a definite counterexample to induction."""
    c, pre = M.config("cti"), witness_state("ctipre")
    t0 = time.perf_counter()
    for st in tr.build(c, pre, tr.name):
        if st.case != case:
            continue
        s = _witness_solver(c, timeout_ms)
        s.add(*[ground(p) for p in (M.invariant(c, pre), st.guard, in_domain(pre, st.args),
                                    z3.Not(k.formula(c, st.post)))])
        return s.check() == z3.sat, time.perf_counter() - t0
    return False, time.perf_counter() - t0


def prove_init(invs: Iterable[str], timeout_ms: int) -> dict[str, list[Query]]:
    c, pre = M.config(), M.state("init")
    out: dict[str, list[Query]] = {}
    for inv in invs:
        out[inv] = []
        for k in M.conjuncts(inv):
            status, dt, why = _prove(c, [M.config_ok(c), M.init(c, pre)], k.formula(c, pre), timeout_ms)
            out[inv].append(Query("empty arena", k.name, status, dt, why))
    return out


def _witness_solver(c: M.Config, timeout_ms: int) -> z3.Solver:
    s = z3.Solver()
    s.set(timeout=timeout_ms)
    s.add(pin_config(c), M.config_ok(c))
    return s


def find_witnesses(tr: T.Transition, timeout_ms: int, mutant: str | None = None, breaks: str | None = None,
                   every_case: bool = False) -> tuple[list[tuple[str, str, float]], list[Witness]]:
    """Non-vacuity (``mutant`` None: a live page before and after the step) or a mutant's counterexample
    (``breaks``: a main conjunct of that ID fails after the step), per case in the witness instance.
    Returns the per-case statuses and the witnesses (the first one only, unless ``every_case``)."""
    c, pre = M.config("wc"), witness_state("wpre")
    tried: list[tuple[str, str, float]] = []
    found: list[Witness] = []
    for st in tr.build(c, pre, tr.name, mutant):
        s = _witness_solver(c, timeout_ms)
        parts = [M.invariant(c, pre), st.guard, in_domain(pre, st.args)]
        if tr.from_settled:
            parts.append(settled(pre))
        if mutant is None:
            parts += [M.some_live_page(pre, "nv1"), M.some_live_page(st.post, "nv2")]
        else:
            parts.append(st.replay_guard)
            parts.append(z3.Not(z3.And(*[k.formula(c, st.post) for k in M.conjuncts(breaks) if not k.aux])))
        s.add(*[ground(p) for p in parts])
        status, dt, why = _check(s)
        tried.append((st.case, status if status != "unknown" else f"unknown ({why})", dt))
        if status == "sat":
            found.append(Witness(s.model(), c, pre, st, tr.name))
            if not every_case:
                break
    return tried, found


def find_init_witness(mutant: str, breaks: str, timeout_ms: int) -> tuple[str, float, Witness | None]:
    c, pre = M.config("wc"), witness_state("winit")
    s = z3.Solver()
    s.set(timeout=timeout_ms)
    w = WITNESS_CONFIG
    if mutant == "init-skips-floor":  # the capacity is what the bug lets through; the geometry is toy-tri's
        s.add(*[c.P[b] == w["P"][b] for b in M.BANDS], *[c.NE[b] == w["NE"][b] for b in M.BANDS],
              *[c.NR[b] == w["NR"][b] for b in M.BANDS], *[c.D[b] == w["D"][b] for b in M.BANDS])
    else:
        s.add(pin_config(c))
    s.add(M.config_ok(c), ground(T.init_mutant(c, pre, mutant)),
          ground(z3.Not(z3.And(*[k.formula(c, pre) for k in M.conjuncts(breaks) if not k.aux]))))
    status, dt, why = _check(s)
    if status != "sat":
        return (status if status != "unknown" else f"unknown ({why})"), dt, None
    return status, dt, Witness(s.model(), c, pre, None, INIT)


def run(invs: Iterable[str] | None = None, transitions: Iterable[str] | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS, replay: bool = True, jobs: int = 1) -> list[Obligation]:
    """Every obligation for the selected IDs and transitions, with non-vacuity, mutants and replays; the
    transitions are shared out over ``jobs`` processes."""
    from kvarena.reference.invariants import INVARIANTS

    modelled = [i for i in INVARIANTS if i not in NOT_MODELLED]
    invs = list(invs or modelled)
    unknown = set(invs) - set(INVARIANTS)
    if unknown:
        raise KeyError(f"unknown invariant IDs {sorted(unknown)}; use {modelled}")
    bare = sorted(set(invs) & set(NOT_MODELLED))
    if bare:
        raise KeyError(f"{bare[0]} has no Z3 obligation: {NOT_MODELLED[bare[0]]}; use one of {modelled}")
    names = list(transitions or [INIT, *[t.name for t in T.TRANSITIONS]])
    bad = set(names) - {INIT, *T.BY_NAME}
    if bad:
        raise KeyError(f"unknown transitions {sorted(bad)}; use {[INIT, *T.BY_NAME]}")
    order = [n for n in [INIT, *T.BY_NAME] if n in names]
    tasks = [(n, invs, timeout_ms, replay) for n in order]
    parts = None
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing as mp

        try:
            ctx = mp.get_context("fork")  # Z3 terms do not pickle: workers rebuild everything from the names
        except ValueError:  # pragma: no cover - no fork on this platform: run in this process
            ctx = None
        if ctx is not None:
            with ctx.Pool(min(jobs, len(tasks))) as pool:
                parts = pool.starmap(_run_one, tasks, chunksize=1)
    if parts is None:
        parts = [_run_one(*task) for task in tasks]
    return [ob for part in parts for ob in part]


def _run_one(name: str, invs: list[str], timeout_ms: int, replay: bool) -> list[Obligation]:
    from kvarena.proofs import replay as R

    results: list[Obligation] = []
    if name == INIT:
        t0 = time.perf_counter()
        proofs = prove_init(invs, timeout_ms)
        per = (time.perf_counter() - t0) / max(1, len(invs))
        for inv in invs:
            ob = Obligation(inv, INIT, proofs[inv], seconds=per, bound=PROOF_BOUND)
            muts = [m for m in T.INIT_MUTANTS if inv in m.breaks]
            for m in muts:
                status, dt, wit = find_init_witness(m.name, inv, timeout_ms)
                ob.mutants.append(_replayed(m, inv, status, "empty arena", dt, wit, replay, R))
            if not muts:
                ob.no_mutant = ("Init is the constructor's empty state: nothing is bound, held or written; its "
                                "planted bugs are init-skips-floor and init-high-unanchored")
            ob.seconds += sum(m.seconds for m in ob.mutants)
            results.append(ob)
        return results
    tr = T.BY_NAME[name]
    t0 = time.perf_counter()
    proofs = prove_transition(tr, invs, timeout_ms)
    per = (time.perf_counter() - t0) / max(1, len(invs))
    t1 = time.perf_counter()
    tried, wits = find_witnesses(tr, timeout_ms, every_case=True)
    vac = _nonvacuity(tried, wits, replay, R)
    vac_time = time.perf_counter() - t1
    writes = writes_of(tr)
    for inv in invs:
        ob = Obligation(inv, tr.name, proofs[inv], nonvacuity=vac, seconds=per + vac_time / len(invs),
                        bound=PROOF_BOUND)
        muts = [m for m in T.MUTANTS if m.transition == tr.name and inv in m.breaks]
        for m in muts:
            t2 = time.perf_counter()
            tried_m, found_m = find_witnesses(tr, timeout_ms, m.name, inv)
            wit_m = found_m[0] if found_m else None
            status = "sat" if wit_m else "; ".join(f"{cs}: {st}" for cs, st, _ in tried_m)
            case = wit_m.step.case if wit_m and wit_m.step else ""
            ob.mutants.append(_replayed(m, inv, status, case, time.perf_counter() - t2, wit_m, replay, R))
        if not muts:
            touched = writes & reads_of(inv)
            if not touched:
                ob.no_mutant = f"frame: {tr.name} writes {sorted(writes) or 'nothing'}, none of which {inv} reads"
            else:
                ob.no_mutant = T.NO_MUTANT.get((tr.name, inv), "")
        ob.seconds += sum(m.seconds for m in ob.mutants)
        results.append(ob)
    return results


def _nonvacuity(tried, wits: list[Witness], replay: bool, R) -> str:
    bad = [f"{c}: {s}" for c, s, _ in tried if s != "sat"]
    if bad:
        return "no witness for " + "; ".join(bad)
    if not replay:
        return f"sat ({len(wits)} case(s))"
    for w in wits:
        try:
            R.replay_valid(w)
        except Exception as e:  # a disagreement between the model and the reference is a failure, shown
            case = w.step.case if w.step else ""
            return f"sat, replay FAILED ({case}): {type(e).__name__}: {e}"
    return f"sat+replayed ({len(wits)} case(s))"


def _replayed(m: T.Mutant, inv: str, status: str, case: str, dt: float, wit: Witness | None, replay: bool,
              R) -> MutantOutcome:
    if wit is None:
        return MutantOutcome(m.name, f"not refuted: {status}", case, dt)
    if not replay:
        return MutantOutcome(m.name, "refuted", case, dt, "(replay skipped)")
    t0 = time.perf_counter()
    try:
        said = R.replay_mutant(wit, m, inv)
    except Exception as e:
        return MutantOutcome(m.name, f"replay FAILED: {type(e).__name__}: {e}", case,
                             dt + time.perf_counter() - t0)
    return MutantOutcome(m.name, "refuted", case, dt + time.perf_counter() - t0, said)
