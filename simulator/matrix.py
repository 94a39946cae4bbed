"""Every allocator under every rule set: what the allocator buys, separated from what the scheduler's rules cost.

``kvarena simulate --workload all`` sets columns side by side that differ in two things at once: the
allocator, and the rules it runs under (vLLM's manager frees window blocks at every allocation and holds its
own state blocks). The matrix holds one fixed at a time. Rows are allocators (:data:`ALLOCATORS`: kvarena's
arena, SGLang 0.5.23's unified and split allocators, vLLM 0.33.0's ``KVCacheManager``, transformers 5.23.0's
sector pool), columns are rule sets (``rules.RULE_SETS``: SGLang's with the mamba strategy ``extra_buffer`` or
``no_buffer``, vLLM's own scheduler), and every cell gets the same bytes and requests.

A cell runs the rule set's :class:`SchedulerModel` with only what the allocator itself imposes changed
(:data:`INHERENT`, each with why), and the running cap the rule set derives (SGLang's from its pools, vLLM's
``max_num_seqs``). A model without recurrent state has no mamba strategy: its ``no_buffer`` column would
repeat ``extra_buffer`` and is not run.

:func:`decompose` then splits the gap between the best cell of a row set and the arena under SGLang's rules:
starting from SGLang's rules it switches one group of rules (``rules.RULE_GROUPS``) to vLLM's value at a time
(each alone, and cumulatively in a fixed order, which ends at the arena under vLLM's rules), so the rules' part
and the allocator's part of the gap are each a measured number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from kvarena.simulator import rules
from kvarena.simulator.costmodel import CostModel
from kvarena.simulator.engines import ENGINES
from kvarena.simulator.report import Outcome, outcome
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.simulation import Configuration, run_local, running_cap
from kvarena.simulator.workloads import Workload
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, preset

ACCOUNTING = "kvarena arena, vLLM's accounting"  # the arena with what vLLM's manager imposes: the allocator alone
# row label -> engines.ENGINES key
ALLOCATORS: dict[str, str] = {
    "kvarena arena": "unified",
    ACCOUNTING: "unified",
    "SGLang unified": "sglang-unified",
    "SGLang split": "sglang-split",
    "vLLM manager": "vllm-real",
    "transformers pool": "transformers",
}

# What an allocator imposes whatever the scheduler's rules. vLLM's manager: each ``allocate_slots`` starts with
# ``remove_skipped_blocks`` (window blocks go at the next allocation, not SGLang's interval later), and in mamba
# "align" mode (prefix caching on, vLLM's default) it holds the request's state blocks itself (one, plus one per
# block crossing until the next step), so it holds no scheduler-side tracking or tree checkpoint slots: it has
# no owner that is state alone. Keyed by row label: the arena's second row takes vLLM's, so that under one rule set
# it differs from vLLM's manager in the allocator only.
_VLLM_ACCOUNTING: dict[str, object] = {"swa_eviction_interval": None, "state_slots": 1, "radix_state_slots": 0,
                                       "chunk_checkpoints": False}
INHERENT: dict[str, dict[str, object]] = {"vLLM manager": _VLLM_ACCOUNTING, ACCOUNTING: _VLLM_ACCOUNTING}

# How each preset is judged: its published metric (the ratio preset: throughput at swa 0.1), else mean running.
LOWER_IS_BETTER = ("retractions_per_1k", "ttft_p50")


def metric_of(w: Workload) -> str:
    p = w.published
    if p is None:
        return "mean_active"
    return "throughput" if p.metric == "ratio_throughput" else p.metric


def value(o: Outcome, metric: str) -> float:
    return {"throughput": o.throughput_tok_s, "max_active": o.max_active, "mean_active": o.mean_active,
            "retractions_per_1k": o.retractions_per_1k, "ttft_p50": o.ttft_p50_s}[metric]


def better(a: float, b: float, metric: str) -> bool:
    """``a`` strictly better than ``b`` on ``metric``."""
    return a < b if metric in LOWER_IS_BETTER else a > b


TIE = 0.005  # within 0.5 % (of the larger) two cells tie: the runs' own noise (a page, a step) is about that


def verdict(a: float, b: float, metric: str) -> str:
    """How ``a`` compares with ``b``: "ties" within TIE, else "beats" / "loses to", with the difference in %."""
    big = max(abs(a), abs(b))
    if big == 0 or abs(a - b) <= TIE * big:
        return "ties"
    pct = f"{100 * (a - b) / abs(b):+.1f} %" if b else "from 0"
    return f"{'beats' if better(a, b, metric) else 'loses to'} ({pct})"


def has_state(model: str) -> bool:
    return any(c.kind is Kind.RECURRENT for c in preset(model).classes)


def rule_sets_for(model: str, names: Sequence[str] | None = None) -> list[str]:
    """The rule sets that differ on ``model``: without recurrent state no_buffer is extra_buffer."""
    out = list(names or rules.RULE_SETS)
    return out if has_state(model) else [n for n in out if n != "sglang-no_buffer"]


def cell_model(allocator: str, rule_set: SchedulerModel, cfg: ArenaConfig) -> SchedulerModel:
    """A cell's rules: the set's, with its running cap for this budget, then what the allocator imposes."""
    pooled = ALLOCATORS[allocator] not in ("split", "sglang-split")  # one pool: the token cap over every byte
    cap = rule_set.max_num_seqs or running_cap(cfg, rule_set.state_slots - 1, pooled)
    return replace(rule_set, max_running=cap, **INHERENT.get(allocator, {}))  # type: ignore[arg-type]


@dataclass(frozen=True)
class CellJob:
    """One cell's run: everything a worker process needs."""

    w: Workload
    allocator: str  # a label of ALLOCATORS
    rule_set: str  # a key of rules.RULE_SETS, or a decomposition step's name
    model: SchedulerModel  # the rule set (before the cap and INHERENT)
    capacity: int
    page_size: int
    seed: int = 0
    scale: float = 1.0

    @property
    def kind(self) -> str:
        return ALLOCATORS[self.allocator]


