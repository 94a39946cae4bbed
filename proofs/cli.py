"""``kvarena prove``: every invariant against every transition (Z3), the ladder theorems, and the contracts."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvarena.proofs import harness as H

# What --help shows, without importing the Z3 harness (so `kvarena prove --help` works without the 'proofs'
# extra); tests/fast/test_cli.py checks both against kvarena.proofs.harness.
DEFAULT_TIMEOUT_MS = 30_000
TRANSITION_NAMES = ("init", "admit", "extend", "share", "copy_state", "slide", "free", "acquire", "release", "write",
                    "move",
                    "compact", "relayout_grow", "relayout_move", "relayout_trim", "absorb")

EPILOG = """\
what it proves (proofs/README.md):
  Init ⇒ ID and  Inv ∧ T ⇒ ID'  for every invariant ID and every transition T of the symbolic model
  (proofs/model.py, proofs/transitions.py): one Z3 query per (case of T, conjunct of ID), each with a
  timeout; 'unknown' is a failure, never a pass. Then, per obligation:
    non-vacuity  Inv ∧ T is satisfiable with live pages, and the witness replays in the reference
    mutant      T with the bug ID rules out reaches a state breaking ID; the counterexample is rebuilt
                as a reference Arena, the same step runs with the same bug, and INVARIANTS[ID] raises
  and the ladder theorems (proofs/ladder.py): rung discipline, plan validity, rung-3 completeness.

reading a failure:
  CTI       Z3 found a valid pre-state and a step that breaks a conjunct: the model (or the spec) is
            wrong; rerun with --only ID --transition T -v to see the case and conjunct
  UNKNOWN   the solver gave up within --timeout: a failure; split the conjunct or raise the timeout
  VACUOUS?  no valid state can take the step: the guard is too strong and the proof says nothing
  MUTANT?   the planted bug was not found, or the reference did not agree (see the message)

examples:
  kvarena prove                          everything (about 30 s on 2 cores)
  kvarena prove --only INV-LEDGER-SAFETY one invariant against every transition
  kvarena prove --transition compact -v  one transition, one row per query
  kvarena prove --contracts              also run CrossHair on the helpers' PEP 316 contracts
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prove", help="prove every invariant against every transition (Z3), the ladder theorems "
                                     "and (--contracts) the helpers' contracts (CrossHair)",
                       description="Check the symbolic model of the arena: initiation and consecution of every "
                                   "invariant for every transition, non-vacuity, planted bugs replayed in the "
                                   "reference, and the admission ladder's theorems. Exits non-zero on any "
                                   "failure.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="INV-ID",
                   help="only this invariant (repeatable); skips the ladder theorems unless --ladder")
    p.add_argument("--transition", action="append", metavar="NAME",
                   help=f"only this transition (repeatable): {', '.join(TRANSITION_NAMES)}")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_MS, metavar="MS",
                   help=f"Z3 timeout per query in milliseconds (default {DEFAULT_TIMEOUT_MS})")
    p.add_argument("--jobs", type=int, default=2, help="processes for the obligations (default 2)")
    p.add_argument("--no-replay", action="store_true",
                   help="skip rebuilding witnesses in the reference (faster; the mutant column then says so)")
    p.add_argument("--ladder", action="store_true", help="run the ladder theorems even with --only/--transition")
    p.add_argument("--no-ladder", action="store_true", help="skip the ladder theorems")
    p.add_argument("--ladder-bound", choices=("ci", "nightly"), default="ci",
                   help="states swept by the exhaustive ladder check (default ci; nightly takes minutes)")
    p.add_argument("--contracts", action="store_true",
                   help="also check the PEP 316 contracts of the pure helpers with CrossHair")
    p.add_argument("-v", "--verbose", action="store_true", help="one row per Z3 query, and mutant details")
    p.set_defaults(func=run)


def _short(inv: str) -> str:
    return inv.removeprefix("INV-")


def _mutant_cell(ob: H.Obligation) -> str:
    if ob.mutants:
        return ", ".join(f"{m.mutant}: {'refuted+replayed' if m.status == 'refuted' else m.status}"
                         for m in ob.mutants)
    return "n/a (frame)" if ob.no_mutant.startswith("frame") else ("n/a (see reason)" if ob.no_mutant else "MISSING")


def _vac_cell(ob: H.Obligation) -> str:
    from kvarena.proofs import harness as H

    if ob.transition == H.INIT:
        return "-"
    return ob.nonvacuity.split(" (")[0] if ob.nonvacuity.startswith("sat") else ob.nonvacuity


