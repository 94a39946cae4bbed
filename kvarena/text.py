"""What every subcommand shares: one-line usage errors, missing-extra messages, tables that fit the terminal.

A subcommand raises :class:`UsageError` for input it cannot use (a flag out of range, a preset that does
not exist); ``kvarena/cli.py`` prints ``kvarena <cmd>: <message>`` on stderr and exits 2, never a
traceback.  A missing optional dependency is reported the same way, naming the extra that installs it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

GiB = 1 << 30
CI_COLUMNS = 100  # CI logs have no terminal: wrap there as on a narrow one

# Exit codes, one convention across conform, check-policy and vectors.
EXIT_OK, EXIT_VIOLATION, EXIT_BROKEN, EXIT_VACUOUS = 0, 1, 2, 3

# Top-level module -> the extra of pyproject.toml that installs it.
EXTRA_OF: dict[str, str] = {
    "hypothesis": "conform",
    "z3": "proofs",
    "crosshair": "proofs",
    "torch": "gpu",
    "triton": "gpu",
    "numpy": "gpu",
    "matplotlib": "plot",
    "sglang": "sglang",
    "msgspec": "sglang",
    "vllm": "vllm",
    "ray": "ray",
    "transformers": "transformers",
}


class UsageError(Exception):
    """Input the command cannot use; the message says what to change (exit 2)."""


def missing_extra(command: str, err: ModuleNotFoundError) -> str | None:
    """The one-line message for a missing optional dependency, or None if ``err`` is not one."""
    root = (err.name or "").split(".")[0]
    extra = EXTRA_OF.get(root)
    if extra is None:
        return None
    return (f"kvarena {command} needs the '{extra}' extra ({root} is not installed): "
            f"pip install 'kvarena[{extra}]'  (from a checkout: pip install '.[{extra}]')")


def gib(nbytes: float) -> str:
    """Bytes in GiB as a user types them on the command line."""
    return f"{nbytes / GiB:.3g} GiB"


def columns() -> int:
    """The width to wrap to: the terminal's, or CI_COLUMNS when there is no terminal or in CI."""
    if os.environ.get("CI"):
        return CI_COLUMNS
    env = os.environ.get("COLUMNS")
    if env and env.isdigit():
        return int(env)
    if not sys.stdout.isatty():
        return CI_COLUMNS
    return shutil.get_terminal_size((CI_COLUMNS, 24)).columns


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], width: int | None = None,
          keep: int = 1, align: str | None = None) -> str:
    """A plain-text table; if wider than ``width``, the columns after the first ``keep`` wrap into
    further blocks, each repeating the key columns, so no line is wider than the terminal.

    ``align`` has one letter per column: ``l`` left, ``r`` right (default: first column left, rest right).
    """
    width = width or columns()
    cells = [[str(h) for h in headers]] + [[_cell(x) for x in r] for r in rows]
    ncol = len(headers)
    align = align or ("l" + "r" * (ncol - 1))
    w = [max(len(r[i]) for r in cells) for i in range(ncol)]

    def render(cols: list[int]) -> list[str]:
        out = []
        for k, r in enumerate(cells):
            parts = [r[i].ljust(w[i]) if align[i] == "l" else r[i].rjust(w[i]) for i in cols]
            out.append("  ".join(parts).rstrip())
            if k == 0:
                out.append("  ".join("-" * w[i] for i in cols))
        return out

    key = list(range(min(keep, ncol)))
    key_w = sum(w[i] + 2 for i in key)
    blocks: list[list[int]] = []
    cur: list[int] = []
    used = key_w
    for i in range(len(key), ncol):
        if cur and used + w[i] + 2 > width:
            blocks.append(cur)
            cur, used = [], key_w
        cur.append(i)
        used += w[i] + 2
    if cur or not blocks:
        blocks.append(cur)
    return "\n\n".join("\n".join(render(key + b)) for b in blocks)


def _cell(x: object) -> str:
    if isinstance(x, bool) or x is None:
        return "-" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


# -- flags several commands share, checked in the user's units ------------------------------------------