def base_model(w: Workload, m: SchedulerModel) -> SchedulerModel:
    """What every run of ``w`` shares (simulation.simulate's base): checks at the end, a livelock guard."""
    m = replace(m, check_every=0, stall_steps=max(50_000, 4 * w.max_context()))
    kinds = {c.kind for c in preset(w.model).classes}
    if Kind.RECURRENT not in kinds:  # the state rules mean nothing without state: one value for every set
        m = replace(m, state_slots=1, radix_state_slots=0, chunk_checkpoints=False)
    if Kind.WINDOW not in kinds:  # the window rules, without a window
        m = replace(m, swa_eviction_interval=None, swa_admission=False)
    return m


def _configuration(job: CellJob) -> Configuration:
    # the ratio preset is about its second ratio (0.1); only the split pools read it
    return Configuration(job.allocator, job.kind, swa_ratio=job.w.swa_ratios[-1])


def effective_model(job: CellJob) -> SchedulerModel:
    """The rules the cell's run uses: its set's, the workload's base, the cap for its bytes, INHERENT."""
    probe = _configuration(job).config(job.w.model, job.capacity, job.page_size, job.w.max_context())
    return cell_model(job.allocator, base_model(job.w, job.model), probe)


def run_cell(job: CellJob) -> Outcome:
    w, kind = job.w, job.kind
    c = _configuration(job)
    m = effective_model(job)
    alloc = c.build(w.model, job.capacity, job.page_size, w.max_context(), m.state_slots)
    r = run(alloc, w.source(job.scale, job.seed), f"{job.allocator} / {job.rule_set}", m, seed=job.seed,
            cost=CostModel(preset(w.model)))
    return outcome(c, r, {}, ENGINES[kind].implementation, m.max_running)


