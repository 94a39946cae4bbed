"""PEP 316 contracts on the reference's pure helpers, checked by CrossHair (proofs/README.md).

The contracts live in the helpers' docstrings (``pre:`` / ``post:``), next to the code they describe:

- ``spec/layout.py`` ``align_up``: alignment, the smallest multiple of ``alignment`` >= ``value``;
- ``spec/layout.py`` ``pack_rows``: packing and the entry size formula: rows 16 B aligned, in order, disjoint; the
  entry 32 B aligned with at most 16 B of padding;
- ``spec/guards.py`` ``ceil_div`` (the one ceil division the reference and gpu/ share), ``reference/ladder.py``
  ``clamp``: the ladder's rounding and clamping;
- ``reference/ladder.py`` ``float_span``: rung 3's extent arithmetic: the span lies in its byte window, holds
  ``need`` slots and covers the immovable ones;
- ``reference/ladder.py`` ``float_target``: the default rung 3's span: the same, and it keeps every slot of the band
  that lies inside the window (only pages outside the window move);
- ``reference/ladder.py`` ``span_free_slots``: rung 3's hole search: the free slots of the target span,
  ascending, every gap slot of it, and only holes inside the band.

CrossHair searches for inputs that meet the preconditions and break a postcondition (symbolic execution
with a budget per condition); no report within the budget is evidence, not proof. The proofs of the same
arithmetic are Z3's (``proofs/ladder.py``). ``PLANTED`` are copies of two helpers with an off-by-one that
CrossHair must report (tests/fast/test_contracts.py).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

TARGETS = (  # the helpers CrossHair checks (module.function)
    "kvarena.spec.layout.align_up",
    "kvarena.spec.layout.pack_rows",
    "kvarena.spec.guards.ceil_div",
    "kvarena.reference.ladder.clamp",
    "kvarena.reference.ladder.float_span",
    "kvarena.reference.ladder.float_target",
    "kvarena.reference.ladder.span_free_slots",
)
PER_CONDITION_TIMEOUT = 1.0  # CPU seconds per pre/post condition (CrossHair's --per_condition_timeout)
PLANTED_BUDGETS = (PER_CONDITION_TIMEOUT, 4.0, 16.0)  # a planted bug's budgets, tried in turn until it is reported

_ERROR = re.compile(r"^(?P<where>.+?):(?P<line>\d+): error: (?P<msg>.*)$")


@dataclass
class CrossHairRun:
    targets: tuple[str, ...]
    returncode: int
    seconds: float
    findings: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and not self.findings


def crosshair(targets: tuple[str, ...] | list[str], per_condition_timeout: float = PER_CONDITION_TIMEOUT,
              cwd: str | Path | None = None, timeout_s: float = 300) -> CrossHairRun:
    """``crosshair check --analysis_kind=PEP316 --per_condition_timeout=N <targets>`` in a subprocess."""
    cmd = [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316",
           f"--per_condition_timeout={per_condition_timeout}", *targets]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout_s)
    out = p.stdout + p.stderr
    findings = [line for line in out.splitlines() if _ERROR.match(line)]
    return CrossHairRun(tuple(targets), p.returncode, time.perf_counter() - t0, findings, out)


def check_all(targets: tuple[str, ...] = TARGETS, per_condition_timeout: float = PER_CONDITION_TIMEOUT,
              jobs: int = 2) -> list[CrossHairRun]:
    """One CrossHair process per target, ``jobs`` at a time."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda t: crosshair((t,), per_condition_timeout), targets))


# ---------------------------------------------------------------------------------------------
# Planted bugs: the real helper, contract included, with one edit


@dataclass(frozen=True)
class Planted:
    name: str
    function: str  # "module:qualname" of the real helper
    original: str
    replacement: str
    header: str  # imports and constants the copy needs
    why: str


PLANTED: tuple[Planted, ...] = (
    Planted("align-up-off-by-one", "kvarena.spec.layout:align_up",
            "return -(-value // alignment) * alignment", "return (value // alignment + 1) * alignment",
            "", "a multiple of the alignment is rounded up a whole step"),
    Planted("hole-search-off-by-one", "kvarena.reference.ladder:span_free_slots",
            "above_span = range(max(t, hi), t_end) if lo < hi else range(0)",
            "above_span = range(max(t, hi), t_end + 1) if lo < hi else range(0)",
            "from itertools import chain\n", "the free slots run one past the target span"),
)


def planted_source(p: Planted) -> str:
    """The planted copy as a module's source (the contract is the real one)."""
    import importlib

    mod_name, qual = p.function.split(":")
    src = inspect.getsource(getattr(importlib.import_module(mod_name), qual))
    if src.count(p.original) != 1:
        raise AssertionError(f"planted bug {p.name}: snippet not found once in {p.function}; "
                             "update proofs/contracts.py")
    return "from __future__ import annotations\n\n" + p.header + "\n\n" + src.replace(p.original, p.replacement)


def check_planted(p: Planted, directory: Path,
                  budgets: tuple[float, ...] = PLANTED_BUDGETS) -> CrossHairRun:
    """Write the planted copy to ``directory`` and check it; the bug must be reported. Each budget (CPU seconds
    per condition) is tried in turn until CrossHair reports: a loaded machine can spend a short budget before
    the search reaches the bug (seen once in CI at 1 s), and only a bug missed at every budget fails."""
    path = Path(directory) / f"planted_{p.name.replace('-', '_')}.py"
    path.write_text(planted_source(p))
    for budget in budgets:
        run = crosshair((str(path),), budget, cwd=directory)
        if run.findings:
            break
    return run
