"""vLLM 0.33.0's real v1 KV cache manager at kvarena's ``block-pool`` level (engines/vllm/).

    make vllm            # or: pytest -m vllm (with vllm installed --no-deps, plus msgspec cbor2 regex)

Skipped, with one line, when vllm is not installed.  What runs and what it found: docs/vllm-findings.md.

* it is vLLM's code: the manager, coordinator, per-type managers and block pool come from the wheel, the
  config from vLLM's own planning, and every ``sys.modules`` stand-in is one vllm_load.py lists and explains;
* the state machine (the scheduler's calls into the manager, every invariant after every call) holds on
  eight setups (four toys, one of them single-group, GPT-OSS-20B, Qwen3.5-4B, and two with hashes finer
  than a block) and exercises prefix hits, deferred frees, preemption, refusals and copy-on-write;
* six planted bugs in vLLM's classes are each killed within the same budget the unmutated manager passes;
* each invariant the planted bugs do not reach fails on a hand-corrupted state.

``KVARENA_VLLM_EXAMPLES`` sets the machine's examples per setup (default 200, derandomized as in CI).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena.engines.vllm import load as vllm_load
from kvarena.spec.errors import InvariantViolation

pytestmark = pytest.mark.vllm

try:
    V = vllm_load.load_vllm()
except vllm_load.VLLMUnavailable as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"vLLM is not installed ({e}); run `make vllm`", allow_module_level=True)

from kvarena.engines.vllm import checks as vc  # noqa: E402
from kvarena.engines.vllm import driver as va  # noqa: E402 - after the skip: it needs vllm
from kvarena.engines.vllm import machine as vm  # noqa: E402

EXAMPLES = int(os.environ.get("KVARENA_VLLM_EXAMPLES", "200"))


def ci(examples: int = EXAMPLES) -> settings:
    return settings(settings.get_profile("ci"), max_examples=examples)


# ---------------------------------------------------------------------------------------------
# It is their code


def test_the_manager_is_vllms_own_code() -> None:
    for module, name in ((V.manager, "kv_cache_manager.py"), (V.coordinator, "kv_cache_coordinator.py"),
                         (V.single, "single_type_kv_cache_manager.py"), (V.pool, "block_pool.py"),
                         (V.planning, "kv_cache_planning.py")):
        path = Path(module.__file__).resolve()
        assert path.name == name and path.parent.name == "core" and "vllm" in path.parts, path
    d = va.Driver(vm.SETUPS["toy-tri"].plan())
    assert isinstance(d.manager, V.manager.KVCacheManager)
    assert type(d.manager.coordinator) is V.coordinator.HybridKVCacheCoordinator
    assert [type(m).__name__ for m in d.manager.coordinator.single_type_managers] == [
        "FullAttentionManager", "FullAttentionManager", "SlidingWindowManager", "SlidingWindowManager",
        "MambaManager"]
    assert type(d.pool) is V.pool.BlockPool and type(d.pool.free_block_queue) is V.utils.FreeKVCacheBlockQueue
    single = va.Driver(vm.SETUPS["toy-full"].plan())
    assert type(single.manager.coordinator) is V.coordinator.UnitaryKVCacheCoordinator
    stubs = sorted(n for n, m in list(sys.modules.items()) if (n.split(".")[0] in ("vllm", "zmq", "psutil"))
                   and (m.__doc__ or "") == vllm_load.STUB_DOC)
    assert set(stubs) <= set(vllm_load.STUBS), sorted(set(stubs) - set(vllm_load.STUBS))
    for name in vllm_load.STUBS:
        assert f"``{name}``" in (vllm_load.__doc__ or ""), f"{name} is not explained in vllm_load's docstring"


def test_vllms_planning_picks_the_block_sizes() -> None:
    """vLLM's get_kv_cache_groups / resolve_kv_cache_block_sizes on kvarena's models (and the 528 / 576 of
    the hybrid block size for Qwen3.5-4B)."""
    qwen = va.preset("qwen3.5-4b")
    assert (va.hybrid_block_size(qwen, 16), va.hybrid_block_size(qwen, 64)) == (528, 576)
    plan = va.build("qwen3.5-4b", num_blocks=40, block_size=16, max_model_len=4096)
    assert plan.manager_kinds == ("FullAttentionSpec", "MambaSpec", "MambaSpec", "MambaSpec")  # 8 attn, 24 GDN
    assert plan.group_block_sizes() == (528,) * 4 and (plan.scheduler_block_size, plan.hash_block_size) == (528, 528)
    pages = {g.kv_cache_spec.page_size_bytes for g in plan.kv_cache_config.kv_cache_groups}
    assert pages == {528 * 4096}  # one attention layer's page; the GDN state is padded up to it
    oss = va.build("gpt-oss-20b", num_blocks=40, block_size=16, max_model_len=4096)
    assert oss.manager_kinds == ("FullAttentionSpec", "SlidingWindowSpec") and oss.group_block_sizes() == (16, 16)
    swa = va.build("toy-swa", num_blocks=24, block_size=4, max_model_len=32)
    # toy-swa's window rows are twice as wide: vLLM doubles the full group's block to equalise pages
    assert swa.group_block_sizes() == (8, 4) and (swa.scheduler_block_size, swa.hash_block_size) == (8, 4)
    assert swa.num_blocks == 24


# ---------------------------------------------------------------------------------------------
# What holds: the machine on the unmutated manager


@pytest.mark.parametrize("setup", sorted(vm.SETUPS))
def test_the_machine_holds(setup: str) -> None:
    t0 = time.perf_counter()
    vm.STATS.clear()
    run_state_machine_as_test(vm.machine_for(vm.SETUPS[setup]), settings=ci())
    stats = dict(vm.STATS)
    print(f"\n{setup}: {EXAMPLES} examples, {time.perf_counter() - t0:.1f} s; {stats}", file=sys.stderr)
    wanted = ["steps", "prefix hits", "deferred frees", "preemptions", "refused"]
    if vm.SETUPS[setup].prefix_match_unit:
        wanted.append("cow copies")  # sub-block hits are served by copy-on-write blocks, withheld for the copy
    for what in wanted:
        assert stats.get(what), f"{setup}: the machine never exercised {what!r}: {stats}"


@pytest.mark.slow
@pytest.mark.parametrize("setup", sorted(vm.SETUPS))
def test_the_machine_holds_on_fresh_seeds(setup: str) -> None:
    """``make slow``: the nightly profile (random seeds, 1,500 examples of up to 120 steps) per setup."""
    run_state_machine_as_test(vm.machine_for(vm.SETUPS[setup]), settings=settings.get_profile("nightly"))


def test_a_deferred_free_is_withheld_until_its_step_completes() -> None:
    d = va.Driver(vm.SETUPS["toy-swa"].plan())
    r = d.add(list(range(20)), 4)
    d.schedule(r, 16)
    free_before = d.pool.get_num_free_blocks()
    held = [b for _g, rid, t in d.tables() if rid == r for b in t if not b.is_null]
    d.finish(r)  # its step is still in flight: the scheduler pops the blocks and defers their free
    assert held and sorted(map(id, d.withheld())) == sorted(map(id, held))
    assert d.pool.get_num_free_blocks() == free_before and all(b.ref_cnt == 1 for b in held)
    d.complete()
    assert not d.withheld() and d.pool.get_num_free_blocks() == free_before + len(held)


# ---------------------------------------------------------------------------------------------
# A check that cannot fail proves nothing: planted bugs, and hand-corrupted states


@pytest.mark.parametrize("name", sorted(vm.MUTANTS))
def test_a_planted_bug_is_killed(name: str) -> None:
    """The same examples the unmutated manager passes (test_the_machine_holds), without the shrink phase: a
    kill needs the first failing example, not the smallest (``make slow``'s nightly profile shrinks)."""
    setup = vm.SETUPS[vm.MUTANTS[name][1]]
    no_shrink = settings(ci(), phases=[p for p in ci().phases if p is not Phase.shrink], report_multiple_bugs=False)
    with vm.planted(name), pytest.raises((InvariantViolation, AssertionError)) as caught:
        run_state_machine_as_test(vm.machine_for(setup), settings=no_shrink)
    print(f"\n{name}: {str(caught.value).splitlines()[0]}", file=sys.stderr)
    if name != "double-push":  # a doubly pushed block may also surface as a leak found at teardown
        assert isinstance(caught.value, InvariantViolation), caught.value


def test_planted_bugs_are_undone() -> None:
    before = {k: k[0].__dict__[k[1]] for name in vm.MUTANTS for k in vm.MUTANTS[name][0](V)}
    for name in vm.MUTANTS:
        with vm.planted(name):
            pass
    assert before == {k: k[0].__dict__[k[1]] for k in before}


def _busy(setup: str = "toy-swa") -> tuple[va.Driver, str, str]:
    d = va.Driver(vm.SETUPS[setup].plan())
    a, b = d.add(list(range(20)), 4), d.add(list(range(100, 120)), 4)
    d.schedule(a, 16)
    d.schedule(b, 16)
    return d, a, b


def _violates(d: va.Driver) -> str:
    with pytest.raises(InvariantViolation) as e:
        vc.check_pool(d)
    return e.value.inv


def test_one_group_fails_on_a_block_in_two_groups() -> None:
    d, a, _ = _busy()
    full, window = d.manager.coordinator.single_type_managers
    blk = full.req_to_blocks[a][0]
    window.req_to_blocks[a].append(blk)
    blk.ref_cnt += 1
    assert _violates(d) == "VLLM-ONE-GROUP"


def test_null_fails_on_a_queued_or_hashed_null_block() -> None:
    d, _, _ = _busy()
    d.pool.null_block._block_hash = b"x"
    assert _violates(d) == "VLLM-NULL"


def test_exclusive_write_fails_on_a_block_another_request_holds() -> None:
    d, a, b = _busy()
    full = d.manager.coordinator.single_type_managers[0]
    shared = full.req_to_blocks[a][1]
    full.req_to_blocks[b][1] = shared  # b's next write lands in a's block
    with pytest.raises(InvariantViolation) as e:
        vc.check_writes(d, b, 8, 16)
    assert e.value.inv == "VLLM-EXCLUSIVE-WRITE"


def test_refcount_and_prefix_map_fail_on_hand_corruption() -> None:
    d, a, _ = _busy()
    full = d.manager.coordinator.single_type_managers[0]
    full.req_to_blocks[a][0].ref_cnt += 1
    assert _violates(d) == "VLLM-REFCOUNT"
    full.req_to_blocks[a][0].ref_cnt -= 1
    vc.check_pool(d)
    cached = next(b for b in full.req_to_blocks[a] if b.block_hash is not None)
    other = full.req_to_blocks[a][1]
    other.reset_hash()
    cached._block_hash = other_key = V.utils.make_block_hash_with_group_id(V.utils.BlockHash(b"\0" * 32), 0)
    assert other_key not in d.pool.cached_block_hash_to_block._cache
    assert _violates(d) == "VLLM-PREFIX-MAP"


def test_free_queue_fails_on_a_broken_link() -> None:
    d, _, _ = _busy()
    q = d.pool.free_block_queue
    first = q.fake_free_list_head.next_free_block
    first.next_free_block.prev_free_block = q.fake_free_list_head  # a skipped back-link
    assert _violates(d) == "VLLM-FREE-QUEUE"
    assert Counter(vc.INVARIANTS) == Counter(set(vc.INVARIANTS))
