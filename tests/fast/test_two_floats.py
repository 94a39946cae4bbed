"""Two float bands between the ends: the reference and gpu/ plan every admission alike (exact lockstep).

Every shipped preset has at most one float band, so the rules that only two floats exercise (spec/arena.md §Rung 1:
non-empty floats in chain order; §Rung 3: each float's window ends at the next non-empty float, and starts where
the previous float's new span ends) ran nowhere. Here a model with state (low end) | a long window | a short
window | full attention (high end), driven by seeded random admits, extends, drops and frees in a small arena,
so that rungs 2 and 3 occur often, relayouts of one float and of both included. At every step the two
implementations' plans (rung, moves in order, placements, spans, bytes moved) and refusals must agree, their
observations must be equal and the reference's invariants must hold (every few steps, and at the end).
"""

from __future__ import annotations

import functools
import random
from collections import Counter

import pytest

from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.gpu.allocator import make
from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.spec.errors import AdmissionRejectedError
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, ModelSpec, StateClass, gated_delta_rows, mha_rows
from kvarena.spec.types import Rung


def two_floats() -> ModelSpec:
    return ModelSpec("two-floats", (
        StateClass("full", Kind.FULL, mha_rows([3], kv_heads=1, head_dim=8)),
        StateClass("long", Kind.WINDOW, mha_rows([1], kv_heads=1, head_dim=16), window=16),
        StateClass("short", Kind.WINDOW, mha_rows([2], kv_heads=2, head_dim=8), window=8),
        StateClass("state", Kind.RECURRENT, gated_delta_rows([0], conv_dim=8, conv_kernel=2, v_heads=1, k_dim=2,
                                                             v_dim=4)),
    ), max_context_len=32)


def _plan(a, demand):  # type: ignore[no-untyped-def]
    try:
        return a.plan_admission(demand)
    except AdmissionRejectedError as e:
        return ("rejected", e.shortfall, str(e))


@functools.cache  # each seed once: the parametrized tests and the coverage test share the runs
def run(seed: int, steps: int = 200) -> Counter:
    rng = random.Random(seed)
    config = ArenaConfig(two_floats(), 6144, page_size=4, max_context_len=32, recurrent_slots=2)
    ref, gpu = Arena(config), make(config)
    assert ref.order == ["state", "long", "short", "full"]
    rungs: Counter = Counter()
    names = 0
    for _ in range(steps):
        live = list(ref.owners)
        op = rng.random()
        if op < 0.45 or not live:
            d = {"state": rng.randint(0, 1), "long": rng.randint(0, 3), "short": rng.randint(0, 3),
                 "full": rng.randint(0, 8)}
            want, got = _plan(ref, d), _plan(gpu, d)
            assert got == want, f"seed {seed}: admit {d}: gpu {got}, reference {want}"
            if isinstance(want, tuple):
                rungs["rejected"] += 1
                continue
            rungs[want.rung] += 1
            if want.rung is Rung.RELAYOUT:
                rungs[f"relaid {len(want.spans)}"] += 1
            names += 1
            o = f"r{names}"
            assert ref.admit(o, d).plan == gpu.admit(o, d).plan
        elif op < 0.6:
            o = rng.choice(live)
            d = {"long": rng.randint(0, 2), "short": rng.randint(0, 2), "full": rng.randint(0, 4)}
            try:
                want = ref.extend(o, d).plan
            except AdmissionRejectedError:
                with pytest.raises(AdmissionRejectedError):
                    gpu.extend(o, d)
                continue
            assert gpu.extend(o, d).plan == want
        elif op < 0.72:
            o = rng.choice(live)
            held = [v for c in ("long", "short", "full") for v in ref.held(o).get(c, ())]
            if held:
                vids = rng.sample(held, rng.randint(1, len(held)))
                ref.drop(o, vids)
                gpu.drop(o, vids)
        else:
            o = rng.choice(live)
            assert ref.free(o) == gpu.free(o)
        if rng.random() < 0.2:  # the plans are compared at every step; the whole state every few
            assert observe_reference(ref) == gpu.observe()
            check_all(ref)
    assert observe_reference(ref) == gpu.observe()
    check_all(ref)
    return rungs


@pytest.mark.parametrize("seed", range(6))
def test_two_floats_plan_alike(seed: int) -> None:
    rungs = run(seed)
    assert rungs[Rung.REUSE] and rungs[Rung.COMPACT] + rungs[Rung.RELAYOUT], rungs


def test_both_floats_are_relaid() -> None:
    """Over the seeds, rung 3 moves both floats in one plan, and each alone."""
    total: Counter = Counter()
    for seed in range(6):
        total += run(seed)
    assert total["relaid 2"] and total["relaid 1"], total


def test_the_machines_run_the_chain_toys() -> None:
    """The lockstep machine (gpu/ against the reference at exact) and the single-arena machine on CHAIN_TOYS."""
    from hypothesis import settings as hsettings
    from hypothesis.stateful import run_state_machine_as_test

    from kvarena.conformance.machine.arena import machine_for
    from kvarena.conformance.machine.lockstep import run_lockstep

    ci = hsettings(hsettings.get_profile("ci"), max_examples=15)
    run_lockstep(make, "exact", ci, chains=True)
    run_state_machine_as_test(machine_for(Arena, "ChainMachine", chains=True), settings=ci)
