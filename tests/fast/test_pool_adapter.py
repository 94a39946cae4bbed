"""conformance/adapter/base.py's PoolAdapter (what a third-party adapter builds on) refuses ids exactly as the reference
does: a bool or a float is never read as a page, on every operation that takes ids, and nothing changes."""

from __future__ import annotations

import pytest

from kvarena.conformance.example.adapter import make
from kvarena.reference.arena import Arena
from kvarena.spec.errors import InvalidArgumentError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

CALLS = {
    "share": lambda a, v: a.share("b", [v]),
    "drop": lambda a, v: a.drop("a", [v]),
    "acquire": lambda a, v: a.acquire("u", UserKind.FORWARD_READ, [v]),
    "admit-shared": lambda a, v: a.admit("c", {}, shared=[v]),
    "write": lambda a, v: a.write(v, 0, 0, 7),
    "read": lambda a, v: a.read(v, 0, 0),
    "translate": lambda a, v: a.translate(v),
}


@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("bad", [True, 1.0])
def test_non_int_ids_are_refused_like_the_reference(op: str, bad: object) -> None:
    config = ArenaConfig(preset("toy-swa"), 4096, page_size=2, max_context_len=16)
    for arena in (Arena(config), make(config)):
        arena.admit("a", {"window": 2, "full": 2})
        arena.admit("b", {"full": 1})
        state = arena.snapshot if isinstance(arena, Arena) else arena.observe
        before = state()
        with pytest.raises(InvalidArgumentError, match="must be ints"):
            CALLS[op](arena, bad)
        assert state() == before, type(arena).__name__


STATE_CALLS = {
    "share-state": lambda a, st: a.share("b", [st]),
    "admit-shared-state": lambda a, st: a.admit("c", {}, shared=[st]),
    "admit-two-states": lambda a, st: a.admit("c", {"state": 2}),
    "extend-second-state": lambda a, st: a.extend("a", {"state": 1}),
}


@pytest.mark.parametrize("op", sorted(STATE_CALLS))
def test_recurrent_state_rules_hold_like_the_reference(op: str) -> None:
    """A recurrent page is never shared and an owner holds at most recurrent_slots (default 1) of them."""
    config = ArenaConfig(preset("toy-tri"), 6144, page_size=2, max_context_len=16)
    for arena in (Arena(config), make(config)):
        adm = arena.admit("a", {"state": 1, "full": 1})
        arena.admit("b", {"full": 1})
        state = arena.snapshot if isinstance(arena, Arena) else arena.observe
        before = state()
        with pytest.raises(InvalidArgumentError, match="recurrent"):
            STATE_CALLS[op](arena, adm.pages["state"][0])
        assert state() == before, type(arena).__name__
