"""Workloads of ``kvarena simulate``: the published single-H200 presets, trace files, the KV budget.

A preset is a closed loop (``clients`` clients, each sending its next request when the last one
completes, as ``bench_serving --max-concurrency``) or a saturated open queue (every request arrives
at t = 0: "maximum concurrency"). Request lengths are fixed, as the published runs state them; the
request count is finite, a few rounds of the concurrency, enough for steady state.

A trace file is CSV (header naming the columns) or JSON lines (one object per line) with three
fields per request: arrival (seconds, >= 0), input length and output length (tokens, >= 1).
Accepted column names: ``arrival`` / ``arrival_s`` / ``timestamp`` / ``time``, ``input`` /
``input_tokens`` / ``input_len`` / ``prompt_tokens``, ``output`` / ``output_tokens`` / ``output_len``
/ ``completion_tokens``. A bad row is refused with the file and line named.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvarena.replay_trace import ACTIVATION_RESERVE_GIB, H200_USABLE_GIB, MEM_FRACTION, WEIGHTS_GB, GiB
from kvarena.scheduler import Arrival, ClosedLoop, TraceSource
from kvarena.spec.errors import ConfigError
from kvarena.spec.models import DEFAULT_SWA_FULL_TOKENS_RATIO, PRESETS, preset


class TraceError(ConfigError):
    """A trace file that cannot be read; the message names the file and line."""


# ---- the KV budget ---------------------------------------------------------------------------------


def kv_budget(model: str, mem_fraction: float = MEM_FRACTION) -> tuple[int, str]:
    """Bytes of KV memory on one H200 for ``model``, and the arithmetic as one line.

    KV = 139 GiB usable x mem_fraction (SGLang --mem-fraction-static) - weights - activation reserve.
    """
    w = WEIGHTS_GB.get(model)
    if w is None:
        raise ConfigError(f"{model}: weights do not fit one H200 (or are not tabulated); pass --capacity-gib")
    if not 0 < mem_fraction <= 1:
        raise ConfigError(f"--mem-fraction {mem_fraction} must be in (0, 1]")
    gib = H200_USABLE_GIB * mem_fraction - w * 1e9 / GiB - ACTIVATION_RESERVE_GIB
    if gib <= 0:
        raise ConfigError(f"{model}: at --mem-fraction {mem_fraction:g} nothing is left for KV ({gib:.1f} GiB)")
    line = (f"{H200_USABLE_GIB:g} GiB usable x {mem_fraction:g} - {w:g} GB weights ({w * 1e9 / GiB:.2f} GiB) "
            f"- {ACTIVATION_RESERVE_GIB:g} GiB activations = {gib:.2f} GiB")
    return int(gib * GiB), line


# ---- presets ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """A published result to set beside ours (never tuned to). ``metric`` names a RunResult-derived
    value: max_active, mean_active, retractions_per_1k, throughput, or ratio_throughput (split pools'
    throughput at the preset's second ratio over the first)."""

    metric: str
    unified: float | None
    split: float | None
    text: str


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    summary: str
    input_tokens: int = 0
    output_tokens: int = 0
    clients: int | None = None  # closed loop; None: every request arrives at t = 0 (saturated queue)
    requests: int = 0
    arrivals: tuple[Arrival, ...] = ()  # a trace file's requests (then the fields above are unused)
    swa_ratios: tuple[float, ...] = (DEFAULT_SWA_FULL_TOKENS_RATIO,)
    published: Published | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def count(self, scale: float = 1.0) -> int:
        if self.arrivals:
            return len(self.arrivals)
        return max(1, round(self.requests * scale))

    def max_context(self) -> int:
        if self.arrivals:
            return max(a.input_tokens + a.output_tokens for a in self.arrivals)
        return self.input_tokens + self.output_tokens

    def source(self, scale: float = 1.0):
        if self.arrivals:
            return TraceSource(self.arrivals)
        shape: Callable[[int], tuple[int, int]] = lambda _i: (self.input_tokens, self.output_tokens)  # noqa: E731
        n = self.count(scale)
        if self.clients is None:
            return TraceSource(Arrival(0.0, *shape(i), self.name) for i in range(n))
        return ClosedLoop(self.clients, n, shape, self.name)

    def describe(self) -> str:
        if self.arrivals:
            span = max(a.step for a in self.arrivals) - min(a.step for a in self.arrivals)
            return (f"{self.model}, trace {self.extra.get('trace', '')}: {len(self.arrivals):,} requests "
                    f"arriving over {span:,.1f} s")
        load = f"{self.clients} clients (closed loop)" if self.clients else "all arrive at t = 0 (saturated queue)"
        return (f"{self.model}, {self.input_tokens:,} in / {self.output_tokens:,} out, {load}, "
                f"{self.count():,} requests")


_GPT_OSS_MAX = dict(model="gpt-oss-20b", input_tokens=1024, output_tokens=1024, clients=None, requests=6000)

PRESET_WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("qwen3.5-4b-1k-256", "qwen3.5-4b", "short prompts, short outputs: memory is not the limit",
             1024, 256, 64, 640,
             published=Published("throughput", None, None, "near parity (unified ~ split)")),
    Workload("gpt-oss-20b-max", summary="window-heavy model at maximum concurrency (1K/1K, the usual ISL/OSL)",
             **_GPT_OSS_MAX,
             published=Published("max_active", 1000, 618, "~1,000 vs 618 concurrent requests")),
    Workload("qwen3.5-4b-16k-4k", "qwen3.5-4b", "long prompts: full-attention KV dominates",
             16384, 4096, 64, 320,
             published=Published("mean_active", 32, 22, "32 vs 22 active requests")),
    Workload("qwen3.5-4b-512-16k", "qwen3.5-4b", "long outputs: decode outgrows admission, retractions",
             512, 16384, 51, 255,
             published=Published("retractions_per_1k", 233, 294, "~233 vs ~294 retractions per 1,000")),
    Workload("gpt-oss-20b-ratio", summary="--swa-full-tokens-ratio 0.1 vs the default 0.8, workload of gpt-oss-20b-max",
             swa_ratios=(DEFAULT_SWA_FULL_TOKENS_RATIO, 0.1), **_GPT_OSS_MAX,
             published=Published("ratio_throughput", None, 0.88, "ratio 0.1 costs ~12% throughput")),
)}


