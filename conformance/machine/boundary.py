"""Boundary scenarios: lockstep traces aimed at the band edges, run before the random examples.

A random walk of fifty steps seldom drives a band to its last page, so an off-by-one at a frontier (a growth check
made where the new page starts instead of where it ends, a backstop rounded the wrong way) can pass a hundred random
examples.  These scenarios are generated from each configuration's geometry (page bytes per class, the feasibility
floor, where a float starts under two sets of ratios, capacities that no page divides) and driven to the
*implementation's own* edges: each end grows one page a step until the implementation or the reference refuses,
and is then probed one to three pages past.  At ``safety`` an admission that fits on the implementation only is
checked as placed before it is undone (conductor.py), so a page that crosses an edge is caught on the step that
places it.  Every step runs through the same :class:`~kvarena.conformance.machine.conductor.Conductor` as the
machine and the vectors: every invariant and every row is checked after every step.

Families (:data:`FAMILIES`):

``floor``        construct at the reference's feasibility floor, one byte under and one over (beside a roomy arena);
                 one worst-case request on an empty arena at the floor
``ends-meet``    one end grows to k pages (k at every offset of its frontier within the neighbour's page), the other
                 grows until refused, then the first until refused; the frontier pages' edge rows are written, a
                 frontier page is freed and regrown, an inner page freed and reused
``last-page``    per token class, the largest single demand that fits (the band's last page), one page more, the
                 same demand with a page of every other class in front (a failed all-or-nothing must give back
                 what it grew), and the last page reached by ``extend``
``float-edges``  the float band filled one page a step, then each end up to it; its first and last pages freed and
                 the ends regrown

    result = run_boundary(factory, "safety")    # BoundaryResult: scenarios run per family, the first divergence
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kvarena.conformance.machine.checks import Geometry
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.coverage import Coverage
from kvarena.conformance.machine.harness import (
    Divergence,
    LiveReference,
    Side,
    StopReplay,
    config_to_json,
    construct_pair,
)
from kvarena.reference.arena import Arena
from kvarena.spec.errors import ArenaError
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, preset, worst_case_demand

FAMILIES = {
    "floor": "construct at the feasibility floor and one byte either side; one worst-case request at the floor",
    "ends-meet": "one end to k pages at every offset of its frontier, the other until refused, then the first",
    "last-page": "the largest demand that fits a band, one page more, after other classes, and by extend",
    "float-edges": "the float filled one page a step, then each end up to it; its edge pages freed and regrown",
}
# the lockstep machine's toys: a float, two ends of each kind, two floats, a window-only chain
MODELS = ("toy-tri", "toy-swa", "toy-state", "toy-two-float", "toy-win-float")
PAGE_SIZES = (2, 4)  # the machine's page sizes
CONTEXT = 16  # the machine's max_context_len
FLOAT_RATIOS = ((0.5, 0.7),)  # (swa_full_tokens_ratio, mamba_full_memory_ratio): another float edge, off the default
PROBES = (1, 2, 3)  # pages asked for past a refusal


def _config(model: str, capacity: int, page_size: int, ratios: tuple[float, float] | None = None,
            context: int = CONTEXT) -> ArenaConfig:
    kw = {} if ratios is None else {"swa_full_tokens_ratio": ratios[0], "mamba_full_memory_ratio": ratios[1]}
    return ArenaConfig(preset(model), capacity, page_size=page_size, max_context_len=context, **kw)


@cache
def feasibility_floor(model: str, page_size: int, ratios: tuple[float, float] | None = None,
                      context: int = CONTEXT) -> int:
    """The smallest capacity the reference builds: from the worst case's byte sum up, one byte at a time (one float:
    at most a few pages above it, a few hundred constructions of a toy, about 0.1 ms each; two floats: up to twice
    it, since each empty float starts at its hint and rung 1 places around both)."""
    probe = _config(model, 1 << 20, page_size, ratios, context)
    worst = worst_case_demand(probe)
    need = sum(n * probe.page_bytes(c) for c, n in worst.items())
    step_limit = 2 * need + 8 * max(probe.page_bytes(c.name) for c in probe.model.classes)
    for cap in range(need, step_limit):
        try:
            Arena(_config(model, cap, page_size, ratios, context))
        except ArenaError:
            continue
        return cap
    raise AssertionError(f"no feasible capacity of {model} page size {page_size} below {step_limit} B")


def configs() -> list[tuple[str, ArenaConfig, ArenaConfig]]:
    """(label, config, the floor's config of its model, page size and ratios) for every arena the scenarios run on:
    per toy and page size (the chain toys at the first page size only) the floor itself (the ends meet with no byte
    to spare) and a roomier one whose capacity no page divides (the page before capacity is followed by padding);
    the float toy once more with other ratios (its hint, where an empty float starts, elsewhere)."""
    out = []
    groups = [(m, ps, None) for m in MODELS for ps in (PAGE_SIZES if m in MODELS[:3] else PAGE_SIZES[:1])]
    groups += [("toy-tri", PAGE_SIZES[-1], r) for r in FLOAT_RATIOS]
    for model, ps, ratios in groups:
        at = _config(model, feasibility_floor(model, ps, ratios), ps, ratios)
        geo = Geometry.of(at)
        ph = geo.page_bytes[geo.high]
        roomy = 2 * at.capacity - (2 * at.capacity) % ph + ph - 1  # the most padding a capacity can have
        name = f"{model}/ps{ps}" + (f"/ratios {ratios}" if ratios else "")
        if ratios is None:
            out.append((f"{name}/floor {at.capacity} B", at, at))
        out.append((f"{name}/{roomy} B", _config(model, roomy, ps, ratios), at))
    return out


# ---------------------------------------------------------------------------------------------
# Drills: what one scenario does on its conductor


class Drill:
    """Steps on a conductor in band terms: admissions of one class, remembered per class in placement order."""

    def __init__(self, c: Conductor) -> None:
        self.c = c
        self.geo = c.geo
        self.placed: dict[str, list[tuple[str, int]]] = {k: [] for k in c.order}  # class -> (owner, handle)

    @property
    def low(self) -> str:
        return self.geo.low

    @property
    def high(self) -> str:
        return self.geo.high

    def recurrent(self, cls: str) -> bool:
        return self.geo.kind[cls] is Kind.RECURRENT

    def admit(self, demand: dict[str, int]) -> bool:
        """A new owner with ``demand`` (chain order); True when both sides placed it."""
        owner = self.c.fresh("b")
        exp = self.c.run("admit", owner=owner, demand={k: demand.get(k, 0) for k in self.c.order}, shared=[])
        if exp.ok:
            for cls, hs in (exp.pages or {}).items():
                self.placed[cls].extend((owner, h) for h in hs)
        return exp.ok

    def grow(self, cls: str, limit: int | None = None) -> int:
        """One page a step until refused (or ``limit`` pages), then the probes past the refusal."""
        n = 0
        while (limit is None or n < limit) and n <= self.geo.top[cls]:
            if not self.admit({cls: 1}):
                self.probe(cls)
                break
            n += 1
        return n

    def probe(self, cls: str) -> None:
        for k in PROBES[:1] if self.recurrent(cls) else PROBES:
            self.admit({cls: k})

    def mark(self, cls: str, which: int = -1) -> None:
        """Write the first and the last row of a page (its two byte edges): a neighbour that overlaps it shows."""
        if not self.placed[cls]:
            return
        _owner, h = self.placed[cls][which]
        last = (self.geo.entries[cls] - 1, self.geo.rows[cls] - 1)
        for entry, row in dict.fromkeys(((0, 0), last)):
            self.c.serial += 1
            self.c.run("write", page=h, entry=entry, row=row, tag=self.c.serial)

    def free_page(self, cls: str, which: int) -> bool:
        """Free the owner of a placed page (its other pages go too)."""
        if not self.placed[cls] or not -len(self.placed[cls]) <= which < len(self.placed[cls]):
            return False
        owner = self.placed[cls][which][0]
        if not self.c.run("free", owner=owner).ok:
            return False
        for k in self.placed:
            self.placed[k] = [(o, h) for o, h in self.placed[k] if o != owner]
        return True

    def churn(self, cls: str) -> None:
        """Free the frontier page and regrow it; write, free and reuse an inner page (a hole handed out again)."""
        if self.free_page(cls, -1):
            self.admit({cls: 1})
        if len(self.placed[cls]) > 2:
            self.mark(cls, 1)
            if self.free_page(cls, 1):
                self.admit({cls: 1})

    def room(self, cls: str) -> int:
        """Pages of ``cls`` the reference still places one a step (on a scratch copy of its arena)."""
        arena = copy.deepcopy(self.c.oracle.arena)
        n = 0
        while n <= self.geo.top[cls]:
            try:
                arena.admit(f"room{n}", {cls: 1})
            except ArenaError:
                break
            n += 1
        return n


def _offsets(geo: Geometry, first: str) -> list[int | None]:
    """Pages ``first`` grows to before the other end: near half the arena, at every offset of its frontier within
    the largest other page (None: until refused)."""
    pa = geo.page_bytes[first]
    pb = max(p for c, p in geo.page_bytes.items() if c != first)
    base = (geo.capacity // 2) // pb * pb // pa
    return [base + r for r in range(max(1, pb // pa))] + [None]


def ends_meet(first: str, k: int | None) -> Callable[[Drill], None]:
    def run(d: Drill) -> None:
        a = d.low if first == "low" else d.high
        b = d.high if a == d.low else d.low
        d.grow(a, k)
        d.mark(a, 0)  # the anchor page: byte 0, or the page before capacity
        d.mark(a)
        d.grow(b)
        d.mark(b, 0)
        d.mark(b)
        d.grow(a)
        d.mark(a)
        d.churn(a)
        d.churn(b)
    return run


def last_page(cls: str) -> Callable[[Drill], None]:
    def run(d: Drill) -> None:
        other = d.low if cls != d.low else d.high
        d.grow(other, max(1, d.geo.top[other] // 3))
        n = d.room(cls)
        d.admit({cls: n + 1})
        d.admit({**{k: 1 for k in d.c.order}, cls: n + 1})  # every class grows, the last one fails: all given back
        if n and d.admit({cls: n}):
            d.mark(cls)
            d.free_page(cls, -1)
        if n > 1 and d.admit({cls: n - 1}):
            owner = d.placed[cls][-1][0]
            for more in (1, 1, 2):
                exp = d.c.run("extend", owner=owner, demand={cls: more})
                if exp.ok:
                    d.placed[cls].extend((owner, h) for h in (exp.pages or {}).get(cls, ()))
            d.mark(cls)
    return run


def float_edges(cls: str) -> Callable[[Drill], None]:
    def run(d: Drill) -> None:
        d.grow(cls)
        d.mark(cls, 0)
        d.mark(cls, -1)
        for end in (d.low, d.high):
            d.grow(end)
            d.mark(end)
        for which in (0, -1):
            if d.free_page(cls, which):
                d.grow(d.low)
                d.grow(d.high)
    return run


def around_floor(floor: ArenaConfig) -> Callable[[Drill], None]:
    """Build (or refuse) one byte under the floor, at it and one over, beside the scenario's own arena: run on a
    roomy arena, so an implementation that refuses the floor itself (allowed at safety) is still asked."""
    def run(d: Drill) -> None:
        base = config_to_json(floor)
        for delta in (-1, 0, 1):
            d.c.run("construct", config={**base, "capacity": floor.capacity + delta})
    return run


def worst_case(d: Drill) -> None:
    """One worst-case request on an empty arena at the floor, then each end to its edge."""
    if d.admit(worst_case_demand(d.c.oracle.arena.config)):
        d.mark(d.high)
    d.grow(d.low)
    d.grow(d.high)


@dataclass(frozen=True)
class Scenario:
    family: str
    name: str
    config: ArenaConfig
    drive: Callable[[Drill], None]


def scenarios() -> Iterator[Scenario]:
    """Every boundary scenario, in a fixed order."""
    for label, config, floor in configs():
        geo = Geometry.of(config)
        if config is floor:
            yield Scenario("floor", f"{label}: one worst-case request", config, worst_case)
        else:
            yield Scenario("floor", f"{label}: construct at {floor.capacity} B and one byte either side", config,
                           around_floor(floor))
        for first, end in (("low", geo.low), ("high", geo.high)):
            for k in _offsets(geo, end):
                yield Scenario("ends-meet", f"{label}: {first} end to {k if k is not None else 'full'} pages first",
                               config, ends_meet(first, k))
        for cls in geo.order:
            if geo.kind[cls] is not Kind.RECURRENT:
                yield Scenario("last-page", f"{label}: {cls}", config, last_page(cls))
        for cls in geo.floats():
            yield Scenario("float-edges", f"{label}: {cls}", config, float_edges(cls))


# ---------------------------------------------------------------------------------------------
# Running them


@dataclass
class BoundaryResult:
    ran: Counter = field(default_factory=Counter)  # family -> scenarios run to the end
    skipped: int = 0  # configurations the implementation refuses (allowed at safety)
    failed: str | None = None  # the first divergence's report
    inv: str | None = None
    scenario: str | None = None
    coverage: Coverage = field(default_factory=Coverage)
    seconds: float = 0.0


def run_boundary(factory: Callable[[ArenaConfig], Any], level: str, deep: bool = True,
                 progress: Callable[[str], None] | None = None, trace_lines: int | None = None,
                 every_s: float = 5.0) -> BoundaryResult:
    """Every scenario against ``factory``'s allocator at ``level``; stops at the first divergence."""
    t0 = last = time.perf_counter()
    res = BoundaryResult()
    extra = {} if trace_lines is None else {"trace_lines": trace_lines}
    for sc in scenarios():
        where = f"boundary scenario {sc.family} ({sc.name})"
        side: Side | None = None
        try:
            ref, imp = construct_pair(factory, sc.config, level)
            if ref is None or imp is None:  # both refuse (not generated), or only the implementation (safety)
                res.skipped += 1
                continue
            geo = Geometry.of(sc.config)
            side = Side(imp, geo)
            c = Conductor(geo, LiveReference(sc.config, arena=ref), side, level=level, deep=deep, factory=factory,
                          config_json=config_to_json(sc.config), where=lambda w=where: w, cov=res.coverage, **extra)
            sc.drive(Drill(c))
            res.ran[sc.family] += 1
        except StopReplay:
            res.skipped += 1
        except Divergence as e:
            res.failed = str(e) if str(e).startswith(where) else f"{where}: {e}"
            res.inv, res.scenario = e.inv, f"{sc.family} ({sc.name})"
            break
        finally:
            if side is not None:
                side.close()
        now = time.perf_counter()
        if progress is not None and now - last >= every_s:
            last = now
            progress(f"boundary: {sum(res.ran.values())} scenarios ({now - t0:.0f} s)")
    res.coverage.boundary.update(res.ran)
    res.seconds = time.perf_counter() - t0
    if progress is not None:
        progress(f"boundary: {sum(res.ran.values())} scenarios {'failed' if res.failed else 'passed'}, "
                 f"{res.skipped} skipped ({res.seconds:.0f} s)")
    return res


__all__ = ["FAMILIES", "BoundaryResult", "Drill", "Scenario", "configs", "feasibility_floor", "run_boundary",
           "scenarios"]
