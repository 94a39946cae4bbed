"""What a conformance run exercised: a PASS is only as strong as the steps behind it.

The :class:`Coverage` counters are updated by the harness after every step from the implementation's
own observations (before / after), so they mean the same for every adapter: pages placed and moved,
frees the ledger deferred, withheld pages later released, refusals by error class, rows read back after
a move, and per invariant ID the steps that could have broken it.  :func:`vacuity` says when a run
exercised nothing meaningful (``kvarena conform`` exits 3 then).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Per invariant ID: which steps could have broken it (spec/arena.md §Invariants).  A step "exposes" an
# invariant when it changed what the invariant reads; a run whose count is 0 never tested it.
EXPOSURE = {
    "INV-NO-OVERLAP": "steps that placed, moved or re-spanned a page",
    "INV-BAND-ORDER": "steps that changed a band's span",
    "INV-LEDGER-SAFETY": "steps that changed the state while a ledger user held pages",
    "INV-PAGE-ATOMIC": "steps that moved, freed or placed pages while written rows were live",
    "INV-VMAP-BIJECTIVE": "steps that bound, unbound or remapped a virtual page",
    "INV-CONTENT-FOLLOWS-VID": "steps that placed or moved a page (fresh rows read 0, written rows follow the id)",
    "INV-BYTE-CONSERVATION": "steps that changed the observation",
    "INV-FEASIBILITY-FLOOR": "configurations built and compared with the reference",
    "INV-REFUSAL-IS-NOOP": "refused steps checked for an unchanged state",
    "INV-STATE-PRIVATE": "steps that gave an owner a recurrent page (admit, extend, copy_state) or shared pages",
}
# At level pool the same IDs are decided on byte ranges (conformance/machine/checks.py check_pool_observation)
POOL_EXPOSURE = {
    "INV-NO-OVERLAP": "steps that placed or moved a page (live, withheld and free byte ranges pairwise disjoint)",
    "INV-BAND-ORDER": "not checked at pool: a pool has no bands",
    "INV-BYTE-CONSERVATION": "steps that changed the observation (live + withheld + free = the pool's own bytes)",
}


@dataclass
class Coverage:
    """Counters of one run (vectors, machine examples), merged with ``+=``."""

    ops: Counter = field(default_factory=Counter)  # steps run on the implementation, per operation
    admissions: Counter = field(default_factory=Counter)  # "rung N" / "rung not reported" / "refused"
    refusals: Counter = field(default_factory=Counter)  # error code -> steps the implementation refused
    pages_placed: int = 0
    pages_moved: int = 0
    moved_under_reader: int = 0  # moves of a page some reader still held (its old slot must be withheld)
    frees_deferred: int = 0  # pages freed while a user held them: withheld, not holes
    withheld_released: int = 0  # withheld slots that later left the withheld set
    rows_after_move: int = 0  # written rows read back from pages that had moved since
    constructions: int = 0
    exposure: Counter = field(default_factory=Counter)  # invariant ID -> steps that could have broken it
    diverged: Counter = field(default_factory=Counter)  # admissions that fit one side only (safety, pool): undone
    boundary: Counter = field(default_factory=Counter)  # boundary scenario family -> scenarios run (boundary.py)

    def __iadd__(self, other: Coverage) -> Coverage:
        for f in ("ops", "admissions", "refusals", "exposure", "diverged", "boundary"):
            getattr(self, f).update(getattr(other, f))
        for f in ("pages_placed", "pages_moved", "moved_under_reader", "frees_deferred", "withheld_released",
                  "rows_after_move", "constructions"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        return self

    @property
    def accepted(self) -> int:
        return sum(n for k, n in self.admissions.items() if k != "refused")

    def to_json(self) -> dict[str, Any]:
        return {"steps": dict(sorted(self.ops.items())), "admissions": dict(sorted(self.admissions.items())),
                "admissions_accepted": self.accepted, "refusals": dict(sorted(self.refusals.items())),
                "admissions_fitting_one_side": dict(sorted(self.diverged.items())),
                "pages_placed": self.pages_placed, "pages_moved": self.pages_moved,
                "pages_moved_under_reader": self.moved_under_reader, "frees_deferred": self.frees_deferred,
                "withheld_released": self.withheld_released, "rows_read_after_move": self.rows_after_move,
                "constructions": self.constructions,
                "boundary_scenarios": dict(sorted(self.boundary.items())),
                "invariant_exposure": {inv: self.exposure.get(inv, 0) for inv in EXPOSURE}}


def vacuity(cov: Coverage, vector_progress: int, machine_placed: int) -> str | None:
    """Why the run exercised nothing meaningful, or None.  ``vector_progress``: vector files that got past
    their first refusal; ``machine_placed``: pages the implementation placed in machine steps."""
    if cov.accepted == 0:
        return ("the implementation accepted no admission: every admit/extend was refused, so no invariant was "
                "ever exercised on a live page. Check that the factory builds a usable pool for the toy configs "
                "(capacity, page size) and that admit() returns pages")
    if vector_progress == 0 and machine_placed == 0:
        return ("no vector got past its first refusal and no machine step placed a page: run the lockstep "
                "machine (--examples N with N > 0) or make the adapter admit what the reference admits")
    return None


def format_coverage(cov: Coverage, vectors: tuple[int, int, int] | None = None, level: str | None = None) -> list[str]:
    """The coverage table as text lines, wrapped to the terminal; ``vectors`` is (completed, stopped early,
    failed); ``level`` pool describes the invariants in byte terms."""
    import textwrap

    from kvarena.text import columns, table

    def label(k: str) -> str:
        return "empty demand" if k == "rung 0" else k

    rows: list[tuple[str, str]] = []
    ops = ", ".join(f"{op} {n:,}" for op, n in sorted(cov.ops.items(), key=lambda kv: -kv[1]))
    rows.append(("steps run", f"{sum(cov.ops.values()):,}" + (f" ({ops})" if ops else "")))
    by_rung = ", ".join(f"{label(k)} {n:,}" for k, n in sorted(cov.admissions.items()) if k != "refused")
    rows.append(("admissions", f"{cov.accepted:,} accepted" + (f" ({by_rung})" if by_rung else "")
                 + f", {cov.admissions.get('refused', 0):,} refused as not fitting"))
    if cov.diverged:
        rows.append(("fits one side only", ", ".join(f"{n:,} on {k}" for k, n in sorted(cov.diverged.items()))
                     + " (allowed at safety and pool: undone there, the invariants checked as placed)"))
    rows.append(("pages placed / moved", f"{cov.pages_placed:,} / {cov.pages_moved:,} "
                                         f"({cov.moved_under_reader:,} moved while a reader held them)"))
    rows.append(("ledger", f"{cov.frees_deferred:,} frees deferred (withheld), {cov.withheld_released:,} "
                           "withheld pages released later"))
    rows.append(("refusals by error", ", ".join(f"{k} {n:,}" for k, n in sorted(cov.refusals.items())) or "none"))
    rows.append(("rows read after a move", f"{cov.rows_after_move:,}"))
    if cov.boundary:
        fams = ", ".join(f"{k} {n:,}" for k, n in sorted(cov.boundary.items()))
        rows.append(("boundary scenarios", f"{sum(cov.boundary.values()):,} run before the random examples ({fams})"))
    if vectors is not None:
        done, stopped, failed = vectors
        rows.append(("vectors", f"{done} completed, {stopped} stopped early, {failed} failed"))
    key = max(len(k) for k, _ in rows)
    width = max(40, columns() - key - 4)
    out = ["coverage (what the implementation was made to do):"]
    for k, v in rows:
        lines = textwrap.wrap(v, width) or [""]
        out.append(f"  {k:<{key}}  {lines[0]}")
        out.extend(f"  {'':<{key}}  {line}" for line in lines[1:])
    why_at = {**EXPOSURE, **POOL_EXPOSURE} if level == "pool" else EXPOSURE
    inv_rows = [[inv, cov.exposure.get(inv, 0), why] for inv, why in why_at.items()]
    out.append("per invariant, the steps that could have broken it (each was checked after every step):")
    out.append(_indent(table(["invariant", "steps", "which steps"], inv_rows, align="lrl")))
    return out


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def merge(covs: Iterable[Coverage]) -> Coverage:
    total = Coverage()
    for c in covs:
        total += c
    return total
