"""`kvarena simulate --ray`: a tiny ratio sweep as Ray tasks on a local Ray with 2 CPUs gives, field by field,
the report one process gives. ray is the `ray` extra, pinned in requirements-ci.txt, so `make test` runs this
(~15 s of Ray's start on 2 idle cores, more on shared ones); skipped where ray is not installed."""

from __future__ import annotations

import json

import pytest

from kvarena.cli import main

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'kvarena[ray]'")

# 30 requests of gpt-oss-20b-max at 1 GiB (the budget binds: the columns differ), split pools at 5 more ratios
ARGV = ["simulate", "--quiet", "--json", "--workload", "gpt-oss-20b-max", "--scale", "0.005", "--capacity-gib", "1",
        "--ratio-sweep", "--engines", "none"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    assert ray.cluster_resources()["CPU"] == 2
    yield
    ray.shutdown()


def _report(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    (w,) = json.loads(capsys.readouterr().out)["workloads"]
    for r in w["results"].values():
        del r["wall_s"]  # the one field that is not the simulation's
    return w


def test_ray_sweep_gives_the_local_report(local_ray: None, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    tasks = []
    remote = ray.remote

    def counted(fn):  # every configuration must run as a Ray task, not quietly in this process
        task = remote(fn)
        return type("Counted", (), {"remote": lambda _self, *a: tasks.append(1) or task.remote(*a)})()

    local = _report(capsys, ARGV)
    monkeypatch.setattr(ray, "remote", counted)
    on_ray = _report(capsys, [*ARGV, "--ray", "auto"])  # connected already: run_on_ray reuses the local Ray
    assert on_ray == local and list(on_ray["results"]) == list(local["results"])  # in the report's order too
    assert len(tasks) == len(local["results"]) >= 8  # split, unified, vLLM-style + 5 sweep ratios
    assert len({r["retractions"] for r in local["results"].values()}) > 1  # the budget binds differently
