"""One workload through every configuration: the same bytes, requests and scheduler rules for each.

A configuration is an engine kind (``engines.py``) at a ratio-flag setting and, for the unified arena,
an admission policy. :func:`simulate` runs them all and returns a :class:`~kvarena.simulator.report.Report`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvarena.simulator import rules
from kvarena.simulator.costmodel import CostModel
from kvarena.simulator.engines import ENGINES, Engine
from kvarena.simulator.report import SLO, Outcome, Report, outcome
from kvarena.simulator.scheduler import SchedulerModel, run
from kvarena.simulator.series import Series
from kvarena.simulator.vllm_model import VllmPool
from kvarena.simulator.workloads import Workload
from kvarena.spec.layout import Kind
from kvarena.spec.models import DEFAULT_MAMBA_FULL_MEMORY_RATIO, DEFAULT_SWA_FULL_TOKENS_RATIO, ArenaConfig, preset
from kvarena.spec.pools import split_regions

DEFAULT_POLICIES = ("default",)  # `--policies all` runs every shipped policy as its own column
# --ratio-sweep: split pools at these ratios besides the default (the flag the model's kind uses)
SWEEP_SWA = (0.1, 0.2, 0.4, 0.6, 1.0)
SWEEP_MAMBA = (0.1, 0.3, 0.5, 1.5, 3.0)


@dataclass(frozen=True)
class Configuration:
    label: str
    kind: str  # a key of engines.ENGINES
    policy: str = "default"
    swa_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    sweep: bool = False  # part of --ratio-sweep (reported in the sweep table)

    def config(self, model: str, capacity: int, page_size: int, context: int, slots: int = 1) -> ArenaConfig:
        """``slots``: recurrent slots a running request holds (ArenaConfig.recurrent_slots; 3 in extra_buffer)."""
        return ArenaConfig(preset(model), capacity, page_size, self.swa_ratio, self.mamba_ratio, context,
                           recurrent_slots=slots)

    def build(self, model: str, capacity: int, page_size: int, context: int, slots: int = 1) -> Engine:
        return ENGINES[self.kind].build(self.config(model, capacity, page_size, context, slots), self.policy)


def real_engines(wanted: tuple[str, ...] | None = None) -> tuple[list[str], list[str]]:
    """The real engines (``EngineKind.real``) to run: those of ``wanted`` (None: every one) whose extra is
    installed, and one line per missing one saying how to add it."""
    run, skipped = [], []
    for name, k in ENGINES.items():
        if not k.real or not k.column or (wanted is not None and name not in wanted):
            continue
        why = k.missing()
        if why is None:
            run.append(name)
        else:
            skipped.append(f"{k.implementation} column skipped: {why}")
    return run, skipped


REAL_LABELS = {"sglang-split": "SGLang split pools", "sglang-unified": "SGLang unified", "vllm-real": "vLLM v1"}


def configurations(w: Workload, sweep: bool = False, policies: tuple[str, ...] = DEFAULT_POLICIES,
                   real: tuple[str, ...] = ()) -> list[Configuration]:
    """Split pools and the unified arena (each policy) at each of the workload's ratios, then vLLM; the
    ``real`` engines (names of ``ENGINES``) beside the kvarena configuration they stand for."""
    out: list[Configuration] = []
    many = len(w.swa_ratios) > 1
    for r in w.swa_ratios:
        tag = f" (swa {r:g})" if many else ""
        out.append(Configuration(f"split pools{tag}", "split", swa_ratio=r))
        for name in policies:
            pol = "" if name == "default" else f" [{name}]"
            out.append(Configuration(f"unified arena{pol}{tag}", "unified", name, swa_ratio=r))
        out += [Configuration(f"{REAL_LABELS[k]}{tag}", k, swa_ratio=r) for k in real if k.startswith("sglang")]
    out.append(Configuration("vLLM-style pool", "vllm"))
    out += [Configuration(REAL_LABELS[k], k) for k in real if not k.startswith("sglang")]
    if sweep:
        kinds = {c.kind for c in preset(w.model).classes}
        if Kind.WINDOW in kinds:
            out += [Configuration(f"split swa {r:g}", "split", swa_ratio=r, sweep=True)
                    for r in SWEEP_SWA if r not in w.swa_ratios]
        if Kind.RECURRENT in kinds:
            out += [Configuration(f"split mamba {r:g}", "split", mamba_ratio=r, sweep=True) for r in SWEEP_MAMBA]
    return out


def running_cap(cfg: ArenaConfig, tracking_slots: int, unified: bool = False) -> int:
    """SGLang's running-request cap for this budget (rules.max_running_requests, rules.mamba_max_running).

    The token capacity is the full pool's (split pools: the region the ratio flags give it; unified:
    every byte, as ``UnifiedKVPool`` sizes each sub-pool's slots over the whole buffer); the state
    slots (``max_mamba_cache_size``) come from --mamba-full-memory-ratio in both modes
    (``_handle_max_mamba_cache`` runs before either pool is built)."""
    regions = split_regions(cfg)
    full = next(c.name for c in cfg.model.classes if c.kind is Kind.FULL)
    lo, hi = (0, cfg.capacity) if unified else regions[full]
    tokens = (hi - lo) // cfg.page_bytes(full) * cfg.page_size
    cap = rules.max_running_requests(tokens, cfg.model.max_context_len)
    for c in cfg.model.classes:
        if c.kind is Kind.RECURRENT:
            lo, hi = regions[c.name]
            cap = min(cap, rules.mamba_max_running((hi - lo) // cfg.page_bytes(c.name), tracking_slots))
    return max(1, cap)


def engine_model(base: SchedulerModel, c: Configuration, cfg: ArenaConfig) -> SchedulerModel:
    """The scheduler rules for one configuration: SGLang's, with the engine's own overrides."""
    cap = base.max_num_seqs or running_cap(cfg, base.state_slots - 1, ENGINES[c.kind].unified)
    model = replace(base, max_running=cap)
    return replace(model, **ENGINES[c.kind].scheduler_overrides)


@dataclass(frozen=True)
class _Job:
    """One configuration's run: everything a worker process needs."""

    w: Workload
    c: Configuration
    capacity: int
    page_size: int
    context: int
    seed: int
    scale: float
    plots: bool
    base: SchedulerModel
    slo: SLO | None = None


