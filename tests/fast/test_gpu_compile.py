"""gpu/kernels compile for Hopper (sm_90) on a machine with no GPU, and the page kernels use 16-byte accesses.

The interpreter runs code the compiler would reject; this compiles every kernel with Triton's bundled ptxas
in a subprocess (the test process has TRITON_INTERPRET=1, under which kernels cannot be compiled).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


def test_kernels_compile_for_sm90() -> None:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this triton wheel carries no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "kvarena.gpu.kernels.aot", "--arch", "90"], capture_output=True,
                         text=True, env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["kernel"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert {"move_pages", "zero_pages", "translate"} <= set(rows)
    assert sum(k.startswith("alloc_tokens") for k in rows) == 3
    # the copy must move 16 B per access to approach the device's copy bandwidth
    assert rows["move_pages"]["widest_load_bits"] == 128 and rows["move_pages"]["widest_store_bits"] == 128
    assert rows["zero_pages"]["widest_store_bits"] == 128
