"""The reference's queries refuse malformed arguments with messages that name the query and the fix
(spec/arena.md §translate_token, §Padding lanes). tests/fast/test_errors.py checks the error class of each; this
file checks the words a caller reads. Written from mutation testing's survivors on reference/arena.py
(docs/mutation.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError, InvalidArgumentError, UnknownPageError
from kvarena.spec.models import ArenaConfig, preset

PS = 4


def _arena() -> tuple[Arena, dict[str, tuple[int, ...]]]:
    a = Arena(ArenaConfig(preset("toy-tri"), capacity=8192, page_size=PS, max_context_len=16))
    return a, a.admit("r", {"state": 1, "window": 2, "full": 2}).pages


@pytest.mark.parametrize("query", ["ceil_pages", "translate_token", "page_offset", "pad_entry"])
def test_an_unknown_class_is_named_by_the_query(query: str) -> None:
    a, _ = _arena()
    call = {"ceil_pages": lambda: a.ceil_pages("nope", 1), "translate_token": lambda: a.translate_token("nope", 0),
            "page_offset": lambda: a.page_offset("nope", 0), "pad_entry": lambda: a.pad_entry("nope")}[query]
    with pytest.raises(InvalidArgumentError) as e:
        call()
    assert str(e.value).startswith(f"{query}: unknown class 'nope'; use one of ['state', 'window', 'full']")


def refusal(call: Callable[[], object], exc: type[ArenaError] = InvalidArgumentError) -> str:
    """The message of the error ``call`` raises, which must be exactly of class ``exc``."""
    with pytest.raises(exc) as e:
        call()
    assert type(e.value) is exc
    return str(e.value)


@pytest.mark.parametrize("tokens", [-1, 2.5, True, "3"])
def test_ceil_pages_names_itself_for_a_bad_token_count(tokens: object) -> None:
    a, _ = _arena()
    assert refusal(lambda: a.ceil_pages("full", tokens)) == (  # type: ignore[arg-type]
        f"ceil_pages: tokens {tokens!r} must be an int >= 0 (a token count); pass the number of tokens as an int")


@pytest.mark.parametrize("vtoken", [-1, -PS, 2.5, True])
def test_translate_token_refuses_a_token_that_is_not_an_int_at_least_zero(vtoken: object) -> None:
    a, _ = _arena()
    assert refusal(lambda: a.translate_token("full", vtoken)) == (  # type: ignore[arg-type]
        f"translate_token: virtual token {vtoken!r} must be an int >= 0 (vpage * entries_per_page + i)")


def test_translate_token_of_another_class_names_the_fix() -> None:
    a, pages = _arena()
    w = pages["window"][0]
    with pytest.raises(InvalidArgumentError) as e:
        a.translate_token("full", w * PS)
    assert str(e.value) == f"virtual page {w} is a 'window' page, not 'full'; pass the class the page belongs to"
    with pytest.raises(UnknownPageError):
        a.translate_token("full", 10_000 * PS)
