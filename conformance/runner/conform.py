"""``kvarena conform``: the vectors plus the lockstep machine against any implementation of the adapter protocol.

    report = conform(factory, level="decisions", examples=100)
    print(report.format()); sys.exit(report.exit_code)

Exit codes: 0 every check passed; 1 a divergence (the report carries the shrunk trace); 2 the adapter,
the vector files or the arguments are broken (:class:`~kvarena.conformance.adapter.protocol.AdapterError`,
:class:`~kvarena.conformance.vectors.replay.VectorFormatError`), raised to the caller.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvarena.conformance.adapter.protocol import (
    LEVELS,
    PROTOCOL_VERSION,
    AdapterError,
    check_adapter,
    declared_version,
    one_line,
    raised_at,
    version_notes,
)
from kvarena.conformance.machine.checks import Geometry
from kvarena.conformance.machine.coverage import Coverage, format_coverage, merge, vacuity
from kvarena.conformance.vectors.replay import VECTOR_DIR, VectorResult, discover, load, replay
from kvarena.spec.errors import ArenaError
from kvarena.spec.models import ArenaConfig, preset

EXIT_OK, EXIT_DIVERGENCE, EXIT_BROKEN, EXIT_VACUOUS = 0, 1, 2, 3  # kvarena.text's convention


@dataclass
class Report:
    impl: str
    level: str
    vectors: list[VectorResult] = field(default_factory=list)
    vector_dir: str = ""
    examples: int = 0  # requested
    machine_runs: int = 0  # machine examples actually run (generation, and shrinking after a failure)
    machine_status: str = "skipped"  # passed | failed | skipped
    machine_message: str = ""
    machine_inv: str | None = None
    machine_coverage: Coverage = field(default_factory=Coverage)
    boundary_failed: str | None = None  # the boundary scenario that diverged (the random examples then do not run)
    seconds: float = 0.0
    min_completed: int = 0  # --min-completed: a PASS on fewer completed vector files is THIN (exit 3)
    protocol_declared: Any = None  # the PROTOCOL_VERSION the adapter declares
    protocol_notes: list[str] = field(default_factory=list)  # the contract changes it needs (version_notes)

    @property
    def failed_vectors(self) -> list[VectorResult]:
        return [v for v in self.vectors if v.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed_vectors and self.machine_status != "failed"

    @property
    def coverage(self) -> Coverage:
        return merge([*(v.coverage for v in self.vectors), self.machine_coverage])

    @property
    def vacuous(self) -> str | None:
        """Why this run exercised nothing meaningful (exit 3), or None."""
        progress = sum(1 for v in self.vectors if v.status == "passed" or v.coverage.accepted > 0)
        return vacuity(self.coverage, progress, self.machine_coverage.pages_placed)

    @property
    def thin(self) -> str | None:
        """Why a PASS stands on too little (exit 3, like a vacuous run): fewer vector files completed than
        ``min_completed`` asks; None otherwise."""
        done, stopped, _ = self.vector_counts()
        if not self.ok or self.vacuous or done >= self.min_completed:
            return None
        return (f"{done} of {len(self.vectors)} vector files completed ({stopped} stopped early), fewer than "
                f"--min-completed {self.min_completed}; the stopped files say where the allocator leaves the "
                "reference's path (a refused admission, a missing optional method or feature)")

    @property
    def exit_code(self) -> int:
        if not self.ok:
            return EXIT_DIVERGENCE
        return EXIT_VACUOUS if self.vacuous or self.thin else EXIT_OK

    @property
    def verdict(self) -> str:
        return "FAIL" if not self.ok else "VACUOUS" if self.vacuous else "THIN" if self.thin else "PASS"

    def basis(self) -> str:
        """What the verdict stands on, for the result line: vectors completed, machine examples, placements."""
        done, stopped, failed = self.vector_counts()
        cov = self.coverage
        parts = [f"{done} of {len(self.vectors)} vectors completed, {stopped} stopped early"
                 + (f", {failed} failed" if failed else "") if self.vectors else "vectors not run"]
        boundary = sum(self.machine_coverage.boundary.values())
        parts.append(f"{boundary:,} boundary scenarios, {self.machine_runs:,} machine examples"
                     if self.machine_status != "skipped" else "machine not run")
        parts.append(f"{cov.accepted:,} admissions accepted, {cov.pages_placed:,} pages placed, "
                     f"{cov.pages_moved:,} moved")
        return "; ".join(parts)

    def headline(self) -> str:
        """One line: the verdict and what it rests on, or the first failure and the invariant it names."""
        if not self.ok:
            v = next(iter(self.failed_vectors), None)
            inv, where = (v.inv, f"vector {v.path.name}") if v else (self.machine_inv, "the lockstep machine")
            return f"FAIL at level {self.level}: {inv + ' in ' if inv else 'a divergence in '}{where}"
        why = self.vacuous or self.thin
        if why:
            return f"{self.verdict} at level {self.level}: {why}"
        return f"PASS at level {self.level} ({self.basis()})"

    def vector_counts(self) -> tuple[int, int, int]:
        n = {s: sum(1 for v in self.vectors if v.status == s) for s in ("passed", "stopped", "failed")}
        return n["passed"], n["stopped"], n["failed"]

    def format(self, verbose: bool = False) -> str:
        done, stopped, failed = self.vector_counts()
        steps = sum(v.steps_run for v in self.vectors)
        out = [f"kvarena conform: impl {self.impl}, level {self.level}", *self.protocol_notes]
        if self.vectors:
            out.append(f"vectors: {done} passed, {failed} failed, {stopped} stopped early "
                       f"({len(self.vectors)} files, {steps} steps, {self.vector_dir})")
        else:
            out.append("vectors: not run")
        for v in self.vectors:
            if v.status == "stopped" or verbose:
                out.append(f"  {v.status:<7} {v.path.name}: {v.message or f'{v.steps_run} steps'}")
        first = sum(self.machine_coverage.boundary.values())
        if self.machine_status == "skipped":
            out.append("machine: not run (--examples 0)")
        elif self.boundary_failed:
            out.append(f"machine: failed in a boundary scenario after {first} passed: {self.boundary_failed} (the "
                       "random examples did not run)")
        else:
            out.append(f"machine: {self.machine_status} ({first} boundary scenarios, then {self.examples} examples "
                       f"requested, {self.machine_runs} run in all; lockstep with the reference on the toy models)")
        out.append("")
        out.extend(format_coverage(self.coverage, (done, stopped, failed) if self.vectors else None, self.level))
        for i, v in enumerate(self.failed_vectors):
            out.append(f"\nDIVERGENCE in vector {v.path.name}" + (f" [{v.inv}]" if v.inv else "") + ":")
            out.append(v.message if i == 0 or verbose else (v.summary or v.message.splitlines()[0]))
        if self.machine_status == "failed":
            where = " in a boundary scenario" if self.boundary_failed else " in the lockstep machine"
            out.append("\nDIVERGENCE" + where + (f" [{self.machine_inv}]" if self.machine_inv else "")
                       + (" (a targeted trace)" if self.boundary_failed else " (the shrunk failing example)") + ":")
            out.append(self.machine_message)
        why = self.vacuous if self.ok else None
        if why:
            out.append(f"\nVACUOUS: {why}.")
        if self.thin:
            out.append(f"\nTHIN: {self.thin}.")
        out.append(f"\nresult: {self.verdict} at level {self.level} ({self.basis()}; {self.seconds:.1f} s)")
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        done, stopped, failed = self.vector_counts()
        return {
            "impl": self.impl, "level": self.level, "result": self.verdict, "exit_code": self.exit_code,
            "vacuous": self.vacuous, "thin": self.thin, "min_completed": self.min_completed,
            "basis": self.basis(), "seconds": round(self.seconds, 3),
            "protocol": {"version": PROTOCOL_VERSION, "declared": self.protocol_declared,
                         "notes": self.protocol_notes},
            "vectors": {"completed": done, "stopped_early": stopped, "failed": failed, "dir": self.vector_dir,
                        "files": [{"file": v.path.name, "status": v.status, "steps_run": v.steps_run,
                                   "steps": v.steps, "inv": v.inv, "message": v.summary or v.message}
                                  for v in self.vectors]},
            "machine": {"status": self.machine_status, "examples": self.examples, "runs": self.machine_runs,
                        "inv": self.machine_inv, "message": self.machine_message,
                        "coverage": self.machine_coverage.to_json()},
            "coverage": self.coverage.to_json(),
        }


def smoke(factory: Callable[[ArenaConfig], Any], config: ArenaConfig | None = None) -> None:
    """Build one allocator and check it speaks the protocol (AdapterError naming what is missing)."""
    config = config or ArenaConfig(preset("toy-tri"), 8192, page_size=4, max_context_len=16)
    try:
        alloc = factory(config)  # the first build: an exception is one line naming the factory and where it raised
    except ArenaError as e:
        raise AdapterError(f"the factory refuses a toy-tri arena of {config.capacity} B that the reference builds "
                           f"({e.code}: {e})") from e
    except Exception as e:
        name = f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', repr(factory))}"
        raise AdapterError(one_line(f"the factory {name} raised {type(e).__name__}: {e} ({raised_at(e)}) building "
                                    f"a toy-tri arena of {config.capacity} B")) from None
    check_adapter(alloc, Geometry.of(config).order, "the factory's allocator")
    close = getattr(alloc, "close", None)
    if callable(close):
        close()


def machine_settings(examples: int, steps: int = 50, seed: int | None = None) -> Any:
    from hypothesis import HealthCheck, Phase, settings

    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]  # no "explain": slow
    kw: dict[str, Any] = dict(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                              phases=phases,
                              print_blob=seed is not None, report_multiple_bugs=False,
                              suppress_health_check=list(HealthCheck))
    if seed is None:
        kw["derandomize"] = True
    return settings(**kw)


Progress = Callable[[str], None]


def conform(factory: Callable[[ArenaConfig], Any], level: str = "exact", vectors: Path | str | None = VECTOR_DIR,
            examples: int = 100, impl: str = "", steps: int = 50, seed: int | None = None,
            deep: bool = True, progress: Progress | None = None, trace_lines: int | None = None,
            boundary: bool = True) -> Report:
    """Run the vectors (``vectors`` None: skip), then (``examples`` > 0) the boundary scenarios (``boundary``) and
    ``examples`` lockstep machine examples at ``level``.
    ``progress`` gets a line after each vector file and every few seconds of the machine."""
    if level not in LEVELS:
        raise AdapterError(f"level {level!r}: choose one of {', '.join(LEVELS)}")
    t0 = time.perf_counter()
    report = Report(impl or getattr(factory, "__qualname__", repr(factory)), level, examples=examples)
    smoke(factory)
    report.protocol_declared, report.protocol_notes = declared_version(factory), version_notes(factory)
    if vectors is not None:
        files = discover(vectors)
        report.vector_dir = str(vectors)
        loaded = [load(f) for f in files]  # every file parses before any runs
        for i, vec in enumerate(loaded, 1):
            r = replay(vec, factory, level, deep=deep, trace_lines=trace_lines)
            report.vectors.append(r)
            if progress is not None:
                progress(f"vectors {i}/{len(loaded)}: {vec.path.name} {r.status} ({r.steps_run}/{r.steps} steps, "
                         f"{time.perf_counter() - t0:.0f} s)")
    if examples > 0 and boundary:  # targeted edges first: random examples rarely reach a band's last page
        from kvarena.conformance.machine.boundary import run_boundary

        b = run_boundary(factory, level, deep, progress, trace_lines)
        report.machine_coverage = b.coverage
        if b.failed is not None:
            report.machine_status, report.machine_message, report.machine_inv = "failed", b.failed, b.inv
            report.boundary_failed = b.scenario
    if examples > 0 and report.boundary_failed is None:
        m = _machine(factory, level, examples, steps, seed, deep, progress, t0)
        report.machine_runs, report.machine_status, report.machine_message, report.machine_inv = m[:4]
        report.machine_coverage = merge([report.machine_coverage, m[4]])
    report.seconds = time.perf_counter() - t0
    return report


PROGRESS_EVERY_S = 5.0


@contextmanager
def hypothesis_home() -> Iterator[None]:
    """Hypothesis keeps its caches under ./.hypothesis, and conform runs in the engine's checkout: point them at
    a temporary directory for the run (a HYPOTHESIS_STORAGE_DIRECTORY the user set is theirs and kept)."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    import hypothesis.configuration as hc

    before = vars(hc).get("__hypothesis_home_directory")  # set by an earlier run in this process, or None
    with tempfile.TemporaryDirectory(prefix="kvarena-hypothesis-") as tmp:
        hc.set_hypothesis_home_dir(tmp)
        try:
            yield
        finally:
            hc.set_hypothesis_home_dir(before)


