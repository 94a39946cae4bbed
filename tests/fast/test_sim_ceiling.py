"""The placement limit the scheduler gives kvarena's arena (simulator/ceiling.py): the window page's life is the
pager's own, the limit goes only to the unified arena and only while admission is blocked, and on a tight
GPT-OSS run it moves far fewer bytes with the same decisions; a planted wrong life (0 crossings) moves more."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.split import SplitPools
from kvarena.simulate import budget_of
from kvarena.simulator import ceiling, simulation
from kvarena.simulator import scheduler as sched
from kvarena.simulator.budget import GiB
from kvarena.simulator.pager import Pager
from kvarena.simulator.rules import SWA_EVICTION_INTERVAL, SchedulerModel
from kvarena.simulator.workloads import workload
from kvarena.spec.models import ArenaConfig, preset

CFG = ArenaConfig(preset("gpt-oss-20b"), 4 * GiB, max_context_len=4096)


def test_window_page_life_is_the_pagers() -> None:
    """Drive one decoding request through the real pager and record when each window page slides out."""
    alloc = SplitPools(CFG)
    pg = Pager(alloc, swa_eviction_interval=SWA_EVICTION_INTERVAL, evict_first=True)
    pg.admit(0, 1024)
    pg.trim(0)
    born: dict[int, tuple[int, int]] = {}  # allocation serial (ids are reused) -> (crossing, predicted life)
    seen = 0
    for crossing in range(1, 40):
        held = len(pg.vids[0]["window"])
        life = ceiling.window_page_life(held, pg.keep["window"], pg.slack["window"])
        before = {alloc.gen[v] for v in pg.vids[0]["window"]}
        pg.grow_one(0)
        after = {alloc.gen[v] for v in pg.vids[0]["window"]}
        (new,) = after - before
        born[new] = (crossing, life)
        for v, (c, want) in list(born.items()):
            if v not in after:
                assert crossing - c == want, (v, c, crossing, want)
                del born[v]
                seen += 1
    assert seen >= 20


def test_planned_full_pages_caps_each_request_at_its_final_length() -> None:
    assert ceiling.planned_full_pages([(10, 12), (3, 30)], 4) == 12 + 7
    assert ceiling.planned_full_pages([], 4) == 0


def _run(model: SchedulerModel, scale: float = 0.02, capacity_gib: float = 4):
    w = workload("gpt-oss-20b-max")
    cap, _ = budget_of(w, argparse.Namespace(capacity_gib=capacity_gib, mem_fraction=None, page_size=64))
    rep = simulation.simulate(w, cap, "preset", scale=scale, model=model, policies=("default",))
    return {o.config: o for o in rep.outcomes}


def _unified(out: dict):
    (u,) = [o for k, o in out.items() if "unified" in str(k)]
    return u


def test_the_limit_moves_fewer_bytes_with_the_same_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    on = _run(SchedulerModel())
    off = _run(replace(SchedulerModel(), placement_limit=False))
    u_on, u_off = _unified(on), _unified(off)
    assert (u_on.max_active, u_on.retractions) == (u_off.max_active, u_off.retractions)
    assert 0 < u_on.bytes_moved_compaction < u_off.bytes_moved_compaction / 10
    for k, o in on.items():  # every other column is untouched
        if "unified" not in str(k):
            assert (o.max_active, o.retractions, o.bytes_moved_compaction) == \
                   (off[k].max_active, off[k].retractions, off[k].bytes_moved_compaction), k
    # a planted bug: the page's life taken as 0 crossings puts it where the full band will be
    monkeypatch.setattr(sched, "window_page_life", lambda held, keep, slack: 0)
    u_bug = _unified(_run(SchedulerModel()))
    assert u_bug.bytes_moved_compaction > u_on.bytes_moved_compaction


def test_only_kvarenas_arena_gets_a_limit_and_only_while_admission_is_blocked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[tuple[str, bool]] = []
    limit = sched.Scheduler.placement_limit

    def spy(self: sched.Scheduler, r):  # type: ignore[no-untyped-def]
        got = limit(self, r)
        if got is not None:
            given.append((type(self.alloc).__name__, bool(self.full or not self.queue)))
        return got

    monkeypatch.setattr(sched.Scheduler, "placement_limit", spy)
    _run(SchedulerModel())
    assert given and {name for name, _ in given} == {Arena.__name__}
    assert all(blocked for _, blocked in given)
    given.clear()
    _run(replace(SchedulerModel(), placement_limit=False))
    assert not given
