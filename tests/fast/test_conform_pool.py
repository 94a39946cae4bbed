"""Level ``pool``: the invariants any paged KV allocator keeps, on byte ranges (conformance/machine/checks.py
check_pool_observation). The example block pool (conformance/example/block_pool.py, a vLLM-style pool written from
the docs) passes it, fails ``safety`` with a pointer to it, and each of its planted bugs is caught with its ID."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings

from kvarena.cli import main
from kvarena.conformance.adapter.protocol import AdapterError, Observation, PoolObservation, observe_pool, pool_view
from kvarena.conformance.example import block_pool
from kvarena.conformance.example.adapter import make as two_ended
from kvarena.conformance.machine.checks import Geometry, HeldPage, check_pool_observation
from kvarena.conformance.machine.harness import Divergence
from kvarena.conformance.machine.lockstep import run_lockstep
from kvarena.conformance.runner.conform import conform
from kvarena.reference.arena import Arena
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Mode

IMPL = "kvarena.conformance.example.block_pool:make"
KILL_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]  # the kill, not the minimal trace (shrinking: ~45 s)


def ci(examples: int, **kw: Any) -> settings:
    return settings(settings.get_profile("ci"), max_examples=examples, **kw)


def test_block_pool_passes_pool(capsys: pytest.CaptureFixture) -> None:
    assert main(["conform", "--impl", IMPL, "--level", "pool", "--examples", "60", "-q"]) == 0
    out = capsys.readouterr().out
    assert "result: PASS at level pool" in out and "not checked at pool: a pool has no bands" in out, out
    report = conform(block_pool.make, "pool", examples=0)
    done, _stopped, failed = report.vector_counts()
    assert done >= 5 and failed == 0, report.format()


def test_block_pool_fails_safety_and_points_to_pool(capsys: pytest.CaptureFixture) -> None:
    assert main(["conform", "--impl", IMPL, "--level", "safety", "--examples", "5", "--vectors", "none", "-q"]) == 1
    out = capsys.readouterr().out
    assert "[INV-BAND-ORDER]" in out and "run it with --level pool" in out, out


def test_help_explains_pool(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["conform", "--help"])
    out = capsys.readouterr().out
    assert "{pool,safety,decisions,exact}" in out and "PoolObservation" in out and "Not checked: spans" in out


@pytest.mark.parametrize("factory", [Arena, two_ended], ids=["reference", "two-ended-example"])
def test_arenas_pass_pool_through_their_band_observation(factory: Any) -> None:
    run_lockstep(factory, "pool", ci(30))  # an Observation is read as byte ranges: any arena runs at pool


BUGS = [("make_buggy_twice", "INV-NO-OVERLAP", "share bytes"),
        ("make_buggy_unzeroed", "INV-CONTENT-FOLLOWS-VID", "never written but reads"),
        ("make_buggy_leak", "INV-BYTE-CONSERVATION", "refused but changed the observable state"),
        ("make_buggy_ledger", "INV-LEDGER-SAFETY", "free .the pool may hand them out."),
        ("make_buggy_shared", "INV-NO-OVERLAP", "a free extent .* and page")]


def test_the_kill_budget_passes_the_unmutated_pool() -> None:
    run_lockstep(block_pool.make, "pool", ci(200, phases=KILL_PHASES))  # so each kill below is the bug's


@pytest.mark.parametrize(("name", "inv", "words"), BUGS, ids=[b[0] for b in BUGS])
def test_planted_bug_is_caught_at_pool(name: str, inv: str, words: str) -> None:
    with pytest.raises(Divergence, match=words) as info:
        run_lockstep(getattr(block_pool, name), "pool", ci(200, phases=KILL_PHASES))
    assert info.value.inv == inv, info.value.summary


# -- the checks on hand-made observations --------------------------------------------------------------------

GEO = Geometry.of(ArenaConfig(preset("toy-swa"), 4096, page_size=2, max_context_len=16))  # window 256 B, full 128 B


def _obs(pages: dict, withheld: tuple = (), free: tuple = (), total: int = 1024) -> PoolObservation:
    return PoolObservation(pages, tuple(withheld), tuple(free), total)


@pytest.mark.parametrize(("obs", "live", "holds", "inv"), [
    (_obs({0: ("full", 0, 256), 1: ("window", 128, 256)}, free=[(384, 640)]), {0: "full", 1: "window"}, [],
     "INV-NO-OVERLAP"),
    (_obs({0: ("window", 0, 128)}, free=[(128, 896)]), {0: "window"}, [], "INV-NO-OVERLAP"),  # spills
    (_obs({0: ("full", 4000, 256)}, free=[(0, 768)]), {0: "full"}, [], "INV-NO-OVERLAP"),  # leaves the arena
    (_obs({0: ("full", 0, 256)}, free=[(256, 768)]), {}, [], "INV-VMAP-BIJECTIVE"),  # a leak
    (_obs({0: ("full", 0, 256)}, free=[(256, 512)]), {0: "full"}, [], "INV-BYTE-CONSERVATION"),  # 256 B lost
    (_obs({}, free=[(0, 1024)]), {}, [HeldPage("u", Mode.READ, "full", 0, None, 256)], "INV-LEDGER-SAFETY"),
    (_obs({}, withheld=[(0, 256)], free=[(256, 768)]), {}, [], "INV-LEDGER-SAFETY"),  # withheld, no user
    (_obs({0: ("full", 256, 256)}, free=[(0, 256), (512, 512)]), {0: "full"},
     [HeldPage("w", Mode.WRITE, "full", 0, ("full", 256), 256)], "INV-LEDGER-SAFETY"),  # a written page moved
])
def test_pool_checks_detect(obs: PoolObservation, live: dict, holds: list, inv: str) -> None:
    with pytest.raises(InvariantViolation) as info:
        check_pool_observation(obs, GEO, live, holds, 1024)
    assert info.value.inv == inv, str(info.value)


def test_pool_checks_accept_a_valid_pool_and_the_total_is_fixed() -> None:
    obs = _obs({0: ("full", 0, 256)}, withheld=[(256, 256)], free=[(512, 512)])
    holds = [HeldPage("u", Mode.READ, "window", 256, None, 256), HeldPage("v", Mode.WRITE, "full", 0, ("full", 0), 256)]
    check_pool_observation(obs, GEO, {0: "full"}, holds, 1024)
    with pytest.raises(InvariantViolation, match="managed 2048"):
        check_pool_observation(obs, GEO, {0: "full"}, holds, 2048)


def test_an_observation_reads_as_byte_ranges() -> None:
    obs = Observation({7: ("full", 2)}, {"window": (0, 1), "full": (2, 3)}, {"window": (0,), "full": ()},
                      {"window": (), "full": ()})
    view = pool_view(obs, GEO.page_bytes, 1000)
    assert view.pages == {7: ("full", 256, 128)} and view.total == 1000
    assert view.free == ((0, 256), (384, 616)) and view.withheld == ()  # the hole, then the gap above the page


class _Shapeless:
    def observe(self) -> dict:
        return {"pages": {0: ("full", 0)}, "withheld": [], "free": [], "total": 1}


def test_a_malformed_pool_observation_is_an_adapter_error() -> None:
    with pytest.raises(AdapterError, match="PoolObservation"):
        observe_pool(_Shapeless(), GEO.order, GEO.page_bytes, GEO.capacity)


def test_every_vllm_check_names_the_kvarena_invariant_it_refines() -> None:
    from kvarena.engines.vllm.checks import INVARIANTS as VLLM_IDS
    from kvarena.engines.vllm.checks import REFINES
    from kvarena.reference.invariants import INVARIANTS

    assert set(REFINES) == set(VLLM_IDS)
    assert all(refined and set(refined) <= set(INVARIANTS) for refined in REFINES.values()), REFINES
