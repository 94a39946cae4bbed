"""The error table (tests/fast/test_errors.py ``CASES``) on every implementation: gpu/ and ``PoolAdapter``.

Each row runs once per implementation, on the operations that implementation offers, and checks what
test_errors.py checks on the reference:

* the exact class the reference raises (``type(err) is case.exc``);
* the message names a fix (``assert_actionable``);
* nothing changed: ``observe()`` (placement: v->p, spans, holes, withheld) and ``pickle.dumps`` of the whole
  object (gpu/ on CPU: the host mirrors, the ledger, the owner log, the planner's bands and every device tensor,
  the arena's bytes and the v->p / p->v tables included, pickle well; ``PoolAdapter`` is plain Python).

Rows on the busy world (``busy``) run on a world built the same way with the implementation's factory; a
construction row runs with the implementation's factory as ``ctx["make"]`` (rows that fail before any factory,
a bad preset or ``StateClass``, are the spec's alone and stay in test_errors.py). gpu/ runs the reference's world
exactly (4096 B). The example ``PoolAdapter`` (kvarena.conformance.example.adapter) gives its middle class a fixed
region and needs 5120 B for toy-tri, so its rows run at 5120 B and are checked against the reference at 5120 B
too; the rows whose numbers are the 4096 B arena's (a grid's top) are left out for it (``POOL_AT_4096``).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from kvarena.conformance.example.adapter import make as make_pool
from kvarena.gpu.allocator import make as make_gpu
from kvarena.gpu.kernels import use_interpreter
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, InvalidArgumentError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind
from tests.fast.test_errors import CASES, PS, Case, assert_actionable, busy

use_interpreter()

POOL_CAP = 5120  # the least capacity (in 256 B steps) the example pool builds toy-tri at, page_size 4


def _tensor(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


IMPLS: dict[str, dict[str, Any]] = {
    "reference": {"make": Arena, "capacity": 4096, "tokens": list},  # test_errors.py tests it; failures() runs it
    "gpu": {"make": make_gpu, "capacity": 4096, "tokens": _tensor},
    "pool": {"make": make_pool, "capacity": POOL_CAP, "tokens": list},
}
TESTED = ("gpu", "pool")

# Operations the PoolAdapter does not offer (case ids start with the operation's name), and the placement limit.
POOL_LACKS = ("plan-", "translate-token", "page-offset", "ceil-pages", "pad-entry", "flush-idle", "copy-state")
# Rows whose arguments are the 4096 B arena's (top 16 full pages, 4096 B): at 5120 B they are valid calls.
POOL_AT_4096 = {"admit-over-grid", "extend-over-grid", "relayout-over-grid"}


def world(impl: str, capacity: int | None = None, make: Callable[..., Any] | None = None
          ) -> tuple[Any, dict[str, Any]]:
    """test_errors.busy's world on ``impl`` (at ``capacity``, with ``make`` for its factory): owners, a shared page, a
    reader, a withheld page, a written row."""
    spec = IMPLS[impl]
    cap = capacity or spec["capacity"]
    a = (make or spec["make"])(ArenaConfig(preset("toy-tri"), capacity=cap, page_size=PS, max_context_len=16))
    r = a.admit("r", {"state": 1, "window": 2, "full": 4}).pages
    f = list(r["full"])
    a.share("cache", [f[0]])
    a.write(f[0], 0, 0, 5)
    a.acquire("u", UserKind.FORWARD_READ, [f[1]])
    a.acquire("u2", UserKind.NET_SEND, [f[2]])
    a.drop("r", [f[2]])
    return a, {"f": f, "gone": f[2], "w": list(r.get("window", ())), "s": list(r.get("state", ())),
               "tokens": spec["tokens"]}


class _Reached(Exception):
    pass


def _probe(config: ArenaConfig) -> None:
    raise _Reached


def _reaches_factory(case: Case) -> bool:
    """Whether a construction row gets as far as the implementation (a bad preset or StateClass does not)."""
    try:
        case.op(None, {"make": _probe})
    except _Reached:
        return True
    except ArenaError:
        return False
    return False


def _offered(impl: str, case: Case) -> bool:
    if case.bug:
        return False
    if case.world is None:
        return _reaches_factory(case)
    if case.world is not busy:  # the split pools, the planted policies, the reference's other worlds
        return False
    if impl == "pool":
        return not (case.id.startswith(POOL_LACKS) or "-below-" in case.id or case.id in POOL_AT_4096)
    return True


ROWS = [pytest.param(impl, c, id=f"{impl}-{c.id}") for impl in TESTED for c in CASES if _offered(impl, c)]


def _state(a: Any) -> tuple[Any, bytes]:
    """What a refusal must leave as it was: the observation (the reference's snapshot) and the whole pickle."""
    return (a.snapshot() if isinstance(a, Arena) else a.observe()), pickle.dumps(a)


def _raised(op: Callable[[], object]) -> ArenaError:
    try:
        op()
    except ArenaError as e:
        return e
    raise AssertionError("no ArenaError was raised: the call was accepted")


def run(impl: str, case: Case, make: Callable[..., Any] | None = None) -> ArenaError:
    """The row on ``impl`` (built by ``make``, default its factory): its error, after checking that nothing
    changed. AssertionError if it raised nothing or changed the state; any other exception propagates."""
    make = make or IMPLS[impl]["make"]
    if case.world is None:
        return _raised(lambda: case.op(None, {"make": make}))
    a, ctx = world(impl, make=make)
    if case.prep is not None:
        case.prep(a, ctx)
    before = _state(a)
    err = _raised(lambda: case.op(a, ctx))
    after = _state(a)
    assert after[0] == before[0], f"{impl}: a failed call changed the observation"
    assert after[1] == before[1], f"{impl}: a failed call changed the state (pickle differs)"
    return err


def failures(impl: str, make: Callable[..., Any] | None = None) -> list[str]:
    """Every row of ``impl`` that does not hold (the class, the message, the state), as lines: how the planted
    bugs in the shared guards are killed (tests/quality/test_guard_mutants.py, gpu_mutants.py)."""
    bad = []
    for case in CASES:
        if not _offered(impl, case):
            continue
        try:
            err = run(impl, case, make)
            assert type(err) is case.exc, f"raised {type(err).__name__}, not {case.exc.__name__}: {err}"
            assert_actionable(err)
        except Exception as e:
            bad.append(f"{impl} {case.id}: {type(e).__name__}: {e}")
    return bad


@pytest.mark.parametrize(("impl", "case"), ROWS)
def test_error_row(impl: str, case: Case) -> None:
    """The reference's class, a message that names the fix, the state unchanged."""
    err = run(impl, case)
    assert type(err) is case.exc, f"{impl} raised {type(err).__name__}, the reference {case.exc.__name__}: {err}"
    assert_actionable(err)
    if impl == "pool" and case.world is not None:  # its world is 5120 B: the row means the same there
        ref, ctx = world("reference", POOL_CAP)
        if case.prep is not None:
            case.prep(ref, ctx)
        assert type(_raised(lambda: case.op(ref, ctx))) is case.exc, f"{case.id} depends on the 4096 B world"


def test_every_implementation_runs_the_new_rows() -> None:
    """The issue-23 reproducers reach every implementation that has the operation."""
    ids = {(impl, c.id) for impl, c in (p.values for p in ROWS)}
    for impl in TESTED:
        for row in ("write-tag-past-int64", "write-tag-under-int64", "admit-owner-unhashable",
                    "acquire-user-unhashable", "config-page-size-float", "config-capacity-float",
                    "config-context-float", "config-mamba-ratio-inf", "config-page-size-bool"):
            assert (impl, row) in ids, (impl, row)
    for row in ("ceil-pages-very-negative", "ceil-pages-fraction", "ceil-pages-bool", "ceil-pages-unknown-class",
                "pad-entry-unknown-class", "translate-tokens-unknown-class", "translate-tokens-narrow-width"):
        assert ("gpu", row) in ids, row


# ---------------------------------------------------------------------------------------------
# gpu/ only: its tensor forms and the batched admit


def test_gpu_translate_tokens_refuses_malformed_tensors_without_reading_them() -> None:
    """The hot path's guards read host metadata only: on the meta device (no memory at all) a list, a float
    tensor, a 2-D tensor and a too-small ``out`` are refused, and a well-formed call goes through."""
    a = make_gpu(ArenaConfig(preset("toy-tri"), 4096, page_size=PS, max_context_len=16), device="meta")
    ok = torch.zeros(3, dtype=torch.int64, device="meta")
    for call in (lambda: a.translate_tokens("full", [0, 1]),
                 lambda: a.translate_tokens("full", ok.to(torch.float32)),
                 lambda: a.translate_tokens("full", ok.view(1, 3)),
                 lambda: a.translate_tokens("full", ok, out=torch.empty(2, dtype=torch.int64, device="meta")),
                 lambda: a.translate_tokens("full", ok, out=torch.empty(8, dtype=torch.int32, device="meta")),
                 lambda: a.translate_tokens("full", ok, out_width=2)):
        err = _raised(call)
        assert type(err) is InvalidArgumentError, err
        assert_actionable(err)
    assert a.translate_tokens("full", ok, out_width=5).shape == (5,)


def test_gpu_admit_batch_refuses_an_unhashable_owner_in_its_lane() -> None:
    """admit_batch is admit per lane: the unhashable name's lane gets admit's InvalidArgument, the others go on."""
    a = make_gpu(ArenaConfig(preset("toy-tri"), 4096, page_size=PS, max_context_len=16))
    res = a.admit_batch([["x"], "y"], np.array([[0, 0, 1], [0, 0, 1]], dtype=np.int64))
    assert type(res.errors[0]) is InvalidArgumentError and 1 not in res.errors
    assert_actionable(res.errors[0])
    assert list(a.owners) == ["y"]
