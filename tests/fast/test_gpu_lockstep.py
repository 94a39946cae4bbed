"""gpu/allocator.py in lockstep with the reference: identical ids, plans, errors, observations and data.

Random operation sequences (plain ``random.Random(seed)``) on the toy models drive
``kvarena.reference.arena.Arena`` and ``kvarena.gpu.allocator.GpuArena`` (CPU tensors, Triton interpreter)
side by side. After every step: the same return value or the same error class (and shortfall), the same
observation (v->p read back from the device tables), the same holdings, and rows read back equal; the ``exact``
level of conformance/adapter/protocol.py. Planted bugs in the device path must be caught.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import random
from typing import Any

import pytest

import kvarena.gpu.allocator as gpu_allocator
import kvarena.gpu.moves as gpu_moves
from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.gpu.kernels import use_interpreter
from kvarena.reference.arena import Arena
from kvarena.spec.errors import AdmissionRejectedError, ArenaError, CapacityTooSmallError, InvariantViolation
from kvarena.spec.layout import entries_per_page
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Rung, UserKind

use_interpreter()

KINDS = list(UserKind)


def _outcome(obj: Any, method: str, *args: Any) -> tuple:
    try:
        out = getattr(obj, method)(*args)
    except ArenaError as e:
        return ("error", type(e), getattr(e, "shortfall", None), getattr(e, "shortfall_bytes", None))
    if hasattr(out, "pages"):  # Admission: compare pages and plan, not the class
        return ("ok", dict(out.pages), out.plan)
    return ("ok", out)


class Lockstep:
    def __init__(self, model: str, seed: int, *, capacity: int | None = None) -> None:
        self.rng = random.Random(seed)
        cap = capacity or 2400 + 128 * self.rng.randint(0, 12)
        self.ps = self.rng.choice([2, 4])
        while True:  # the smallest capacity >= the drawn one that passes the feasibility floor
            try:
                self.config = ArenaConfig(preset(model), cap, page_size=self.ps, max_context_len=16)
                self.ref = Arena(self.config)
                break
            except CapacityTooSmallError:
                cap += 256
        self.gpu = gpu_allocator.make(self.config)
        assert self.gpu.order == self.ref.order
        self.owners: list[str] = []
        self.users: list[str] = []
        self.n = 0
        self.rungs: set[int] = set()
        self.errors: set[str] = set()

    # -- helpers ------------------------------------------------------------------------------
    def both(self, method: str, *args: Any) -> tuple:
        a, b = _outcome(self.ref, method, *args), _outcome(self.gpu, method, *args)
        assert a == b, f"step {self.n}: {method}{args}:\n  reference {a}\n  gpu       {b}"
        if a[0] == "error":
            self.errors.add(a[1].__name__)
        else:
            plan = a[2] if len(a) == 3 else a[1]
            if hasattr(plan, "rung"):
                self.rungs.add(int(plan.rung))
        return a

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def bound(self) -> list[int]:
        return sorted(self.ref.v2p)

    def some(self, xs: list[int], k: int) -> list[int]:
        return self.rng.sample(xs, min(len(xs), self.rng.randint(0, k)))

    def demand(self, hi: int) -> dict[str, int]:
        return {c: self.rng.randint(0, hi) for c in self.ref.order}

    def owner(self) -> str:
        return self.rng.choice(self.owners) if self.owners and self.rng.random() < 0.95 else "ghost"

    def row_of(self, vid: int) -> tuple[int, int]:
        c = self.ref.v2p[vid][0]
        return (self.rng.randrange(entries_per_page(self.ref.classes[c], self.ps)),
                self.rng.randrange(len(self.ref.layouts[c].slots)))

    # -- one random operation ----------------------------------------------------------------
    def step(self) -> None:
        r = self.rng
        op = r.choices(["admit", "extend", "free", "drop", "slide", "share", "acquire", "release", "compact",
                        "relayout", "write", "translate", "bad", "churn"],
                       [6, 4, 3, 2, 2, 2, 2, 2, 1, 1, 5, 1, 2, 1])[0]
        if op == "admit":
            o = self.name("r") if r.random() < 0.95 or not self.owners else r.choice(self.owners)
            if self.both("admit", o, self.demand(3), self.some(self.bound(), 2))[0] == "ok":
                self.owners.append(o)
        elif op == "extend":
            self.both("extend", self.owner(), self.demand(2))
        elif op == "free":
            o = self.owner()
            if self.both("free", o)[0] == "ok":
                self.owners.remove(o)
        elif op == "drop":
            o = self.owner()
            held = [v for vs in self.ref.owners.get(o, {}).values() for v in vs]
            vids = self.some(held, 2)
            if r.random() < 0.2:
                vids += self.some(self.bound(), 1) + ([vids[0]] if vids and r.random() < 0.5 else [])
            self.both("drop", o, vids)
        elif op == "slide":
            self.both("slide", self.owner(), r.choice([*self.ref.order, "nope"]), r.choice([0, 1, 1, 2, 5, -1]))
        elif op == "share":
            o = "cache" if r.random() < 0.7 else self.owner()
            if self.both("share", o, self.some(self.bound(), 2))[0] == "ok" and o not in self.owners:
                self.owners.append(o)
        elif op == "acquire":
            u = self.name("u") if r.random() < 0.9 or not self.users else r.choice(self.users)
            if self.both("acquire", u, r.choice(KINDS), self.some(self.bound(), 3))[0] == "ok":
                self.users.append(u)
        elif op == "release":
            u = r.choice(self.users) if self.users and r.random() < 0.9 else "nobody"
            if self.both("release", u)[0] == "ok":
                self.users.remove(u)
        elif op == "compact":
            self.both("compact", r.choice([None, None, 0, 1, 2]))
        elif op == "relayout":
            self.both("relayout", self.demand(2))
        elif op == "write":
            for _ in range(r.randint(1, 6)):
                if self.bound():
                    v = r.choice(self.bound())
                    self.both("write", v, *self.row_of(v), r.randint(-2**62, 2**62))
            if self.bound() and r.random() < 0.3:  # a whole page: every row of every entry
                v = r.choice(self.bound())
                c = self.ref.v2p[v][0]
                for e in range(entries_per_page(self.ref.classes[c], self.ps)):
                    for row in range(len(self.ref.layouts[c].slots)):
                        self.both("write", v, e, row, r.randint(-2**62, 2**62))
        elif op == "translate":
            v = r.choice([*self.bound(), 10_000]) if self.bound() else 0
            self.both("translate", v)
            if v in self.ref.v2p:
                c = r.choice(self.ref.order)
                n = entries_per_page(self.ref.classes[c], self.ps)
                self.both("translate_token", c, v * n + r.randrange(n))
        elif op == "bad":
            self.bad()
        else:
            self.churn()

    def bad(self) -> None:
        """Malformed arguments: each must be refused with the same class and change nothing."""
        r, v = self.rng, (self.bound() or [0])[0]
        c = self.ref.order[0]
        case = r.randrange(12)
        if case == 0:
            self.both("admit", self.name("r"), [("full", 1)])
        elif case == 1:
            self.both("admit", self.name("r"), {"nope": 1})
        elif case == 2:
            self.both("admit", self.name("r"), {c: r.choice([-1, True, 1.0, 10_000])})
        elif case == 3:
            self.both("admit", self.name("r"), {c: 1}, [v, v])
        elif case == 4:
            self.both("acquire", self.name("u"), "forward_read", [v])
        elif case == 5:
            self.both("compact", r.choice([-1, True, 1.5]))
        elif case == 6:
            self.both("write", v, r.choice([-1, 99, True]), 0, 1)
        elif case == 7:
            self.both("write", v, 0, 0, r.choice([None, 1.5, True, "x"]))
        elif case == 8:
            self.both("read", 10_000, 0, 0)
        elif case == 9:
            self.both("translate_token", r.choice([c, "nope"]), r.choice([-1, True, 10_000 * 64]))
        elif case == 10:
            self.both("relayout", {c: -1})
        else:
            self.both("share", "cache", [10_000])

    def churn(self) -> None:
        """Admit a few small requests and free every other one: holes in every band feed rungs 2 and 3."""
        made = []
        for _ in range(self.rng.randint(2, 5)):
            o = self.name("c")
            if self.both("admit", o, {c: self.rng.randint(1, 2) for c in self.ref.order})[0] != "ok":
                break
            made.append(o)
        for o in made[::2]:
            self.both("free", o)
        self.owners += made[1::2]

    # -- after every step -----------------------------------------------------------------------
    def compare(self, all_rows: bool) -> None:
        assert observe_reference(self.ref) == self.gpu.observe(), f"step {self.n}: observations differ"
        for o in self.ref.owners:
            assert self.ref.held(o) == self.gpu.held(o), f"step {self.n}: holdings of {o} differ"
        bound = self.bound()
        pages = bound if all_rows else self.rng.sample(bound, min(4, len(bound)))
        for v in pages:
            c = self.ref.v2p[v][0]
            for e in range(entries_per_page(self.ref.classes[c], self.ps)):
                for row in range(len(self.ref.layouts[c].slots)):
                    assert self.ref.read(v, e, row) == self.gpu.read(v, e, row), \
                        f"step {self.n}: page {v} entry {e} row {row} reads differ"

    def run(self, steps: int) -> None:
        for i in range(steps):
            self.step()
            self.compare(all_rows=i % 10 == 9)
        self.compare(all_rows=True)


@pytest.mark.parametrize("model", ["toy-tri", "toy-swa", "toy-state"])
def test_lockstep_exact(model: str) -> None:
    """Three seeds per model agree at every step; together they reach every rung the model has (the
    shortfall-sized rung 2 moves few pages, so one seed may need no compaction in 250 steps) and the errors."""
    rungs: set = set()
    errors: set = set()
    moved = 0
    for seed in (0, 1, 2):
        ls = Lockstep(model, seed)
        ls.run(250)
        rungs |= ls.rungs
        errors |= ls.errors
        moved += ls.gpu.stats["moves"][2]
    assert {1, 2} <= rungs, f"no run needed compaction: rungs {rungs}"
    if model == "toy-tri":
        assert 3 in rungs, f"no run relaid the float out: rungs {rungs}"
    assert {"AdmissionRejectedError", "InvalidArgumentError", "UnknownOwnerError"} <= errors
    assert moved > 0, "no page moved on the device"


@pytest.mark.parametrize("model", ["toy-tri", "toy-swa", "toy-state"])
def test_lockstep_exact_on_the_torch_path(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU path without the interpreter (plain torch in every kernel wrapper) agrees as well."""
    import kvarena.gpu.kernels as kernels

    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    moved = 0
    for seed in (1, 2):
        ls = Lockstep(model, seed)
        ls.run(150)
        moved += ls.gpu.stats["moves"][2]
    assert moved > 0, "no page moved on the torch path"


