"""gpu/'s placement limit ``below`` (issue 14, spec/arena.md §Placement limit) in lockstep with the reference.

Random operation sequences (``random.Random(seed)``, the seeds drawn by Hypothesis under the ``ci`` profile) pass
random limits to ``admit`` / ``extend`` / ``plan_admission`` and to the batched ``admit_batch`` / ``extend_batch``
(one limit for every lane; the decode step's lean path included). After every step: the same pages, the same
placements (the slots the new vids bind to, in order) and plans, the same observation. Every malformed ``below``
is refused with InvalidArgumentError, the reference's message, and nothing changed. A planted wrong hole order is
caught.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvarena.gpu.kernels as kernels
from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.gpu.allocator import GpuArena, make
from kvarena.gpu.planner import Band, Role
from kvarena.gpu.results import BatchResult
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, CapacityTooSmallError, InvalidArgumentError
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, preset

MODELS = ["toy-tri", "toy-swa", "toy-state"]


def _outcome(call: Any) -> tuple:
    try:
        out = call()
    except ArenaError as e:
        return ("error", type(e), getattr(e, "shortfall", None))
    if hasattr(out, "pages"):
        return ("ok", dict(out.pages), out.plan)
    return ("ok", out)


def _lane(x: Any) -> tuple:
    """One lane of a batch result (an Admission or the error object) as ``_outcome`` reports a call."""
    if isinstance(x, ArenaError):
        return ("error", type(x), getattr(x, "shortfall", None))
    return ("ok", dict(x.pages), x.plan)


def _same_lane(ref: tuple, lane: tuple) -> bool:
    """A batch lane placed vectorized carries a rung-1 plan of its placements only: compare pages, rung and
    placements; a lane the ladder placed carries the full plan."""
    if ref[0] != lane[0] or ref[0] == "error":
        return ref == lane
    return ref[1] == lane[1] and ref[2].rung == lane[2].rung and dict(ref[2].placements) == dict(lane[2].placements) \
        and tuple(ref[2].moves) == tuple(lane[2].moves)


class BelowLockstep:
    def __init__(self, model: str, seed: int) -> None:
        self.rng = random.Random(seed)
        cap = 6000 + 256 * self.rng.randint(0, 16)
        ps = self.rng.choice([2, 4])
        while True:
            try:
                self.config = ArenaConfig(preset(model), cap, page_size=ps, max_context_len=16)
                self.ref = Arena(self.config)
                break
            except CapacityTooSmallError:
                cap += 256
        self.gpu: GpuArena = make(self.config)
        self.order = self.ref.order
        self.state = {c for c in self.order if self.ref.classes[c].kind is Kind.RECURRENT}
        self.owners: list[str] = []
        self.n = 0
        self.limited = 0  # rung-1 takes where the limit changed which holes (or their order) against no limit

    # -- drawing ------------------------------------------------------------------------------
    def name(self) -> str:
        self.n += 1
        return f"r{self.n}"

    def demand(self, hi: int, state: int = 1) -> dict[str, int]:
        """Up to ``hi`` pages per class, up to ``state`` recurrent ones (an owner holds one state)."""
        return {c: self.rng.randint(0, state if c in self.state else hi) for c in self.order}

    def below(self) -> dict[str, int] | None:
        r = self.rng
        if r.random() < 0.2:
            return None
        out = {}
        for c in (self.order[0], self.order[-1]):
            if r.random() < 0.75:
                band = self.gpu.bands[c]
                holes = list(band.holes)
                slot = r.choice(holes) + r.choice([-1, 0, 1]) if holes and r.random() < 0.7 else r.randint(0, band.top)
                b = max(0, slot) * band.page_bytes + r.choice([0, 0, 1, band.page_bytes - 1])
                out[c] = min(b, self.config.capacity) if r.random() < 0.95 else r.choice([0, self.config.capacity])
        return out

    def owner(self) -> str:
        return self.rng.choice(self.owners) if self.owners and self.rng.random() < 0.95 else "ghost"

    def note(self, demand: dict[str, int], below: dict[str, int] | None) -> None:
        """Count the takes the limit changes (non-vacuity of the lockstep: the limited order is exercised)."""
        for c, b in (below or {}).items():
            band = self.gpu.bands[c]
            k = min(demand.get(c, 0), len(band.holes))
            if k and band.limited_holes(k, self.gpu._below({c: b})[c]) != band.nearest_holes(k):
                self.limited += 1

    # -- both sides -----------------------------------------------------------------------------
    def both(self, method: str, *args: Any, **kw: Any) -> tuple:
        a = _outcome(lambda: getattr(self.ref, method)(*args, **kw))
        b = _outcome(lambda: getattr(self.gpu, method)(*args, **kw))
        assert a == b, f"step {self.n}: {method}{args} {kw}:\n  reference {a}\n  gpu       {b}"
        return a

    def step(self) -> None:
        r = self.rng
        op = r.choices(["admit", "extend", "free", "churn", "plan", "admit_batch", "extend_batch", "decode"],
                       [5, 4, 6, 3, 1, 2, 2, 3])[0]
        if len(self.owners) > 7:  # keep the small arena part free, so that most admissions fit (rung 1)
            op = "free"
        if op == "admit":
            o, d, lim = self.name(), self.demand(3), self.below()
            self.note(d, lim)
            if self.both("admit", o, d, below=lim)[0] == "ok":
                self.owners.append(o)
        elif op == "extend":
            d, lim = self.demand(2, state=int(r.random() < 0.1)), self.below()
            self.note(d, lim)
            self.both("extend", self.owner(), d, below=lim)
        elif op == "free":
            o = self.owner()
            if self.both("free", o)[0] == "ok":
                self.owners.remove(o)
        elif op == "churn":  # holes in every band: what the limit orders
            made = []
            for _ in range(r.randint(2, 6)):
                o = self.name()
                if self.both("admit", o, {c: 1 if c in self.state else r.randint(1, 2) for c in self.order})[0] != "ok":
                    break
                made.append(o)
            for o in made[::2]:
                self.both("free", o)
            self.owners += made[1::2]
        elif op == "plan":
            self.both("plan_admission", self.demand(3), below=self.below())
        elif op == "admit_batch":
            names = [self.name() for _ in range(r.randint(1, 5))]
            if self.owners and r.random() < 0.2:
                names[r.randrange(len(names))] = r.choice(self.owners)  # a duplicate lane
            demands = [self.demand(2) for _ in names]
            form: Any = demands if r.random() < 0.5 else np.array([[d[c] for c in self.order] for d in demands])
            self.batch("admit", names, demands, form, self.below())
        else:
            if not self.owners:
                return
            names = [self.owner() for _ in range(r.randint(1, 6))]
            if op == "decode":  # one page of one end class per lane: the engine's decode step (the lean path)
                c = r.choice([0, len(self.order) - 1])
                demands = [{x: int(i == c) for i, x in enumerate(self.order)} for _ in names]
            else:
                demands = [self.demand(2, state=0) for _ in names]
            arr = np.array([[d[c] for c in self.order] for d in demands], dtype=np.int64)
            if op == "decode" and "ghost" not in names and r.random() < 0.7:
                handles: Any = np.array([self.gpu.owners.rows[o] for o in names], dtype=np.int64)
            else:
                handles = names
            self.batch("extend", names, demands, arr if r.random() < 0.7 else demands, self.below(), handles)

    def batch(self, op: str, names: list[str], demands: list[dict[str, int]], form: Any,
              lim: dict[str, int] | None, handles: Any = None) -> None:
        """The gpu's one batched call against the reference's sequential calls, lane by lane."""
        ref = []
        for o, d in zip(names, demands):
            self.note(d, lim)
            ref.append(_outcome(lambda o=o, d=d: getattr(self.ref, op)(o, d, below=lim)))
        res = getattr(self.gpu, f"{op}_batch")(names if handles is None else handles, form, below=lim)
        for k, (a, x) in enumerate(zip(ref, res)):
            assert _same_lane(a, _lane(x)), f"step {self.n}: {op}_batch lane {k}:\n  reference {a}\n  gpu {_lane(x)}"
            if op == "admit" and a[0] == "ok":
                self.owners.append(names[k])

    def compare(self) -> None:
        assert observe_reference(self.ref) == self.gpu.observe(), f"step {self.n}: observations differ"

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
            self.compare()


@pytest.fixture(autouse=True)
def _torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)  # plain torch: placement is the host's


@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(MODELS))
@settings(settings.get_profile("ci"), max_examples=25, deadline=None)
def test_below_lockstep(seed: int, model: str) -> None:
    BelowLockstep(model, seed).run(80)


def test_the_limit_is_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-vacuity: on fixed seeds the limit changes rung 1's takes many times, on the ladder and on the batched
    calls' vectorized paths (``_place_fast``, the lean decode step: ``Band.pop_holes``), and the runs agree."""
    fast = []
    real = Band.pop_holes

    def counted(self: Band, k: int, c: int | None = None) -> np.ndarray:
        if c is not None and k and self.limited_holes(k, c) != self.nearest_holes(k):
            fast.append(self.name)
        return real(self, k, c)

    monkeypatch.setattr(Band, "pop_holes", counted)
    limited = 0
    for seed, model in enumerate(MODELS):
        ls = BelowLockstep(model, seed)
        ls.run(100)
        limited += ls.limited
    assert limited >= 30, f"the limit changed only {limited} takes"
    assert len(fast) >= 5, f"the batched fast paths took limited holes only {len(fast)} times"


