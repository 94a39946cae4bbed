"""What a simulation reports: per-configuration outcomes, latency percentiles, the published comparison,
the table and the JSON. Plain data and text; the plots are ``plots.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvarena.simulator import rules
from kvarena.simulator.result import RunResult
from kvarena.simulator.workloads import Workload
from kvarena.text import gib, table

PARITY = 0.05  # "near parity": unified / split within 5 %
PERCENTILES = (50, 90, 99)


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 for no samples)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-len(s) * q // 100) - 1))]


@dataclass
class Outcome:
    """One configuration's run, reduced to the reported metrics (time: modeled seconds)."""

    config: str
    kind: str
    implementation: str
    swa_ratio: float
    mamba_ratio: float
    requests: int
    completed: int
    max_active: int
    max_running_cap: int | None
    mean_active: float
    retractions: int
    retractions_per_1k: float
    bytes_moved_compaction: int
    bytes_moved_relayout: int
    pages_moved: int
    throughput_tok_s: float
    latency: dict[str, float]  # ttft_p50_s, ..., tpot_p99_s, e2e_p99_s; and ttft_mean_s
    makespan_s: float
    peak_utilization: float
    steps: int
    decode_steps: int
    operations: int
    wall_s: float
    prefix_cache: str = ""  # "on", "off: why", "" (the workload shares no prefix)
    prefix: dict = field(default_factory=dict)  # lookups, hits, hit_rate, token_hit_rate, tokens_hit, evicted
    series: dict = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str) -> float:  # o.ttft_p99_s etc.
        lat = self.__dict__.get("latency", {})
        if name in lat:
            return lat[name]
        raise AttributeError(name)


