"""gpu/kernels/copy.py (the page copy behind GpuArena.copy_state): the torch path and the Triton kernel (under the
interpreter, in a subprocess so this process's kernels stay as they are) match the reference copy, a batch that
one launch cannot run is refused, and a planted bug in either path fails ``check()``."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types

import pytest
import torch

from kvarena.gpu.kernels import copy as K
from kvarena.spec.errors import PlanError


def test_torch_path_matches_the_reference_copy() -> None:
    for seed in range(4):
        K.check(path="torch", seed=seed)


def test_a_batch_one_launch_cannot_run_is_refused() -> None:
    words = torch.zeros(8 * 10, dtype=torch.int64)
    for src, dst, why in (([1, 2], [3, 3], "written by two copies"), ([1, 3], [3, 4], "both read and written"),
                          ([1], [10], "outside the grid"), ([1], [2, 3], "pair each source")):
        with pytest.raises(PlanError, match=why):
            K.copy_pages(words, src, dst, 64)
    with pytest.raises(PlanError, match="multiple of 8"):
        K.copy_pages(words, [1], [2], 60)


def test_one_source_into_several_pages_leaves_the_source() -> None:
    words = torch.arange(8 * 6, dtype=torch.int64)
    before = words.clone()
    K.copy_pages(words, [1, 1], [4, 5], 64)
    pages, want = words.view(6, 8), before.view(6, 8)
    assert torch.equal(pages[4], want[1]) and torch.equal(pages[5], want[1]) and torch.equal(pages[1], want[1])
    assert torch.equal(pages[[0, 2, 3]], want[[0, 2, 3]])


def _mutated(original: str, replacement: str) -> types.ModuleType:
    src = inspect.getsource(K)
    assert src.count(original) == 1, original
    mod = types.ModuleType("kvarena.gpu.kernels.copy_planted")
    mod.__file__ = K.__file__
    sys.modules[mod.__name__] = mod
    exec(compile(src.replace(original, replacement), K.__file__ or "<copy>", "exec"), mod.__dict__)
    return mod


def test_a_planted_bug_in_the_torch_path_fails_check() -> None:
    bad = _mutated("pages.index_copy_(0, d, pages.index_select(0, s))",
                   "pages.index_copy_(0, s, pages.index_select(0, d))")  # the copy's direction reversed
    with pytest.raises(AssertionError, match="differ from the torch reference"):
        bad.check(path="torch", seed=1)


INTERPRETED = """
import importlib, inspect, pathlib, sys, tempfile
from kvarena.gpu.kernels import copy as K
K.check(path="triton", seed=3)
# Triton compiles a kernel from its file's source: the planted bug goes into a copy of the file
src = inspect.getsource(K).replace("tl.store(words_ptr + dst * page_words + offs",
                                   "tl.store(words_ptr + (dst + 1) * page_words + offs")
d = tempfile.mkdtemp()
pathlib.Path(d, "copy_planted.py").write_text(src)
sys.path.insert(0, d)
bad = importlib.import_module("copy_planted")
try:
    bad.check(path="triton", seed=3)
except AssertionError:
    print("planted bug caught")
"""


def test_the_triton_kernel_under_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "planted bug caught" in out.stdout, out.stdout + out.stderr[-2000:]
