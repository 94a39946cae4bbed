"""The ``kvarena`` command: one subcommand per job. ``kvarena <cmd> --help`` teaches each.

Only the chosen subcommand's module is imported, and each imports its optional dependencies inside the
function that runs it: ``kvarena --help``, ``replay``, ``models`` and ``simulate`` need nothing beyond
what ``make run`` installs, and a subcommand whose extra is missing says which one to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvarena.text import EXIT_BROKEN, UsageError, missing_extra

DESCRIPTION = """\
kvarena: the executable contract for the unified KV-cache arena of hybrid LLMs.

  kvarena replay            replay the built-in mixed trace on GPT-OSS-20B at an H200's KV budget,
                            unified arena vs split pools, invariants checked as it goes (`make run`)
  kvarena models            list the model presets with their exact per-class entry and page sizes
  kvarena simulate          capacity simulator: split pools vs unified arena vs a vLLM-style pool on the
                            published single-H200 workloads or a trace file (modeled throughput, TTFT)
  kvarena conform           run the conformance vectors and the lockstep machine against an allocator
                            (--impl package.module:factory, --level safety|decisions|exact)   [conform]
  kvarena explore           enumerate every reachable state of a small arena (breadth first), every
                            invariant checked in each; --impl replays an allocator in lockstep     [conform]
  kvarena vectors           regenerate (--write) or verify (--check) the committed conformance vectors
  kvarena check-policy      check admission policies for safety (state machine + plan validator) and
                            compare their quality with the default ladder on standard traces  [conform]
  kvarena prove             prove every invariant against every transition (Z3), with non-vacuity and
                            planted bugs replayed in the reference, plus the ladder theorems   [proofs]

[extra]: the optional dependencies a subcommand needs, pip install 'kvarena[extra]' (or '.[extra]'
from a checkout); `kvarena <command> --help` works without them.
"""

# subcommand -> (module, function registering its parser)
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("kvarena.replay", "add_parser"),
    "models": ("kvarena.models_cmd", "add_parser"),
    "simulate": ("kvarena.simulate", "add_parser"),
    "conform": ("kvarena.conformance.runner.cli", "add_conform_parser"),
    "vectors": ("kvarena.conformance.runner.cli", "add_vectors_parser"),
    "explore": ("kvarena.conformance.explore.cli", "add_parser"),
    "check-policy": ("kvarena.check_policy", "add_parser"),
    "prove": ("kvarena.proofs.cli", "add_parser"),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    """The top-level parser, with only ``command``'s subparser registered (its module imported)."""
    parser = argparse.ArgumentParser(prog="kvarena", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if command is not None:
        module, register = COMMANDS[command]
        sub = parser.add_subparsers(dest="command", metavar="<command>")
        getattr(importlib.import_module(module), register)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None and not argv:
        print(DESCRIPTION, file=sys.stderr)
        return EXIT_BROKEN
    if command is not None and command not in COMMANDS:
        print(f"kvarena: unknown command {command!r}; the commands are {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_BROKEN
    try:
        parser = _parser(command)  # `kvarena --help`: the description lists every command, nothing imported
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_BROKEN
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"kvarena {command}: {e}", file=sys.stderr)
        return EXIT_BROKEN
    except ModuleNotFoundError as e:
        message = missing_extra(command or "", e)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return EXIT_BROKEN
    except BrokenPipeError:  # `kvarena ... | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
