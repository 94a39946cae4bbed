"""``kvarena conform`` and ``kvarena vectors``: registered by kvarena/cli.py through :func:`add_parser`."""

from __future__ import annotations

import argparse
import sys

from kvarena.conformance.adapter.protocol import DEFAULT_IMPL, LEVELS, REFERENCE_ALIAS

CONFORM_DESCRIPTION = """\
Run the conformance suite against an allocator: every committed vector (traces with the reference's
expected results, conformance/vectors/) and the lockstep state machine (Hypothesis drives the reference
and your allocator with the same operations and compares them after every step). Your allocator is
reached through a factory: a callable ArenaConfig -> allocator that speaks the adapter protocol
(kvarena.conformance.adapter.protocol.Allocator: the reference's methods plus observe()).

levels (safety, decisions and exact each include the ones above them):
  pool       for an allocator without bands (a block pool: one block size for every class, one shared
             free list, classes interleaved, nothing moves): observe() returns a PoolObservation,
             per live page its byte range (class, offset, nbytes), the withheld and free ranges and
             the bytes the pool manages. Checked: no two pages share a byte, ledger safety (a freed
             page a user still holds is withheld, not handed out), a bijective id map with no leak,
             live + withheld + free = the pool's bytes, every written row reads back and fresh rows
             read 0, the same pages are freed, refusals other than "does not fit" are the same error
             class and change nothing. Not checked: spans, band order, the ladder's decisions (rung,
             slots, moves, shortfall); an admission may fit on one side only (undone there). Vectors
             stop early at the first admission the reference accepts and your pool refuses
  safety     your allocator's own state satisfies every invariant (no overlap, band order, a bijective
             v->p map with no leak, ledger safety, byte conservation, the feasibility floor); every
             written row reads back after any move; the same pages are freed; every refusal other
             than "does not fit" is the same error class and leaves the state unchanged
  decisions  + the same admit / extend / relayout outcome (admitted or AdmissionRejected) and the
             same shortfall per class as the reference
  exact      + the same placement: virtual ids, v->p, spans, holes, withheld pages (and plans, if
             your admit/compact/relayout return them)

Virtual ids may differ below exact: the harness names pages by logical handle (the n-th page the
trace was given) and maps each side's ids.
"""

CONFORM_EPILOG = f"""\
examples:
  kvarena conform --impl {REFERENCE_ALIAS}                  # the harness against the reference itself
  kvarena conform                                    # kvarena's own gpu/ ({DEFAULT_IMPL}) at exact
  kvarena conform --impl mypkg.kv_adapter:make --level decisions --examples 300
  kvarena conform --impl mypkg.kv_adapter:make --level safety --vectors my_vectors/ --examples 0
  kvarena conform --impl kvarena.conformance.example.block_pool:make --level pool   # a vLLM-style block pool

in an engine's CI (docs/ci.md; non-zero exit fails the job and prints the shrunk reproducing trace):
  kvarena conform --impl myengine.kvarena_adapter:make --junit-xml kvarena.xml
  or, with pytest (the kvarena plugin is installed with the package):
  pytest --kvarena-impl=myengine.kvarena_adapter:make --kvarena-level=safety

every run prints a coverage table: steps per operation, admissions accepted (by rung) and refused,
pages placed and moved (and moved under a reader), frees the ledger deferred, withheld pages released,
refusals by error class, rows read back after a move, vectors completed vs stopped early, and per
invariant ID the steps that could have broken it. A PASS over a run that exercised nothing is VACUOUS;
the result line says what a PASS stands on (vector files completed and stopped early, machine examples,
admissions, pages placed and moved), and --min-completed N makes a PASS on fewer than N completed vector
files THIN (exit 3).

exit status: 0 pass; 1 a divergence (the failing step, both sides' answers, the invariant it breaks and
the trace that led there); 2 broken input: the adapter (one line naming the module and the error: an
import that failed, a syntax error, the factory raising, a missing method), a vector file (its file and
line) or the arguments, written to --junit-xml as an error too; 3 vacuous or thin: nothing meaningful
was exercised (no admission accepted, or no vector got past its first refusal and no machine step
placed a page), or fewer vector files completed than --min-completed, with the coverage table.
An adapter declares the protocol version it was written for (PROTOCOL_VERSION beside its factory); an
older one gets a warning naming each contract change since (conformance/CHANGELOG.md).
See conformance/README.md ("Don't Panic") for the protocol and how to read a divergence.
"""

VECTORS_DESCRIPTION = """\
The committed conformance vectors (conformance/vectors/*.jsonl, format in conformance/vectors/FORMAT.md)
are generated from the reference by the scenarios of kvarena/conformance/vectors/scenarios.py.
  --write   regenerate them (review the diff: a change means the reference's behaviour changed)
  --check   verify the committed files are exactly what the reference generates now (exit 1 if not)
  --list    list the files, what each covers and its size

exit status: 0 ok; 1 a committed file differs from the reference; 2 broken input (no such directory).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register both subcommands."""
    add_conform_parser(sub)
    add_vectors_parser(sub)