def _meta_steps(a: Any, ref: Arena | None, below: dict[str, int] | None) -> list[BatchResult]:
    """Batched calls under one limit; the reference (when given) makes the same calls one by one."""
    n, out = 48, []
    owners = [f"m{i}" for i in range(n)]

    def seq(op: str, names: list[str], demands: list[dict[str, int]]) -> None:
        if ref is not None:
            for o, d in zip(names, demands):
                getattr(ref, op)(o, d, below=below)

    out.append(a.admit_batch(owners, np.tile([[2, 4]], (n, 1)), below=below))
    seq("admit", owners, [{"window": 2, "full": 4}] * n)
    assert not a.free_batch(owners[::3]).errors  # holes in both end bands
    for o in owners[::3] if ref is not None else ():
        ref.free(o)
    live = [o for i, o in enumerate(owners) if i % 3]
    rows = a.owners.lookup(live)
    for c in (1, 0, 1, 0):  # the lean decode step, from the holes just freed (in the limited order)
        d = np.zeros((len(live), 2), dtype=np.int64)
        d[:, c] = 1
        out.append(a.extend_batch(rows, d, below=below))
        seq("extend", live, [{a.order[c]: 1}] * len(live))
    out.append(a.extend_batch(live, [{"window": 1, "full": 2}] * len(live), below=below))  # both ends at once
    seq("extend", live, [{"window": 1, "full": 2}] * len(live))
    return out


