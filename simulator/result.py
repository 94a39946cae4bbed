"""What one run of the scheduler model measured (``scheduler.run``); ``report.py`` turns it into metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunResult:
    """What one run measured. Clock units are steps without a cost model, modeled seconds with one."""

    label: str
    requests: int = 0
    admitted: int = 0
    completed: int = 0
    max_active: int = 0
    mean_active: float = 0.0  # clock-weighted
    rejected_headroom: int = 0
    rejected_ladder: int = 0
    retractions: int = 0
    forward_waits: int = 0
    checkpoints_refused: int = 0  # radix state checkpoints that found no free slot (SGLang would assert)
    mean_wait_steps: float = 0.0  # from arrival to first admission, in steps
    steps: int = 0
    decode_steps: int = 0
    clock: float = 0.0  # the clock when the last request completed
    output_tokens: int = 0  # of completed requests, each counted once
    prefill_tokens: int = 0  # prompt tokens processed, redone prefills after retraction included
    ttft: list[float] = field(default_factory=list)  # arrival to the end of the first prefill, on the clock
    tpot: list[float] = field(default_factory=list)  # (e2e - ttft) / (output - 1), requests with output > 1
    e2e: list[float] = field(default_factory=list)  # arrival to the last token
    finished: list[tuple[float, float]] = field(default_factory=list)  # (ttft, tpot) per completed request
    moves: dict[int, int] = field(default_factory=dict)
    bytes_moved: dict[int, int] = field(default_factory=dict)
    rung_used: dict[int, int] = field(default_factory=dict)
    peak_utilization: float = 0.0
    prefix_cache: str = ""  # "on", "off: <why>", or "" when the workload shares no prefix
    prefix: dict[str, int] = field(default_factory=dict)  # lookups, hits, tokens_hit, tokens_asked, evicted
    invariant_checks: int = 0
    operations: int = 0
    wall_s: float = 0.0
