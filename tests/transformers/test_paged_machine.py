"""transformers 5.23.0's own paged KV cache under kvarena's contract (engines/transformers/paged_*.py).

* it is transformers' code: ``PagedAttentionCache`` built by its own constructor, its allocators, pool, ledgers,
  ``FIFOScheduler`` and ``OffloadingManager``; the block extents the checks use come from its own K/V views;
* the state machine (the engine's calls, every invariant after every call, every batch run through the real
  ``allocator.update``) holds on two layouts, async and sync, and exercises prefix hits, forks, refusals,
  offloading, eviction, cancellation and blocks reused while a batch is in flight;
* eleven planted bugs in transformers' classes are each killed, by the invariant named in ``MUTANTS``, within
  the examples the unpatched code passes; the IDs no planted bug reaches fail on a hand-corrupted state;
* the findings of docs/transformers-findings.md reproduce (strict xfails: each asserts the invariant and fails
  while transformers breaks it; an XPASS means transformers changed and the report must be updated), and what
  each leads to in the engine is asserted beside it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.transformers]
pytest.importorskip("transformers")

from hypothesis import Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from kvarena.engines.transformers import paged_checks as pc  # noqa: E402
from kvarena.engines.transformers import paged_machine as pm  # noqa: E402
from kvarena.spec.errors import InvariantViolation  # noqa: E402

HYBRID, FULL = pm.LAYOUTS["hybrid"], pm.LAYOUTS["full"]
P = pm.prompt


def ci() -> settings:
    return settings(settings.get_profile("ci"), max_examples=200)


# ---------------------------------------------------------------------------------------------
# It is their code


def test_the_cache_is_transformers_own_code() -> None:
    from transformers.generation.continuous_batching.cache_allocators import (
        FullAttentionCacheAllocator,
        SlidingAttentionCacheAllocator,
    )

    d = pm.Driver(HYBRID)
    path = Path(sys.modules[type(d.cache).__module__].__file__ or "").resolve()
    assert path.name == "cache.py" and "transformers" in path.parts and "site-packages" in path.parts
    assert [type(a) for a in d.allocs] == [SlidingAttentionCacheAllocator, FullAttentionCacheAllocator]
    assert not d.cache.use_prefix_sharing and pm.Driver(FULL).cache.use_prefix_sharing
    for layout in (HYBRID, FULL):
        cache = pm.build_cache(layout)
        assert cache.num_sectors == 6 and cache.bytes_per_sector == 128
        for a in cache.cache_allocators.values():
            assert a.blocks_per_sector == 2 and a.bytes_per_block == 64
            # the extents the checks compute from transformers' views are the blocks of the layout it documents
            for b in range(2 * a.blocks_per_sector, (cache.num_sectors + 2) * a.blocks_per_sector):
                assert pc.block_extent(a, b, cache.cache_tensor.data_ptr()) == (b * 64, (b + 1) * 64)


# ---------------------------------------------------------------------------------------------
# What holds: the machine on the unpatched cache

WANTED = {
    "hybrid": ["batches", "forked", "fork refused", "copies run", "refused", "offloads", "trash writes",
               "cancelled", "probes", "skipped at update", "in-flight reuse"],
    "full": ["batches", "prefix hits", "evictions", "forked", "copies run", "refused", "offloads", "cancelled",
             "probes"],
}


@pytest.mark.parametrize("layout,sync", [("hybrid", False), ("full", False), ("hybrid", True), ("full", True)])
def test_the_machine_holds(layout: str, sync: bool) -> None:
    """Async steps around findings 2 and 3 (counted); sync is faithful to finding 2 (TF-DANGLING checked: sync has
    no such race) and steps around finding 3 (which sync reaches too: test_a_lone_request_..._is_served[sync])."""
    t0 = time.perf_counter()
    pm.STATS.clear()
    run_state_machine_as_test(pm.machine_for(pm.LAYOUTS[layout], sync=sync, faithful=sync, floor=False),
                              settings=ci())
    stats = dict(pm.STATS)
    print(f"\n{layout} {'sync' if sync else 'async'}: {time.perf_counter() - t0:.1f} s; {stats}", file=sys.stderr)
    wanted = [w for w in WANTED[layout] if not sync or w not in ("in-flight reuse", "skipped at update")]
    for what in wanted:
        assert stats.get(what), f"{layout}: the machine never exercised {what!r}: {stats}"


# ---------------------------------------------------------------------------------------------
# A check that cannot fail proves nothing: planted bugs, and hand-corrupted states


@pytest.mark.parametrize("name", sorted(pc.MUTANTS))
def test_a_planted_bug_is_killed(name: str) -> None:
    """The examples the unpatched cache passes, without the shrink phase (a kill needs the first failing example)."""
    _, layout, expected, options = pc.MUTANTS[name]
    no_shrink = settings(ci(), phases=[p for p in ci().phases if p is not Phase.shrink], report_multiple_bugs=False)
    with pc.planted(name), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(pm.machine_for(pm.LAYOUTS[layout], **options), settings=no_shrink)
    print(f"\n{name}: {str(caught.value).splitlines()[0]}", file=sys.stderr)
    assert caught.value.inv == expected, caught.value


def test_planted_bugs_are_undone() -> None:
    before = {k: k[0].__dict__.get(k[1]) for name in pc.MUTANTS for k in pc.MUTANTS[name][0]()}
    for name in pc.MUTANTS:
        with pc.planted(name):
            assert any(k[0].__dict__.get(k[1]) is not v for k, v in before.items())
    assert before == {k: k[0].__dict__.get(k[1]) for k in before}


def _busy(layout: pm.Layout = HYBRID) -> pm.Driver:
    d = pm.Driver(layout)
    d.add(P(1, 4, 0, 0), 4)
    d.add(P(2, 4, 0, 1), 4)
    d.iterate(8, 2)
    assert len(d.live()) == 2
    return d


def test_free_is_unheld_fails_on_a_held_block_in_the_free_list() -> None:
    d = _busy()
    a = d.allocs[1]
    d.cache.pool.free_blocks(a.index, [a.block_table["r0"][0]])
    assert pm.violation(d.check) == "TF-FREE-IS-UNHELD"


def test_leak_fails_on_a_sector_left_cut_into_blocks() -> None:
    d = _busy()
    d.teardown()
    d.cache.pool.allocate_sector(0)
    assert pm.violation(pc.check_teardown, d.cache) == "TF-LEAK"


def test_window_fails_on_a_read_outside_the_table() -> None:
    d = _busy()
    e = pm.Entry(d.live()["r0"], 8, 1, [[3 * d.allocs[0].block_physical_stride], []], [[], []])
    assert pm.violation(pc.check_batch_indices, d.cache, [e]) == "TF-WINDOW"


# ---------------------------------------------------------------------------------------------
# Findings (docs/transformers-findings.md)


def _holds(inv: str, layout: pm.Layout, calls: list, **kw: bool) -> None:
    """Runs the calls; a violation of ``inv`` propagates (the strict xfail's expected failure), any other one is
    turned into an error so the xfail cannot pass on the wrong invariant."""
    try:
        pm.run_example(layout, calls, **kw)
    except InvariantViolation as e:
        if e.inv != inv:
            raise RuntimeError(f"expected {inv}, got {e}") from e
        raise

# finding 1: a request that finishes at update N is freed while batch N+1 (launched, still running) reads its
# blocks; the next prepare hands them out. Safe only because every cache write is queued on one compute stream.
WITHHOLD = [("add", (P(0, 1, 0, 0), 1)), ("iterate", (2, 2)), ("add", (P(0, 1, 0, 0), 1)), ("step", (1,))]


@pytest.mark.xfail(strict=True, raises=InvariantViolation,
                   reason="finding 1: blocks of an in-flight batch are handed out again before it retires "
                          "(continuous_api.py:566-568 -> scheduler.py:82 -> cache_allocator.py:233-239)")
def test_blocks_an_in_flight_batch_reads_are_withheld() -> None:
    _holds("TF-WITHHOLD", FULL, WITHHOLD, strict_withhold=True)


def test_the_reuse_is_safe_in_stream_order() -> None:
    """The same calls without the strict check: the batch still in flight runs before the one the block went to,
    and reads its own KV (TF-INFLIGHT and TF-CONTENT hold when every batch has run)."""
    d = pm.run_example(FULL, WITHHOLD)
    assert d.counts["in-flight reuse"] == 1
    d.teardown()
    assert d.counts["batches"] == 3 and not d.stream


# finding 2: async only; a request cancelled between the prepare and the update of its batch (``iterate``: in
# sync mode the update comes first)
CANCEL_FORK = [("add", (P(0, 2, 0, 0), 1, 1)), ("step", (1,)), ("cancel", ("r0",)), ("step", (1,))]
CANCEL_MARK = [("add", (P(0, 1, 0, 0), 4)), ("step", (1,)), ("step", (1,)), ("update", ()), ("cancel", ("r0",)),
               ("step", (1,))]
SYNC = {"fork": [("add", (P(0, 2, 0, 0), 1, 1)), ("iterate", (1,)), ("cancel", ("r0",)), ("iterate", (1,))],
        "mark": [("add", (P(0, 1, 0, 0), 4)), ("iterate", (1, 2)), ("cancel", ("r0",)), ("iterate", (1,))]}


@pytest.mark.xfail(strict=True, raises=InvariantViolation,
                   reason="finding 2: a cancelled parent stays queued to fork (scheduler.py:96-111, "
                          "continuous_api.py:581-593, cache_allocator.py:249)")
def test_a_cancelled_fork_parent_is_not_forked() -> None:
    _holds("TF-DANGLING", HYBRID, CANCEL_FORK, faithful=True)


@pytest.mark.xfail(strict=True, raises=InvariantViolation,
                   reason="finding 2: a cancelled request's in-flight batch is marked at its update "
                          "(continuous_api.py:566, cache.py:353-357, cache_allocator.py:294)")
def test_a_cancelled_request_is_not_marked() -> None:
    _holds("TF-DANGLING", FULL, CANCEL_MARK, faithful=True)


@pytest.mark.parametrize("layout,calls,which", [(HYBRID, CANCEL_FORK, "fork"), (FULL, CANCEL_MARK, "mark")],
                         ids=["fork", "mark"])
def test_a_cancel_in_flight_crashes_the_update(layout: pm.Layout, calls: list, which: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """What finding 2 leads to: transformers' own update path raises KeyError (the engine's generation loop then
    fails every request); in sync mode the same calls update first and nothing breaks."""
    monkeypatch.setattr(pc, "check_dangling", lambda d: None)
    d = pm.run_example(layout, calls, faithful=True)
    with pytest.raises(KeyError, match="r0"):
        d.update()
    monkeypatch.undo()
    sync = pm.run_example(layout, SYNC[which], faithful=True, sync=True)
    assert sync.counts["cancelled"] == 1
    sync.teardown()


# finding 3: sector fragmentation; r1 alone needs 13 tokens: 7 full + 3 sliding blocks = 6 sectors of 6
STRANDED = {"async": [("add", (P(0, 2, 0, 0), 1)), ("add", (P(0, 12, 0, 0), 1)), ("iterate", (4, 5))],
            "sync": [("add", (P(0, 2, 0, 0), 4)), ("add", (P(0, 12, 0, 1), 2)), ("iterate", (4, 12))]}


@pytest.mark.xfail(strict=True, raises=InvariantViolation,
                   reason="finding 3: free blocks stranded in sectors a live block pins; the engine raises "
                          "RuntimeError (cache_pool.py:73-79, offloading_manager.py:183, continuous_api.py:506-509)")
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_lone_request_that_fits_the_empty_cache_is_served(mode: str) -> None:
    _holds("TF-FLOOR", HYBRID, STRANDED[mode], faithful=True, sync=mode == "sync")


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_stranded_blocks_stop_the_engine(mode: str) -> None:
    """What finding 3 leads to: schedule_batch finds nothing, offload_requests has nothing to offload (one active
    request), so the engine's prepare_next_batch raises; the request fits the empty cache."""
    d = pm.run_example(HYBRID, STRANDED[mode], sync=mode == "sync")
    assert d.counts["stuck"] >= 1 and list(d.live()) == ["r1"]
    assert d.scheduler.schedule_batch(4, d.cache.max_tokens_read)[0] is None
    assert not d.offloader.offload_requests()
    sliding = d.allocs[0]
    assert pc.free_leaves(d.cache, sliding) and not d.cache.pool.free_sectors  # free, but only for the sliding group
    assert pc.sectors_alone(d.cache, d.live()["r1"].current_len() + 1) == d.cache.num_sectors
