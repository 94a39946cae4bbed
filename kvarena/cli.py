"""The ``kvarena`` command: one subcommand per job. ``kvarena <cmd> --help`` teaches each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

DESCRIPTION = """\
kvarena: the executable contract for the unified KV-cache arena of hybrid LLMs.

  kvarena replay            replay the built-in mixed trace on GPT-OSS-20B at an H200's KV budget,
                            unified arena vs split pools, invariants checked as it goes (`make run`)
  kvarena models            list the model presets with their exact per-class entry and page sizes
  kvarena simulate          capacity simulator: split pools vs unified arena vs a vLLM-style pool on the
                            published single-H200 workloads or a trace file (modeled throughput, TTFT)
  kvarena conform           run the conformance vectors and the lockstep machine against an allocator
                            (--impl package.module:factory, --level safety|decisions|exact)
  kvarena vectors           regenerate (--write) or verify (--check) the committed conformance vectors
  kvarena check-policy      check admission policies for safety (state machine + plan validator) and
                            compare their quality with the default ladder on standard traces
  kvarena prove             prove every invariant against every transition (Z3), with non-vacuity and
                            planted bugs replayed in the reference, plus the ladder theorems (--only INV-...)
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvarena", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    from kvarena import check_policy, models_cmd, replay, simulate
    from kvarena.conformance import cli as conformance_cli
    from kvarena.proofs import cli as prove_cli

    replay.add_parser(sub)
    models_cmd.add_parser(sub)
    conformance_cli.add_parser(sub)
    check_policy.add_parser(sub)
    simulate.add_parser(sub)
    prove_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
