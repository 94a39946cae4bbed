"""gpu/kernels: each kernel against plain torch on fresh random data, guards around every output.

Runs the Triton kernels under the interpreter (TRITON_INTERPRET=1, set before triton decorates them) and the
plain-torch CPU path, both against the kernel file's own independent reference.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import pytest
import torch

from kvarena.gpu.kernels import alloc, interpreted, move, translate, use_interpreter, zero
from kvarena.spec.errors import PlanError

use_interpreter()  # in case another test module imported kvarena.gpu first, without the variable

PATHS = ["triton", "torch"]
SEEDS = [0, 1, 2]


def test_kernels_run_under_the_interpreter() -> None:
    for k in (move.move_pages_kernel, zero.zero_pages_kernel, translate.translate_kernel,
              alloc.alloc_tokens_kernel):
        assert interpreted(k), f"{k} was decorated without TRITON_INTERPRET=1"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_move_matches_torch(path: str, seed: int) -> None:
    move.check(path=path, seed=seed)
    move.check(path=path, seed=seed + 100, page_bytes=32, n_pages=40, n_moves=15)  # one 32 B entry per page


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_zero_matches_torch(path: str, seed: int) -> None:
    zero.check(path=path, seed=seed)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("epp", [1, 4, 64])
def test_translate_matches_python(path: str, epp: int) -> None:
    for seed in SEEDS:
        translate.check(path=path, seed=seed, epp=epp)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("epp", [1, 2, 4, 64])
def test_alloc_extend_and_decode_match_python(path: str, epp: int) -> None:
    for seed in SEEDS:
        alloc.check(path=path, seed=seed, epp=epp)  # extends, zero-token ones included
        alloc.check(path=path, seed=seed, epp=epp, decode=True, bs=13)


@pytest.mark.parametrize("path", PATHS)
def test_alloc_large_batches(path: str) -> None:
    """More requests than one program holds (the in-kernel prefix over earlier blocks) and more new tokens per
    request than one program holds (several token chunks)."""
    alloc.check(path=path, seed=5, decode=True, bs=2500, epp=4)  # 3 request blocks of 1,024
    alloc.check(path=path, seed=6, bs=40, max_ext=300, epp=8)  # BLOCK_T 512: 5 request blocks
    alloc.check(path=path, seed=7, bs=3, max_ext=1500, epp=64)  # BLOCK_T 1,024: 2 token chunks


def test_move_refuses_batches_one_launch_cannot_run() -> None:
    words = torch.arange(64, dtype=torch.int64)
    with pytest.raises(PlanError, match="both a source and a destination"):
        move.move_pages(words, [1, 2], [2, 3], 64)
    with pytest.raises(PlanError, match="appears twice"):
        move.move_pages(words, [1, 2], [3, 3], 64)
    with pytest.raises(PlanError, match="outside the grid"):
        move.move_pages(words, [1], [8], 64)  # 8 pages of 8 words
    with pytest.raises(PlanError, match="outside the grid"):
        move.move_pages(words, [-1], [2], 64)
    with pytest.raises(PlanError, match="sources but"):
        move.move_pages(words, [1, 2], [3], 64)
    with pytest.raises(PlanError, match="multiple of 8"):
        move.move_pages(words, [1], [2], 12)
    assert torch.equal(words, torch.arange(64, dtype=torch.int64)), "a refused batch must not touch the arena"
    with pytest.raises(PlanError, match="outside the grid"):
        zero.zero_pages(words, [8], 64)


def test_guards_catch_an_out_of_bounds_store() -> None:
    """The interpreter has no bounds checks: a store past a slice lands in the guard words around it, which is
    what every check() looks at. Launch the kernel (unchecked) one page past the arena and see the guard move."""
    full = torch.randint(1, 2**62, (8 + 4 * 4 + 8,), dtype=torch.int64)
    before = full.clone()
    arena = full[8:8 + 16]  # 4 pages of 4 words
    move.launch(arena, torch.tensor([0]), torch.tensor([4]), 4)  # page 4 does not exist
    assert not torch.equal(full[24:], before[24:]), "the out-of-bounds store did not reach the guard words"
