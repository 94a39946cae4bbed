"""Workloads of ``kvarena simulate``: the published single-H200 presets and trace files.

A workload is an arrival process, a length distribution and a KV budget:

- arrivals: a closed loop (``clients`` clients, each sending its next request when the last one
  completes, as ``bench_serving --max-concurrency``), a saturated queue (every request at t = 0:
  "maximum concurrency"), Poisson arrivals at a rate, or a trace file's own arrival times;
- lengths: fixed (the published runs state them), uniform, or drawn from a trace's rows. Fixed-length
  benchmark requests run with ``ignore_eos`` (bench_serving's default), which SGLang reserves at ratio
  1.0; requests of drawn lengths end at their EOS and reserve their ``max_new_tokens`` (the longest
  output of the distribution) at the decaying ratio;
- budget: SGLang's profile of an H200 at ``--mem-fraction`` (budget.sglang_budget), or, where the
  published setup is not known, a budget *calibrated on the published split figure*: one number fitted
  so the split pools reproduce the published split value; the unified value is then predicted.

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
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvarena.simulator.arrivals import (
    Arrival,
    ClosedLoop,
    Lengths,
    Sessions,
    Sharing,
    TraceSource,
    fixed_rows,
    poisson,
    saturated,
)
from kvarena.spec.errors import ConfigError
from kvarena.spec.models import DEFAULT_SWA_FULL_TOKENS_RATIO, PRESETS, preset


class TraceError(ConfigError):
    """A trace file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Published:
    """A published result to set beside ours (never tuned to). ``metric`` names a RunResult-derived
    value: max_active, mean_active, retractions_per_1k, throughput, ttft_p50 (seconds), or ratio_throughput
    (split pools' throughput at the preset's second ratio over the first)."""

    metric: str
    unified: float | None
    split: float | None
    text: str


@dataclass(frozen=True)
class Calibration:
    """A budget fitted on one published split figure (``fitted``), with how it was found."""

    gib: float
    fitted: str


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    summary: str
    lengths: Lengths = field(default_factory=Lengths)
    clients: int | None = None  # closed loop; None: saturated queue (or Poisson at ``rate``)
    rate: float | None = None  # Poisson arrivals per modeled second
    requests: int = 0
    arrivals: tuple[Arrival, ...] = ()  # a trace file's requests (then the fields above are unused)
    swa_ratios: tuple[float, ...] = (DEFAULT_SWA_FULL_TOKENS_RATIO,)
    ignore_eos: bool = True  # fixed-length benchmark requests (bench_serving's default)
    published: Published | None = None
    calibration: Calibration | None = None
    extra: dict[str, str] = field(default_factory=dict)
    sharing: Sharing = field(default_factory=Sharing)  # shared system prompts, multi-turn sessions (prefix.py)

    def count(self, scale: float = 1.0) -> int:
        if self.arrivals:
            return len(self.arrivals)
        return max(1, round(self.requests * scale))

    def max_context(self) -> int:
        if self.arrivals:
            return max(a.input_tokens + a.output_tokens for a in self.arrivals)
        sh = self.sharing
        if sh.turns > 1 and self.clients:
            return sh.context(self.lengths.max_tokens() - self.lengths.max_output(), self.lengths.max_output())
        return self.lengths.max_tokens() + sh.system_tokens

    def eos(self) -> bool:
        """ignore_eos for the requests: fixed lengths only (drawn lengths end at their EOS)."""
        return self.ignore_eos and self.lengths.kind == "fixed"

    def source(self, scale: float = 1.0, seed: int = 0):
        if self.arrivals:
            return TraceSource(self.arrivals)
        shape, n, eos = self.lengths.shape(seed), self.count(scale), self.eos()
        if self.sharing.turns > 1 and self.clients:
            src = Sessions(self.clients, n, shape, self.sharing, self.name, eos)
        elif self.rate is not None:
            src = poisson(self.rate, n, shape, seed, self.name, eos)
        elif self.clients is None:
            src = saturated(n, shape, self.name, eos)
        else:
            src = ClosedLoop(self.clients, n, shape, self.name, eos)
        if self.sharing.system_tokens and not isinstance(src, Sessions):
            src = _Tagged(src, self.sharing)
        # EOS-terminated requests: the scheduler knows only max_new_tokens, the longest output drawn
        return src if eos else _WithCap(src, self.lengths.max_output())

    def describe(self) -> str:
        if self.arrivals:
            span = max(a.step for a in self.arrivals) - min(a.step for a in self.arrivals)
            return (f"{self.model}, trace {self.extra.get('trace', '')}: {len(self.arrivals):,} requests "
                    f"arriving over {span:,.1f} s")
        if self.rate is not None:
            load = f"Poisson arrivals at {self.rate:g} req/s"
        elif self.clients:
            load = f"{self.clients} clients (closed loop)"
        else:
            load = "all arrive at t = 0 (saturated queue)"
        share = f", {self.sharing.describe()}" if self.sharing.describe() else ""
        return f"{self.model}, {self.lengths.describe()}, {load}, {self.count():,} requests{share}"

    def with_load(self, clients: int | None = None, rate: float | None = None, requests: int | None = None
                  ) -> Workload:
        """The same requests driven by ``clients`` closed-loop clients, or Poisson arrivals at ``rate``."""
        tag = f"@c{clients}" if clients else f"@{rate:g}rps"
        n = requests or self.requests or len(self.arrivals)
        lengths = self.lengths
        if self.arrivals:  # a trace's lengths, re-driven
            lengths = Lengths("trace", rows=fixed_rows(self.arrivals))
        return replace(self, name=self.name + tag, clients=clients, rate=rate, requests=n, arrivals=(),
                       lengths=lengths, ignore_eos=self.ignore_eos and not self.arrivals)

    def with_lengths(self, lengths: Lengths) -> Workload:
        return replace(self, lengths=lengths, name=f"{self.name}+{lengths.kind}")