# What one run of `replay` or `simulate` may build. Past these a run takes minutes and gigabytes before its first
# line of progress (`replay --capacity-gib 100000` grew to 5 GB in 10 minutes), so such input is refused in one
# line naming the flag. Measured: split pools of 4.2M slots take 0.8 s and 190 MB to build (8.4M: ~400 MB);
# `make run` replays ~7,850 requests in ~40 s, so 100,000 is ~9 minutes with progress at each quarter.
MAX_SLOTS = 1 << 23  # slots of the arena's finest page grid (gpt-oss-20b's H200 budget at --page-size 1: 4.8M)
MAX_REQUESTS = 100_000  # requests in one run (the largest preset has 17,155 at scale 1: hymba-1.5b in replay)


def _floor(x: float) -> str:
    """``x`` rounded down to 3 significant digits, as a user types it (a suggested limit must itself pass)."""
    import math

    if x <= 0:
        return "0"
    step = 10 ** (math.floor(math.log10(x)) - 2)
    return f"{math.floor(x / step) * step:.6g}"


def check_arena_size(model: str, capacity: int, page_size: int, given: str, most_gib: float | None = None) -> None:
    """One line (UsageError) when the arena's finest page grid has more than MAX_SLOTS slots; ``given`` names
    where the capacity came from (``--capacity-gib 1e+09``, or the preset's budget); ``most_gib``: another bound
    on the capacity the suggested --capacity-gib must also keep (the trace's size grows with it)."""
    import math

    from kvarena.spec.models import ArenaConfig, chain, preset

    config = ArenaConfig(preset(model), capacity, page_size=page_size)
    finest = min(config.page_bytes(c.name) for c in chain(config.model))
    slots = capacity // finest
    if slots > MAX_SLOTS:
        raise UsageError(f"{given} is {slots:,} pages of {finest:,} B ({model} at --page-size {page_size}), over "
                         f"the limit of {MAX_SLOTS:,} pages a run may build: pass --capacity-gib "
                         f"{_floor(min(MAX_SLOTS * finest / GiB, most_gib or math.inf))} or less, or a larger "
                         "--page-size")


def check_requests(n: int, what: str, fix: str) -> None:
    """One line (UsageError) when a run would simulate more than MAX_REQUESTS requests; ``what`` says where the
    count came from, ``fix`` the flag to change."""
    if n > MAX_REQUESTS:
        raise UsageError(f"{what} makes {n:,} requests, over the limit of {MAX_REQUESTS:,} per run: {fix}")


def check_model(name: str, toys: bool = False) -> None:
    """A model preset name (``kvarena models`` lists them), or one line naming the presets."""
    from kvarena.spec.errors import ArenaError
    from kvarena.spec.models import PRESETS, REFUSED_MODELS, TOY_MODELS, validate_model

    if name in PRESETS or (toys and name in TOY_MODELS):
        return
    if name in REFUSED_MODELS:  # a named model the arena refuses: say why (spec §Integrations)
        try:
            validate_model(REFUSED_MODELS[name]())
        except ArenaError as e:
            raise UsageError(str(e)) from None
    hint = f" (toy geometries for tests: {', '.join(TOY_MODELS)})" if toys else ""
    raise UsageError(f"unknown model {name!r}; the presets are {', '.join(PRESETS)}{hint}")


def check_page_size(page_size: int) -> None:
    """The arena's own rule (``ArenaConfig.validate``) decides, so a command accepts exactly what an arena does."""
    from kvarena.spec.errors import ConfigError
    from kvarena.spec.models import ArenaConfig, preset

    try:
        ArenaConfig(preset("toy-swa"), capacity=1, page_size=page_size).validate()
    except ConfigError:
        raise UsageError(f"--page-size {page_size} must be a power of two (e.g. 16 or 64 tokens)") from None


def check_run_flags(args: object) -> None:
    """``--model``, ``--capacity-gib``, ``--page-size``, ``--scale`` and ``--check-every`` (replay and simulate)."""
    import math

    if getattr(args, "model", None) is not None:
        check_model(args.model)

    cap = getattr(args, "capacity_gib", None)
    if cap is not None and not (math.isfinite(cap) and cap > 0):
        raise UsageError(f"--capacity-gib {cap:g} must be a number of GiB > 0 (e.g. 16)")
    check_page_size(args.page_size)  # type: ignore[attr-defined]
    if args.scale <= 0:  # type: ignore[attr-defined]
        raise UsageError(f"--scale {args.scale:g} must be > 0")  # type: ignore[attr-defined]
    if args.check_every < 0:  # type: ignore[attr-defined]
        raise UsageError(f"--check-every {args.check_every} must be >= 0 (0: at the end only)")  # type: ignore