def print_table(obs: list[H.Obligation], verbose: bool) -> None:
    from kvarena.proofs import harness as H

    rows = [("obligation", "invariant", "transition", "result", "queries", "non-vacuity", "mutant", "time",
             "bound")]
    for ob in obs:
        obligation = f"Init ⇒ {_short(ob.inv)}" if ob.transition == H.INIT else f"Inv ∧ {ob.transition} ⇒ " \
                                                                               f"{_short(ob.inv)}'"
        proven = sum(q.status == "unsat" for q in ob.queries)
        rows.append((obligation, ob.inv, ob.transition, ob.result, f"{proven}/{len(ob.queries)}", _vac_cell(ob),
                     _mutant_cell(ob), f"{ob.seconds:.2f}s", ob.bound))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 2)]
    for r in rows:
        head = "  ".join(c.ljust(w) for c, w in zip(r, widths))
        print(f"{head}  {r[-2]:>7}  {r[-1]}")
        ob = obs[rows.index(r) - 1] if r is not rows[0] else None
        if ob is None:
            continue
        if verbose:
            for q in ob.queries:
                print(f"    {q.case:<18} {q.conjunct:<22} {q.status:<8} {q.seconds * 1000:7.1f} ms {q.reason}")
            for m in ob.mutants:
                print(f"    mutant {m.mutant} ({m.case}): {m.status}; reference: {m.replay}")
            if ob.no_mutant:
                print(f"    no mutant: {ob.no_mutant}")
        elif not ob.ok:
            bad = [q for q in ob.queries if q.status != "unsat"]
            for q in bad[:3]:
                print(f"    {q.case}: {q.conjunct} is {q.status} {q.reason}")
            for m in ob.mutants:
                if m.status != "refuted":
                    print(f"    mutant {m.mutant}: {m.status}")
            if not (ob.nonvacuity.startswith("sat") or ob.transition == H.INIT):
                print(f"    non-vacuity: {ob.nonvacuity}")


def run(args: argparse.Namespace) -> int:
    from kvarena.proofs import harness as H  # needs z3: the 'proofs' extra (kvarena/cli.py names it if missing)
    from kvarena.proofs import ladder as LD

    t0 = time.perf_counter()
    failures = 0
    try:
        obs = H.run(args.only, args.transition, args.timeout, replay=not args.no_replay, jobs=args.jobs)
    except KeyError as e:
        print(f"kvarena prove: {e.args[0]}", file=sys.stderr)
        return 2
    print_table(obs, args.verbose)
    failures += sum(not ob.ok for ob in obs)
    print(f"\n{len(obs)} obligations, {sum(ob.ok for ob in obs)} proven with non-vacuity and mutants; "
          f"{sum(len(ob.queries) for ob in obs)} Z3 queries; bound: {H.PROOF_BOUND} for proofs, "
          f"{H.WITNESS_BOUND} for witnesses")
    ladder = (not args.no_ladder) and (args.ladder or not (args.only or args.transition))
    if ladder:
        bounds = LD.LADDER_BOUNDS if args.ladder_bound == "ci" else (LD.NIGHTLY_BOUND,)
        from kvarena.proofs import theorems  # the ladder's, sized rung 2's and padding's (spec §Padding lanes)

        ths = theorems.run(args.timeout, bounds, args.jobs)
        print("\nladder theorem       result                     time     bound")
        for th in ths:
            print(f"{th.name:<20} {th.status[:26]:<26} {th.seconds:7.2f}s  {th.bound}")
            print(f"    {th.statement}")
            if th.detail:
                print(f"    {th.detail}")
            if not th.ok and len(th.status) > 26:
                print(f"    {th.status}")
        failures += sum(not th.ok for th in ths)
    if args.contracts:
        from kvarena.proofs import contracts as C

        print(f"\nCrossHair (PEP 316, --per_condition_timeout={C.PER_CONDITION_TIMEOUT})")
        for r in C.check_all():
            status = "no counterexample" if r.clean else "VIOLATION"
            print(f"  {r.targets[0]:<45} {status:<18} {r.seconds:6.1f}s")
            for f in r.findings:
                print(f"    {f}")
            failures += not r.clean
    print(f"\n{'FAILED' if failures else 'OK'}: {failures} failure(s), {time.perf_counter() - t0:.1f} s")
    return 1 if failures else 0
