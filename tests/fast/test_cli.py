"""The ``kvarena`` command as a new user meets it: every ``--help`` works with only the core dependency, a
missing extra is one line (exit 2) naming the extra, and ``kvarena models`` answers bad input in one line.

"Only the core dependency" is simulated, not built: the subprocess installs an import hook that refuses every
module outside the standard library, kvarena and sortedcontainers (what ``make run`` installs), so an import of
an optional dependency at the top of a subcommand's module fails here exactly as on a fresh clone.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvarena.cli import COMMANDS
from kvarena.text import EXIT_BROKEN, EXTRA_OF

# Runs kvarena.cli.main with imports limited to the core install, or (KVARENA_BLOCK) without the modules named.
PRELUDE = r"""
import os, sys
CORE = {"kvarena", "sortedcontainers"}
BLOCK = set(os.environ.get("KVARENA_BLOCK", "").split())
ONLY_CORE = not os.environ.get("KVARENA_BLOCK")


def allowed(name):
    root = name.partition(".")[0]
    if not ONLY_CORE:
        return root not in BLOCK
    return root in CORE or root in sys.stdlib_module_names or root.startswith("_")


class CoreOnly:
    def find_spec(self, name, path=None, target=None):
        if allowed(name):
            return None
        root = name.partition(".")[0]
        raise ModuleNotFoundError(f"No module named {root!r} (blocked by tests/fast/test_cli.py)", name=root)