def test_lockstep_relayout_moves_bytes() -> None:
    """Across seeds, rung 3 moves float pages on the device (not only empty-float placements)."""
    moved = 0
    for seed in range(3):
        ls = Lockstep("toy-tri", seed)
        ls.run(150)
        moved += ls.gpu.stats["moves"][3]
    assert moved > 0


# ---------------------------------------------------------------------------------------------
# Planted bugs in the device path: data integrity and the read-back tables must catch each.


def _fails(model: str, seeds: range = range(3), steps: int = 200) -> str:
    for seed in seeds:
        try:
            Lockstep(model, seed).run(steps)
        except (AssertionError, InvariantViolation) as e:
            return str(e)
    return ""


def test_a_torn_move_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpu_moves.move_slots

    def torn(words, src, dst, page_bytes, **kw):  # copies all but the last 8 bytes of each page
        real(words, src, dst, page_bytes, **kw)
        for d in dst.tolist():
            words[d * page_bytes // 8 + page_bytes // 8 - 1] = words[d * page_bytes // 8] ^ 0x5A

    monkeypatch.setattr(gpu_moves, "move_slots", torn)
    assert _fails("toy-swa"), "a move that leaves bytes behind went unnoticed"


def test_a_skipped_zeroing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_allocator, "zero_slots", lambda *a, **k: None)
    assert _fails("toy-state"), "recurrent slots handed out with stale state went unnoticed"


def test_a_lost_table_remap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpu_moves.move_slots
    monkeypatch.setattr(gpu_moves, "move_slots", lambda *a, remap=None, **k: real(*a, **k))  # bytes only
    assert "observations differ" in _fails("toy-swa")


def test_rejection_leaves_device_state_unchanged() -> None:
    ls = Lockstep("toy-tri", 7)
    ls.run(60)
    raw, v2p, p2v = ls.gpu.mem.raw.clone(), ls.gpu.tables.v2p.clone(), ls.gpu.tables.p2v.clone()
    with pytest.raises(AdmissionRejectedError):
        ls.gpu.admit("huge", {c: ls.gpu.bands[c].top for c in ls.gpu.order[-1:]})
    assert ls.gpu.mem.raw.equal(raw) and ls.gpu.tables.v2p.equal(v2p) and ls.gpu.tables.p2v.equal(p2v)
    assert ls.gpu.plan_admission({}).rung is Rung.NONE
