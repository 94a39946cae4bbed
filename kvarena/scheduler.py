"""The continuous-batching scheduler model shared by ``kvarena replay`` and ``kvarena simulate``.

One loop iteration is one scheduler step (one forward pass):

1. arrivals whose time has come join the FIFO queue;
2. window pages a prefill chunk held through last step's forward slide out (``transient_window``);
3. every decoding request writes one token: at a page boundary it extends one full page (and one
   page per window class), then window pages wholly outside the window slide out; if the allocator
   refuses, the step waits once for the last forward to let go of its pages (the ledger), then the
   newest request is retracted (as SGLang's ``retract_decode``) and re-queued at the front, to redo
   its prefill with the tokens it had generated;
4. requests that wrote their last token free everything;
5. prefill: the request whose prompt is mid-chunk continues, then the queue is admitted head-of-line
   while the chunked-prefill budget lasts and the free memory covers the prompt plus a decode
   reserve (SGLang's ``new_token_ratio`` share of every running request's remaining output);
6. the last step's forward releases its ledger users; this step's forward acquires the pages of a
   few running requests (reads: their state, window pages and first full page; writes: the newest
   full page), so pages freed or moved next step are withheld until it finishes;
7. the step's work (decode tokens, context read, prefill tokens, bytes moved) goes to the cost model,
   whose step time advances the modeled clock; without one the clock counts steps.

The allocator is any object with the reference arena's page API (``admit / extend / slide / free /
acquire / release``, ``stats``, ``used_bytes``): ``Arena``, ``SplitPools`` or ``VllmPool``.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvarena.reference.invariants import check_all
from kvarena.reference.split import SplitPools
from kvarena.spec.errors import AdmissionRejectedError, InvariantViolation
from kvarena.spec.layout import Kind
from kvarena.spec.types import UserKind


@dataclass(frozen=True)
class Arrival:
    """One request: when it arrives (on the scheduler's clock: steps, or modeled seconds under a cost
    model), its prompt and output lengths in tokens, and a free-form tag."""

    step: float
    input_tokens: int
    output_tokens: int
    phase: str = ""


@dataclass(frozen=True)
class SchedulerModel:
    """The knobs of the scheduler model. The defaults are ``kvarena replay``'s."""

    prefill_chunk: int | None = None  # prompt tokens per step (chunked prefill); None: a whole prompt a step
    transient_window: bool = False  # a prefill chunk holds window pages for all its tokens during its forward
    lazy_window: bool = False  # free out-of-window pages only once a window's worth piled up (SGLang), not per page
    new_token_ratio: tuple[float, float, float] = (0.7, 0.1, 0.001)  # initial, floor, decay per step
    clip_new_tokens: int | None = None  # cap on one request's reserved output (SGLang CLIP_MAX_NEW_TOKENS)
    forward_requests: int = 4  # requests whose pages a forward pass holds in the ledger
    check_every: int = 200  # steps between full invariant checks (O(arena) each); 0: at the end only
    stall_steps: int = 50_000  # steps without a completion that mean the model livelocked


@dataclass(frozen=True)
class StepWork:
    """What one forward pass did, for the cost model."""

    decode_requests: int  # requests that wrote one token
    decode_context: int  # sum of their context lengths (tokens whose KV they read)
    prefill_tokens: int  # prompt tokens processed
    prefill_attention: int  # sum over chunk tokens of the context each attends to
    prefill_requests: int  # requests with a chunk in this step
    prefill_prefix: int  # sum over those chunks of the prompt tokens before them (KV read once)
    moved_bytes: int  # bytes the allocator moved (compaction, relayout) this step


class SchedulerInvariantError(Exception):
    def __init__(self, label: str, step: int, err: InvariantViolation) -> None:
        super().__init__(f"invariant violated in {label} at step {step}: {err}")
        self.inv = err.inv


# ---- arrivals ------------------------------------------------------------------------------------


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

    def completed(self, clock: float) -> None:
        pass


class ClosedLoop:
    """``clients`` clients, each sending its next request when its last one completes."""

    def __init__(self, clients: int, total: int, shape: Callable[[int], tuple[int, int]], tag: str = "") -> None:
        self.total, self.shape, self.tag = total, shape, tag
        self._ready = [0.0] * min(clients, total)  # arrival times not yet handed out
        self._issued = 0

    def _make(self, at: float) -> Arrival:
        self._issued += 1
        return Arrival(at, *self.shape(self._issued - 1), self.tag)

    def due(self, clock: float) -> list[Arrival]:
        out = [self._make(t) for t in self._ready if t <= clock]
        self._ready = [t for t in self._ready if t > clock]
        return out

    def next_time(self) -> float | None:
        return min(self._ready) if self._ready else None

    def completed(self, clock: float) -> None:
        if self._issued + len(self._ready) < self.total:
            self._ready.append(clock)