def _machine(factory: Callable[[ArenaConfig], Any], level: str, examples: int, steps: int, seed: int | None,
             deep: bool, progress: Progress | None = None, t0: float = 0.0
             ) -> tuple[int, str, str, str | None, Coverage]:
    from hypothesis import seed as hypothesis_seed
    from hypothesis.stateful import get_state_machine_test

    from kvarena.conformance.machine.lockstep import lockstep_for

    runs = [0]
    cov = Coverage()
    last = [time.perf_counter()]
    base = lockstep_for(factory, level, deep)

    class Counted(base):  # type: ignore[valid-type, misc]
        def teardown(self) -> None:
            runs[0] += 1
            if self.c is not None:
                cov.__iadd__(self.c.cov)
            now = time.perf_counter()
            if progress is not None and now - last[0] >= PROGRESS_EVERY_S:
                last[0] = now
                progress(f"machine: {runs[0]}/{examples} examples, {sum(cov.ops.values()):,} steps "
                         f"({now - t0:.0f} s)")
            super().teardown()

    Counted.__name__ = Counted.__qualname__ = f"Lockstep_{level}"
    test = get_state_machine_test(Counted, settings=machine_settings(examples, steps, seed))
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        with hypothesis_home():
            test()
    except AdapterError:
        raise
    except AssertionError as e:
        notes = "\n".join(str(n) for n in getattr(e, "__notes__", ()))  # Hypothesis: the shrunk rule calls
        message = str(e) + (f"\n\nas Hypothesis rule calls:\n{notes}" if notes else "")
        return runs[0], "failed", message, getattr(e, "inv", None), cov
    return runs[0], "passed", "", None, cov