class _Tagged:
    """A single-turn source whose prompts start with one of the workload's shared system prompts."""

    shares_prefixes = True

    def __init__(self, src, sharing: Sharing) -> None:
        self.src, self.sharing, self.total, self._i = src, sharing, src.total, 0

    def due(self, clock: float) -> list[Arrival]:
        out = []
        for a in self.src.due(clock):
            out.append(self.sharing.tag(a, self._i))
            self._i += 1
        return out

    def next_time(self) -> float | None:
        return self.src.next_time()

    def completed(self, clock: float, arrival: Arrival | None = None) -> None:
        self.src.completed(clock, arrival)


class _WithCap:
    """A source whose requests carry ``max_new_tokens`` = the distribution's longest output."""

    def __init__(self, src, cap: int) -> None:
        self.src, self.cap, self.total = src, cap, src.total
        self.shares_prefixes = getattr(src, "shares_prefixes", False)

    def due(self, clock: float) -> list[Arrival]:
        return [replace(a, max_new_tokens=self.cap) for a in self.src.due(clock)]

    def next_time(self) -> float | None:
        return self.src.next_time()

    def completed(self, clock: float, arrival: Arrival | None = None) -> None:
        self.src.completed(clock, arrival)


def _fixed(i: int, o: int) -> Lengths:
    return Lengths("fixed", i, o)


_GPT_OSS_MAX = dict(model="gpt-oss-20b", lengths=_fixed(1024, 1024), clients=None, requests=6000)
# Fitted by simulator/calibrate.py (the command in its docstring); see README "Capacity simulator". The
# c1000 preset's published split TTFT (43 s) is where the cost model's one constant, costmodel.HBM_EFFICIENCY,
# was fitted (at this budget); its unified TTFT (6 s) is then predicted. Max active at t = 0 does not depend
# on the clock, so this budget and that constant do not interact.
_GPT_OSS_CAL = Calibration(52.16, "split pools' max active requests = 618")

