"""`kvarena simulate --ray`: a workload's configurations as Ray tasks on a local Ray with 2 CPUs give the
report a single process gives. Skipped without ray (pip install ray). Ray is not in requirements-ci.txt:
its install (~50 s) plus this test (~40 s on 2 shared cores, mostly Ray's start) exceed a minute of CI."""

from __future__ import annotations

import pytest

from kvarena.simulator.simulation import simulate
from kvarena.simulator.workloads import workload

ray = pytest.importorskip("ray", reason="ray is not installed: pip install ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_tasks_give_the_local_report(local_ray: None) -> None:
    w = workload("gpt-oss-20b-max")
    args = dict(capacity=1 << 30, budget="test", scale=0.01)
    local = simulate(w, **args)
    remote = simulate(w, **args, ray_address="auto")  # connected already: run_on_ray reuses it
    key = [(o.config, o.completed, o.max_active, o.retractions, o.steps) for o in local.outcomes]
    assert key == [(o.config, o.completed, o.max_active, o.retractions, o.steps) for o in remote.outcomes]
    assert any(o.retractions for o in local.outcomes)  # the budget binds: the runs differ by configuration
