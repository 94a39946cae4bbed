"""`kvarena explore` measured: states and transitions per configuration and depth, and the project's planted bugs
each bound kills, against the lockstep machine's random search given the same time.

    python bench/explore_kills.py                     # reference mutants; writes bench/results/explore-<date>.md
    python bench/explore_kills.py --suite gpu         # gpu/'s lockstep mutants through --impl gpu/ (slower)
    python bench/explore_kills.py --smoke             # two mutants, small bounds, prints only

A mutant is planted in a copy of the reference (tests/quality/mutants.py ``isolated``, with its plan validator, as
the reference ships; the harness's checks include the reference's invariant predicates on an Arena-like
implementation, as ``kvarena conform`` runs them by default: with the validator off those predicates' refusal probe
fails on every copy, so that is not measured here) or in gpu/ (tests/quality/gpu_mutants.py ``applied``, the plain-torch
path), and replayed in lockstep with the real reference at ``exact``. Explore runs breadth first up to ``--depth``
(``--max-states``): its kill depth is the depth of the first violation, so one run says what every smaller bound
kills. The random search is the lockstep machine
(conformance/machine/lockstep.py, Hypothesis, random seeds, 50 steps an example) on the same factory, run in
rounds of 10 examples until it fails or has used as much time as explore did (at least ``--min-random`` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.quality: the mutants live with the tests

from bench._provenance import finish, machine_line, python_line
from kvarena.conformance.explore.search import Bounds, explore

OUT = Path(__file__).resolve().parent / "results"
CONFIGS = [("toy-tri", 4), ("toy-two-float", 3), ("toy-win-float", 4), ("toy-swa", 4), ("toy-state", 4)]


def random_search(factory: Callable, seconds: float, deep: bool) -> tuple[bool, float, int, str]:
    """The lockstep machine on random seeds until it fails or ``seconds`` pass: (killed, seconds, examples, why)."""
    from hypothesis import HealthCheck, Phase, settings

    from kvarena.conformance.machine.lockstep import run_lockstep

    t0, examples = time.perf_counter(), 0
    s = settings(max_examples=10, derandomize=False, database=None, deadline=None, stateful_step_count=50,
                 phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
    while time.perf_counter() - t0 < seconds:
        try:
            run_lockstep(factory, "exact", s, deep=deep)
        except Exception as e:  # a divergence, or the mutant's own crash reported through the harness
            return True, time.perf_counter() - t0, examples + 10, str(e).split("\n")[0][:90]
        examples += 10
    return False, time.perf_counter() - t0, examples, ""


@contextlib.contextmanager
def reference_mutant(m: Any) -> Iterator[Callable]:
    from tests.quality.mutants import isolated

    yield isolated(m, validator=True)


def reference_suite() -> list[tuple[str, Any, str, Callable]]:
    from tests.quality import mutants as M

    out = []
    for group in ("MUTANTS", "REFUSAL_MUTANTS", "ACCOUNTING_MUTANTS", "CONTENT_MUTANTS", "SHAPE_MUTANTS",
                  "CHAIN_MUTANTS"):
        model = "toy-two-float" if group == "CHAIN_MUTANTS" else "toy-tri"
        label = {"MUTANTS": "arena"}.get(group, group.lower().removesuffix("_mutants"))
        out += [(label, m, model, reference_mutant) for m in getattr(M, group)]
    return out


def gpu_suite() -> list[tuple[str, Any, str, Callable]]:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tests.quality import gpu_mutants as G

    @contextlib.contextmanager
    def planted(m: Any) -> Iterator[Callable]:
        with G.applied(m, "torch") as factory:
            yield factory

    return [("gpu", m, "toy-tri", planted) for m in G.MUTANTS if m.lockstep and m.machine == "lockstep"]


def kill_table(suite: list, depth: int, max_states: int, min_random: float, log: Callable[[str], None]) -> list[dict]:
    rows = []
    for group, m, model, plant in suite:
        with plant(m) as factory:
            t0 = time.perf_counter()
            r = explore(Bounds(model=model, depth=depth, max_states=max_states, impl=m.name), factory=factory)
            ex_s = time.perf_counter() - t0
            v = r.violations[0] if r.violations else None
            killed, rs, examples, why = random_search(factory, max(ex_s, min_random), deep=True)
        rows.append({"group": group, "name": m.name, "model": model, "kill_depth": v.depth if v else None,
                     "inv": (v.inv or "divergence") if v else "", "states": r.states, "explore_s": ex_s,
                     "random_killed": killed, "random_s": rs, "random_examples": examples, "random_why": why})
        log(f"{m.name}: explore {'depth ' + str(v.depth) if v else 'survived'} ({r.states:,} states, {ex_s:.1f} s); "
            f"random {'killed' if killed else 'survived'} ({examples} examples, {rs:.1f} s)")
    return rows


def state_table(depth_cap: int, log: Callable[[str], None]) -> list[str]:
    lines = ["| model | arena B | level | states found so far (within level + 1 steps; the last level only checks) | "
             "transitions so far | level s |",
             "|---|---:|---:|---:|---:|---:|"]
    for model, depth in CONFIGS:
        r = explore(Bounds(model=model, depth=min(depth, depth_cap)))
        log(f"{model}: {r.states:,} states to depth {r.depth_reached} in {r.seconds:.1f} s")
        for d in r.per_depth:
            lines.append(f"| {model} | {r.capacity} | {d['depth']} | {d['states']:,} | {d['transitions']:,} | "
                         f"{d['seconds']:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("reference", "gpu"), default="reference")
    p.add_argument("--depth", type=int, default=None, help="explore's bound per mutant (reference 4, gpu 2)")
    p.add_argument("--max-states", type=int, default=20_000)
    p.add_argument("--min-random", type=float, default=5.0, help="the random search's least seconds per mutant")
    p.add_argument("--no-states", action="store_true", help="skip the states-per-configuration table")
    p.add_argument("--smoke", action="store_true", help="two mutants, depth 2, print only")
    args = p.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {line}", file=sys.stderr, flush=True)

    suite = reference_suite() if args.suite == "reference" else gpu_suite()
    depth = args.depth or (4 if args.suite == "reference" else 2)
    if args.smoke:
        suite, depth = suite[:2], 2
    states = [] if args.no_states or args.smoke or args.suite == "gpu" else state_table(4, log)
    rows = kill_table(suite, depth, args.max_states, args.min_random, log)
    date = datetime.date.today().isoformat()
    cmd = "python bench/explore_kills.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = [f"# kvarena explore: states, and the planted bugs each bound kills ({args.suite} mutants), {date}", "",
            f"- command: `{cmd}` (wall {time.perf_counter() - t0:.0f} s)", machine_line(load), python_line(),
            f"- explore: breadth first to depth {depth} (at most {args.max_states:,} states), lockstep with the real "
            "reference at exact, " + ("the mutant's plan validator on (as the reference ships), conform's default deep "
                                      "predicates on the Arena-like implementation" if args.suite == "reference" else
                                      "the mutant planted in gpu/ (its plain-torch path)"),
            f"- random: the lockstep machine, random seeds, 10 examples a round of 50 steps, until killed or the time "
            f"explore took (at least {args.min_random:.0f} s)", ""]
    if states:
        text += ["## States and transitions (the reference alone, demand 0..1 a class, smallest arena at "
                 "max_context_len 4, page size 2)", "", *states, ""]
    text += ["## Kills", "", "| group | mutant | model | explore: killed at depth | invariant | states | explore s | "
             "random: killed | random s | examples |", "|---|---|---|---:|---|---:|---:|---|---:|---:|"]
    for r in rows:
        text.append(f"| {r['group']} | {r['name']} | {r['model']} | {r['kill_depth'] or '-'} | {r['inv']} | "
                    f"{r['states']:,} | {r['explore_s']:.1f} | {'yes' if r['random_killed'] else 'no'} | "
                    f"{r['random_s']:.1f} | {r['random_examples']} |")
    text += ["", "| bound | killed by explore | killed by random search at explore's time |", "|---|---:|---:|"]
    for d in range(1, depth + 1):
        k = sum(1 for r in rows if r["kill_depth"] is not None and r["kill_depth"] <= d)
        text.append(f"| depth <= {d} | {k} of {len(rows)} | |")
    text.append(f"| all | {sum(1 for r in rows if r['kill_depth'])} of {len(rows)} | "
                f"{sum(1 for r in rows if r['random_killed'])} of {len(rows)} |")
    only_e = [r["name"] for r in rows if r["kill_depth"] and not r["random_killed"]]
    only_r = [r["name"] for r in rows if r["random_killed"] and not r["kill_depth"]]
    neither = [r["name"] for r in rows if not r["random_killed"] and not r["kill_depth"]]
    text += ["", f"- explore only: {', '.join(only_e) or 'none'}", f"- random only: {', '.join(only_r) or 'none'}",
             f"- neither: {', '.join(neither) or 'none'}", ""]
    name = f"explore-{args.suite}-{date}.md"
    return finish(OUT, name, "\n".join(text), args.smoke)


if __name__ == "__main__":
    sys.exit(main())