def test_batched_limit_on_the_meta_device() -> None:
    """Under a limit the batched calls stay on their vectorized paths (rung 1, no per-lane plan) on torch's meta
    device (no device read, no data-dependent shape); the host state is the reference's sequential calls'."""
    config = ArenaConfig(preset("toy-swa"), 1 << 18, page_size=4, max_context_len=16)  # window low, full high
    below = {"window": 40 * 1024 + 512, "full": (1 << 18) - 16 * 1024}
    meta, ref, plain = make(config, device="meta"), Arena(config), make(config, device="meta")
    got = _meta_steps(meta, ref, below)
    assert all(not x.errors and not x.plans for x in got), "every call: rung 1, batched"
    assert meta.v2p == ref.v2p, "the meta arena's placements are not the reference's"
    for c, band in meta.bands.items():
        assert (band.lo, band.hi, list(band.holes)) == (ref.bands[c].lo, ref.bands[c].hi, list(ref.bands[c].holes))
    _meta_steps(plain, None, None)
    assert plain.v2p != meta.v2p, "the limit changed nothing: the test is vacuous"
    with pytest.raises((RuntimeError, NotImplementedError)):
        meta.tables.v2p.cpu()


# ---------------------------------------------------------------------------------------------
# Error paths: a malformed ``below`` is refused before anything changes, with the reference's message.