def run_jobs(jobs: list[CellJob], workers: int, done: Callable[[CellJob, Outcome], None] | None = None
             ) -> list[Outcome]:
    """The jobs in ``workers`` local processes (simulation.run_local; 1: here), results in ``jobs``' order."""
    if workers > 1 and len(jobs) > 1:
        return run_local(jobs, workers, run_cell, lambda j: j.kind, done)
    out = []
    for j in jobs:
        out.append(run_cell(j))
        if done:
            done(j, out[-1])
    return out


@dataclass
class Matrix:
    workload: Workload
    capacity: int
    budget: str
    page_size: int
    metric: str
    rule_sets: list[str]
    allocators: list[str]
    cells: dict[tuple[str, str], Outcome]  # (allocator, rule set) -> outcome
    skipped: dict[str, str] = field(default_factory=dict)  # allocator -> how to add it

    def get(self, allocator: str, rule_set: str) -> float | None:
        o = self.cells.get((allocator, rule_set))
        return None if o is None else value(o, self.metric)

    def best(self) -> tuple[str, str]:
        """The cell with the best metric (ties: the arena, then the first in row and column order)."""
        first = ("kvarena arena", "sglang")
        keys = ([first] if first in self.cells else []) + [k for k in self.cells if k != first]
        best = keys[0]
        for k in keys[1:]:
            if better(value(self.cells[k], self.metric), value(self.cells[best], self.metric), self.metric):
                best = k
        return best

    def arena_vs(self, rule_set: str, allocator: str) -> tuple[float, float] | None:
        a, b = self.get("kvarena arena", rule_set), self.get(allocator, rule_set)
        return None if a is None or b is None else (a, b)