@dataclass(frozen=True)
class SLO:
    """A latency objective: a request meets it when its TTFT and its TPOT are both within bounds."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, ttft: float, tpot: float) -> bool:
        return (self.ttft_s is None or ttft <= self.ttft_s) and (self.tpot_s is None or tpot <= self.tpot_s)


def latencies(r: RunResult, slo: SLO | None = None) -> dict[str, float]:
    out = {"ttft_mean_s": sum(r.ttft) / max(1, len(r.ttft))}
    for name, xs in (("ttft", r.ttft), ("tpot", r.tpot), ("e2e", r.e2e)):
        for q in PERCENTILES:
            out[f"{name}_p{q}_s"] = percentile(xs, q)
    if slo is not None and (slo.ttft_s is not None or slo.tpot_s is not None):
        ok = sum(slo.met(t, p) for t, p in r.finished)
        out["slo_attained"] = ok / max(1, len(r.finished))  # share of completed requests within the SLO
        out["goodput_req_s"] = ok / r.clock if r.clock else 0.0  # requests within the SLO per modeled second
    return out


def outcome(c, r: RunResult, series: dict, implementation: str, cap: int | None, slo: SLO | None = None
            ) -> Outcome:
    return Outcome(
        c.label, c.kind, implementation, c.swa_ratio, c.mamba_ratio, r.requests, r.completed, r.max_active, cap,
        r.mean_active, r.retractions, 1000 * r.retractions / max(1, r.completed), r.bytes_moved.get(2, 0),
        r.bytes_moved.get(3, 0), sum(r.moves.values()), r.output_tokens / r.clock if r.clock else 0.0,
        latencies(r, slo), r.clock, r.peak_utilization, r.steps, r.decode_steps, r.operations, r.wall_s,
        r.prefix_cache, _prefix(r.prefix), series)


def _prefix(p: dict[str, int]) -> dict:
    if not p:
        return {}
    return {**p, "hit_rate": p["hits"] / max(1, p["lookups"]),
            "token_hit_rate": p["tokens_hit"] / max(1, p["tokens_asked"])}


@dataclass
class Report:
    workload: Workload
    capacity: int
    budget: str
    context: int
    page_size: int
    outcomes: list[Outcome]
    regions: dict[str, tuple[int, int]]
    vllm: dict[str, object]
    sweep_labels: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)  # real engines not installed: how to add each

    def sweep(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.config in self.sweep_labels]

    def main(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.config not in self.sweep_labels]


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}" if s < 1 else f"{s * 1e3:,.0f}"


ROWS: list[tuple[str, Callable[[Outcome], str]]] = [
    ("requests completed", lambda o: f"{o.completed:,} / {o.requests:,}"),
    ("max active requests", lambda o: f"{o.max_active:,}"),
    ("running cap (SGLang)", lambda o: "-" if o.max_running_cap is None else f"{o.max_running_cap:,}"),
    ("mean active (time-weighted)", lambda o: f"{o.mean_active:,.1f}"),
    ("retractions", lambda o: f"{o.retractions:,}"),
    ("retractions per 1,000", lambda o: f"{o.retractions_per_1k:,.1f}"),
    ("moved: compaction", lambda o: gib(o.bytes_moved_compaction)),
    ("moved: relayout", lambda o: gib(o.bytes_moved_relayout)),
    ("prefix cache: hits / tokens hit", lambda o: (o.prefix_cache or "-") if not o.prefix else
     f"{100 * o.prefix['hit_rate']:.1f} % / {100 * o.prefix['token_hit_rate']:.1f} %, {o.prefix['evicted']:,} evicted"),
    ("modeled throughput (tok/s)", lambda o: f"{o.throughput_tok_s:,.0f}"),
    ("TTFT p50 / p90 / p99 (s)", lambda o: f"{o.ttft_p50_s:,.2f} / {o.ttft_p90_s:,.2f} / {o.ttft_p99_s:,.2f}"),
    ("TPOT p50 / p99 (ms)", lambda o: f"{_ms(o.tpot_p50_s)} / {_ms(o.tpot_p99_s)}"),
    ("end-to-end p50 / p99 (s)", lambda o: f"{o.e2e_p50_s:,.1f} / {o.e2e_p99_s:,.1f}"),
    ("SLO met / goodput (req/s)", lambda o: "-" if "slo_attained" not in o.latency else
     f"{100 * o.slo_attained:.1f} % / {o.goodput_req_s:,.1f}"),
    ("time to drain (s)", lambda o: f"{o.makespan_s:,.1f}"),
    ("peak utilization", lambda o: f"{100 * o.peak_utilization:.1f} %"),
    ("scheduler steps (decode)", lambda o: f"{o.steps:,} ({o.decode_steps:,})"),
    ("wall time", lambda o: f"{o.wall_s:.1f} s"),
]


def format_table(outcomes: list[Outcome], width: int | None = None) -> str:
    """Metrics as rows, configurations as columns; wraps to the terminal (kvarena.text.table)."""
    return table(["", *(o.config for o in outcomes)], [[name, *(fn(o) for o in outcomes)] for name, fn in ROWS],
                 width=width)


def comparison(rep: Report) -> dict | None:
    """Our value of the published metric for the unified arena and the split pools (default policy,
    first ratio), the ratio beside the published one, and whether the direction agrees."""
    p = rep.workload.published
    if p is None:
        return None
    splits = [o for o in rep.main() if o.kind == "split"]
    unis = [o for o in rep.main() if o.kind == "unified" and "[" not in o.config]
    if p.metric == "ratio_throughput":
        ours_split = splits[1].throughput_tok_s / splits[0].throughput_tok_s
        ours_uni = unis[1].throughput_tok_s / unis[0].throughput_tok_s
        by = {}
        for kind in dict.fromkeys(o.kind for o in rep.main()):
            pair = [o for o in rep.main() if o.kind == kind and "[" not in o.config]
            if len(pair) == 2:
                by[pair[0].config.split(" (")[0]] = pair[1].throughput_tok_s / pair[0].throughput_tok_s
        return {"metric": p.metric, "published": p.text, "split": ours_split, "unified": ours_uni,
                "by_configuration": by,
                "ratio": ours_split, "published_ratio": p.split, "agrees": (ours_split < 1) == (p.split < 1),
                "within_25pct": abs(ours_split / p.split - 1) <= 0.25}
    get: Callable[[Outcome], float] = {
        "throughput": lambda o: o.throughput_tok_s, "max_active": lambda o: o.max_active,
        "mean_active": lambda o: o.mean_active, "retractions_per_1k": lambda o: o.retractions_per_1k,
        "ttft_p50": lambda o: o.ttft_p50_s}[p.metric]
    u, s = get(unis[0]), get(splits[0])
    every = {o.config: get(o) for o in rep.main()}  # the real engines' values beside kvarena's
    ratio = u / s if s else (float("inf") if u else 1.0)
    published_ratio = p.unified / p.split if p.unified and p.split else 1.0
    if p.unified is None or p.split is None:  # published parity
        agree = abs(ratio - 1) <= PARITY
    else:
        agree = u != s and (u > s) == (p.unified > p.split)
    return {"metric": p.metric, "published": p.text, "unified": u, "split": s, "ratio": ratio,
            "published_ratio": published_ratio, "agrees": agree,
            "within_25pct": abs(ratio / published_ratio - 1) <= 0.25 if ratio != float("inf") else False,
            "by_configuration": every}


def assumptions(page_size: int) -> list[str]:
    init, lo, decay = rules.new_token_ratio_schedule()
    return [
        "KV budget: SGLang's _profile_available_bytes on one H200 (139 GiB usable x --mem-fraction - weights), "
        "or the preset's budget calibrated on the published split figure; the same bytes for every configuration",
        f"scheduler: SGLang 0.5.23's rules (kvarena/simulator/rules.py): chunked prefill "
        f"{rules.CHUNKED_PREFILL_SIZE_H200:,} tokens, prefill and decode in separate steps (enable_mixed_chunk off), "
        f"reserve = running requests' remaining output (<= {rules.CLIP_MAX_NEW_TOKENS:,} each) at new_token_ratio "
        f"{init:g} -> {lo:g} (-{decay:.6f} per decode step), 1.0 for ignore_eos, plus the new request's own output "
        "in full; retract fewest-decoded first (ties: the last to join the batch) until the step fits, keeping "
        "one, the victim re-queued at the back; ratio after a retraction = "
        f"estimate_new_token_ratio_after_retract; window KV freed {rules.SWA_EVICTION_INTERVAL} tokens past the "
        "window; Qwen3.5 holds 1 + 2 state slots per request (extra_buffer) and the radix tree 1 more per "
        "prefill chunk (the newest locked; the earlier ones unlocked, reclaimed only by state allocations), "
        "running capped at max_mamba_cache_size // 5",
        f"pages of {page_size} tokens (SGLang picks 1 on Hopper, rules.page_size_on_hopper: one page per "
        "request per class of rounding, not simulated token by token for speed); prefix cache: SGLang's radix "
        "cache modeled for workloads that share prefixes (kvarena/simulator/prefix.py), evictable entries free",
        "split pools: SGLang's ratio flags (--swa-full-tokens-ratio 0.8, --mamba-full-memory-ratio 0.9); "
        "unified arena: the reference Arena, given each new window page's placement limit by the scheduler "
        "(ceiling.py); vLLM-style: one page size, state padded to one page, no moves, "
        "window pages freed at once, one state slot (moved to a fresh block per crossing: vLLM's align mode), "
        "decides as vLLM 0.33.0's manager (docs/vllm-findings.md §8); real engines (when installed): SGLang "
        "0.5.23's split and unified allocators, vLLM 0.33.0's KVCacheManager, each column's 'implementation' naming it",
        "throughput and latencies are MODELED by the roofline in kvarena/simulator/costmodel.py, not measured; "
        "its one fitted constant, HBM_EFFICIENCY (the HBM bandwidth share of decode), was fitted on "
        "gpt-oss-20b-c1000's published split TTFT",
    ]


def report_json(rep: Report) -> dict:
    w = rep.workload
    out = {"workload": w.name, "description": w.describe(), "model": w.model, "capacity_bytes": rep.capacity,
           "budget": rep.budget, "context_tokens": rep.context, "page_size": rep.page_size,
           "ignore_eos": w.eos(),
           "split_regions_bytes": {c: hi - lo for c, (lo, hi) in rep.regions.items()}, "vllm": rep.vllm,
           "results": {}, "published": comparison(rep)}
    for o in rep.outcomes:
        d = {k: v for k, v in asdict(o).items() if k not in ("series", "latency")}
        d.update(o.latency)
        out["results"][o.config] = d
    return out
