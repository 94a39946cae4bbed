"""Event users (spec/arena.md §Ledger, Event users) on the reference and gpu/: every call starts with ``poll()``;
a refused call changes nothing beyond its ``poll()``; ``release`` of an event user by hand, once.

The rule is checked as stated: for every refusal of the error table's kinds, the state after the refused call
equals the state after ``poll()`` alone, on a copy; a planted implementation that polls after its guards (the
rule reversed) fails it."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

from collections.abc import Callable
from typing import Any

import pytest

import kvarena.gpu.allocator as gpu_allocator
from kvarena.conformance.adapter.protocol import observe_reference
from kvarena.gpu.kernels import use_interpreter
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, ReleaseWithoutAcquireError, UnknownOwnerError
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import UserKind

use_interpreter()

CONFIG = ArenaConfig(preset("toy-tri"), 4096, page_size=4, max_context_len=16)


class Event:
    """A device event stand-in: ``query()`` is what a torch.cuda.Event answers (done or not), never blocking."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def _observe(a: Any) -> Any:
    return a.observe() if hasattr(a, "observe") else observe_reference(a)


IMPLS: dict[str, Callable[[ArenaConfig], Any]] = {"reference": Arena, "gpu": gpu_allocator.make}


def _world(make: Callable[[ArenaConfig], Any]) -> tuple[Any, Event, list[int]]:
    """A request whose freed page is withheld by a forward pass that has finished (its event completed)."""
    a = make(CONFIG)
    got = a.admit("r", {"state": 1, "full": 3}).pages
    e = Event()
    a.acquire("fwd", UserKind.FORWARD_READ, [got["full"][0]], event=e)
    a.drop("r", [got["full"][0]])
    e.done = True  # the step completed on the device; nothing has polled yet
    return a, e, list(got["full"])


REFUSALS: dict[str, Callable[[Any], Any]] = {
    "extend-unknown-owner": lambda a: a.extend("ghost", {"full": 1}),
    "admit-duplicate-owner": lambda a: a.admit("r", {"full": 1}),
    "free-unknown-owner": lambda a: a.free("ghost"),
    "bad-demand": lambda a: a.admit("x", {"nope": 1}),
    "compact-negative": lambda a: a.compact(-1),
    "acquire-unknown-page": lambda a: a.acquire("u", UserKind.FORWARD_READ, [999]),
    "release-unknown-user": lambda a: a.release("never"),
}
BATCHED: dict[str, Callable[[Any], Any]] = {  # gpu/'s batched calls: a malformed limit refuses the whole call
    "extend-batch-bad-below": lambda a: a.extend_batch(["r"], [{"full": 1}], below={"nope": 0}),
    "admit-batch-bad-below": lambda a: a.admit_batch(["x"], [{"full": 1}], below={"full": -1}),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_call_changes_nothing_beyond_its_poll(impl: str, refusal: str) -> None:
    polled, _e, _ = _world(IMPLS[impl])
    assert polled.poll() == ["fwd"]
    a, _e, _ = _world(IMPLS[impl])
    with pytest.raises(ArenaError):
        REFUSALS[refusal](a)
    assert _observe(a) == _observe(polled)  # the withheld page is a hole again in both
    assert a.poll() == []


@pytest.mark.parametrize("refusal", BATCHED)
def test_a_refused_batched_call_changes_nothing_beyond_its_poll(refusal: str) -> None:
    polled, _e, _ = _world(gpu_allocator.make)
    polled.poll()
    a, _e, _ = _world(gpu_allocator.make)
    with pytest.raises(ArenaError):
        BATCHED[refusal](a)
    assert a.observe() == polled.observe()


@pytest.mark.parametrize("impl", IMPLS)
def test_poll_releases_only_completed_users_in_acquisition_order(impl: str) -> None:
    a = IMPLS[impl](CONFIG)
    pages = a.admit("r", {"full": 3}).pages["full"]
    events = [Event() for _ in pages]
    for i, (v, e) in enumerate(zip(pages, events)):
        a.acquire(f"u{i}", UserKind.FORWARD_READ, [v], event=e)
    assert a.poll() == []
    events[2].done = events[0].done = True
    assert a.poll() == ["u0", "u2"]
    with pytest.raises(ReleaseWithoutAcquireError):
        a.release("u0")  # released by its event: a second release is refused
    a.release("u1")  # by hand, before its event: then its event is ignored
    events[1].done = True
    assert a.poll() == []


@pytest.mark.parametrize("impl", IMPLS)
def test_a_successful_call_sees_the_polled_state(impl: str) -> None:
    """The released page serves the very admission that needs it (rule 1)."""
    a, _e, _full = _world(IMPLS[impl])
    assert a.admit("next", {"full": 1}).pages["full"]  # placed on a state where fwd is gone
    with pytest.raises(ReleaseWithoutAcquireError):
        a.release("fwd")


def test_the_rule_reversed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gpu/ that polls after its guards (so a refused call leaves completed users held) fails the rule."""
    real = gpu_allocator.GpuArena.extend

    def planted(self: Any, owner: str, demand: Any, below: Any = None) -> Any:
        poll, self.poll = self.poll, lambda: []  # planted: guards first, poll only once they passed
        try:
            if owner not in self.owners.rows:
                raise UnknownOwnerError(f"unknown owner {owner!r}; admit it first")
        finally:
            self.poll = poll
        return real(self, owner, demand, below)

    monkeypatch.setattr(gpu_allocator.GpuArena, "extend", planted)
    with pytest.raises(AssertionError):
        test_a_refused_call_changes_nothing_beyond_its_poll("gpu", "extend-unknown-owner")


def test_the_refusal_predicate_compares_with_the_polled_state_and_releases_nobody() -> None:
    """reference/invariants.py check_refusal_is_noop, on a state with a completed event user: it passes (the
    refusals are compared with the state after poll()) and the checked arena still holds the user."""
    from kvarena.reference.invariants import check_all

    a, _e, _ = _world(Arena)
    check_all(a)
    assert "fwd" in a.users
    assert a.poll() == ["fwd"]