def allocators_available(wanted: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    run_, skipped = [], {}
    for label, kind in ALLOCATORS.items():
        if wanted is not None and label not in wanted and kind not in wanted:
            continue
        why = ENGINES[kind].missing()
        if why is None:
            run_.append(label)
        else:
            skipped[label] = why
    return run_, skipped


def matrix(w: Workload, capacity: int, budget: str, page_size: int = 64, seed: int = 0, scale: float = 1.0,
           workers: int = 1, allocators: Sequence[str] | None = None, rule_set_names: Sequence[str] | None = None,
           done: Callable[[CellJob, Outcome], None] | None = None) -> Matrix:
    """Every available allocator under every rule set that differs on ``w``'s model."""
    labels, skipped = allocators_available(allocators)
    sets = rule_sets_for(w.model, rule_set_names)
    jobs = [CellJob(w, a, s, rules.RULE_SETS[s], capacity, page_size, seed, scale) for a in labels for s in sets]
    # a run is deterministic in (allocator kind, rules): a cell whose rules another cell already has is that run
    # (the arena with vLLM's accounting under vLLM's own rules is the arena's cell)
    first: dict[tuple[str, SchedulerModel], int] = {}
    for i, j in enumerate(jobs):
        first.setdefault((j.kind, effective_model(j)), i)
    unique = sorted(set(first.values()))
    got = dict(zip(unique, run_jobs([jobs[i] for i in unique], workers, done), strict=True))
    cells = {}
    for j in jobs:
        o = got[first[(j.kind, effective_model(j))]]
        cells[(j.allocator, j.rule_set)] = o if o.config == j.allocator else replace(o, config=j.allocator)
    return Matrix(w, capacity, budget, page_size, metric_of(w), sets, labels, cells, skipped)


# ---- the decomposition ---------------------------------------------------------------------------------------


def switched(groups: Sequence[str]) -> SchedulerModel:
    """SGLang's rules with ``groups`` (names of rules.RULE_GROUPS) at vLLM's values."""
    vllm = rules.RULE_SETS["vllm"]
    change = {f: getattr(vllm, f) for g in groups for f in rules.RULE_GROUPS[g]}
    return replace(rules.RULE_SETS["sglang"], **change)


def groups_for(model: str) -> list[str]:
    """The rule groups that can matter on ``model``: the state slots need recurrent state, window eviction a
    window class."""
    kinds = {c.kind for c in preset(model).classes}
    needs = {"state slots": Kind.RECURRENT, "window eviction": Kind.WINDOW}
    return [g for g in rules.RULE_GROUPS if g not in needs or needs[g] in kinds]


@dataclass
class Decomposition:
    metric: str
    start: float  # the arena under SGLang's rules
    end: float  # the arena under vLLM's rules (the last cumulative step)
    alone: dict[str, float]  # group -> the arena's value with that group alone at vLLM's value
    path: list[tuple[str, float]]  # cumulative: group switched, value after it
    outcomes: dict[str, Outcome]  # step label -> outcome (alone: "<group>", cumulative: "+<group>")

    def as_json(self) -> dict:
        return {"metric": self.metric, "arena_sglang": self.start, "arena_vllm_rules": self.end,
                "alone": self.alone, "cumulative": [{"group": g, "value": v} for g, v in self.path],
                "steps": {k: cell_json(o) for k, o in self.outcomes.items()}}


def decompose(w: Workload, capacity: int, page_size: int = 64, seed: int = 0, scale: float = 1.0,
              workers: int = 1, start: Outcome | None = None,
              done: Callable[[CellJob, Outcome], None] | None = None) -> Decomposition:
    """The arena's metric from SGLang's rules to vLLM's, one rule group at a time (alone and cumulatively in
    rules.RULE_GROUPS' order). ``start``: the arena's SGLang cell if already run."""
    metric, groups = metric_of(w), groups_for(w.model)
    jobs = [CellJob(w, "kvarena arena", g, switched([g]), capacity, page_size, seed, scale)
            for g in groups]
    # the last cumulative step is every group: the arena under vLLM's rules (the matrix has that cell too)
    jobs += [CellJob(w, "kvarena arena", "+" + g, switched(groups[:i + 1]), capacity, page_size, seed,
                     scale) for i, g in enumerate(groups) if i > 0]
    if start is None:
        jobs.append(CellJob(w, "kvarena arena", "sglang", rules.RULE_SETS["sglang"], capacity, page_size, seed,
                            scale))
    outs = dict(zip([j.rule_set for j in jobs], run_jobs(jobs, workers, done), strict=True))
    s = start if start is not None else outs["sglang"]
    alone = {g: value(outs[g], metric) for g in groups}
    path = [(g, value(outs[g if i == 0 else "+" + g], metric)) for i, g in enumerate(groups)]
    return Decomposition(metric, value(s, metric), path[-1][1] if path else value(s, metric), alone, path, outs)


def cell_json(o: Outcome) -> dict:
    keep = ("implementation", "completed", "max_active", "max_running_cap", "mean_active", "retractions",
            "retractions_per_1k", "bytes_moved_compaction", "bytes_moved_relayout", "throughput_tok_s",
            "peak_utilization", "wall_s")
    d = asdict(o)
    return {**{k: d[k] for k in keep}, "ttft_p50_s": o.ttft_p50_s}


# ---- text -----------------------------------------------------------------------------------------------------

METRIC_TEXT = {"mean_active": "mean running requests", "max_active": "most running requests",
               "retractions_per_1k": "retractions per 1,000", "ttft_p50": "TTFT p50 (s)",
               "throughput": "output throughput (tok/s)"}
SET_TEXT = {"sglang": "SGLang (extra_buffer)", "sglang-no_buffer": "SGLang (no_buffer)", "vllm": "vLLM 0.33"}


def fmt(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if metric in ("throughput", "max_active") else f"{v:,.2f}" if metric in (
        "ttft_p50", "mean_active") else f"{v:,.1f}"


def gib_moved(o: Outcome) -> float:
    return (o.bytes_moved_compaction + o.bytes_moved_relayout) / (1 << 30)


def format_matrix(m: Matrix) -> list[str]:
    """The matrix as text: the metric per cell, then the arena against each allocator under the same rules."""
    better_word = "lower" if m.metric in LOWER_IS_BETTER else "higher"
    out = [f"   matrix: {METRIC_TEXT[m.metric]} ({better_word} is better), rows allocators, columns rule sets"]
    w0 = max(len(a) for a in m.allocators) + 2
    head = "".join(f"{SET_TEXT.get(s, s):>24}" for s in m.rule_sets)
    out.append(f"   {'':<{w0}}{head}")
    best = m.best()
    for a in m.allocators:
        cells = ""
        for s in m.rule_sets:
            o = m.cells.get((a, s))
            txt = fmt(m.get(a, s), m.metric)
            if o is not None:
                txt += f" ({o.retractions_per_1k:,.0f} r, {gib_moved(o):.1f} G)" if m.metric != "retractions_per_1k" \
                    else f" ({o.mean_active:,.1f} run, {gib_moved(o):.1f} G)"
            cells += f"{txt + ('*' if (a, s) == best else ''):>24}"
        out.append(f"   {a:<{w0}}{cells}")
    extra = "mean running" if m.metric == "retractions_per_1k" else "retractions per 1,000"
    out.append(f"   (in brackets: {extra}, GiB moved by compaction and relayout; * the best cell)")
    for a, why in m.skipped.items():
        out.append(f"   {a}: skipped: {why}")
    for s in m.rule_sets:
        row = []
        for a in m.allocators:
            if a == "kvarena arena":
                continue
            pair = m.arena_vs(s, a)
            if pair is None:
                continue
            x, y = pair
            row.append(f"{a}: {verdict(x, y, m.metric)} ({fmt(x, m.metric)} vs {fmt(y, m.metric)})")
        if row:
            out.append(f"   under {SET_TEXT.get(s, s)}, the arena against " + "; ".join(row))
        x, y = m.get(ACCOUNTING, s), m.get("vLLM manager", s)
        if x is not None and y is not None:
            out.append(f"     the allocator alone (the arena with vLLM's accounting against vLLM's manager): "
                       f"{verdict(x, y, m.metric)} ({fmt(x, m.metric)} vs {fmt(y, m.metric)})")
    return out


def format_decomposition(m: Matrix, d: Decomposition) -> list[str]:
    ba, bs = m.best()
    best = m.get(ba, bs)
    arena_same = m.get("kvarena arena", bs)
    out = [f"   gap: best cell {ba} / {SET_TEXT.get(bs, bs)} {fmt(best, d.metric)} vs the arena under SGLang's rules "
           f"{fmt(d.start, d.metric)}"]
    if arena_same is not None and best is not None:
        out.append(f"     rules (arena, SGLang's -> {SET_TEXT.get(bs, bs)}): {fmt(arena_same, d.metric)} "
                   f"({arena_same - d.start:+,.2f}); allocator ({ba} vs arena, same rules): "
                   f"{best - arena_same:+,.2f}")
    def side(key: str) -> str:  # the other axis: retractions (or, judged on retractions, mean running)
        o = d.outcomes.get(key)
        if o is None:
            return ""
        return f", {o.mean_active:,.1f} run" if d.metric == "retractions_per_1k" else f", {o.retractions_per_1k:,.0f} r"

    out.append("     one group alone at vLLM's value: " + "; ".join(
        f"{g} {fmt(v, d.metric)} ({v - d.start:+,.2f}{side(g)})" for g, v in d.alone.items()))
    prev, steps = d.start, []
    for i, (g, v) in enumerate(d.path):
        steps.append(f"+{g} {fmt(v, d.metric)} ({v - prev:+,.2f}{side(g if i == 0 else '+' + g)})")
        prev = v
    out.append("     cumulative: " + " -> ".join(steps) + " = the arena under vLLM's rules")
    return out


def matrix_json(m: Matrix, d: Decomposition | None = None) -> dict:
    ba, bs = m.best()
    return {"workload": m.workload.name, "model": m.workload.model, "capacity_bytes": m.capacity, "budget": m.budget,
            "page_size": m.page_size, "metric": m.metric, "rule_sets": m.rule_sets, "allocators": m.allocators,
            "skipped": m.skipped, "best": {"allocator": ba, "rule_set": bs, "value": m.get(ba, bs)},
            "cells": [{"allocator": a, "rule_set": s, "value": value(o, m.metric), **cell_json(o)}
                      for (a, s), o in m.cells.items()],
            "decomposition": d.as_json() if d is not None else None}