def build_configuration(c: Configuration, model: str, capacity: int, page_size: int, context: int,
                        base: SchedulerModel) -> tuple[object, SchedulerModel]:
    """A column's allocator, built with the state slots its requests hold, and its scheduler model."""
    slots = int(ENGINES[c.kind].scheduler_overrides.get("state_slots", base.state_slots))  # type: ignore[call-overload]
    alloc = c.build(model, capacity, page_size, context, slots)
    return alloc, engine_model(base, c, alloc.config)


def run_configuration(job: _Job, progress: Callable[[str, int, int, int, int], None] | None = None
                      ) -> tuple[Outcome, dict[str, object]]:
    """Run one configuration; returns its outcome and, for the vLLM model, its page geometry."""
    w, c = job.w, job.c
    alloc, m = build_configuration(c, w.model, job.capacity, job.page_size, job.context, job.base)
    info: dict[str, object] = {}
    if isinstance(alloc, VllmPool):
        g = alloc.geometry
        info = {"block_tokens": g.block_tokens, "page_bytes": g.page_bytes, "groups": g.groups,
                "padding_bytes": {n: alloc.padding_bytes(n) for n in alloc.order}}
    series = Series() if job.plots else None
    r = run(alloc, w.source(job.scale, job.seed), c.label, m, seed=job.seed, cost=CostModel(preset(w.model)),
            progress=progress, sampler=series, sample_every=1 if job.plots else 0)
    return outcome(c, r, series.data if series else {}, ENGINES[c.kind].implementation, m.max_running,
                   job.slo), info