assert all(allowed(m) for m in sys.modules), "a refused module was imported at start-up"
sys.meta_path.insert(0, CoreOnly())
from kvarena.cli import main
sys.exit(main(sys.argv[1:]))
"""


def kvarena(*argv: str, block: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    """``kvarena argv`` in a subprocess; with ``block`` (space-separated top-level modules) only those are
    refused, otherwise everything outside the core install is."""
    env = {"KVARENA_BLOCK": block, "PATH": "/usr/bin:/bin", "CI": "true"}
    return subprocess.run([sys.executable, "-c", PRELUDE, *argv], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_needs_only_the_core_dependency(command: str | None) -> None:
    argv = ["--help"] if command is None else [command, "--help"]
    r = kvarena(*argv)
    assert r.returncode == 0, f"kvarena {' '.join(argv)} with only the core install:\n{r.stderr}"
    assert r.stdout.startswith("usage: kvarena"), r.stdout[:200]
    assert r.stderr == ""


def test_top_level_help_lists_every_command() -> None:
    out = kvarena("--help").stdout
    for command in COMMANDS:
        assert f"kvarena {command} " in out, command


def test_the_hook_refuses_what_it_should() -> None:
    """The prelude is the test's premise: with only the core, an optional dependency does not import."""
    r = subprocess.run([sys.executable, "-c", PRELUDE.replace("from kvarena.cli import main", "import hypothesis")],
                       capture_output=True, text=True, env={"KVARENA_BLOCK": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "No module named 'hypothesis'" in r.stderr


@pytest.mark.parametrize(("argv", "expect"), [
    (["models"], "page B"),
    (["simulate", "--list"], "gpt-oss-20b-max"),
    (["replay", "--capacity-gib", "6", "--scale", "0.05", "--quiet"], "invariant checks passed"),
])
def test_core_commands_run_with_only_the_core_dependency(argv: list[str], expect: str) -> None:
    """What `make run` installs runs `replay`, `models` and `simulate` (a small replay: `make run` in .ci/run
    runs the full one on a real core-only venv)."""
    r = kvarena(*argv)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout


@pytest.mark.parametrize(("argv", "block", "extra"), [
    (["prove", "--only", "INV-NO-OVERLAP", "--no-ladder"], "z3", "proofs"),
    (["prove", "--contracts"], "crosshair z3", "proofs"),
    (["conform", "--impl", "reference", "--examples", "5", "-q"], "hypothesis", "conform"),  # -q: no progress
    (["check-policy"], "hypothesis", "conform"),
])
def test_missing_extra_is_one_line_naming_it(argv: list[str], block: str, extra: str) -> None:
    r = kvarena(*argv, block=block)
    assert r.returncode == EXIT_BROKEN, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"kvarena {argv[0]} needs the '{extra}' extra" in lines[0]
    assert f"pip install 'kvarena[{extra}]'" in lines[0]


def test_every_extra_named_by_the_cli_exists_in_pyproject() -> None:
    """A missing-module message must name an extra pip can install (sglang, vllm and ray included: a message
    naming no extra would send the user to a dead end)."""
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for module, extra in EXTRA_OF.items():
        assert extra in extras, f"{module} -> '{extra}' is not an extra of pyproject.toml"


# ----- kvarena models: one-line errors in the user's terms, tables that fit -----

def test_models_unknown_preset() -> None:
    r = kvarena("models", "nosuch")
    assert r.returncode == EXIT_BROKEN and r.stdout == ""
    line, = r.stderr.strip().splitlines()
    assert line.startswith("kvarena models: unknown model 'nosuch'; the presets are gpt-oss-20b, ")
    assert "qwen3.5-4b" in line


@pytest.mark.parametrize("argv", [["models", "nosuch"], ["replay", "--model", "nosuch"],
                                  ["simulate", "--model", "nosuch", "--workload", "gpt-oss-20b-max"]])
def test_an_unknown_model_is_the_same_one_line_everywhere(argv: list[str]) -> None:
    r = kvarena(*argv)
    assert r.returncode == EXIT_BROKEN and r.stdout == ""
    line, = r.stderr.strip().splitlines()
    assert line.startswith(f"kvarena {argv[0]}: unknown model 'nosuch'; the presets are gpt-oss-20b, "), line


@pytest.mark.parametrize("page_size", ["3", "0", "-64", "48"])
def test_models_bad_page_size(page_size: str) -> None:
    r = kvarena("models", "--page-size", page_size)
    assert r.returncode == EXIT_BROKEN and r.stdout == ""
    line, = r.stderr.strip().splitlines()
    assert line == f"kvarena models: --page-size {page_size} must be a power of two (e.g. 16 or 64 tokens)"


def test_models_page_size_rule_is_the_arenas() -> None:
    """The command accepts exactly the page sizes ArenaConfig does (the rule is not restated)."""
    from kvarena.spec.errors import ConfigError
    from kvarena.spec.models import ArenaConfig, preset

    def arena_accepts(n: int) -> bool:
        try:
            ArenaConfig(preset("gpt-oss-20b"), 1 << 30, page_size=n).validate()
        except ConfigError:
            return False
        return True

    for n in (-2, 0, 1, 2, 3, 16, 24, 64, 128):
        r = kvarena("models", "gpt-oss-20b", "--page-size", str(n), block="hypothesis")
        assert (r.returncode == 0) == arena_accepts(n), (n, r.stderr)


def test_models_table_wraps_to_the_width() -> None:
    r = kvarena("models", "--toys")
    assert r.returncode == 0
    assert max(map(len, r.stdout.splitlines())) <= 100  # CI=true: 100 columns
    from kvarena.text import table

    narrow = table(("model", "class", "kind", "rows", "entry B", "page B"),
                   [("qwen3-next-80b-a3b", "state", "recurrent", 72, 77_266_944, 77_266_944)], width=40, keep=2)
    assert max(map(len, narrow.splitlines())) <= 40
    blocks = narrow.split("\n\n")
    assert len(blocks) >= 2 and all("qwen3-next-80b-a3b  state" in b for b in blocks)  # key columns repeat


def test_prove_help_constants_match_the_harness() -> None:
    """proofs/cli.py restates two harness constants so --help works without z3; they must not drift."""
    pytest.importorskip("z3")
    from kvarena.proofs import cli
    from kvarena.proofs import harness as H

    assert cli.DEFAULT_TIMEOUT_MS == H.DEFAULT_TIMEOUT_MS
    assert list(cli.TRANSITION_NAMES) == [H.INIT, *H.T.BY_NAME]
