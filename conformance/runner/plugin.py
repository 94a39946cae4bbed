"""The pytest plugin: an engine's CI runs the conformance suite in one line.

    pytest --kvarena-impl=mypkg.kv_adapter:make --kvarena-level=decisions

adds one test item, ``kvarena-conformance[<impl>@<level>]``, that runs the committed vectors and the
lockstep machine (kvarena.conformance.runner.conform.conform) and fails with the divergence and its shrunk trace.
Registered as the ``kvarena`` entry point of ``pytest11``; without ``--kvarena-impl`` it does nothing
(it is loaded in every pytest run of an environment where kvarena is installed, and needs pytest >= 7, which
kvarena's ``conform`` extra does not install).  The factory's module imports from pytest's working directory too.

The item's outcome tells the runs apart: a divergence fails with ``FAIL at level L: INV-... in <where>`` first;
a vacuous run (nothing exercised) fails with ``VACUOUS: ...``; a PASS on fewer completed vector files than
``--kvarena-min-completed`` fails with ``THIN: ...``; a PASS some of whose vector files stopped early passes
with a warning saying what it stands on (``1 passed, 1 warning``); broken input fails with ``broken adapter``.
The verdict and its basis are also the item's user properties (``kvarena_result``, ``kvarena_basis``), which
pytest's ``--junit-xml`` writes as the test case's properties.
"""

from __future__ import annotations

from typing import Any

import pytest

LEVELS = ("pool", "safety", "decisions", "exact")  # adapter.protocol.LEVELS, without importing it here


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvarena", "kvarena conformance (run the suite against your allocator)")
    group.addoption("--kvarena-impl", default=None, metavar="MODULE:FACTORY",
                    help="run the kvarena conformance suite against this factory (config -> allocator); "
                         "'reference' for the reference itself")
    group.addoption("--kvarena-level", default=None, choices=LEVELS,
                    help="pool | safety | decisions | exact (default: exact for kvarena's own gpu/ and the reference, "
                         "safety for any other factory); see `kvarena conform --help`")
    group.addoption("--kvarena-vectors", default=None, metavar="DIR",
                    help="vector directory or file (default: the committed set; 'none' skips them)")
    group.addoption("--kvarena-examples", default=100, type=int, metavar="N",
                    help="lockstep machine examples (default 100; 0 skips the machine)")
    group.addoption("--kvarena-min-completed", default=0, type=int, metavar="N",
                    help="fail a PASS that completed fewer than N vector files (THIN; the rest stopped early)")


class KvarenaWarning(UserWarning):
    """A PASS some of whose vector files stopped early (the warning says what it stands on), or an adapter
    whose PROTOCOL_VERSION is behind (the warning names the changes since)."""


class ConformanceFailure(Exception):
    """The implementation diverged, or its adapter / the vectors are broken; the message is the report."""


class ConformanceItem(pytest.Item):
    def __init__(self, *, impl: str, level: str, vectors: str | None, examples: int, min_completed: int = 0,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.impl, self.level, self.vectors, self.examples = impl, level, vectors, examples
        self.min_completed = min_completed

    def runtest(self) -> None:
        from pathlib import Path

        from kvarena.conformance.adapter.protocol import AdapterError, load_factory
        from kvarena.conformance.runner.conform import conform
        from kvarena.conformance.vectors.replay import VECTOR_DIR, VectorFormatError

        vectors = None if self.vectors == "none" else Path(self.vectors) if self.vectors else VECTOR_DIR
        import warnings

        try:
            name, factory = load_factory(self.impl)
            report = conform(factory, level=self.level, vectors=vectors, examples=self.examples, impl=name)
        except (AdapterError, VectorFormatError) as e:
            kind = "vector file" if isinstance(e, VectorFormatError) else "adapter"
            self.user_properties.append(("kvarena_result", "BROKEN"))
            raise ConformanceFailure(f"broken {kind}: {e}") from None
        report.min_completed = self.min_completed
        self.user_properties += [("kvarena_result", report.verdict), ("kvarena_basis", report.basis())]
        if report.exit_code != 0:  # a divergence, a vacuous run that exercised nothing, or a thin PASS
            raise ConformanceFailure(f"{report.headline()}\n\n{report.format()}")
        _, stopped, _ = report.vector_counts()
        if report.protocol_notes:
            warnings.warn(KvarenaWarning("kvarena: " + "\n".join(report.protocol_notes)), stacklevel=1)
        if stopped:
            warnings.warn(KvarenaWarning(f"kvarena: {report.headline()}: {stopped} vector files stopped early; "
                                         "--kvarena-min-completed N fails a PASS on fewer than N completed"),
                          stacklevel=1)
        self.user_properties.append(("kvarena", report.format()))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"kvarena conformance of {self.impl} at {self.level}"


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so they apply to this item too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    impl = config.getoption("kvarena_impl", None)
    if not impl:
        return
    from kvarena.conformance.adapter.protocol import default_level  # light: no hypothesis until the item runs

    level = config.getoption("kvarena_level") or default_level(impl)
    items.append(ConformanceItem.from_parent(session, name=f"kvarena-conformance[{impl}@{level}]", impl=impl,
                                             level=level, vectors=config.getoption("kvarena_vectors"),
                                             examples=config.getoption("kvarena_examples"),
                                             min_completed=config.getoption("kvarena_min_completed")))
