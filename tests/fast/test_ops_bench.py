"""bench/ops_vs_sglang.py runs (smoke: few repetitions, small sizes, H200 scaled down; no file written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ops_vs_sglang_smoke(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the plain-torch path, as in the bench
    r = subprocess.run([sys.executable, "bench/ops_vs_sglang.py", "--smoke", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "| alloc 1, no holes |" in out and "| compaction of 16 holes |" in out
    assert "| gpt-oss-20b" in out and out.count("| hymba-1.5b") == 3  # rung 3 at three float sizes
    assert list(tmp_path.iterdir()) == []  # a smoke run writes no results file
