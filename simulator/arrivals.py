"""Arrival processes: where the requests of a run come from, and when.

Every source answers three questions on the scheduler's clock (steps, or modeled seconds under a cost
model): which requests are ``due(clock)``, when the ``next_time()`` one arrives, and it hears when a
request ``completed(clock)`` (a closed loop sends its next request then).

- :class:`TraceSource`  a fixed list: a trace file, or a saturated queue (everything at t = 0);
- :class:`ClosedLoop`   ``C`` clients, each sending its next request when its last one completes
                        (``bench_serving --max-concurrency C``);
- :class:`Poisson`      open-loop arrivals at ``rate`` requests per clock unit (``--request-rate``).

Output lengths come from :class:`Lengths`: fixed, uniform in a range, or drawn from a trace's rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Arrival:
    """One request: when it arrives, its prompt and output lengths in tokens, a free-form tag, and
    whether it runs to its full output (``ignore_eos``: a fixed-length benchmark request, which
    SGLang reserves at ratio 1.0 instead of the decaying ``new_token_ratio``); an EOS-terminated
    request ends at ``output_tokens`` but is reserved for ``max_new_tokens``."""

    step: float
    input_tokens: int
    output_tokens: int
    phase: str = ""
    ignore_eos: bool = False
    max_new_tokens: int = 0  # what the scheduler reserves for; 0: the output length (known exactly)
    prefix: str = ""  # the prompt starts with this shared context (prefix.py: a system prompt, an earlier turn)
    prefix_tokens: int = 0  # ... of this many tokens
    cache_as: str = ""  # cache the whole context under this key when the request completes (a session's turn)
    session: int = -1  # the session (closed-loop client) it belongs to: its next turn follows its completion


@dataclass(frozen=True)
class Sharing:
    """How a workload's prompts share prefixes: ``system_tokens`` of each prompt are one of ``system_prompts``
    shared system prompts (request i uses prompt i mod that), and each closed-loop client runs sessions of
    ``turns`` turns: turn k's prompt is turn k-1's prompt and output plus the workload's input."""

    system_tokens: int = 0
    system_prompts: int = 1
    turns: int = 1

    def context(self, inp: int, out: int) -> int:
        """The longest context of a session: system prompt, then ``turns`` x (input + output)."""
        return self.system_tokens + self.turns * (inp + out)

    def describe(self) -> str:
        parts = []
        if self.system_tokens:
            parts.append(f"{self.system_prompts} shared system prompt(s) of {self.system_tokens:,} tokens")
        if self.turns > 1:
            parts.append(f"sessions of {self.turns} turns")
        return ", ".join(parts)

    def tag(self, a: Arrival, i: int) -> Arrival:
        """Request ``i`` (a single-turn source): its system prompt as the prefix, prepended to its input."""
        if not self.system_tokens:
            return a
        key = f"sys{i % self.system_prompts}"
        return replace(a, input_tokens=a.input_tokens + self.system_tokens, prefix=key,
                       prefix_tokens=self.system_tokens)


class Sessions:
    """``clients`` closed-loop clients, each running sessions of ``sharing.turns`` turns: a turn is sent
    when the client's previous one completes, its prompt the previous context plus ``shape``'s input, its
    prefix that context (cached by the previous turn, ``cache_as``)."""

    shares_prefixes = True  # the scheduler runs a prefix cache for it (prefix.py)

    def __init__(self, clients: int, total: int, shape: Shape, sharing: Sharing, tag: str = "",
                 ignore_eos: bool = False) -> None:
        self.total, self.shape, self.sharing, self.tag, self.ignore_eos = total, shape, sharing, tag, ignore_eos
        n = min(clients, total)
        self._ready: list[tuple[float, int]] = [(0.0, c) for c in range(n)]  # (time, client)
        self._turn = [0] * n  # the client's next turn
        self._ctx = [0] * n  # its session's context so far (tokens)
        self._sess = list(range(n))  # its current session id
        self._next_session = n
        self._issued = 0

    def _make(self, at: float, c: int) -> Arrival:
        i = self._issued
        self._issued += 1
        inp, out = self.shape(i)
        sh, k, sess = self.sharing, self._turn[c], self._sess[c]
        if k == 0:
            key, pre = (f"sys{sess % sh.system_prompts}", sh.system_tokens) if sh.system_tokens else ("", 0)
            prompt = sh.system_tokens + inp
        else:
            key, pre = f"s{sess}t{k - 1}", self._ctx[c]
            prompt = self._ctx[c] + inp
        last = k + 1 >= sh.turns
        self._ctx[c] = prompt + out
        self._turn[c] = 0 if last else k + 1
        if last:
            self._sess[c], self._next_session = self._next_session, self._next_session + 1
        return Arrival(at, prompt, out, self.tag, self.ignore_eos, prefix=key, prefix_tokens=pre,
                       cache_as="" if last else f"s{sess}t{k}", session=c)

    def due(self, clock: float) -> list[Arrival]:
        out = [self._make(t, c) for t, c in self._ready if t <= clock]
        self._ready = [(t, c) for t, c in self._ready if t > clock]
        return out

    def next_time(self) -> float | None:
        return min(t for t, _ in self._ready) if self._ready else None

    def completed(self, clock: float, arrival: Arrival | None = None) -> None:
        if self._issued + len(self._ready) < self.total:
            c = arrival.session if arrival is not None and arrival.session >= 0 else 0
            self._ready.append((clock, c))


