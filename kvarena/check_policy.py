"""``kvarena check-policy``: can this admission policy corrupt memory, and is it any good?

1. Safety: the conformance state machine drives an arena that uses the policy; after
   every step every invariant is checked, and every plan the policy returns is
   validated against the spec's rules before it is applied.  A violation is printed
   with its invariant ID and the shrunk trace that reproduces it.
2. Z3 plan obligations: every step a validated plan can be made of (a placement, a page
   move, a float retarget / move / trim, a boundary absorption) preserves every invariant
   whenever its guard holds, and the validator checks exactly those guards (spec/arena.md
   §Policies); so any policy whose plans pass the validator keeps the invariants.  They need z3 (the
   'proofs' extra); without it they are skipped with a note saying how to add them, and the rest runs.
3. Quality: the policy and the default ladder replay the same standard traces; the
   report compares rejections, bytes moved and peak utilization.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvarena.reference.arena import Arena
from kvarena.reference.policy import POLICIES, Policy
from kvarena.spec.errors import PlanError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.text import EXIT_OK, EXIT_VIOLATION, UsageError, missing_extra

# Standard traces for the quality comparison: (model preset, capacity bytes, page size, scale).
STANDARD_TRACES = (
    ("gpt-oss-20b", 6 << 30, 64, 0.5),
    ("qwen3.5-4b", 10 << 30, 64, 0.5),
    ("hymba-1.5b", 4 << 30, 64, 0.5),  # three classes: the float band, so rung 3 (relayout) runs
)


@dataclass
class Safety:
    policy: str
    ok: bool
    inv: str | None = None
    rule: str | None = None
    message: str = ""
    trace: str = ""


def load_policy(spec: str) -> Callable[[], Policy]:
    """``package.module:Name`` (a Policy class or a zero-argument factory) or a shipped policy's name."""
    if spec in POLICIES:
        return POLICIES[spec]
    if ":" not in spec:
        raise UsageError(f"{spec!r} is neither a shipped policy ({', '.join(sorted(POLICIES))}) "
                         "nor package.module:Policy")
    mod_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # like `python -m`: the policy may live in the project being checked
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"cannot load {spec!r}: {type(e).__name__}: {e}; pass package.module:Policy importable "
                         "from the current directory or environment") from None
    if not callable(factory):
        raise UsageError(f"{spec}: {attr!r} is not a class or a zero-argument factory")
    try:
        probe = factory()
    except Exception as e:
        raise UsageError(f"{spec} cannot be instantiated with no arguments: {type(e).__name__}: {e} "
                         f"({_own_frame(e) or 'no frame'})") from None
    for method in ("plan", "after_free"):
        if not callable(getattr(probe, method, None)):
            raise UsageError(f"{spec} has no {method}() method; a policy implements "
                             "plan(arena, demand) -> Plan and after_free(arena) -> Plan | None "
                             "(subclass kvarena.reference.policy.Ladder to inherit both)")
    return factory


def _own_frame(e: BaseException) -> str:
    """The innermost traceback frame outside Hypothesis and kvarena: where the policy's own code raised."""
    import kvarena.conformance
    import kvarena.reference
    import kvarena.spec

    internal = [str(Path(m.__file__).resolve().parent) + os.sep
                for m in (kvarena.reference, kvarena.conformance, kvarena.spec)] + [str(Path(__file__).parent) + os.sep]
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if f"{os.sep}hypothesis{os.sep}" not in f.filename
           and not any(str(Path(f.filename).resolve()).startswith(d) for d in internal)]
    f = own[-1] if own else (frames[-1] if frames else None)
    return f"{f.filename}:{f.lineno} in {f.name}: {f.line}" if f else ""


def check_safety(name: str, factory: Callable[[], Policy], examples: int | None = None) -> Safety:
    from hypothesis import settings
    from hypothesis.reporting import with_reporter
    from hypothesis.stateful import run_state_machine_as_test

    from kvarena.conformance.machine.arena import machine_for

    machine = machine_for(lambda cfg: Arena(cfg, factory()), "PolicyMachine")
    profile = settings.get_profile("ci")
    if examples is not None:
        profile = settings(profile, max_examples=examples)
    out = io.StringIO()
    try:
        with with_reporter(lambda text: out.write(str(text) + "\n")):
            run_state_machine_as_test(machine, settings=profile)
    except (AssertionError, PlanError) as e:
        notes = "\n".join(getattr(e, "__notes__", []))
        trace = (out.getvalue() + "\n" + notes).strip()
        return Safety(name, False, getattr(e, "inv", None), getattr(e, "rule", None), str(e), trace)
    except Exception as e:  # the policy's own code raised: show its frame, not Hypothesis internals
        notes = "\n".join(getattr(e, "__notes__", []))
        trace = (out.getvalue() + "\n" + notes).strip()
        return Safety(name, False, None, "policy raised",
                      f"the policy raised {type(e).__name__}: {e} at {_own_frame(e)}; a policy's plan() returns a "
                      "Plan or raises AdmissionRejectedError, and after_free() returns a Plan or None", trace)
    return Safety(name, True)


# The transitions of the proofs' model that a plan is made of (proofs/transitions.py).
PLAN_STEPS = ("admit", "move", "relayout_grow", "relayout_move", "relayout_trim", "absorb")


