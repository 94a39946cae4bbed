"""The prefix (radix) cache model (kvarena/simulator/prefix.py): hits share pages through ``share``, recurrent
state is copied (``copy_state``), cache-only pages are evicted before anything is refused, sessions chain."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvarena.reference.arena import Arena
from kvarena.simulator.arrivals import Lengths, Sessions, Sharing
from kvarena.simulator.pager import Pager
from kvarena.simulator.prefix import PrefixCache
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.vllm_model import VllmPool
from kvarena.simulator.workloads import workload
from kvarena.spec.models import ArenaConfig, preset

GiB = 1 << 30


def _chat(model: str = "gpt-oss-20b", gib: float = 1.0, slots: int = 1, **kw) -> tuple:
    w = replace(workload("gpt-oss-20b-chat"), model=model, requests=48, clients=12)
    cfg = ArenaConfig(preset(model), int(gib * GiB), 64, max_context_len=w.max_context(), recurrent_slots=slots)
    arena = Arena(cfg)
    r = run(arena, w.source(), "t", SchedulerModel(state_slots=slots, check_every=100, **kw))
    return r, arena


def test_sessions_chain_their_turns() -> None:
    src = Sessions(1, 3, Lengths("fixed", 100, 10).shape(), Sharing(system_tokens=64, turns=2))
    (a,) = src.due(0.0)
    assert (a.input_tokens, a.prefix, a.prefix_tokens, a.cache_as) == (164, "sys0", 64, "s0t0")
    src.completed(1.0, a)
    (b,) = src.due(1.0)
    assert (b.input_tokens, b.prefix, b.prefix_tokens, b.cache_as) == (274, "s0t0", 174, "")  # 164 + 10, + 100
    src.completed(2.0, b)
    (c,) = src.due(2.0)
    assert (c.prefix, c.cache_as) == ("sys0", "s1t0")  # a new session


def test_hits_share_pages_and_skip_prefill() -> None:
    on, arena = _chat(gib=4.0)
    off, _ = _chat(gib=4.0, prefix_cache=False)
    assert on.prefix_cache == "on" and on.prefix["hits"] > 0.8 * on.prefix["lookups"]
    assert on.completed == off.completed == 48
    assert on.prefill_tokens < 0.6 * off.prefill_tokens  # system prompts and earlier turns are not recomputed
    assert arena.used_bytes() == 0  # every entry and request freed at the end (checked by check_all too)


def test_cache_only_pages_are_evicted_before_a_refusal() -> None:
    r, _ = _chat(gib=0.6)
    assert r.completed == 48
    assert r.prefix["evicted"] > 0  # the budget could not keep every turn cached


def test_recurrent_state_is_copied_not_shared() -> None:
    """Qwen3.5-4B (state | full): an entry holds its own state page, a hit gets a copy (copy_state)."""
    cfg = ArenaConfig(preset("qwen3.5-4b"), 2 * GiB, 64, max_context_len=4096, recurrent_slots=3)
    arena = Arena(cfg)
    pg = Pager(arena, state_slots=3)
    cache = PrefixCache(arena, pg)
    pg.admit(0, 2048)
    cache.insert("sys0", 0, 2048)
    e = cache.peek("sys0", 2048, 3000)
    assert e is not None and e.state is not None and e.state not in pg.vids[0]["state"]
    assert len(e.full) == 32 and all(arena.refs[v] == 2 for v in e.full)  # the request's pages, shared
    cache.lock(e)
    pg.admit(1, 3000, shared=e.full, state_src=e.state)
    assert pg.vids[1]["full"][:32] == e.full and len(pg.vids[1]["state"]) == 3  # 1 copied + 2 tracking slots
    assert all(arena.refs[v] == 3 for v in e.full)
    assert not cache.evict_one()  # locked: in use by request 1
    cache.unlock(e)
    pg.free(0)
    pg.free(1)
    before = arena.used_bytes()
    assert cache.evict_one() and arena.used_bytes() < before
    assert arena.used_bytes() == 0


def test_an_engine_without_share_runs_without_a_cache() -> None:
    w = replace(workload("gpt-oss-20b-chat"), requests=16, clients=8)
    pool = VllmPool(ArenaConfig(preset("gpt-oss-20b"), GiB, 64, max_context_len=w.max_context()))
    r = run(pool, w.source(), "v", SchedulerModel(state_slots=1, check_every=0))
    assert r.prefix_cache.startswith("off") and r.completed == 16


@pytest.mark.parametrize("scale", [0.05])
def test_chat_preset_reports_hit_rates(scale: float, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvarena.cli import main

    assert main(["simulate", "--quiet", "--json", "--engines", "none", "--workload", "gpt-oss-20b-chat",
                 "--scale", str(scale)]) == 0
    (w,) = json.loads(capsys.readouterr().out)["workloads"]
    uni = w["results"]["unified arena"]
    assert uni["prefix_cache"] == "on" and 0 < uni["prefix"]["hit_rate"] <= 1
    assert w["results"]["vLLM-style pool"]["prefix_cache"].startswith("off")