# Relative CPU cost of one configuration by engine kind (measured: bench/results/simulate-*.md), to start the
# longest runs first when --jobs spreads them: SGLang's unified allocator is ~5x kvarena's split pools.
COST = {"sglang-unified": 6.0, "unified": 1.5, "transformers": 1.5, "split": 1.0, "sglang-split": 1.0,
        "vllm-real": 1.0, "vllm": 0.3}


def _one_torch_thread() -> None:
    """A --jobs worker process: torch's intra-op pool at one thread (N workers each with a pool as wide as the
    machine oversubscribe its cores; the engines' index ops are far too small to gain from threads)."""
    import os
    import sys

    os.environ["OMP_NUM_THREADS"] = "1"  # read by torch when this worker imports it
    if "torch" in sys.modules:  # inherited from the parent (fork)
        sys.modules["torch"].set_num_threads(1)


def run_local(work: list, jobs: int, fn: Callable | None = None,
              kind: Callable[[object], str] = lambda j: j.c.kind,
              done: Callable[[object, object], None] | None = None) -> list:
    """``fn`` (default run_configuration) over ``work`` in ``jobs`` local processes, longest first (by the engine
    kind ``kind`` names, COST), results in ``work``'s order; ``done(job, result)`` as each finishes."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    fn = fn or run_configuration
    order = sorted(range(len(work)), key=lambda i: -COST.get(kind(work[i]), 1.0))
    out: dict[int, object] = {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), initializer=_one_torch_thread) as pool:
        futures = {pool.submit(fn, work[i]): i for i in order}
        for f in as_completed(futures):
            i = futures[f]
            out[i] = f.result()
            if done is not None:
                done(work[i], out[i])
    return [out[i] for i in range(len(work))]


class RayUnavailable(ImportError):
    """--ray needs the ray extra (tested with 2.60.0): pip install 'kvarena[ray]'."""


def run_on_ray(work: list[_Job], address: str) -> list[tuple[Outcome, dict[str, object]]]:
    """Each configuration's run as one Ray task (``ray.remote``), results in order. ``address`` is Ray's own:
    ``auto`` (the cluster this machine is part of), ``ray://host:10001``, or ``local`` (start one here).
    Connects once per process (``ray.init`` is a no-op when already connected)."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs the ray extra (tested with 2.60.0): pip install 'kvarena[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(run_configuration)
    return ray.get([task.remote(j) for j in work])


def simulate(w: Workload, capacity: int, budget: str, page_size: int = 64, seed: int = 0, scale: float = 1.0,
             sweep: bool = False, plots: bool = False, check_every: int = 0,
             progress: Callable[[str, int, int, int, int], None] | None = None,
             policies: tuple[str, ...] = DEFAULT_POLICIES, model: SchedulerModel | None = None,
             jobs: int = 1, slo: SLO | None = None, real: tuple[str, ...] = (), skipped: tuple[str, ...] = (),
             ray_address: str | None = None) -> Report:
    """Every configuration of ``w`` at ``capacity`` bytes; ``jobs`` > 1 runs them in that many local
    processes, ``ray_address`` as Ray tasks on that cluster (each run is deterministic and independent,
    so the report is the same)."""
    context = w.max_context()
    base = replace(model or SchedulerModel(), check_every=check_every, stall_steps=max(50_000, 4 * context))
    if not any(c.kind is Kind.RECURRENT for c in preset(w.model).classes):
        base = replace(base, state_slots=1)
    work = [_Job(w, c, capacity, page_size, context, seed, scale, plots, base, slo)
            for c in configurations(w, sweep, policies, real)]
    if ray_address is not None:
        done = run_on_ray(work, ray_address)
    elif jobs > 1 and len(work) > 1:
        done = run_local(work, jobs)
    else:
        done = [run_configuration(j, progress) for j in work]
    outcomes = [o for o, _ in done]
    vllm_info = next((info for _, info in done if info), {})
    regions = split_regions(ArenaConfig(preset(w.model), capacity, page_size, max_context_len=context))
    sweep_labels = {c.label for c in configurations(w, True, policies) if c.sweep}
    return Report(w, capacity, budget, context, page_size, outcomes, regions, vllm_info, sweep_labels,
                  list(skipped))