PRESET_WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("qwen3.5-4b-1k-256", "qwen3.5-4b", "short prompts, short outputs: memory is not the limit",
             _fixed(1024, 256), 64, requests=640,
             published=Published("throughput", None, None, "near parity (unified ~ split)")),
    Workload("gpt-oss-20b-max", summary="window-heavy model at maximum concurrency (1K/1K, the usual ISL/OSL)",
             **_GPT_OSS_MAX, calibration=_GPT_OSS_CAL,
             published=Published("max_active", 1000, 618, "~1,000 vs 618 concurrent requests")),
    Workload("qwen3.5-4b-16k-4k", "qwen3.5-4b", "long prompts: full-attention KV dominates",
             _fixed(16384, 4096), 64, requests=320,
             calibration=Calibration(27.33, "split pools' mean active requests = 22 (22.4 at this budget)"),
             published=Published("mean_active", 32, 22, "32 vs 22 active requests")),
    Workload("qwen3.5-4b-512-16k", "qwen3.5-4b", "long outputs: decode outgrows admission, retractions",
             _fixed(512, 16384), 51, requests=255,
             calibration=Calibration(32.36, "split pools' retractions per 1,000 = 294 (286 at this budget)"),
             published=Published("retractions_per_1k", 233, 294, "~233 vs ~294 retractions per 1,000")),
    Workload("gpt-oss-20b-c1000", summary="gpt-oss-20b-max driven by 1,000 closed-loop clients (the published "
             "unified concurrency): time to first token", model="gpt-oss-20b", lengths=_fixed(1024, 1024), clients=1000,
             requests=6000, calibration=_GPT_OSS_CAL,
             published=Published("ttft_p50", 6, 43, "TTFT 43 s (split) -> 6 s (unified)")),
    Workload("gpt-oss-20b-ratio", summary="--swa-full-tokens-ratio 0.1 vs the default 0.8, workload of gpt-oss-20b-max",
             swa_ratios=(DEFAULT_SWA_FULL_TOKENS_RATIO, 0.1), **_GPT_OSS_MAX, calibration=_GPT_OSS_CAL,
             published=Published("ratio_throughput", None, 0.88, "ratio 0.1 costs ~12% throughput")),
    # No published figure: a chat service (prefix.py). 4 system prompts of 2,048 tokens, sessions of 4 turns
    # (512 in / 256 out each), 256 clients: the radix cache's hit rate and its evictions under a tight budget.
    Workload("gpt-oss-20b-chat", "gpt-oss-20b", "multi-turn chat (no published figure): shared system prompts "
             "and earlier turns hit the prefix cache", _fixed(512, 256), 256, requests=2048,
             calibration=Calibration(8.0, "8 GiB, not fitted: a budget where the cache must evict"),
             sharing=Sharing(system_tokens=2048, system_prompts=4, turns=4)),
    # No published figure: the one preset with a float band (state | window | full) at the H200 budget.
    Workload("hymba-1.5b-6k-2k", "hymba-1.5b", "three classes (no published figure): the window float moves (rung "
             "3) while state, window and full pages share the arena", _fixed(6144, 2048), None,
             requests=2000),  # 4,000 ran SGLang's unified column ~2 min alone; 2,000: means within 3.5 % of it
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
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{p}: cannot read the trace ({e.strerror or e})") from None
    except UnicodeDecodeError as e:  # a binary file (a .parquet, a gzip): say so, not a traceback
        raise TraceError(f"{p}: not a text file (byte {e.start:,} is not UTF-8); a trace is CSV (arrival,input,"
                         "output) or JSON lines") from None
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
                    arrivals=tuple(arrivals), ignore_eos=False, extra={"trace": str(path)})


def lengths_from(spec: str, w: Workload) -> Lengths:
    """``--output-lengths``: ``fixed`` (the workload's own), ``uniform`` or ``uniform:LO`` (output drawn in
    [LO, the workload's output], LO default 1), or ``trace:FILE`` (input and output drawn from FILE's rows)."""
    kind, _, arg = spec.partition(":")
    if kind == "fixed" and not arg:
        return w.lengths
    if kind == "uniform":
        try:
            lo = int(arg) if arg else 1
        except ValueError:
            lo = 0
        if not 1 <= lo <= w.lengths.output:
            raise ConfigError(f"--output-lengths uniform:{arg}: the low end must be a whole number of tokens in "
                              f"1..{w.lengths.output:,} (the workload's output length)")
        return Lengths("uniform", w.lengths.input, w.lengths.output, lo)
    if kind == "trace" and arg:
        return Lengths("trace", rows=fixed_rows(load_trace(arg, preset(w.model).max_context_len)))
    raise ConfigError(f"--output-lengths {spec!r}: use fixed, uniform[:LO] or trace:FILE")
