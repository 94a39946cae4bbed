"""Planted bugs in the argument guards every implementation shares (spec/guards.py, spec/models.py; issue 23): each
is killed by the error table run on every implementation (tests/fast/test_errors_impls.py ``failures``: the rows of
tests/fast/test_errors.py on the reference, gpu/ and the example PoolAdapter), and the unmutated guards pass the
same rows. A guard mutant is patched into every module that imported the guard (the reference, gpu/, PoolAdapter,
spec/models.py), a method of a spec class (``ArenaConfig.validate``) into the class itself, so each implementation
runs the planted bug.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton or kvarena.gpu: kernels are interpreted

import contextlib
import inspect
import sys
import types
from collections.abc import Iterator
from unittest import mock

import pytest

import kvarena.spec.guards as guards_mod
import kvarena.spec.models as models_mod
from kvarena.gpu.kernels import use_interpreter
from tests.fast.test_errors_impls import IMPLS, failures
from tests.quality.mutants import Mutant, mutate

use_interpreter()

GUARD_MUTANTS: tuple[Mutant, ...] = (
    Mutant("config-page-size-type-unchecked", models_mod,
           "        if not is_int(self.page_size) or self.page_size <= 0 or self.page_size & (self.page_size - 1):",
           "        if self.page_size <= 0 or self.page_size & (self.page_size - 1):",
           ("ERROR-CONTRACT",),
           "page_size=True is a page of 1 token, 4.0 a bare TypeError from the power-of-two test"),
    Mutant("config-int-type-unchecked", guards_mod,
           "    if not is_int(value) or value < lo:  # type: ignore[operator]\n        raise ConfigError",
           "    if value < lo:  # type: ignore[operator]\n        raise ConfigError",
           ("ERROR-CONTRACT",),
           "capacity=4096.0, max_context_len=8.5 pass validate and fail later as a TypeError (or are rounded)"),
    Mutant("tag-range-unchecked", guards_mod,
           "    if not TAG_MIN <= tag < TAG_END:  # type: ignore[operator]",
           "    if False:  # type: ignore[operator]",
           ("ERROR-CONTRACT",),
           "write takes a tag outside [-2**63, 2**63): the reference keeps it, a row of 8 bytes cannot"),
    Mutant("owner-id-unhashable-accepted", guards_mod,
           "    try:\n        hash(x)\n    except TypeError:\n        raise InvalidArgumentError",
           "    try:\n        pass\n    except TypeError:\n        raise InvalidArgumentError",
           ("ERROR-CONTRACT",),
           "an owner or ledger-user id that is a list ends in a bare TypeError from the owner tables"),
)


def _users(home: types.ModuleType) -> list[types.ModuleType]:
    """The project's modules (and the tests') that may hold names imported from ``home``."""
    return [m for n, m in list(sys.modules.items())
            if m is not None and n.startswith(("kvarena.", "tests.")) and "_mutant_" not in n and m is not home]


@contextlib.contextmanager
def applied(m: Mutant) -> Iterator[None]:
    """The mutant in place everywhere: each function of the mutated module replaces the original in every module
    that imported it; each method of its classes replaces the original method on the real class (the configs the
    tests build are the real ArenaConfig)."""
    mod = mutate(m)
    home = m.module
    with contextlib.ExitStack() as stack:
        for name, obj in vars(home).items():
            new = getattr(mod, name, None)
            if inspect.isfunction(obj) and obj.__module__ == home.__name__:
                stack.enter_context(mock.patch.object(home, name, new))
                for user in _users(home):
                    if vars(user).get(name) is obj:
                        stack.enter_context(mock.patch.object(user, name, new))
            elif inspect.isclass(obj) and obj.__module__ == home.__name__:
                for attr, f in vars(obj).items():
                    if inspect.isfunction(f) and f.__code__.co_filename == inspect.getsourcefile(home):
                        stack.enter_context(mock.patch.object(obj, attr, vars(new)[attr]))
        yield


def every_failure() -> list[str]:
    return [line for impl in IMPLS for line in failures(impl)]


@pytest.mark.parametrize("mutant", GUARD_MUTANTS, ids=[m.name for m in GUARD_MUTANTS])
def test_snippet_still_present(mutant: Mutant) -> None:
    """A refactor that removes a mutant's snippet must update the mutant, not retire it silently."""
    mutate(mutant)


@pytest.mark.quality
@pytest.mark.parametrize("mutant", GUARD_MUTANTS, ids=[m.name for m in GUARD_MUTANTS])
def test_error_table_kills_guard_mutant(mutant: Mutant) -> None:
    with applied(mutant):
        bad = every_failure()
    assert bad, f"{mutant.name}: every row of the error table still holds on every implementation"
    # every implementation that runs the guard sees the bug, not only one of them
    hit = {line.split(" ", 1)[0] for line in bad}
    assert hit == set(IMPLS), f"{mutant.name} is seen on {sorted(hit)} only: {bad[:3]}"
    assert not every_failure(), "the unmutated guards fail the same rows: the kill proves nothing"