def prove_plan_steps() -> tuple[int, int, float, list[str]]:
    """Z3: (proven, total, seconds, failures) for every invariant x plan step (no replays: fast)."""
    import time

    from kvarena.proofs import harness

    t0 = time.perf_counter()
    obs = harness.run(transitions=PLAN_STEPS, replay=False, jobs=2)
    bad = [f"{o.name}: {o.result}" for o in obs if not o.ok]
    return len(obs) - len(bad), len(obs), time.perf_counter() - t0, bad


def compare_quality(policies: dict[str, Callable[[], Policy]]) -> list[tuple[str, str, dict]]:
    from kvarena.replay import replay  # the main job's scheduler model
    from kvarena.simulator.mixed_trace import build_trace

    rows = []
    for model, capacity, page_size, scale in STANDARD_TRACES:
        config = ArenaConfig(preset(model), capacity, page_size=page_size)
        trace = build_trace(config, seed=0, scale=scale)
        for name, factory in policies.items():
            m = replay(Arena(config, factory()), trace, name, check_every=10_000)
            rows.append((model, name, {
                "rejections": m.rejected_headroom + m.rejected_ladder,
                "retractions": m.retractions,
                "max_active": m.max_active,
                "bytes_moved": sum(m.bytes_moved.values()),
                "peak_util": m.peak_utilization,
            }))
    return rows


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-policy", help="check an admission policy for safety and compare its quality with the ladder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__ + """
A policy implements plan(arena, demand) -> Plan (read-only; raise AdmissionRejectedError when it
finds none) and after_free(arena) -> Plan | None; subclass kvarena.reference.policy.Ladder to start
from the spec's ladder. It is never trusted: every plan passes the validator (reference/validate.py).

examples:
  kvarena check-policy                                  # the default ladder and every shipped policy
  kvarena check-policy best-fit --examples 500          # one shipped policy, more exploration
  kvarena check-policy mypkg.policies:Greedy            # your own
exit status: 0 when every policy checked is safe; 1 a violation (a broken invariant, a plan the validator
refuses, a policy that raises); 2 broken input (a policy that cannot be found or instantiated).""")
    p.add_argument("policy", nargs="*", help="package.module:Policy or a shipped name "
                                             f"({', '.join(sorted(POLICIES))}); default: all shipped")
    p.add_argument("--examples", type=int, default=None, help="state-machine runs (default: the ci profile's)")
    p.add_argument("--no-quality", action="store_true", help="skip the replay comparison (safety only)")
    p.add_argument("--no-proofs", action="store_true",
                   help="skip the Z3 plan obligations (measured on 2 cores: 4 s idle, 6-17 s with other jobs "
                        "running; they need the 'proofs' extra: without z3 they are skipped with a note and the rest "
                        "runs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvarena.conformance.runner.profiles import register_profiles  # hypothesis: the 'conform' extra

    register_profiles()
    chosen = {s: load_policy(s) for s in args.policy} if args.policy else dict(POLICIES)
    unsafe = 0
    print(f"{'policy':<34} {'safety':<8} invariant")
    for name, factory in chosen.items():
        r = check_safety(name, factory, args.examples)
        print(f"{name:<34} {'ok' if r.ok else 'VIOLATED':<8} {r.inv or '-'}" + (f" ({r.rule})" if r.rule else ""))
        if not r.ok:
            unsafe += 1
            print(f"  {r.message}\n  shrunk trace that reproduces it:")
            print("\n".join("    " + line for line in r.trace.splitlines()))
    proofs_failed = False
    if not args.no_proofs:
        try:
            proven, total, secs, bad = prove_plan_steps()
        except ModuleNotFoundError as e:  # z3 is the 'proofs' extra, not 'conform': the rest needs no solver
            if missing_extra("check-policy", e) is None:
                raise
            print(f"\nZ3 plan obligations: skipped ({(e.name or '').split('.')[0]} is not installed); "
                  "pip install 'kvarena[proofs]' (from a checkout: pip install '.[proofs]') adds them, "
                  "--no-proofs skips them without this note")
        else:
            print(f"\nZ3 plan obligations: {proven}/{total} proven in {secs:.1f} s — every invariant is preserved "
                  f"by each plan step ({', '.join(PLAN_STEPS)}) whose guard the validator checks")
            for line in bad:
                print(f"  FAILED {line}")
            proofs_failed = bool(bad)
    quality_failed = False
    if not args.no_quality:
        compared = {"ladder": POLICIES["ladder"], **chosen}
        print(f"\n{'trace':<14} {'policy':<26} {'rejections':>10} {'retracts':>8} {'max active':>10} "
              f"{'MiB moved':>11} {'peak util':>9}")
        try:
            for model, name, m in compare_quality(compared):
                print(f"{model:<14} {name:<26} {m['rejections']:>10,} {m['retractions']:>8,} {m['max_active']:>10,} "
                      f"{m['bytes_moved'] / 2**20:>11,.1f} {m['peak_util']:>9.1%}")
        except (AssertionError, PlanError) as e:
            print(f"  quality replay stopped by a violation: {e}")
            quality_failed = True
    print(f"\n{len(chosen) - unsafe} of {len(chosen)} policies safe")
    return EXIT_VIOLATION if unsafe or quality_failed or proofs_failed else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(argparse.Namespace(policy=sys.argv[1:], examples=None, no_quality=False, no_proofs=False)))
