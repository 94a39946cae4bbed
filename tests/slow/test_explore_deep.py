"""`kvarena explore` at its defaults and deeper (nightly, `make slow`): toy-tri at depth 4 holds at least 10^4
distinct states, every one clean; the float-chain toys one level deeper than the fast tests; gpu/ at exact to
depth 3."""

from __future__ import annotations

import pytest

from kvarena.conformance.explore.search import Bounds, explore

pytestmark = pytest.mark.slow


def test_the_defaults_enumerate_ten_thousand_states_of_toy_tri_cleanly() -> None:
    r = explore(Bounds())
    assert not r.violations and r.states >= 10_000 and r.depth_reached == Bounds().depth


@pytest.mark.parametrize("model", ["toy-two-float", "toy-win-float", "toy-swa", "toy-state"])
def test_the_other_toys_to_depth_three(model: str) -> None:
    r = explore(Bounds(model=model, depth=3))
    assert not r.violations and r.states > 400  # two-class toys: ~500-600 states within 3 steps, the others more


def test_gpu_at_exact_to_depth_three() -> None:
    pytest.importorskip("torch")
    from kvarena.gpu.allocator import make

    r = explore(Bounds(depth=3, impl="kvarena.gpu.allocator:make"), factory=make)
    assert not r.violations and r.states > 1000
