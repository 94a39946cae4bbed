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
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvarena", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    from kvarena import models_cmd, replay

    replay.add_parser(sub)
    models_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