def workload(name: str) -> Workload:
    try:
        return PRESET_WORKLOADS[name]
    except KeyError:
        raise ConfigError(f"unknown workload {name!r}; choose one of {', '.join(PRESET_WORKLOADS)} "
                          "(kvarena simulate --list), or pass --trace FILE") from None


# ---- trace files -----------------------------------------------------------------------------------

ALIASES = {
    "arrival": ("arrival", "arrival_s", "timestamp", "time"),
    "input": ("input", "input_tokens", "input_len", "prompt_tokens"),
    "output": ("output", "output_tokens", "output_len", "completion_tokens"),
}


def _column(keys, field_name: str) -> str | None:
    lower = {str(k).strip().lower(): k for k in keys if k is not None}
    return next((lower[a] for a in ALIASES[field_name] if a in lower), None)


def _row(where: str, raw: dict, max_tokens: int | None) -> Arrival:
    vals = {}
    for f in ("arrival", "input", "output"):
        key = _column(raw, f)
        if key is None or raw[key] is None or str(raw[key]).strip() == "":
            raise TraceError(f"{where}: missing {f!r} (columns: {', '.join(ALIASES[f])}); every row needs "
                             "arrival (s), input and output (tokens)")
        vals[f] = raw[key]
    try:
        at = float(vals["arrival"])
    except (TypeError, ValueError):
        raise TraceError(f"{where}: arrival {vals['arrival']!r} is not a number of seconds") from None
    if not math.isfinite(at) or at < 0:
        raise TraceError(f"{where}: arrival {vals['arrival']!r} must be a finite number of seconds >= 0")
    lens = []
    for f in ("input", "output"):
        v = vals[f]
        try:
            n = int(v) if not isinstance(v, float) else None
        except (TypeError, ValueError):
            n = None
        if n is None or isinstance(v, bool) or n < 1:
            raise TraceError(f"{where}: {f} length {v!r} must be a whole number of tokens >= 1")
        lens.append(n)
    if max_tokens is not None and lens[0] + lens[1] > max_tokens:
        raise TraceError(f"{where}: input + output = {lens[0] + lens[1]:,} tokens exceeds the model's context "
                         f"of {max_tokens:,}; drop or truncate the request")
    return Arrival(at, lens[0], lens[1], "trace")


def load_trace(path: str | Path, max_tokens: int | None = None) -> list[Arrival]:
    """Read a CSV or JSON-lines trace; raises TraceError naming the file and line of a bad row."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TraceError(f"{p}: cannot read the trace ({e.strerror or e})") from None
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    out: list[Arrival] = []
    if p.suffix.lower() in (".jsonl", ".ndjson", ".json") or first.startswith("{"):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{p}:{i}: not a JSON object ({e.msg}); write one object per line") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{p}:{i}: expected a JSON object with arrival, input, output")
            out.append(_row(f"{p}:{i}", obj, max_tokens))
    else:
        reader = csv.DictReader(text.splitlines())
        missing = [f for f in ALIASES if _column(reader.fieldnames or (), f) is None]
        if missing:
            raise TraceError(f"{p}:1: the CSV header {reader.fieldnames} lacks {missing}; name the columns "
                             "arrival,input,output")
        for raw in reader:
            if not any((v or "").strip() for v in raw.values() if isinstance(v, str)):
                continue
            if None in raw:  # more cells than header columns
                raise TraceError(f"{p}:{reader.line_num}: {len(raw) - 1 + len(raw[None])} cells for "
                                 f"{len(reader.fieldnames or ())} columns")
            out.append(_row(f"{p}:{reader.line_num}", raw, max_tokens))
    if not out:
        raise TraceError(f"{p}: no requests in the trace")
    return out


def trace_workload(path: str | Path, model: str) -> Workload:
    if model not in PRESETS:
        raise ConfigError(f"unknown model {model!r}; choose one of {sorted(PRESETS)}")
    arrivals = load_trace(path, preset(model).max_context_len)
    return Workload(Path(path).stem, model, "requests replayed from a trace file (arrival times in seconds)",
                    arrivals=tuple(arrivals), extra={"trace": str(path)})