def _bad_belows(cfg_cap: int, order: list[str]) -> list[Any]:
    low, high = order[0], order[-1]
    floats = order[1:-1]
    return [
        [(low, 0)], 5, "full", {"nope": 0}, {1: 0}, *({f: 0} for f in floats),
        {low: 1.0}, {high: float(cfg_cap)}, {low: True}, {high: False}, {low: -1}, {high: cfg_cap + 1},
        {low: "0"}, {low: None}, {low: 0, "nope": 0}, {low: 0, high: -5},
    ]


def _calls(ls: BelowLockstep, o: str, bad: Any) -> tuple[dict[str, Any], list[Any]]:
    """Every call that takes ``below``, with the malformed ``bad``: single ones (either arena), batched (gpu)."""
    d = {c: int(c not in ls.state) for c in ls.order}  # valid but for ``below`` (the owner has its state)
    arr = np.array([[d[c] for c in ls.order]], dtype=np.int64)
    rows = np.array([ls.gpu.owners.rows[o]], dtype=np.int64)
    single = {"admit": lambda a: a.admit("fresh", d, below=bad), "extend": lambda a: a.extend(o, d, below=bad),
              "plan_admission": lambda a: a.plan_admission(d, below=bad)}
    batched = [lambda: ls.gpu.admit_batch(["fresh"], [d], below=bad), lambda: ls.gpu.extend_batch([o], arr, below=bad),
               lambda: ls.gpu.extend_batch(rows, arr, below=bad)]
    return single, batched


@pytest.mark.parametrize("model", MODELS)
def test_malformed_below_is_refused_unchanged(model: str) -> None:
    ls = BelowLockstep(model, 3)
    ls.run(30)
    while not ls.owners:
        ls.step()
    o = ls.owners[0]
    before = ls.gpu.observe()
    held = ls.gpu.held(o)
    for bad in _bad_belows(ls.config.capacity, ls.order):
        single, batched = _calls(ls, o, bad)
        for what, call in single.items():
            with pytest.raises(InvalidArgumentError) as g:
                call(ls.gpu)
            with pytest.raises(InvalidArgumentError) as e:
                call(ls.ref)
            assert str(g.value) == str(e.value), f"{what}(below={bad!r}): messages differ"
            assert "below" in str(g.value)
        for call in batched:
            with pytest.raises(InvalidArgumentError, match="below"):
                call()
        assert ls.gpu.observe() == before == observe_reference(ls.ref), f"below={bad!r} changed the state"
        assert ls.gpu.held(o) == held and "fresh" not in ls.gpu.owners


def test_a_class_the_demand_does_not_name_is_allowed() -> None:
    ls = BelowLockstep("toy-swa", 4)
    ls.run(20)
    high = ls.order[-1]
    ls.both("admit", "only-low", {ls.order[0]: 1}, below={high: 0})
    ls.compare()


# ---------------------------------------------------------------------------------------------
# A planted bug: holes below the limit taken ascending (the anchor's order, not the limit's) must be caught.


def _ascending_below(self: Band, k: int, c: int) -> list[int]:
    h = list(self.holes)
    if self.role is Role.LOW:
        order = [s for s in h if s < c] + [s for s in h if s >= c]
    else:
        order = [s for s in h if s >= c] + [s for s in h if s < c][::-1]
    return order[:max(0, k)]


def _pop_by_value(self: Band, k: int, c: int | None = None) -> np.ndarray:
    taken = self.limited_holes(k, c) if c is not None else self.nearest_holes(k)
    for s in taken:
        self.holes.remove(s)
    return np.asarray(taken, dtype=np.int64)


def test_the_planted_bug_is_only_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant's other half (taking holes by value) is correct on its own: the lockstep agrees with it."""
    monkeypatch.setattr(Band, "pop_holes", _pop_by_value)
    for seed in range(3):
        BelowLockstep("toy-swa", seed).run(60)


def test_a_wrong_limited_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Band, "limited_holes", _ascending_below)
    monkeypatch.setattr(Band, "pop_holes", _pop_by_value)
    for seed in range(6):
        try:
            BelowLockstep("toy-swa", seed).run(60)
        except AssertionError as e:
            assert "reference" in str(e) or "observations differ" in str(e)
            return
    pytest.fail("holes below the limit taken in ascending order went unnoticed")
