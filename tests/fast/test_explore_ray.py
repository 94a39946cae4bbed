"""`kvarena explore --ray`: each level's frontier sharded by state hash across Ray actors on a local Ray with 2
CPUs gives, number for number, what one process gives (states, transitions, refusals, per-depth counts, ops), and
finds the same shortest violation with the same trace. Skipped where ray is not installed (the `ray` extra, pinned
in requirements-ci.txt, so `make test` runs it)."""

from __future__ import annotations

import pytest

from kvarena.conformance.explore.search import Bounds, explore
from kvarena.conformance.explore.shard import explore_on_ray

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'kvarena[ray]'")


@pytest.fixture(scope="module")
def local_ray():  # type: ignore[no-untyped-def]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _same(r) -> dict:  # type: ignore[no-untyped-def]
    out = r.to_json()
    for k in ("seconds", "workers"):
        del out[k]
    for d in out["per_depth"]:
        del d["seconds"]
    return out


@pytest.mark.parametrize("bounds", [
    Bounds(model="toy-two-float", depth=2),
    Bounds(depth=3, max_states=1500),  # truncated: the cut must fall on the same states
    Bounds(depth=3, impl="kvarena.conformance.example.adapter:make_buggy", level="safety"),
], ids=["two-float", "truncated", "violation"])
def test_ray_shards_give_the_single_process_result(local_ray: None, bounds: Bounds) -> None:
    one = explore(bounds)
    sharded = explore_on_ray(bounds, "auto", workers=2)
    assert sharded.workers == 2
    assert _same(sharded) == _same(one)
    assert [v.steps for v in sharded.violations] == [v.steps for v in one.violations]
    if bounds.impl:
        assert one.violations
    if bounds.max_states < 100_000:
        assert one.truncated and one.states == bounds.max_states