# ---- the allocator as the scheduler sees it -------------------------------------------------------


class Pager:
    """Per-request page bookkeeping over one allocator: tokens in, page demands out."""

    def __init__(self, alloc, lazy_window: bool = False) -> None:
        self.alloc = alloc
        cfg = alloc.config
        self.pt = getattr(alloc, "page_tokens", cfg.page_size)  # tokens per page of token classes
        self.full = next(c.name for c in cfg.model.classes if c.kind is Kind.FULL)
        windows = [c for c in cfg.model.classes if c.kind is Kind.WINDOW]
        # a window of W tokens touches at most ceil(W / pt) + 1 pages: keep the newest that many
        self.keep = {c.name: -(-c.window // self.pt) + 1 for c in windows}
        # lazy: pages outside the window go only when W more tokens piled up (SGLang's maybe_evict_swa
        # evicts every sliding_window_size decode steps), so a request holds W .. 2W (+ a page) tokens
        self.slack = {c.name: -(-c.window // self.pt) if lazy_window else 0 for c in windows}
        self.state = [c.name for c in cfg.model.classes if c.kind is Kind.RECURRENT]
        self.split = isinstance(alloc, SplitPools)
        self.page_bytes = {c: alloc.page_bytes_of(c) if hasattr(alloc, "page_bytes_of")
                           else alloc.bands[c].page_bytes for c in alloc.order}
        self.vids: dict[int, dict[str, list[int]]] = {}

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.pt)

    def prompt_demand(self, tokens: int) -> dict[str, int]:
        """Pages a prompt of ``tokens`` holds once prefilled (window pages trimmed to the window)."""
        full = self.pages(tokens)
        return {self.full: full, **{w: min(full, k) for w, k in self.keep.items()}, **dict.fromkeys(self.state, 1)}

    def fits(self, demand: dict[str, int], reserve_tokens: int) -> bool:
        """Admission headroom: free memory covers ``demand`` plus a decode reserve of full-attention tokens."""
        reserve = self.pages(reserve_tokens)
        if hasattr(self.alloc, "fits"):
            return self.alloc.fits(demand, reserve)
        if self.split:
            return all(demand.get(c, 0) + (reserve if c == self.full else 0) <= len(self.alloc.bands[c].holes)
                       for c in self.alloc.order)
        need = sum(n * self.page_bytes[c] for c, n in demand.items()) + reserve * self.page_bytes[self.full]
        return need <= self.alloc.free_bytes()

    def _chunk_demand(self, held_full: int, tokens: int, transient: bool, first: bool) -> dict[str, int]:
        add = self.pages(tokens) - held_full
        out = {self.full: add}
        for w, k in self.keep.items():
            out[w] = add if transient else min(add, k)
        if first:
            out.update(dict.fromkeys(self.state, 1))
        return out

    def admit(self, rid: int, tokens: int, transient: bool = False) -> None:
        got = self.alloc.admit(f"r{rid}", self._chunk_demand(0, tokens, transient, True)).pages
        self.vids[rid] = {c: list(got.get(c, ())) for c in self.alloc.order}

    def extend_to(self, rid: int, tokens: int, transient: bool = False) -> int:
        """Hold ``tokens`` of context: extend the full pages (and window pages alongside). Returns ops."""
        v = self.vids[rid]
        demand = self._chunk_demand(len(v[self.full]), tokens, transient, False)
        if not demand[self.full]:
            return 0
        got = self.alloc.extend(f"r{rid}", demand).pages
        for c, vs in got.items():
            v[c].extend(vs)
        return 1 + (0 if transient else self.trim(rid))

    def grow_one(self, rid: int) -> int:
        """One more full page (and one page per window class), then the window slides. Returns ops."""
        got = self.alloc.extend(f"r{rid}", {self.full: 1, **dict.fromkeys(self.keep, 1)}).pages
        v = self.vids[rid]
        for c, vs in got.items():
            v[c].extend(vs)
        return 1 + self.trim(rid)

    def trim(self, rid: int) -> int:
        """Slide out window pages wholly outside the window. Returns the allocator calls made."""
        v, ops = self.vids[rid], 0
        for w, k in self.keep.items():
            if (n := len(v[w]) - k) > self.slack[w]:
                self.alloc.slide(f"r{rid}", w, n)
                del v[w][:n]
                ops += 1
        return ops

    def free(self, rid: int) -> None:
        self.alloc.free(f"r{rid}")
        del self.vids[rid]

    def forward_pages(self, rid: int) -> tuple[list[int], list[int]]:
        """What a forward pass touches: reads the first full page and every non-full page, writes the newest."""
        v = self.vids[rid]
        return [v[self.full][0]] + [x for c in self.alloc.order if c != self.full for x in v[c]], [v[self.full][-1]]

    def occupancy(self) -> dict[str, int]:
        """Bytes of live pages per class."""
        if hasattr(self.alloc, "occupancy"):
            return self.alloc.occupancy()
        return {c: len(b.live) * b.page_bytes for c, b in self.alloc.bands.items()}


def default_check(alloc) -> None:
    """The allocator's own invariant check if it has one (``VllmPool``), else the reference predicates."""
    own = getattr(alloc, "check_invariants", None)
    if own is not None:
        own()
    else:
        check_all(alloc)


# ---- one run ---------------------------------------------------------------------------------------


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
    mean_wait_steps: float = 0.0  # from arrival to first admission, in steps
    steps: int = 0
    clock: float = 0.0  # the clock when the last request completed
    output_tokens: int = 0  # of completed requests, each counted once
    prefill_tokens: int = 0  # prompt tokens processed, redone prefills after retraction included
    ttft: list[float] = field(default_factory=list)  # arrival to the end of the first prefill, on the clock
    moves: dict[int, int] = field(default_factory=dict)
    bytes_moved: dict[int, int] = field(default_factory=dict)
    rung_used: dict[int, int] = field(default_factory=dict)
    peak_utilization: float = 0.0
    invariant_checks: int = 0
    operations: int = 0
    wall_s: float = 0.0


class _Req:
    __slots__ = ("admit_step", "arrival", "dec_start", "done", "epoch", "finish", "first_admit", "input", "orig_out",
                 "output", "pos", "rid", "ttft")

    def __init__(self, rid: int, a: Arrival) -> None:
        self.rid, self.arrival, self.input, self.output = rid, a.step, a.input_tokens, a.output_tokens
        self.orig_out = a.output_tokens
        self.admit_step = self.dec_start = self.finish = self.first_admit = self.pos = -1
        self.done = 0  # prompt tokens prefilled
        self.epoch = 0  # bumped when it stops running: its scheduled events of older epochs are stale
        self.ttft = -1.0


Progress = Callable[[str, int, int, int, int], None]
Sampler = Callable[[int, float, "Pager", int], None]


def run(alloc, source, label: str, model: SchedulerModel = SchedulerModel(), seed: int = 0,
        cost: Callable[[StepWork], float] | None = None, progress: Progress | None = None,
        check: Callable[[object], None] | None = None, sampler: Sampler | None = None,
        sample_every: int = 0) -> RunResult:
    """Drive ``alloc`` with the requests of ``source``; raises SchedulerInvariantError on a violation."""
    t0 = time.perf_counter()
    check_fn = check or default_check
    pg = Pager(alloc, model.lazy_window)
    pt, chunk_cap, clip = pg.pt, model.prefill_chunk, model.clip_new_tokens
    res = RunResult(label, requests=source.total)
    reqs: list[_Req] = []
    queue: deque[_Req] = deque()
    active: dict[int, _Req] = {}  # admission order: the last one is the newest (retraction victim)
    pool: list[_Req] = []  # the same requests, for O(1) random picks
    grow: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # step -> page-boundary crossings
    fin: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # step -> last token
    unclip: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # step -> remaining output == clip
    rng = random.Random(seed)
    ratio = model.new_token_ratio[0]
    # decode reserve: remaining output of decoding requests = clip * n_clipped + sum_finish - n_unclipped * step
    st = {"sum_finish": 0, "n_unclipped": 0, "n_clipped": 0, "prefill_reserve": 0, "sum_base": 0, "n_dec": 0}
    chunked: list[_Req] = []  # at most one request mid-prompt
    trims: list[_Req] = []  # transient window pages to slide out next step
    users: list[str] = []
    step, clock, last_check, busy_clock = 0, 0.0, -1, 0.0
    step_prefill = [0, 0, 0, 0]  # tokens, attention, requests, prefix
    just_prefilled: list[_Req] = []
    moved_before = sum(alloc.stats.bytes_moved.values())

    def out_reserve(n: int) -> int:
        return n if clip is None else min(n, clip)

    def start_decode(r: _Req) -> None:
        r.dec_start, r.finish = step, step + r.output
        st["prefill_reserve"] -= out_reserve(r.output)
        st["sum_base"] += r.input - step
        st["n_dec"] += 1
        if clip is not None and r.output > clip:
            st["n_clipped"] += 1
            unclip[r.finish - clip].append((r, r.epoch))
        else:
            st["sum_finish"] += r.finish
            st["n_unclipped"] += 1
        first = step + -(-r.input // pt) * pt - r.input + 1  # first step whose token needs a new page
        if first <= r.finish:
            grow[first].append((r, r.epoch))
        fin[r.finish].append((r, r.epoch))
        just_prefilled.append(r)

    def stop_decode(r: _Req) -> None:
        st["sum_base"] -= r.input - r.dec_start
        st["n_dec"] -= 1
        if clip is not None and r.finish - step > clip:
            st["n_clipped"] -= 1
        else:
            st["sum_finish"] -= r.finish
            st["n_unclipped"] -= 1

    def unlink(r: _Req) -> None:
        del active[r.rid]
        last = pool.pop()
        if last is not r:
            pool[r.pos], last.pos = last, r.pos
        if r.dec_start >= 0:
            stop_decode(r)
        else:
            st["prefill_reserve"] -= out_reserve(r.output)
        r.epoch += 1

    def retract(r: _Req) -> None:
        nonlocal ratio
        ratio = model.new_token_ratio[0]
        gen = max(0, step - r.dec_start - 1) if r.dec_start >= 0 else 0  # this step's token is lost with it
        pg.free(r.rid)
        unlink(r)
        if chunked and chunked[0] is r:
            chunked.clear()
        r.input, r.output, r.done, r.dec_start = r.input + gen, r.output - gen, 0, -1
        queue.appendleft(r)
        res.retractions += 1
        res.operations += 1

    def settle() -> None:
        """The forward pass of the last step finishes: its pages may move and be reused again."""
        for uid in users:
            alloc.release(uid)
        res.operations += len(users)
        users.clear()

    def with_wait(op: Callable[[], int]) -> int | None:
        """Run an allocation; if refused, wait once for the in-flight forward and retry. None: refused."""
        while True:
            try:
                res.operations += 1
                return op()
            except AdmissionRejectedError:
                if not users:
                    return None
                settle()
                res.forward_waits += 1

    def on_grow(r: _Req) -> None:
        while True:
            ops = with_wait(lambda: pg.grow_one(r.rid))
            if ops is not None:
                res.operations += ops - 1
                break
            victim = active[next(reversed(active))]
            retract(victim)
            if victim is r:
                return
        if step + pt <= r.finish:
            grow[step + pt].append((r, r.epoch))

    def reserve_tokens(r: _Req) -> int:
        remaining = ((clip or 0) * st["n_clipped"] + st["sum_finish"] - st["n_unclipped"] * step
                     + st["prefill_reserve"] + out_reserve(r.output))
        return int(ratio * remaining)

    def prefill_chunk(r: _Req, budget: int | None, first: bool) -> int | None:
        """Prefill the next chunk of ``r``; returns tokens processed, None if memory refused it."""
        c = r.input - r.done if budget is None else min(r.input - r.done, budget)
        while True:
            target = r.done + c
            if first:
                ops = with_wait(lambda t=target: pg.admit(r.rid, t, model.transient_window) or 1)
            else:
                ops = with_wait(lambda t=target: pg.extend_to(r.rid, t, model.transient_window) or 1)
            if ops is not None:
                break
            if budget is None or c <= pt:
                return None
            c = max(pt, c // 2)  # a chunk that does not fit shrinks to what memory holds (SGLang truncates it)
        res.operations += ops - 1
        step_prefill[0] += c
        step_prefill[1] += c * r.done + c * (c + 1) // 2
        step_prefill[2] += 1
        step_prefill[3] += r.done
        res.prefill_tokens += c
        r.done = target
        if model.transient_window and pg.keep:
            trims.append(r)
        if r.done == r.input:
            chunked.clear()
            start_decode(r)
        else:
            chunked[:] = [r]
        return c

    def admit() -> None:
        budget = chunk_cap
        if chunked:
            got = prefill_chunk(chunked[0], budget, False)
            if got is None or chunked:
                return  # the chunked request waits for memory, or took the whole budget
            budget = None if budget is None else budget - got
        while queue and (budget is None or budget > 0):
            r = queue[0]
            if active and not pg.fits(pg.prompt_demand(r.input), reserve_tokens(r)):
                res.rejected_headroom += 1
                return
            r.admit_step, r.pos = step, len(pool)
            active[r.rid] = r
            pool.append(r)
            st["prefill_reserve"] += out_reserve(r.output)
            got = prefill_chunk(r, budget, True)
            if got is None:
                del active[r.rid]
                pool.pop()
                st["prefill_reserve"] -= out_reserve(r.output)
                res.rejected_ladder += 1
                return
            queue.popleft()
            r.first_admit = step if r.first_admit < 0 else r.first_admit
            if chunked:
                return
            budget = None if budget is None else budget - got

    def forward() -> None:
        picks = {pool[rng.randrange(len(pool))].rid: None for _ in range(min(model.forward_requests, len(pool)))}
        reads, writes = [], []
        for rid in picks:
            rd, wr = pg.forward_pages(rid)
            reads += rd
            writes += wr
        for uid, kind, vids in ((f"fr{step}", UserKind.FORWARD_READ, reads),
                                (f"fw{step}", UserKind.FORWARD_WRITE, writes)):
            vids = list(dict.fromkeys(vids))
            if vids:
                alloc.acquire(uid, kind, vids)
                users.append(uid)
                res.operations += 1

    def do_check() -> None:
        try:
            check_fn(alloc)
        except InvariantViolation as e:
            raise SchedulerInvariantError(label, step, e) from e
        res.invariant_checks += 1

    def enqueue(clock_now: float) -> None:
        for a in source.due(clock_now):
            r = _Req(len(reqs), a)
            reqs.append(r)
            queue.append(r)

    stall = (0, 0)  # (completed, step) at the last completion: a livelock guard
    while res.completed < source.total:  # one iteration = one scheduler step
        if res.completed != stall[0]:
            stall = (res.completed, step)
        elif step - stall[1] > model.stall_steps:
            raise RuntimeError(f"{label}: no request completed in {model.stall_steps} steps (step {step}, "
                               f"{len(active)} running, {len(queue)} queued): the scheduler model livelocked")
        if not active and not queue and (nt := source.next_time()) is not None:
            if cost is None:  # idle: jump to the next arrival
                step = max(step, int(-(-nt // 1)))
                clock = float(step)
            else:
                clock = max(clock, nt)
        enqueue(clock)
        for r in trims:
            if r.rid in pg.vids:  # still running (a retracted request holds nothing)
                res.operations += pg.trim(r.rid)
        trims.clear()
        for r, ep in unclip.pop(step, ()):
            if ep == r.epoch:
                st["n_clipped"] -= 1
                st["sum_finish"] += r.finish
                st["n_unclipped"] += 1
        n_dec, ctx_dec = st["n_dec"], st["sum_base"] + st["n_dec"] * step
        for r, ep in grow.pop(step, ()):
            if ep == r.epoch:
                on_grow(r)
        for r, ep in fin.pop(step, ()):
            if ep == r.epoch:
                pg.free(r.rid)
                unlink(r)
                res.completed += 1
                res.output_tokens += r.orig_out
                res.operations += 1
                source.completed(clock)
        enqueue(clock)
        admit()
        # last step's forward ran while this step's frees and moves were planned (an overlap
        # scheduler): it lets go of its pages only now, so pages it held were withheld meanwhile
        settle()
        if pool:
            forward()
        if cost is not None:
            moved = sum(alloc.stats.bytes_moved.values())
            dt = cost(StepWork(n_dec, ctx_dec, *step_prefill, moved - moved_before))
            moved_before = moved
        else:
            dt = 1.0
        clock += dt
        busy_clock += dt * len(active)
        for r in just_prefilled:
            if r.ttft < 0:
                r.ttft = clock - r.arrival
                res.ttft.append(r.ttft)
        just_prefilled.clear()
        step_prefill[:] = [0, 0, 0, 0]
        ratio = max(model.new_token_ratio[1], ratio - model.new_token_ratio[2])
        res.max_active = max(res.max_active, len(active))
        res.peak_utilization = max(res.peak_utilization, alloc.used_bytes() / alloc.capacity)
        if model.check_every and step // model.check_every != last_check:
            last_check = step // model.check_every
            do_check()
        if sampler is not None and sample_every and step % sample_every == 0:
            sampler(step, clock, pg, len(active))
        if progress is not None:
            progress(label, res.completed, source.total, step, len(active))
        step += 1
        if cost is None:
            clock = float(step)
    for uid in users:
        alloc.release(uid)
    do_check()  # the end state, ledger empty
    s = alloc.stats
    res.admitted, res.steps, res.clock = s.admitted, step, clock
    res.moves, res.bytes_moved = {k: s.moves[k] for k in (2, 3)}, {k: s.bytes_moved[k] for k in (2, 3)}
    res.rung_used = dict(s.rung_used)
    res.mean_active = busy_clock / clock if clock else 0.0
    res.mean_wait_steps = sum(r.first_admit - r.arrival for r in reqs) / max(1, len(reqs))
    res.wall_s = time.perf_counter() - t0
    return res
