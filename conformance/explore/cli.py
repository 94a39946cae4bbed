"""``kvarena explore``: every state of a small arena reachable within the bounds, each checked."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvarena.text import EXIT_BROKEN, EXIT_OK, EXIT_VIOLATION, UsageError

DESCRIPTION = """\
Breadth-first enumeration of every state reachable from the empty arena of a small configuration (a toy
model, a few pages a class), over a bounded alphabet of every operation: admit / extend / share / drop /
slide / free / copy_state, acquire by each user kind and release, compact, relayout, flush_idle, writes,
reads and translations, each with its argument ranges, and one malformed call per refusal the state allows.
States are canonical (owners, ids, users and tags renamed away: symmetric states count once). In every new
state every invariant of spec/arena.md is checked, every written row must read back, and every refused call
must change nothing. Random search finds what it draws; this checks every state within the bounds.

With --impl the allocator is replayed in lockstep with the reference along every transition and compared at
--level (safety, pool, decisions, exact), so a third-party allocator gets the exhaustive check too.

The first violation stops the search after its level; its trace is a shortest one (breadth first), printed
and, with --vector-out FILE, written as a conformance vector (replay it: kvarena conform --vectors FILE).
"""

EPILOG = """\
examples:
  kvarena explore                                    # toy-tri to depth 4: ~38,000 states, ~2 min on one core
  kvarena explore --model toy-two-float --depth 3    # two float bands between the ends
  kvarena explore --impl kvarena.conformance.example.adapter:make_buggy --depth 3   # exit 1: INV-NO-OVERLAP
  kvarena explore --json --depth 3 | jq .states
  kvarena explore --ray local --workers 2            # each level's frontier sharded by state hash (Ray actors)

exit status: 0 no violation within the bounds; 1 a violation (its shortest trace is printed); 2 broken input
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explore", help="enumerate every reachable state of a small arena (breadth first), each checked",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="toy-tri", help="a toy model (kvarena models --toys); default toy-tri")
    p.add_argument("--depth", type=int, default=4, help="steps from the empty arena (default 4)")
    p.add_argument("--max-states", type=int, default=100_000, metavar="N",
                   help="stop adding states past N distinct ones (default 100,000)")
    p.add_argument("--pages", type=int, default=1, metavar="N",
                   help="an admission's demand ranges over 0..N pages of each class (default 1)")
    p.add_argument("--capacity", type=int, default=0, metavar="BYTES",
                   help="arena bytes (default: the smallest arena the reference builds for the model)")
    p.add_argument("--page-size", type=int, default=2, metavar="TOKENS", help="tokens per page (default 2)")
    p.add_argument("--max-context", type=int, default=4, metavar="TOKENS",
                   help="max_context_len, which sets the feasibility floor and so the arena's size (default 4)")
    p.add_argument("--impl", default=None, metavar="MODULE:FACTORY",
                   help="replay this allocator in lockstep with the reference ('reference' for the reference "
                        "itself, kvarena.gpu.allocator:make for gpu/); default: the reference alone")
    p.add_argument("--level", default=None, choices=("safety", "pool", "decisions", "exact"),
                   help="how closely --impl must agree (default: exact for gpu/ and the reference, safety otherwise)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="shard each level's frontier by state hash across Ray actors on that cluster ('auto', "
                        "'ray://HOST:10001', or 'local' to start one here); needs the ray extra")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="Ray actors with --ray (default 2)")
    p.add_argument("--vector-out", default=None, metavar="FILE",
                   help="write the first violation's shortest trace there as a conformance vector")
    p.add_argument("--json", action="store_true",
                   help='print {"states", "transitions", "violations", "depth_reached", ...} as JSON')
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvarena.conformance.adapter.protocol import AdapterError, default_level
    from kvarena.conformance.explore.search import Bounds, explore
    from kvarena.spec.errors import ConfigError

    if args.depth < 0 or args.max_states < 1 or args.pages < 1 or args.capacity < 0 or args.workers < 1:
        raise UsageError("--depth >= 0, --max-states >= 1, --pages >= 1, --capacity >= 0 and --workers >= 1")
    level = args.level or (default_level(args.impl) if args.impl else "exact")
    bounds = Bounds(model=args.model, depth=args.depth, max_states=args.max_states, pages=args.pages,
                    capacity=args.capacity, page_size=args.page_size, max_context_len=args.max_context,
                    impl=args.impl, level=level)
    progress = None if args.quiet else (lambda line: print(f"kvarena explore: {line}", file=sys.stderr, flush=True))
    try:
        if args.ray is not None:
            from kvarena.conformance.explore.shard import RayUnavailable, explore_on_ray

            try:
                result = explore_on_ray(bounds, args.ray, args.workers, progress=progress)
            except RayUnavailable as e:
                raise UsageError(str(e)) from None
        else:
            result = explore(bounds, progress=progress)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except AdapterError as e:
        print(f"kvarena explore: broken adapter: {e}", file=sys.stderr)
        return EXIT_BROKEN
    if args.vector_out and result.violations:
        Path(args.vector_out).write_text(result.vector(0))
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(format_result(result, args.vector_out))
    return EXIT_VIOLATION if result.violations else EXIT_OK


def format_result(r, vector_out: str | None = None) -> str:  # type: ignore[no-untyped-def]
    b = r.bounds
    who = f"{b.impl} at {b.level} in lockstep with the reference" if b.impl else "the reference"
    lines = [f"{b.model}, {r.capacity:,} B arena, {b.page_size} tokens a page, demand 0..{b.pages} a class: {who}",
             f"{'depth':>5} {'checked':>9} {'new':>9} {'states':>9} {'transitions':>12} {'s':>7}"]
    for d in r.per_depth:
        lines.append(f"{d['depth']:>5} {d['frontier']:>9,} {d['new']:>9,} {d['states']:>9,} {d['transitions']:>12,} "
                     f"{d['seconds']:>7.1f}")
    why = ("stopped after the level of the first violation" if r.violations else
           "every reachable state seen (the frontier emptied)" if r.exhausted else
           f"stopped at --max-states {b.max_states:,}" if r.truncated else f"bounded by --depth {b.depth}")
    lines.append(f"{r.states:,} distinct states, {r.transitions:,} transitions ({r.refused:,} refused, each "
                 f"checked to change nothing), depth {r.depth_reached}: {why}; {r.seconds:.1f} s"
                 + (f" on {r.workers} Ray workers" if b and r.workers > 1 else ""))
    if not r.violations:
        lines.append("result: no violation")
        return "\n".join(lines)
    v = r.violations[0]
    lines.append(f"result: VIOLATION {v.inv or ''} at depth {v.depth} ({len(r.violations)} found at that depth)")
    lines.append(f"  {v.message}")
    lines.append("shortest trace (vector step lines; pages are logical handles):")
    lines.extend("  " + json.dumps({k: s[k] for k in ("step", "op", "args") if k in s}) for s in v.steps)
    if vector_out:
        lines.append(f"written as a vector: {vector_out} (kvarena conform --vectors {vector_out} --impl ...)")
    return "\n".join(lines)