def add_conform_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conform", help="run the conformance vectors and the lockstep machine against an allocator",
                       description=CONFORM_DESCRIPTION, epilog=CONFORM_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default=None, metavar="MODULE:FACTORY",
                   help=f"the factory building your allocator from an ArenaConfig, as package.module:callable; "
                        f"'{REFERENCE_ALIAS}' for the reference itself (default: {DEFAULT_IMPL}, at exact)")
    p.add_argument("--level", choices=LEVELS, default=None,
                   help="how closely to agree with the reference. Default: exact for kvarena's own gpu/ and the "
                        "reference (ports of the spec's ladder must place pages exactly as it does); safety for "
                        "any other --impl, since a third-party allocator has its own placement policy and is held "
                        "to the invariants, not to the reference's choices. pool: for an allocator without bands "
                        "(a block pool), the invariants on byte ranges (see the levels above)")
    p.add_argument("--vectors", default=None, metavar="DIR",
                   help="a directory (or one file) of *.jsonl vectors (default: the committed set); 'none' skips them")
    p.add_argument("--examples", type=int, default=100, metavar="N",
                   help="lockstep machine examples (default 100; 0 skips the machine)")
    p.add_argument("--steps", type=int, default=50, metavar="N", help="steps per machine example (default 50)")
    p.add_argument("--seed", type=int, default=None,
                   help="explore with this seed instead of the derandomized (same every run) examples")
    p.add_argument("--no-deep", action="store_true",
                   help="do not run kvarena.reference.invariants on an Arena-like implementation (observation "
                        "checks only)")
    p.add_argument("--json", action="store_true", help="print the report (results and coverage numbers) as JSON")
    p.add_argument("--junit-xml", metavar="FILE", help="also write the report as JUnit XML: one test case per "
                                                        "vector file and per invariant of the machine run")
    p.add_argument("--trace-lines", type=int, default=None, metavar="N",
                   help="trace lines a divergence prints (default 30; 0: the whole trace)")
    p.add_argument("--min-completed", type=int, default=0, metavar="N",
                   help="exit 3 (THIN) when a PASS completed fewer than N vector files (the rest stopped early: "
                        "an admission your allocator refused, a method or feature it lacks); default 0")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("-v", "--verbose", action="store_true", help="list every vector file's result")
    p.set_defaults(func=run_conform)


def add_vectors_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vectors", help="regenerate (--write) or verify (--check) the committed conformance vectors",
                       description=VECTORS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="regenerate the vector files from the reference")
    g.add_argument("--check", action="store_true", help="exit 1 unless the committed files match the reference")
    g.add_argument("--list", action="store_true", help="list the vector files and what they cover")
    p.add_argument("--dir", default=None, help="the vector directory (default: the package's conformance/vectors)")
    p.set_defaults(func=run_vectors)


def run_conform(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from kvarena.conformance.adapter.protocol import AdapterError, default_level, load_factory, one_line
    from kvarena.conformance.runner.conform import EXIT_BROKEN, conform
    from kvarena.conformance.vectors.replay import VECTOR_DIR, VectorFormatError

    def broken(message: str, line: str | None = None) -> int:  # one line on stderr; a JUnit error (--junit-xml)
        print(line or f"kvarena conform: {message}", file=sys.stderr)
        if args.junit_xml:
            from kvarena.conformance.runner import junit

            junit.write_error(args.junit_xml, args.impl or "", args.level or default_level(args.impl), message)
        return EXIT_BROKEN

    if args.examples < 0 or args.steps < 1 or (args.trace_lines is not None and args.trace_lines < 0) \
            or args.min_completed < 0:
        return broken("--examples, --trace-lines and --min-completed must be >= 0 and --steps >= 1")
    if args.examples > 0:
        try:
            import hypothesis  # noqa: F401  the machine needs the 'conform' extra: say so before the vectors run
        except ModuleNotFoundError as e:
            from kvarena.text import missing_extra

            line = missing_extra("conform", e) or f"kvarena conform: {e}"
            return broken(line.removeprefix("kvarena conform "), line)
    vectors = None if args.vectors == "none" else Path(args.vectors) if args.vectors else VECTOR_DIR
    level = args.level or default_level(args.impl)
    progress = None if args.quiet else (lambda line: print(f"kvarena conform: {line}", file=sys.stderr, flush=True))
    try:
        name, factory = load_factory(args.impl)
        report = conform(factory, level=level, vectors=vectors, examples=args.examples, impl=name,
                         steps=args.steps, seed=args.seed, deep=not args.no_deep, progress=progress,
                         trace_lines=args.trace_lines)
    except (AdapterError, VectorFormatError) as e:
        kind = "vector file" if isinstance(e, VectorFormatError) else "adapter"
        return broken(f"broken {kind}: {one_line(str(e))}")
    report.min_completed = args.min_completed
    if args.junit_xml:
        from kvarena.conformance.runner import junit

        junit.write(report, args.junit_xml)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.format(verbose=args.verbose))
    return report.exit_code


def run_vectors(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from kvarena.conformance.vectors import replay as vectors

    directory = Path(args.dir) if args.dir else vectors.VECTOR_DIR
    if not args.write and not directory.is_dir():
        print(f"kvarena vectors: {directory} is not a directory of vector files; pass --dir DIR", file=sys.stderr)
        return 2
    if args.write:
        written = vectors.write_all(directory)
        total = sum(n for _, n in written)
        for name, n in written:
            print(f"wrote {directory / name} ({n:,} B)")
        print(f"{len(written)} files, {total:,} B")
        return 0
    if args.check:
        problems = vectors.check_all(directory)
        for name, problem in problems:
            print(f"{directory / name}: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"{directory}: every vector matches the reference")
        return 0
    for path in vectors.discover(directory):
        with path.open() as f:
            head = json.loads(f.readline())
        cov = head.get("covers", {})
        errors = sorted({e for es in cov.get("errors", {}).values() for e in es})
        print(f"{path.name:<36} {head.get('steps', '?'):>4} steps {path.stat().st_size:>8,} B  "
              f"{head['config']['model']:<12} rungs {cov.get('rungs')}  {head.get('description', '')}")
        if errors:
            print(f"{'':<36} errors: {', '.join(errors)}")
        if head.get("requires"):
            print(f"{'':<36} requires: {', '.join(head['requires'])} (optional features, FORMAT.md §Features)")
    return 0
