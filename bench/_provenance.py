"""Where a benchmark ran: what every results file in bench/results/ records next to its table."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "?"


def machine_line(load: str) -> str:
    """``load`` is the load average taken before the run: a busy machine slows every column alike."""
    return (f"- machine: `{sh('uname', '-a') or platform.platform()}`, nproc {os.cpu_count()}, "
            f"load average before the run {load}")


def python_line() -> str:
    return f"- python {platform.python_version()}, commit {sh('git', 'rev-parse', '--short', 'HEAD') or '?'}"


def finish(out: Path, name: str, text: str, smoke: bool) -> int:
    """A bench's last step: a smoke run prints its text, a full run writes it to ``out / name`` too; exit 0."""
    if smoke:
        print(text)
    else:
        write(out, name, text)
    return 0


def write(out: Path, name: str, text: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(text)
    print(text)
    print(f"wrote {path}")
    return path