Shape = Callable[[int], tuple[int, int]]  # request index -> (input tokens, output tokens)


@dataclass(frozen=True)
class Lengths:
    """A distribution of (input, output) lengths.

    ``kind``: ``fixed`` (``input`` / ``output``), ``uniform`` (output drawn in [output_lo, output],
    input fixed), or ``trace`` (rows drawn from ``rows``, a trace's (input, output) pairs).
    Draws are seeded, so a run is deterministic."""

    kind: str = "fixed"
    input: int = 0
    output: int = 0
    output_lo: int = 0
    rows: tuple[tuple[int, int], ...] = ()

    def shape(self, seed: int = 0) -> Shape:
        if self.kind == "fixed":
            return lambda _i: (self.input, self.output)
        rng = random.Random(seed ^ 0x0DD)
        if self.kind == "uniform":
            lo = max(1, self.output_lo)
            return lambda _i: (self.input, rng.randint(lo, self.output))
        if self.kind == "trace":
            rows = self.rows
            return lambda _i: rows[rng.randrange(len(rows))]
        raise ValueError(f"unknown length distribution {self.kind!r}; use fixed, uniform or trace")

    def max_tokens(self) -> int:
        if self.kind == "trace":
            return max(i + o for i, o in self.rows)
        return self.input + self.output

    def max_output(self) -> int:
        return max(o for _, o in self.rows) if self.kind == "trace" else self.output

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.input:,} in / {self.output:,} out"
        if self.kind == "uniform":
            return f"{self.input:,} in / {max(1, self.output_lo):,}-{self.output:,} out (uniform)"
        return f"lengths drawn from {len(self.rows):,} trace rows"


class TraceSource:
    """A fixed list of arrivals (sorted by time)."""

    def __init__(self, arrivals: Iterable[Arrival]) -> None:
        self.arrivals = sorted(arrivals, key=lambda a: a.step)
        self.total = len(self.arrivals)
        self._next = 0

    def due(self, clock: float) -> list[Arrival]:
        out = []
        while self._next < self.total and self.arrivals[self._next].step <= clock:
            out.append(self.arrivals[self._next])
            self._next += 1
        return out

    def next_time(self) -> float | None:
        return self.arrivals[self._next].step if self._next < self.total else None

    def completed(self, clock: float, arrival: Arrival | None = None) -> None:
        pass


class ClosedLoop:
    """``clients`` clients, each sending its next request when its last one completes."""

    def __init__(self, clients: int, total: int, shape: Shape, tag: str = "", ignore_eos: bool = False) -> None:
        self.total, self.shape, self.tag, self.ignore_eos = total, shape, tag, ignore_eos
        self._ready = [0.0] * min(clients, total)  # arrival times not yet handed out
        self._issued = 0

    def _make(self, at: float) -> Arrival:
        self._issued += 1
        return Arrival(at, *self.shape(self._issued - 1), self.tag, self.ignore_eos)

    def due(self, clock: float) -> list[Arrival]:
        out = [self._make(t) for t in self._ready if t <= clock]
        self._ready = [t for t in self._ready if t > clock]
        return out

    def next_time(self) -> float | None:
        return min(self._ready) if self._ready else None

    def completed(self, clock: float, arrival: Arrival | None = None) -> None:
        if self._issued + len(self._ready) < self.total:
            self._ready.append(clock)


def poisson(rate: float, total: int, shape: Shape, seed: int = 0, tag: str = "",
            ignore_eos: bool = False) -> TraceSource:
    """``total`` requests with exponential gaps of mean 1 / ``rate`` (clock units), from t = 0."""
    if rate <= 0:
        raise ValueError(f"a Poisson rate must be > 0 requests per second, got {rate!r}")
    rng = random.Random(seed ^ 0xA11)
    t, out = 0.0, []
    for i in range(total):
        out.append(Arrival(t, *shape(i), tag, ignore_eos))
        t += rng.expovariate(rate)
    return TraceSource(out)


def saturated(total: int, shape: Shape, tag: str = "", ignore_eos: bool = False) -> TraceSource:
    """Every request queued at t = 0 ("maximum concurrency")."""
    return TraceSource(Arrival(0.0, *shape(i), tag, ignore_eos) for i in range(total))


def fixed_rows(arrivals: Sequence[Arrival]) -> tuple[tuple[int, int], ...]:
    """A trace's (input, output) pairs, for a ``Lengths("trace", rows=...)`` distribution."""
    return tuple((a.input_tokens, a.output_tokens) for a in arrivals)
