"""Every error path raises its exact typed error, names the fix, and leaves the state bit-identical.

The error paths are one table, ``CASES``.  Each case builds a busy arena (owners, a shared
prefix page, readers, a withheld page, written content), runs an optional preparation step,
then the failing call; the parametrized tests check

* the exact class raised (``type(err) is case.exc``, not just a subclass),
* ``pickle.dumps(arena)`` and ``snapshot()`` unchanged by the failed call,
* the message is actionable (``assert_actionable``).

Construction errors are cases too (no arena state to compare).  ``test_every_error_code_is_raised``
checks that the table covers every concrete class in ``ERROR_CODES``.  A construction case builds through
``ctx["make"]`` (``Arena`` here), and tests/fast/test_errors_impls.py runs the table on gpu/ and ``PoolAdapter``
too, each operation they offer, each construction with their factory.  Cases marked ``bug`` are
behaviour of the reference that breaks the error contract (xfail, strict); cases marked ``vague``
raise the right class but their message names no fix (xfail, strict, in the message test only).
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.policy import Ladder
from kvarena.reference.split import SplitPools
from kvarena.spec.errors import (
    ERROR_CODES,
    AdmissionRejectedError,
    ArenaError,
    CapacityTooSmallError,
    ConfigError,
    DoubleFreeError,
    DuplicateOwnerError,
    DuplicateUserError,
    InvalidArgumentError,
    InvariantViolation,
    MisalignedRowError,
    PlanError,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
    UnknownPageError,
    UnknownUserError,
)
from kvarena.spec.layout import Kind, Row, StateClass
from kvarena.spec.models import ArenaConfig, ModelSpec, mha_rows, preset
from kvarena.spec.types import Move, Plan, Rung, UserKind
from tests.quality.unsafe_policies import FillsWithheldHole

CAP = 4096
PS = 4
NEVER = 999  # a virtual page id that was never allocated

# Words that name a fix ("use extend()", "raise capacity", "pass only pages ...").  Whole words,
# case-insensitive: "names" or "user" do not count as "name" or "use".
HINT_WORDS = ("use", "raise", "pass", "drop", "admit", "release", "must", "choose", "split", "evict",
              "serve", "pad", "merge", "add", "name", "give", "pick", "retry", "lower", "change", "extend",
              "write")
_HINT = re.compile(r"\b(" + "|".join(HINT_WORDS) + r")\b", re.IGNORECASE)


def assert_actionable(err: BaseException) -> None:
    """The one message check: non-empty and names a fix."""
    msg = str(err)
    assert msg.strip(), f"{type(err).__name__} has an empty message"
    if isinstance(err, ArenaError):
        assert err.message == msg
    assert _HINT.search(msg), f"{type(err).__name__} message names no fix: {msg!r}"


# =============================================================================================
# The busy arena every operation case starts from


World = tuple[Arena, dict[str, Any]]


def busy(model: str = "toy-tri", capacity: int = CAP, cls: type[Arena] = Arena) -> World:
    a = cls(ArenaConfig(preset(model), capacity=capacity, page_size=PS, max_context_len=16))
    demand = {"state": 1, "window": 2, "full": 4}
    r = a.admit("r", {c: n for c, n in demand.items() if c in a.bands}).pages
    f = r["full"]
    a.share("cache", [f[0]])  # a prefix page with two owners
    a.write(f[0], 0, 0, 5)
    a.acquire("u", UserKind.FORWARD_READ, [f[1]])  # a live reader
    a.acquire("u2", UserKind.NET_SEND, [f[2]])
    a.drop("r", [f[2]])  # freed while sent: withheld
    # tokens: how an implementation takes translate_tokens' ids (a list here, a tensor on gpu/)
    ctx: dict[str, Any] = {"f": f, "gone": f[2], "w": r.get("window", ()), "s": r.get("state", ()), "tokens": list}
    check_all(a)
    return a, ctx


def busy_split() -> tuple[Arena, dict[str, Any]]:
    return busy(capacity=16384, cls=SplitPools)


def busy_state() -> tuple[Arena, dict[str, Any]]:
    return busy("toy-state")


def blocked_float() -> tuple[Arena, dict[str, Any]]:
    """toy-tri: the window float must move up for more state, but a reader pins its page (one owner's state
    pages are low-band filler here, so the cap is raised)."""
    a = Arena(ArenaConfig(preset("toy-tri"), capacity=CAP, page_size=PS, max_context_len=16, recurrent_slots=64))
    w = a.admit("W", {"window": 2}).pages["window"]
    a.admit("F", {"full": 2})
    a.admit("S", {"state": 32})
    a.acquire("pin", UserKind.FORWARD_READ, [w[0]])
    return a, {"w": w}


def full_arena(cls: type[Arena] = Arena, capacity: int = CAP) -> tuple[Arena, dict[str, Any]]:
    a, ctx = busy(capacity=capacity, cls=cls)
    free_full = a.bands["full"].hi - a.bands["full"].lo if cls is SplitPools else a.bands["full"].top
    ctx["too_much"] = {"full": free_full}  # valid (fits the grid) but more than is free
    return a, ctx


class MovingReuseHook(Ladder):
    """A free-time hook whose plan breaks PLAN-RUNG (a rung-1 plan that moves a page)."""

    name = "bad-free-hook"

    def after_free(self, arena: Arena) -> Plan | None:
        high = arena.bands[arena.order[-1]]
        return Plan(Rung.REUSE, (Move(high.name, max(high.live), high.lo - 1),))


class PlacingHook(Ladder):
    """A free-time hook that places a page (nobody asked for it: it would leak)."""

    name = "placing-free-hook"

    def after_free(self, arena: Arena) -> Plan | None:
        high = arena.bands[arena.order[-1]]
        return Plan(Rung.NONE, placements={high.name: (high.lo - 1,)})


class ExtraClassPlan(Ladder):
    """An admission plan that also places a class the demand does not name."""

    name = "extra-class"

    def plan(self, arena: Arena, demand: dict[str, int]) -> Plan:
        plan = arena.ladder(demand)
        low = arena.bands[arena.order[0]]
        extra = {low.name: (low.hi,)} if low.name not in plan.placements else {}
        return Plan(plan.rung, plan.moves, {**plan.placements, **extra}, plan.bytes_moved, plan.spans)


def busy_with(policy: type[Ladder]) -> Callable[[], World]:
    def world() -> World:
        a, ctx = busy()
        a.policy = policy()
        return a, ctx
    return world


def tiny_model(*classes: StateClass, name: str = "custom") -> ModelSpec:
    return ModelSpec(name, classes, max_context_len=32)


FULL = StateClass("full", Kind.FULL, mha_rows([1], kv_heads=1, head_dim=8))
WINDOW = StateClass("window", Kind.WINDOW, mha_rows([0], kv_heads=1, head_dim=8), window=8)
STATE = StateClass("state", Kind.RECURRENT, mha_rows([2], kv_heads=1, head_dim=8))


def cfg(model: str | ModelSpec = "toy-tri", **kw: Any) -> ArenaConfig:
    m = preset(model) if isinstance(model, str) else model
    args: dict[str, Any] = {"capacity": CAP, "page_size": PS, "max_context_len": 16}
    args.update(kw)
    return ArenaConfig(m, **args)


# =============================================================================================
# The table


@dataclass(frozen=True)
class Case:
    id: str
    exc: type[ArenaError]
    op: Callable[[Any, dict[str, Any]], object]
    world: Callable[[], tuple[Arena, dict[str, Any]]] | None = busy  # None: a construction error
    prep: Callable[[Any, dict[str, Any]], object] | None = None  # runs before the state is recorded
    bug: str | None = None  # the reference breaks the contract here (xfail strict)
    vague: str | None = None  # right class, message names no fix (xfail strict in the message test)


def _demand_cases(name: str, call: Callable[[Arena, dict], object]) -> list[Case]:
    """Every malformed demand, for one demand-taking operation."""
    return [
        Case(f"{name}-negative", InvalidArgumentError, lambda a, c: call(a, {"full": -1})),
        Case(f"{name}-float", InvalidArgumentError, lambda a, c: call(a, {"full": 1.0})),
        Case(f"{name}-str", InvalidArgumentError, lambda a, c: call(a, {"full": "1"})),
        Case(f"{name}-bool", InvalidArgumentError, lambda a, c: call(a, {"full": True})),
        Case(f"{name}-none", InvalidArgumentError, lambda a, c: call(a, {"full": None})),
        Case(f"{name}-unknown-class", InvalidArgumentError, lambda a, c: call(a, {"nope": 1})),
        Case(f"{name}-over-grid", InvalidArgumentError, lambda a, c: call(a, {"full": 17})),  # top is 16
        Case(f"{name}-over-capacity", InvalidArgumentError, lambda a, c: call(a, {"state": 64, "full": 16})),
        Case(f"{name}-not-a-mapping", InvalidArgumentError, lambda a, c: call(a, [("full", 1)])),
    ]


def _below_cases(name: str, call: Callable[[Arena, object], object]) -> list[Case]:
    """Every malformed placement limit (spec §Placement limit), for one limit-taking operation (toy-tri: the
    ends are ``state`` and ``full``, ``window`` is a float)."""
    return [
        Case(f"{name}-below-not-a-mapping", InvalidArgumentError, lambda a, c: call(a, [("full", 0)])),
        Case(f"{name}-below-unknown-class", InvalidArgumentError, lambda a, c: call(a, {"nope": 0})),
        Case(f"{name}-below-float-band", InvalidArgumentError, lambda a, c: call(a, {"window": 0})),
        Case(f"{name}-below-bool", InvalidArgumentError, lambda a, c: call(a, {"full": True})),
        Case(f"{name}-below-negative", InvalidArgumentError, lambda a, c: call(a, {"full": -1})),
        Case(f"{name}-below-past-capacity", InvalidArgumentError, lambda a, c: call(a, {"state": CAP + 1})),
        Case(f"{name}-below-float-value", InvalidArgumentError, lambda a, c: call(a, {"full": 64.0})),
    ]


CASES: list[Case] = [
    # -- unknown owner ------------------------------------------------------------------------
    Case("extend-unknown-owner", UnknownOwnerError, lambda a, c: a.extend("ghost", {"full": 1})),
    Case("slide-unknown-owner", UnknownOwnerError, lambda a, c: a.slide("ghost", "window", 0)),
    Case("free-unknown-owner", UnknownOwnerError, lambda a, c: a.free("ghost")),
    Case("drop-unknown-owner", UnknownOwnerError, lambda a, c: a.drop("ghost", [])),
    Case("held-unknown-owner", UnknownOwnerError, lambda a, c: a.held("ghost")),
    Case("free-twice", UnknownOwnerError, lambda a, c: a.free("r"), prep=lambda a, c: a.free("r")),
    # -- duplicate owner ----------------------------------------------------------------------
    Case("admit-duplicate-owner", DuplicateOwnerError, lambda a, c: a.admit("r", {"full": 1})),
    Case("admit-duplicate-owner-cache", DuplicateOwnerError, lambda a, c: a.admit("cache", {})),
    # -- unknown page -------------------------------------------------------------------------
    Case("admit-shared-never", UnknownPageError, lambda a, c: a.admit("n", {"full": 1}, shared=[NEVER])),
    Case("admit-shared-freed", UnknownPageError, lambda a, c: a.admit("n", {}, shared=[c["gone"]])),
    Case("share-unknown-page", UnknownPageError, lambda a, c: a.share("cache", [c["f"][3], NEVER])),
    Case("share-new-owner-unknown-page", UnknownPageError, lambda a, c: a.share("new", [c["gone"]])),
    Case("acquire-unknown-page", UnknownPageError,
         lambda a, c: a.acquire("n", UserKind.FORWARD_READ, [c["f"][0], NEVER])),
    Case("write-unknown-page", UnknownPageError, lambda a, c: a.write(NEVER, 0, 0, 1)),
    Case("write-freed-page", UnknownPageError, lambda a, c: a.write(c["gone"], 0, 0, 1)),
    Case("read-unknown-page", UnknownPageError, lambda a, c: a.read(c["gone"], 0, 0)),
    Case("translate-unknown-page", UnknownPageError, lambda a, c: a.translate(NEVER)),
    Case("translate-token-unknown-page", UnknownPageError, lambda a, c: a.translate_token("full", NEVER * PS)),
    # -- duplicate ids ------------------------------------------------------------------------
    Case("admit-shared-duplicate", InvalidArgumentError,
         lambda a, c: a.admit("n", {"full": 1}, shared=[c["f"][0], c["f"][0]])),
    Case("share-duplicate", InvalidArgumentError, lambda a, c: a.share("new", [c["f"][1], c["f"][1]])),
    Case("share-already-held", InvalidArgumentError, lambda a, c: a.share("cache", [c["f"][1], c["f"][0]])),
    Case("drop-duplicate", InvalidArgumentError, lambda a, c: a.drop("r", [c["f"][1], c["f"][1]])),
    Case("acquire-duplicate", InvalidArgumentError,
         lambda a, c: a.acquire("n", UserKind.FORWARD_READ, [c["f"][0], c["f"][0]])),
    # -- double free --------------------------------------------------------------------------
    Case("drop-not-held", DoubleFreeError, lambda a, c: a.drop("cache", [c["f"][1]])),
    Case("drop-freed-page", DoubleFreeError, lambda a, c: a.drop("r", [c["gone"]])),
    Case("drop-never-allocated", DoubleFreeError, lambda a, c: a.drop("r", [NEVER])),
    Case("drop-twice", DoubleFreeError, lambda a, c: a.drop("r", [c["f"][3]]),
         prep=lambda a, c: a.drop("r", [c["f"][3]])),
    Case("drop-twice-shared", DoubleFreeError, lambda a, c: a.drop("cache", [c["f"][0]]),
         prep=lambda a, c: a.drop("cache", [c["f"][0]])),
    # -- ledger -------------------------------------------------------------------------------
    Case("release-never-acquired", ReleaseWithoutAcquireError, lambda a, c: a.release("nobody")),
    Case("release-twice", ReleaseWithoutAcquireError, lambda a, c: a.release("u"),
         prep=lambda a, c: a.release("u")),
    Case("acquire-duplicate-user", DuplicateUserError,
         lambda a, c: a.acquire("u", UserKind.FORWARD_WRITE, [c["f"][3]])),
    Case("acquire-duplicate-user-empty", DuplicateUserError,
         lambda a, c: a.acquire("u2", UserKind.NET_SEND, [])),
    Case("acquire-kind-not-userkind", InvalidArgumentError,
         lambda a, c: a.acquire("n", "forward_read", [c["f"][0]])),
    # -- owner and ledger-user ids: any hashable value (spec §admit, §acquire) ---------------
    Case("admit-owner-unhashable", InvalidArgumentError, lambda a, c: a.admit(["n"], {"full": 1})),
    Case("extend-owner-unhashable", InvalidArgumentError, lambda a, c: a.extend(["r"], {"full": 1})),
    Case("free-owner-unhashable", InvalidArgumentError, lambda a, c: a.free({"r": 1})),
    Case("share-owner-unhashable", InvalidArgumentError, lambda a, c: a.share(["cache"], [c["f"][1]])),
    Case("acquire-user-unhashable", InvalidArgumentError,
         lambda a, c: a.acquire(["n"], UserKind.FORWARD_READ, [c["f"][0]])),
    Case("acquire-user-tuple-of-list", InvalidArgumentError,  # a tuple claims to be hashable; this one is not
         lambda a, c: a.acquire(("n", []), UserKind.FORWARD_READ, [c["f"][0]])),
    Case("release-user-unhashable", InvalidArgumentError, lambda a, c: a.release(["u"])),
    # -- demand -------------------------------------------------------------------------------
    *_demand_cases("admit", lambda a, d: a.admit("n", d)),
    *_demand_cases("extend", lambda a, d: a.extend("r", d)),
    *_below_cases("admit", lambda a, b: a.admit("n", {"full": 1}, below=b)),
    *_below_cases("extend", lambda a, b: a.extend("r", {"full": 1}, below=b)),
    *_below_cases("plan-admission", lambda a, b: a.plan_admission({"full": 1}, below=b)),
    *_demand_cases("relayout", lambda a, d: a.relayout(d)),
    # -- slide --------------------------------------------------------------------------------
    Case("slide-negative", InvalidArgumentError, lambda a, c: a.slide("r", "window", -1)),
    Case("slide-too-many", InvalidArgumentError, lambda a, c: a.slide("r", "window", 3)),  # holds 2
    Case("slide-float", InvalidArgumentError, lambda a, c: a.slide("r", "window", 1.0)),
    Case("slide-str", InvalidArgumentError, lambda a, c: a.slide("r", "window", "1")),
    Case("slide-unknown-class", InvalidArgumentError, lambda a, c: a.slide("r", "nope", 0)),
    Case("slide-bool", InvalidArgumentError, lambda a, c: a.slide("r", "window", True)),
    # -- rows and entries ---------------------------------------------------------------------
    Case("write-entry-too-big", InvalidArgumentError, lambda a, c: a.write(c["f"][0], PS, 0, 1)),
    Case("write-entry-negative", InvalidArgumentError, lambda a, c: a.write(c["f"][0], -1, 0, 1)),
    Case("write-row-too-big", InvalidArgumentError, lambda a, c: a.write(c["f"][0], 0, 4, 1)),
    Case("read-row-negative", InvalidArgumentError, lambda a, c: a.read(c["f"][0], 0, -1)),
    Case("read-state-entry-1", InvalidArgumentError, lambda a, c: a.read(c["s"][0], 1, 0)),
    Case("write-entry-float", InvalidArgumentError, lambda a, c: a.write(c["f"][0], 1.5, 0, 1)),
    Case("write-tag-str", InvalidArgumentError, lambda a, c: a.write(c["f"][0], 0, 0, "x")),
    Case("write-tag-bool", InvalidArgumentError, lambda a, c: a.write(c["f"][0], 0, 0, True)),
    Case("write-tag-past-int64", InvalidArgumentError, lambda a, c: a.write(c["f"][0], 0, 0, 2**63)),
    Case("write-tag-under-int64", InvalidArgumentError, lambda a, c: a.write(c["f"][0], 0, 0, -2**63 - 1)),
    # -- compact ------------------------------------------------------------------------------
    Case("compact-negative", InvalidArgumentError, lambda a, c: a.compact(-1)),
    Case("compact-float", InvalidArgumentError, lambda a, c: a.compact(1.0)),
    Case("compact-str", InvalidArgumentError, lambda a, c: a.compact("3")),
    Case("compact-bool", InvalidArgumentError, lambda a, c: a.compact(True)),
    Case("split-compact-negative", InvalidArgumentError, lambda a, c: a.compact(-1), world=busy_split),
    # -- translation --------------------------------------------------------------------------
    Case("translate-token-wrong-class", InvalidArgumentError,
         lambda a, c: a.translate_token("window", c["f"][0] * PS)),
    Case("translate-token-unknown-class", InvalidArgumentError, lambda a, c: a.translate_token("nope", 0)),
    Case("page-offset-unknown-class", InvalidArgumentError, lambda a, c: a.page_offset("nope", 0)),
    Case("page-offset-negative", InvalidArgumentError, lambda a, c: a.page_offset("full", -1)),
    Case("page-offset-past-the-grid", InvalidArgumentError, lambda a, c: a.page_offset("full", 16)),  # top 16
    Case("page-offset-float", InvalidArgumentError, lambda a, c: a.page_offset("full", 1.0)),
    Case("page-offset-bool", InvalidArgumentError, lambda a, c: a.page_offset("full", True)),
    Case("ceil-pages-unknown-class", InvalidArgumentError, lambda a, c: a.ceil_pages("nope", 4)),
    Case("ceil-pages-negative", InvalidArgumentError, lambda a, c: a.ceil_pages("full", -1)),
    Case("ceil-pages-float", InvalidArgumentError, lambda a, c: a.ceil_pages("full", 4.0)),
    Case("ceil-pages-bool", InvalidArgumentError, lambda a, c: a.ceil_pages("full", True)),
    Case("ceil-pages-fraction", InvalidArgumentError, lambda a, c: a.ceil_pages("full", 2.5)),
    Case("ceil-pages-very-negative", InvalidArgumentError, lambda a, c: a.ceil_pages("full", -5)),
    Case("pad-entry-unknown-class", InvalidArgumentError, lambda a, c: a.pad_entry("nope")),
    Case("pad-entry-unhashable-class", InvalidArgumentError, lambda a, c: a.pad_entry(["full"])),
    Case("translate-tokens-unknown-class", InvalidArgumentError,
         lambda a, c: a.translate_tokens("nope", c["tokens"]([0]))),
    Case("translate-tokens-narrow-width", InvalidArgumentError,
         lambda a, c: a.translate_tokens("full", c["tokens"]([0, 1, 2]), out_width=2)),
    Case("translate-tokens-width-float", InvalidArgumentError,
         lambda a, c: a.translate_tokens("full", c["tokens"]([0]), out_width=4.0)),
    # -- plan_admission (public, read-only) ---------------------------------------------------
    Case("plan-negative", InvalidArgumentError, lambda a, c: a.plan_admission({"full": -1})),
    Case("plan-unknown-class", InvalidArgumentError, lambda a, c: a.plan_admission({"nope": 1})),
    Case("plan-float", InvalidArgumentError, lambda a, c: a.plan_admission({"full": 1.5})),
    Case("plan-over-grid", InvalidArgumentError, lambda a, c: a.plan_admission({"full": 17})),
    # -- plans the validator refuses: nothing applied, the free included ---------------------
    Case("drop-free-time-plan-refused", PlanError, lambda a, c: a.drop("r", [c["f"][3]]),
         world=busy_with(MovingReuseHook)),
    Case("slide-free-time-plan-refused", PlanError, lambda a, c: a.slide("r", "window", 1),
         world=busy_with(MovingReuseHook)),
    Case("free-free-time-plan-refused", PlanError, lambda a, c: a.free("r"), world=busy_with(MovingReuseHook)),
    Case("free-time-plan-places", PlanError, lambda a, c: a.drop("r", [c["f"][3]]), world=busy_with(PlacingHook)),
    Case("split-free-time-plan-refused", PlanError, lambda a, c: a.free("r"),
         world=lambda: (lambda w: (setattr(w[0], "policy", MovingReuseHook()), w)[1])(busy_split())),
    Case("admit-plan-fills-withheld", PlanError, lambda a, c: a.admit("n", {"full": 1}),
         world=busy_with(FillsWithheldHole)),
    Case("extend-plan-fills-withheld", PlanError, lambda a, c: a.extend("r", {"full": 1}),
         world=busy_with(FillsWithheldHole)),
    Case("admit-plan-extra-class", PlanError, lambda a, c: a.admit("n", {"full": 1}),
         world=busy_with(ExtraClassPlan)),
    # -- admission rejected -------------------------------------------------------------------
    Case("admit-rejected", AdmissionRejectedError, lambda a, c: a.admit("n", c["too_much"]),
         world=full_arena),
    Case("extend-rejected", AdmissionRejectedError, lambda a, c: a.extend("r", c["too_much"]),
         world=full_arena),
    Case("plan-rejected", AdmissionRejectedError, lambda a, c: a.plan_admission(c["too_much"]),
         world=full_arena),
    Case("admit-rejected-pinned-float", AdmissionRejectedError, lambda a, c: a.admit("n", {"state": 4}),
         world=blocked_float),
    Case("relayout-rejected-pinned-float", AdmissionRejectedError, lambda a, c: a.relayout({"state": 4}),
         world=blocked_float),
    Case("split-admit-rejected", AdmissionRejectedError, lambda a, c: a.admit("n", c["too_much"]),
         world=lambda: full_arena(SplitPools, 16384)),
    # -- SplitPools shares the arena's validation ---------------------------------------------
    Case("split-unknown-owner", UnknownOwnerError, lambda a, c: a.free("ghost"), world=busy_split),
    Case("split-double-free", DoubleFreeError, lambda a, c: a.drop("r", [c["gone"]]), world=busy_split),
    Case("split-release-twice", ReleaseWithoutAcquireError, lambda a, c: a.release("u"),
         prep=lambda a, c: a.release("u"), world=busy_split),
    Case("split-bad-demand", InvalidArgumentError, lambda a, c: a.admit("n", {"full": -1}), world=busy_split),
    Case("split-relayout-bad-demand", InvalidArgumentError, lambda a, c: a.relayout({"nope": 1}),
         world=busy_split),
    Case("two-class-unknown-class", InvalidArgumentError, lambda a, c: a.admit("n", {"window": 1}),
         world=busy_state),
    # -- construction -------------------------------------------------------------------------
    Case("config-full-only", ConfigError, lambda a, c: c["make"](cfg(tiny_model(FULL))), world=None),
    Case("config-no-full", ConfigError, lambda a, c: c["make"](cfg(tiny_model(WINDOW, STATE))), world=None),
    Case("config-state-only", ConfigError, lambda a, c: c["make"](cfg(tiny_model(STATE))), world=None),
    Case("config-no-classes", ConfigError, lambda a, c: c["make"](cfg(tiny_model())), world=None),
    Case("config-duplicate-names", ConfigError,
         lambda a, c: c["make"](cfg(tiny_model(FULL, StateClass("full", Kind.WINDOW, WINDOW.rows, window=8)))),
         world=None),
    Case("config-two-full", ConfigError,
         lambda a, c: c["make"](cfg(tiny_model(FULL, StateClass("full2", Kind.FULL, FULL.rows)))), world=None),
    Case("config-two-recurrent", ConfigError,
         lambda a, c: c["make"](cfg(tiny_model(FULL, STATE, StateClass("s2", Kind.RECURRENT, STATE.rows)))),
         world=None),
    Case("config-model-context-zero", ConfigError,
         lambda a, c: c["make"](ArenaConfig(ModelSpec("m", (FULL, STATE), max_context_len=0), capacity=CAP,
                                            page_size=PS)), world=None),
    Case("config-context-zero", ConfigError, lambda a, c: c["make"](cfg(max_context_len=0)), world=None),
    Case("config-capacity-zero", ConfigError, lambda a, c: c["make"](cfg(capacity=0)), world=None),
    Case("config-page-size-zero", ConfigError, lambda a, c: c["make"](cfg(page_size=0)), world=None),
    Case("config-page-size-odd", ConfigError, lambda a, c: c["make"](cfg(page_size=3)), world=None),
    Case("config-page-size-not-pow2", ConfigError, lambda a, c: c["make"](cfg(page_size=12)), world=None),
    Case("config-page-size-negative", ConfigError, lambda a, c: c["make"](cfg(page_size=-4)), world=None),
    Case("config-swa-ratio-zero", ConfigError, lambda a, c: c["make"](cfg(swa_full_tokens_ratio=0)), world=None),
    Case("config-swa-ratio-over-one", ConfigError, lambda a, c: c["make"](cfg(swa_full_tokens_ratio=1.5)),
         world=None),
    Case("config-mamba-ratio-zero", ConfigError, lambda a, c: c["make"](cfg(mamba_full_memory_ratio=0)),
         world=None),
    Case("config-mamba-ratio-negative", ConfigError,
         lambda a, c: SplitPools(cfg(mamba_full_memory_ratio=-1.0, capacity=16384)), world=None),
    # a field of the wrong type is refused by type, naming the field and its form (never a TypeError, never rounded)
    Case("config-page-size-float", ConfigError, lambda a, c: c["make"](cfg(page_size=4.0)), world=None),
    Case("config-page-size-str", ConfigError, lambda a, c: c["make"](cfg(page_size="4")), world=None),
    Case("config-page-size-bool", ConfigError, lambda a, c: c["make"](cfg(page_size=True)), world=None),
    Case("config-capacity-float", ConfigError, lambda a, c: c["make"](cfg(capacity=4096.0)), world=None),
    Case("config-capacity-str", ConfigError, lambda a, c: c["make"](cfg(capacity="4096")), world=None),
    Case("config-context-float", ConfigError, lambda a, c: c["make"](cfg(max_context_len=8.5)), world=None),
    Case("config-context-str", ConfigError, lambda a, c: c["make"](cfg(max_context_len="16")), world=None),
    Case("config-model-context-float", ConfigError,
         lambda a, c: c["make"](ArenaConfig(ModelSpec("m", (FULL, STATE), max_context_len=16.5), capacity=CAP,
                                            page_size=PS)), world=None),
    Case("config-mamba-ratio-inf", ConfigError, lambda a, c: c["make"](cfg(mamba_full_memory_ratio=float("inf"))),
         world=None),
    Case("config-swa-ratio-nan", ConfigError, lambda a, c: c["make"](cfg(swa_full_tokens_ratio=float("nan"))),
         world=None),
    Case("config-swa-ratio-str", ConfigError, lambda a, c: c["make"](cfg(swa_full_tokens_ratio="0.8")), world=None),
    Case("config-class-kind-str", ConfigError, lambda a, c: StateClass("x", "full", FULL.rows), world=None),
    Case("config-unknown-preset", ConfigError, lambda a, c: preset("llama-9000"), world=None),
    Case("config-unknown-class-name", ConfigError, lambda a, c: preset("toy-tri").cls("nope"), world=None),
    Case("config-class-no-rows", ConfigError, lambda a, c: StateClass("x", Kind.FULL, ()), world=None),
    Case("config-window-zero", ConfigError,
         lambda a, c: StateClass("w", Kind.WINDOW, WINDOW.rows, window=0), world=None),
    Case("config-unknown-dtype", ConfigError,
         lambda a, c: StateClass("x", Kind.FULL, (Row(0, "k", (8,), "fp64"),)), world=None),
    Case("config-zero-dim", ConfigError,
         lambda a, c: StateClass("x", Kind.FULL, (Row(0, "k", (0, 8), "bf16"),)), world=None),
    Case("misaligned-row", MisalignedRowError,
         lambda a, c: StateClass("x", Kind.FULL, (Row(0, "k", (1, 7), "bf16"),)), world=None),  # 14 B
    Case("misaligned-row-fp8", MisalignedRowError,
         lambda a, c: StateClass("x", Kind.FULL, (Row(0, "k", (24,), "fp8"),)), world=None),  # 24 B
    Case("capacity-below-floor", CapacityTooSmallError, lambda a, c: c["make"](cfg(capacity=2048)), world=None),
    Case("capacity-below-floor-context", CapacityTooSmallError,
         lambda a, c: c["make"](cfg(max_context_len=1024)), world=None),
    Case("split-capacity-below-floor", CapacityTooSmallError, lambda a, c: SplitPools(cfg()), world=None),
]


def _ids_unique() -> None:
    ids = [c.id for c in CASES]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids {dup}"


_ids_unique()


def _params(with_vague: bool) -> list:
    """Cases as pytest params.  ``bug`` cases are xfail strict in the type test and left out of the
    message test (they do not raise the right error); ``vague`` cases are xfail strict in the message test."""
    out = []
    for c in CASES:
        if with_vague and c.bug:
            continue
        if with_vague:
            reason = f"BUG (message names no fix): {c.vague}" if c.vague else None
        else:
            reason = c.bug
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


def _run(case: Case) -> tuple[Arena | None, BaseException]:
    a, ctx = case.world() if case.world is not None else (None, {"make": Arena})
    if case.prep is not None:
        case.prep(a, ctx)
    if a is None:
        with pytest.raises(ArenaError) as exc:
            case.op(a, ctx)
        return None, exc.value
    blob, snap = pickle.dumps(a), a.snapshot()
    with pytest.raises(ArenaError) as exc:
        case.op(a, ctx)
    assert a.snapshot() == snap, "a failed call changed the observable state"
    assert pickle.dumps(a) == blob, "a failed call changed the state (pickle differs)"
    check_all(a)
    return a, exc.value


@pytest.mark.parametrize("case", _params(with_vague=False))
def test_error_path(case: Case) -> None:
    """Exact class, and the state is bit-identical after the failure."""
    _a, err = _run(case)
    assert type(err) is case.exc, f"raised {type(err).__name__}, expected {case.exc.__name__}: {err}"
    assert err.code == case.exc.code and ERROR_CODES[err.code] is case.exc


@pytest.mark.parametrize("case", _params(with_vague=True))
def test_error_message_is_actionable(case: Case) -> None:
    _a, err = _run(case)
    assert_actionable(err)


def test_every_error_code_is_raised() -> None:
    """Each concrete class in ERROR_CODES has at least one passing (non-bug) case in CASES."""
    abstract = {ArenaError, ConfigError, UnknownUserError}
    excluded = abstract
    covered = {c.exc for c in CASES if c.bug is None}
    missing = sorted(code for code, cls in ERROR_CODES.items() if cls not in excluded and cls not in covered)
    assert not missing, f"no test raises {missing}"
    assert ConfigError in covered  # raised directly too, not only through its subclasses


# =============================================================================================
# The hierarchy and the rejection's payload


def test_error_hierarchy() -> None:
    codes = [cls.code for cls in ERROR_CODES.values()]
    assert len(set(codes)) == len(codes)
    assert all(issubclass(cls, ArenaError) for cls in ERROR_CODES.values())
    assert all(ERROR_CODES[cls.code] is cls for cls in ERROR_CODES.values())
    assert issubclass(MisalignedRowError, ConfigError) and issubclass(CapacityTooSmallError, ConfigError)
    assert issubclass(ReleaseWithoutAcquireError, UnknownUserError)
    # an invariant violation is a bug, never bad input: not an ArenaError
    assert not issubclass(InvariantViolation, ArenaError) and issubclass(InvariantViolation, AssertionError)
    assert InvariantViolation("INV-X", "m").inv == "INV-X"


@pytest.mark.parametrize("cls", [Arena, SplitPools])
def test_admission_rejected_carries_shortfall(cls: type[Arena]) -> None:
    capacity = 16384 if cls is SplitPools else CAP
    a, ctx = full_arena(cls, capacity)
    blob = pickle.dumps(a)
    with pytest.raises(AdmissionRejectedError) as exc:
        a.admit("n", ctx["too_much"])
    err = exc.value
    assert isinstance(err.shortfall, dict) and err.shortfall
    assert all(isinstance(n, int) and n > 0 for n in err.shortfall.values())
    assert set(err.shortfall) <= set(a.bands)
    assert err.shortfall_bytes > 0
    assert err.shortfall_bytes == sum(n * a.bands[c].page_bytes for c, n in err.shortfall.items())
    assert pickle.dumps(a) == blob
    assert_actionable(err)


def test_admission_rejected_shortfall_is_what_is_missing() -> None:
    a = Arena(cfg("toy-state"))
    a.admit("r", {"full": 14})
    with pytest.raises(AdmissionRejectedError) as exc:
        a.admit("n", {"full": 5})
    assert exc.value.shortfall == {"full": 3} and exc.value.shortfall_bytes == 3 * 256


def test_ceil_pages_and_page_offset_in_range() -> None:
    """The helpers' valid ranges, next to their refusals in CASES."""
    a, _ctx = busy()
    assert [a.ceil_pages("full", t) for t in (0, 1, PS, PS + 1)] == [0, 1, 1, 2]
    assert a.ceil_pages("state", 0) == 0 and a.ceil_pages("state", 1) == 1
    assert a.page_offset("full", 0) == 0 and a.page_offset("full", 15) == 15 * 256


def test_snapshot_names_each_holds_serial() -> None:
    """A hold is (class, slot, page, allocation serial): two states that differ in a serial only differ."""
    a, ctx = busy()
    v = ctx["f"][1]
    kind, holds = a.snapshot()["users"]["u"]
    assert kind == "forward_read" and holds == [(*a.translate(v), v, a.gen[v])]
    b, _ctx = busy()
    u = b.users["u"]
    b.users["u"] = dataclasses.replace(u, holds=tuple(dataclasses.replace(h, gen=h.gen + 1) for h in u.holds))
    assert a.snapshot() != b.snapshot()
