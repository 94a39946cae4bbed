"""The GPU benchmark scripts run end to end on CPU: ``bench/gpu.py --dry-run`` (every section, the Triton
interpreter, tiny sizes, every GPU column "not measured"), ``bench/host_cost.py --smoke``,
``bench/decode_vs_sglang.py --smoke`` and ``bench/admission_h200.py --smoke``."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def test_gpu_bench_dry_run(tmp_path: Path) -> None:
    out = _run("bench/gpu.py", "--dry-run", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    (md,) = tmp_path.glob("gpu-*-dry-run.md")
    text = md.read_text()
    for section in ("## Sync audit", "## Decode step in a CUDA graph", "## Overlap", "## Preset page sizes",
                    "conformance/machine/batched.py at exact"):
        assert section in text, section
    assert "not a GPU measurement" in text and "| PASS" not in text, "a dry run must not claim GPU results"
    (js,) = tmp_path.glob("gpu-*-dry-run.json")
    assert {"checks", "sync_audit", "graph_decode", "overlap", "preset_pages"} <= set(json.loads(js.read_text())
                                                                                    ["sections"])


def test_host_cost_smoke() -> None:
    out = _run("bench/host_cost.py", "--smoke", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "extend_batch" in out.stdout and "| 256 |" in out.stdout
    # the placement-limit section ran its own checks (every page in rung 1's batch, other holes taken with it)
    assert "without and with a placement limit" in out.stdout


def test_decode_vs_sglang_smoke() -> None:
    """SGLang's composite ``alloc_decode`` (its torch fallback at the kernel's launch site) against gpu/'s step."""
    out = _run("bench/decode_vs_sglang.py", "--smoke", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "UnifiedSWATokenToKVPoolAllocator.alloc_decode" in out.stdout and "| 256 |" in out.stdout
    assert "zeroing off" in out.stdout


def test_admission_h200_smoke() -> None:
    """The admission-decision bench builds its states, reaches the intended rungs and finds the plans equal."""
    out = _run("bench/admission_h200.py", "--smoke", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| gpt-oss-20b | 2 |" in out.stdout and "| hymba-1.5b | 3 |" in out.stdout
    assert "no timed plan differed" in out.stdout
