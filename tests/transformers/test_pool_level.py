"""transformers 5.23.0's real sector pool at ``kvarena conform --level pool`` (engines/transformers/pool_adapter.py):
``CachePool`` and ``RegularTrees``, one allocator index per class, pass; three bugs planted in that code are each
caught with the kvarena invariant they break."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.transformers]
pytest.importorskip("transformers")

from hypothesis import Phase, settings  # noqa: E402
from transformers.generation.continuous_batching.cache_allocators import cache_pool as tf_pool  # noqa: E402

from kvarena.conformance.machine.harness import Divergence  # noqa: E402
from kvarena.conformance.machine.lockstep import run_lockstep  # noqa: E402
from kvarena.conformance.runner.conform import conform  # noqa: E402
from kvarena.engines.transformers.pool_adapter import make  # noqa: E402
from kvarena.spec.models import ArenaConfig, preset  # noqa: E402

KILL = settings(settings.get_profile("ci"), max_examples=200, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def test_transformers_sector_pool_passes_pool() -> None:
    report = conform(make, "pool", examples=60)
    assert report.exit_code == 0, report.format()
    done, _stopped, failed = report.vector_counts()
    cov = report.coverage
    assert done >= 5 and failed == 0 and cov.ops["share"] > 0 and cov.frees_deferred > 0, cov.to_json()


def test_sectors_follow_transformers_sizing() -> None:
    """A sector is lcm(every class's page bytes, 128), cut into whole blocks of each class (cache.py:173)."""
    a = make(ArenaConfig(preset("toy-tri"), 1 << 16, page_size=4, max_context_len=16))
    assert a.sector % 128 == 0 and all(a.sector == a.per_sector[c] * p for c, p in a.page_bytes.items())
    a.admit("r", {c: 1 for c in a.order})
    obs = a.observe()
    assert sum(n for _c, _o, n in obs.pages.values()) + sum(n for _o, n in obs.free) == obs.total


def _pop_keeps_last(pop: Callable) -> Callable:
    def planted(self: Any, num_leaves: int) -> list[int]:  # the last leaf popped is also left in its tree
        out = pop(self, num_leaves)
        if out:
            self.trees.setdefault(out[-1] // self.elems_per_tree, []).append(out[-1])
            self._length += 1
        return out
    return planted


def _frees_partial_trees(delete: Callable) -> Callable:
    def planted(self: Any) -> list[int]:  # a sector goes back while some of its blocks are still held
        roots = [r for r, tree in self.trees.items() if len(tree) >= self.elems_per_tree - 1]
        self._length -= sum(len(self.trees.pop(r)) for r in roots)
        return roots
    return planted


def _loses_leaves(add: Callable) -> Callable:
    def planted(self: Any, leaves: list[int]) -> None:  # a sector's first block, when freed, is dropped
        add(self, [leaf for leaf in leaves if leaf % self.elems_per_tree])
    return planted


@pytest.mark.parametrize(("method", "plant", "inv"), [
    ("pop_leaves", _pop_keeps_last, "INV-NO-OVERLAP"),
    ("delete_full_trees", _frees_partial_trees, "INV-NO-OVERLAP"),
    ("add_leaves", _loses_leaves, "INV-BYTE-CONSERVATION"),
], ids=["pop-keeps-last", "frees-partial-sector", "loses-leaves"])
def test_a_bug_planted_in_transformers_pool_is_caught(monkeypatch: pytest.MonkeyPatch, method: str,
                                                       plant: Callable, inv: str) -> None:
    monkeypatch.setattr(tf_pool.RegularTrees, method, plant(getattr(tf_pool.RegularTrees, method)))
    with pytest.raises(Divergence) as info:
        run_lockstep(make, "pool", KILL)
    assert info.value.inv == inv, info.value.summary
