"""The continuous-batching scheduler model shared by ``kvarena replay`` and ``kvarena simulate``.

One loop iteration is one scheduler step (one forward pass). With SGLang's default
(``mixed_chunk=False``, srt/arg_groups/fields/schedule.py ``enable_mixed_chunk``) a step is *either* a prefill
batch or a decode batch, as ``Scheduler.get_next_batch_to_run`` picks: admission runs first and, if
it prefilled anything, the running requests wait; otherwise every running request decodes a token.
With ``mixed_chunk=True`` (``kvarena replay``'s simple model) each step decodes, then admits.

- **decode**: ``check_decode_mem`` (the step's page needs fit, else retract in SGLang's victim order
  until they do, keeping one); each request at a page boundary extends one full page (and one page per
  window class), then window pages past the eviction interval slide out; a refused extend waits once
  for the in-flight forward (the ledger), then retracts; requests that wrote their last token free all.
- **admission**: the chunked request continues, then the queue head-of-line while the chunk budget
  lasts, the running cap allows, and free memory covers the prompt plus the decode reserve
  (``rules.py``: running requests' remaining output at ``new_token_ratio`` or 1.0 for ``ignore_eos``,
  the new request's own output in full).
- **forward**: the last step's forward releases its ledger users; this step's acquires the pages of
  a few running requests, so pages freed or moved next step are withheld until it finishes.
- **clock**: the step's work goes to the cost model, whose step time advances the modeled clock;
  without one the clock counts steps.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.simulator import prefix, rules
from kvarena.simulator.arrivals import Arrival
from kvarena.simulator.ceiling import PlacementLimit, window_page_life
from kvarena.simulator.checkpoints import StateCheckpoints
from kvarena.simulator.costmodel import StepWork
from kvarena.simulator.pager import Pager
from kvarena.simulator.prefix import PrefixCache
from kvarena.simulator.result import RunResult

# the scheduler's options live with the rules they switch; re-exported for the callers of run()
from kvarena.simulator.rules import SIMPLE as SIMPLE
from kvarena.simulator.rules import SchedulerModel as SchedulerModel
from kvarena.spec.errors import AdmissionRejectedError, InvariantViolation
from kvarena.spec.types import UserKind

SGLANG = SchedulerModel()  # SGLang 0.5.23's rules, every default


class SchedulerInvariantError(Exception):
    def __init__(self, label: str, step: int, err: InvariantViolation) -> None:
        super().__init__(f"invariant violated in {label} at step {step}: {err}")
        self.label, self.step, self.err, self.inv = label, step, err, err.inv

    def __reduce__(self):  # picklable: `kvarena replay` runs a side in a child process
        return type(self), (self.label, self.step, self.err)


def default_check(alloc) -> None:
    """The allocator's own invariant check if it has one (the vLLM model), else the reference predicates."""
    own = getattr(alloc, "check_invariants", None)
    if own is not None:
        own()
    else:
        check_all(alloc)


class _Req:
    __slots__ = ("a", "admit_step", "arrival", "cap", "dec_start", "done", "entry", "eos", "epoch", "finish",
                 "first_admit", "input", "orig_cap", "orig_in", "orig_out", "output", "pos", "rfinish", "rid", "ttft")

    def __init__(self, rid: int, a: Arrival) -> None:
        self.rid, self.arrival, self.input, self.output = rid, a.step, a.input_tokens, a.output_tokens
        self.a, self.entry = a, None  # entry: the prefix-cache entry it holds locked
        self.orig_in, self.orig_out, self.eos = a.input_tokens, a.output_tokens, a.ignore_eos
        self.cap = self.orig_cap = max(a.max_new_tokens, a.output_tokens)  # max_new_tokens: what is reserved
        self.admit_step = self.dec_start = self.finish = self.rfinish = self.first_admit = self.pos = -1
        self.done = 0  # prompt tokens prefilled
        self.epoch = 0  # bumped when it stops running: its scheduled events of older epochs are stale
        self.ttft = -1.0


Progress = Callable[[str, int, int, int, int], None]
Sampler = Callable[[int, float, Pager, int], None]


class _Reserve:
    """O(1) sums of the running requests' remaining output, for the decode reserve.

    Per group (ignore_eos or not): remaining = clip x n_clipped + sum_finish - n_unclipped x t, where t
    is the decode clock; ``pending`` is the output of admitted requests not decoding yet."""

    def __init__(self) -> None:
        self.sum_finish = {False: 0, True: 0}
        self.n_unclipped = {False: 0, True: 0}
        self.n_clipped = {False: 0, True: 0}
        self.pending = 0
        self.this_pass = 0.0  # requests admitted in this admission pass: the rest of their output, in full

    def remaining(self, g: bool, t: int, clip: int | None) -> int:
        return (clip or 0) * self.n_clipped[g] + self.sum_finish[g] - self.n_unclipped[g] * t


class Scheduler:
    """One run: drive ``alloc`` with the requests of ``source`` under ``model``."""

    def __init__(self, alloc, source, label: str, model: SchedulerModel, seed: int, cost, progress, check,
                 sampler, sample_every: int) -> None:
        self.alloc, self.source, self.label, self.m = alloc, source, label, model
        self.cost, self.progress, self.sampler, self.sample_every = cost, progress, sampler, sample_every
        self.check_fn = check or default_check
        self.pg = Pager(alloc, model.swa_eviction_interval, model.state_slots, model.evict_before_alloc)
        self.pt, self.clip = self.pg.pt, model.clip_new_tokens
        self.res = RunResult(label, requests=source.total)
        self.reqs: list[_Req] = []
        self.queue: deque[_Req] = deque()
        self.active: dict[int, _Req] = {}  # admission order: the last one is the newest
        self.pool: list[_Req] = []  # the same requests, for O(1) random picks
        self.decoding: dict[int, _Req] = {}  # the running batch (prefill done)
        self.grow: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # decode step -> page crossings
        self.fin: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # decode step -> last token
        self.unclip: defaultdict[int, list[tuple[_Req, int]]] = defaultdict(list)  # remaining output == clip
        self.rng = random.Random(seed)
        self.ratio = model.new_token_ratio[0]
        self.rs = _Reserve()
        self.sum_base = self.n_dec = 0  # decode context = sum_base + n_dec x t
        self.chunked: list[_Req] = []  # at most one request mid-prompt
        self.trims: list[_Req] = []  # transient window pages to slide out next step
        self.users: list[str] = []
        self.step, self.t, self.clock, self.busy_clock = 0, -1, 0.0, 0.0  # t: the decode clock
        self.step_prefill = [0, 0, 0, 0]  # tokens, attention, requests, prefix
        self.just_prefilled: list[_Req] = []
        self.just_finished: list[_Req] = []
        self.retracted_this_step = False
        self.decoded_now = 0  # requests this step decodes (a mixed step's prefill budget, decode_in_budget)
        self.admitting = False
        self.full = False  # SGLang's running_batch.batch_is_full: set by a refusal, cleared when the batch shrinks
        self.full_sticks = model.batch_is_full and not self.pg.windows  # hybrid SWA resets it every pass
        self.limit = self._placement_limit(alloc) if model.placement_limit else None
        self.moved_before = sum(alloc.stats.bytes_moved.values())
        # the radix tree's locked state checkpoint of each running request (rules.mamba_radix_checkpoint_slots):
        # an owner of its own, as the tree holds it, freed (evictable) when the request stops running
        self.ckpt_on = model.prefix_cache and model.radix_state_slots > 0 and bool(self.pg.state)
        self.ckpt = StateCheckpoints(alloc, self.pg.state[0] if self.pg.state else "", self.pg.fits,
                                     self._admit_checkpoint)
        self.cache: PrefixCache | None = None
        if model.prefix_cache and getattr(source, "shares_prefixes", False):
            if prefix.supported(alloc):
                self.cache = PrefixCache(alloc, self.pg)
                self.res.prefix_cache = "on"
            else:
                self.res.prefix_cache = "off: the engine has no share / copy_state"

    # ---- reserve bookkeeping ------------------------------------------------------------------------

    def out_reserve(self, n: int) -> int:
        return n if self.clip is None else min(n, self.clip)

    def start_decode(self, r: _Req) -> None:
        t, clip = self.t, self.clip
        r.dec_start, r.finish, r.rfinish = t, t + r.output, t + r.cap
        self.rs.pending -= self.out_reserve(r.cap)
        self.sum_base += r.input - t
        self.n_dec += 1
        self.decoding[r.rid] = r
        if clip is not None and r.cap > clip:
            self.rs.n_clipped[r.eos] += 1
            self.unclip[r.rfinish - clip].append((r, r.epoch))
        else:
            self.rs.sum_finish[r.eos] += r.rfinish
            self.rs.n_unclipped[r.eos] += 1
        first = t + -(-r.input // self.pt) * self.pt - r.input + 1  # first decode step whose token needs a page
        if first <= r.finish:
            self.grow[first].append((r, r.epoch))
        self.fin[r.finish].append((r, r.epoch))
        self.just_prefilled.append(r)
        if self.admitting and self.m.new_request_in_full:  # SGLang charges it in full for the rest of the pass
            ratio = rules.running_reserve_ratio(r.eos and self.m.ignore_eos_at_one, self.ratio)
            self.rs.this_pass += (1 - ratio) * self.out_reserve(r.cap) + self.pt

    def stop_decode(self, r: _Req) -> None:
        self.sum_base -= r.input - r.dec_start
        self.n_dec -= 1
        del self.decoding[r.rid]
        if self.clip is not None and r.rfinish - self.t > self.clip:
            self.rs.n_clipped[r.eos] -= 1
        else:
            self.rs.sum_finish[r.eos] -= r.rfinish
            self.rs.n_unclipped[r.eos] -= 1

    def unlink(self, r: _Req) -> None:
        del self.active[r.rid]
        last = self.pool.pop()
        if last is not r:
            self.pool[r.pos], last.pos = last, r.pos
        if r.rid in self.decoding:
            self.stop_decode(r)
        else:
            self.rs.pending -= self.out_reserve(r.cap)
        r.epoch += 1

    def reserve_tokens(self, r: _Req) -> int:
        """Decode headroom admission keeps for the running requests and ``r`` (rules.py)."""
        m, rs, t = self.m, self.rs, self.t
        if not m.new_request_in_full:  # the simple model: everything at the ratio
            remaining = rs.remaining(False, t, self.clip) + rs.remaining(True, t, self.clip)
            return int(self.ratio * (remaining + rs.pending + self.out_reserve(r.cap)))
        running = sum(rules.running_reserve_ratio(g and m.ignore_eos_at_one, self.ratio)
                      * rs.remaining(g, t, self.clip) for g in (False, True))
        return int(running + rs.this_pass) + rs.pending + rules.new_request_reserve_tokens(r.cap, self.pt, self.clip)

    # ---- retraction ---------------------------------------------------------------------------------

    def decoded(self, r: _Req) -> int:
        return r.orig_out - r.output + (max(0, self.t - r.dec_start) if r.rid in self.decoding else 0)

    def victim(self) -> _Req | None:
        """The next request to retract, or None when only one is left to keep."""
        if self.m.retraction == "newest":
            return self.active[next(reversed(self.active))] if self.active else None
        if len(self.decoding) <= 1:
            return self.chunked[0] if self.chunked else None
        batch = list(self.decoding.values())  # the running batch's order: the last one joined it last
        return batch[rules.retraction_victim([rules.retraction_key(self.decoded(r), r.orig_in) for r in batch])]

    def unlock(self, r: _Req) -> None:
        if r.entry is not None:
            self.cache.unlock(r.entry)
            r.entry = None

    def _admit_checkpoint(self, owner: str, slots: int) -> bool:
        return self.with_wait(lambda: (self.alloc.admit(owner, {self.pg.state[0]: slots}), 1)[1]) is not None

    def checkpoint(self, r: _Req) -> None:
        """The tree takes ``r``'s state checkpoint after a prefill chunk (rules.mamba_radix_checkpoint_slots,
        rules.mamba_chunk_checkpoints: the earlier ones stay, interior). Its refusals and frees are counted by
        ``self.ckpt`` and reported at the end of the run."""
        self.ckpt.take(r.rid, self.m.radix_state_slots)

    def drop_checkpoint(self, r: _Req) -> None:
        self.ckpt.drop(r.rid)  # unlocked: evictable, which SGLang counts as free

    def retract(self, r: _Req) -> None:
        gen = max(0, self.t - r.dec_start - 1) if r.rid in self.decoding else 0  # this step's token is lost with it
        self.pg.free(r.rid)
        self.drop_checkpoint(r)
        self.unlock(r)
        self.unlink(r)
        if self.chunked and self.chunked[0] is r:
            self.chunked.clear()
        r.input, r.output, r.cap, r.done, r.dec_start = r.input + gen, r.output - gen, r.cap - gen, 0, -1
        (self.queue.append if self.m.requeue_retracted == "back" else self.queue.appendleft)(r)
        self.full = False
        self.res.retractions += 1
        self.res.operations += 1
        self.retracted_this_step = True
        if self.m.ratio_after_retract == "reset":  # the simple model: back to the initial ratio at once
            self.ratio = self.m.new_token_ratio[0]

    def after_retractions(self) -> None:
        if self.m.ratio_after_retract == "reset":
            self.ratio = self.m.new_token_ratio[0]
            return
        batch = self.decoding.values()
        self.ratio = rules.ratio_after_retract(sum(self.decoded(r) for r in batch),
                                               sum(r.orig_cap for r in batch), len(self.decoding))

    # ---- the allocator, with the ledger ---------------------------------------------------------------

    def settle(self) -> None:
        """The forward pass of the last step finishes: its pages may move and be reused again."""
        for uid in self.users:
            self.alloc.release(uid)
        self.res.operations += len(self.users)
        self.users.clear()

    def with_wait(self, op: Callable[[], int]) -> int | None:
        """Run an allocation; if refused, wait once for the in-flight forward and retry. None: refused."""
        while True:
            try:
                self.res.operations += 1
                return op()
            except AdmissionRejectedError:
                if self.users:
                    self.settle()
                    self.res.forward_waits += 1
                elif self.cache is None or not self.cache.evict_one():  # evictable cache is free memory
                    return None

    def _placement_limit(self, alloc) -> PlacementLimit | None:
        """Only kvarena's arena takes a limit, and only for a window class that is its low end band below the
        full-attention high band (GPT-OSS; a float window, as hymba's, has no anchor side)."""
        if not isinstance(alloc, Arena) or self.pg.split or len(self.pg.keep) != 1 or alloc.order[-1] != self.pg.full:
            return None
        window = next(iter(self.pg.keep))
        if alloc.order[0] != window:
            return None
        high = alloc.bands[self.pg.full]
        return PlacementLimit(high.top * high.page_bytes, high.page_bytes, window)

    def placement_limit(self, r: _Req) -> Mapping[str, int] | None:
        """The window page ``r`` allocates now gets the full band's planned peak as its limit (ceiling.py),
        while admission is blocked."""
        lim, pg = self.limit, self.pg
        if lim is None or (self.queue and not self.full):
            return None
        keep = pg.keep[lim.window]
        life = window_page_life(len(pg.vids[r.rid][lim.window]), keep, pg.slack[lim.window])
        running = ((len(pg.vids[x][pg.full]), -(-(q.orig_in + q.orig_cap) // pg.pt))
                   for x, q in self.active.items() if x in pg.vids)
        return lim.below(self.step, life, running)

    def on_grow(self, r: _Req) -> None:
        below = self.placement_limit(r)
        while True:
            ops = self.with_wait(lambda: self.pg.grow_one(r.rid, below))
            if ops is not None:
                self.res.operations += ops - 1
                break
            victim = self.victim() or r
            self.retract(victim)
            if victim is r:
                return
        if self.t + self.pt <= r.finish:
            self.grow[self.t + self.pt].append((r, r.epoch))

    # ---- one decode step ------------------------------------------------------------------------------

    def decode(self) -> tuple[int, int]:
        """Every running request writes one token. Returns (requests, context) for the cost model."""
        self.t = self.step if self.m.mixed_chunk else self.t + 1
        t, rs = self.t, self.rs
        for r, ep in self.unclip.pop(t, ()):
            if ep == r.epoch:
                rs.n_clipped[r.eos] -= 1
                rs.sum_finish[r.eos] += r.rfinish
                rs.n_unclipped[r.eos] += 1
        crossing = [(r, ep) for r, ep in self.grow.pop(t, ()) if ep == r.epoch]
        if self.m.check_decode_mem and crossing:
            self.check_decode_mem(crossing)
        n_dec, ctx = self.n_dec, self.sum_base + self.n_dec * t
        for r, ep in crossing:
            if ep == r.epoch:
                self.on_grow(r)
        for r, ep in self.fin.pop(t, ()):
            if ep == r.epoch:
                if self.cache is not None and r.a.cache_as:  # the session's next turn starts with this context
                    self.cache.insert(r.a.cache_as, r.rid, r.orig_in + r.orig_out)
                self.pg.free(r.rid)
                self.drop_checkpoint(r)
                self.unlock(r)
                self.unlink(r)
                self.res.completed += 1
                self.full = False
                self.res.output_tokens += r.orig_out
                self.res.operations += 1
                self.just_finished.append(r)
                self.source.completed(self.clock, r.a)
        self.res.decode_steps += 1
        if self.retracted_this_step and self.m.ratio_after_retract == "estimate":
            self.after_retractions()
        elif self.m.decay_on_decode_only:
            self.decay()
        return n_dec, ctx

    def check_decode_mem(self, crossing: list[tuple[_Req, int]]) -> None:
        """Retract in victim order until this step's page needs fit (``ScheduleBatch.retract_decode``)."""
        while not self.pg.fits(self.pg.step_demand([r.rid for r, ep in crossing if ep == r.epoch]), 0):
            if self.cache is not None and self.cache.evict_one():
                continue
            victim = self.victim()
            if victim is None:
                return
            self.retract(victim)

    def decay(self) -> None:
        lo, step = self.m.new_token_ratio[1], self.m.new_token_ratio[2]
        self.ratio = max(lo, self.ratio - step)

    # ---- admission ----------------------------------------------------------------------------------

    def prefill_chunk(self, r: _Req, budget: int | None, first: bool) -> int | None:
        """Prefill the next chunk of ``r``; returns tokens processed, None if memory refused it."""
        m, pg = self.m, self.pg
        c = r.input - r.done if budget is None else min(r.input - r.done, budget)
        while True:
            target = r.done + c
            if first:
                e = r.entry
                self.ckpt.make_room(self.pg.state_slots)  # its state slots may evict interior checkpoints
                ops = self.with_wait(lambda t=target, e=e: pg.admit(
                    r.rid, t, m.transient_window, (r.input, r.cap), e.full if e else (),
                    e.state if e else None) or 1)
            else:
                ops = self.with_wait(lambda t=target: pg.extend_to(r.rid, t, m.transient_window) or 1)
            if ops is not None:
                break
            if budget is None or c <= self.pt:
                return None
            c = max(self.pt, c // 2)  # a chunk that does not fit shrinks to what memory holds (SGLang truncates it)
        self.res.operations += ops - 1
        sp = self.step_prefill
        sp[0] += c
        sp[1] += c * r.done + c * (c + 1) // 2
        sp[2] += 1
        sp[3] += r.done
        self.res.prefill_tokens += c
        r.done = target
        if self.ckpt_on and (m.chunk_checkpoints or r.rid not in self.ckpt) and rules.radix_checkpoint_taken(c):
            self.checkpoint(r)
        if m.transient_window and pg.keep:
            self.trims.append(r)
        a = r.a
        if self.cache is not None and a.prefix and r.done >= a.prefix_tokens and r.entry is None:
            self.cache.insert(a.prefix, r.rid, a.prefix_tokens)  # the radix tree now holds its prefix
        if r.done == r.input:
            self.chunked.clear()
            self.start_decode(r)
        else:
            self.chunked[:] = [r]
        return c

    def admit(self) -> None:
        self.admitting, self.rs.this_pass = True, 0.0
        try:
            self._admit()
        finally:
            self.admitting = False

    def _admit(self) -> None:
        budget = self.m.prefill_chunk
        if budget is not None and self.m.decode_in_budget:  # vLLM: this step's decodes came out of the budget
            budget = rules.vllm_step_budget(self.decoded_now, budget)
            if not budget:
                return
        if self.chunked:
            got = self.prefill_chunk(self.chunked[0], budget, False)
            if got is None or self.chunked:
                return  # the chunked request waits for memory, or took the whole budget
            budget = None if budget is None else budget - got
        if self.full and self.full_sticks and self.active:
            return  # srt/managers/scheduler.py _get_new_batch_prefill_raw: batch_is_full, no chunked request
        cap = self.m.max_running
        while self.queue and (budget is None or budget > 0):
            if cap is not None and len(self.active) >= cap:
                return
            r = self.queue[0]
            e = self.cache.peek(r.a.prefix, r.a.prefix_tokens, r.input) if self.cache is not None else None
            if e is not None:
                self.cache.lock(e)  # not evicted to make room for its own hit
                r.entry, r.done = e, e.tokens
            demand, reserve = self.admission_demand(r, budget), self.reserve_tokens(r)
            for c in self.pg.state:
                self.ckpt.make_room(demand[c])
            if self.active and not self.pg.fits(demand, reserve) and not (
                    self.cache is not None and self.cache.evict_until(lambda d=demand, x=reserve: self.pg.fits(d, x))):
                self.unlock(r)
                r.done = 0
                self.res.rejected_headroom += 1
                self.full = True
                return
            r.admit_step, r.pos = self.step, len(self.pool)
            self.active[r.rid] = r
            self.pool.append(r)
            self.rs.pending += self.out_reserve(r.cap)
            got = self.prefill_chunk(r, budget, True)
            if got is None:
                self.unlock(r)
                r.done = 0
                del self.active[r.rid]
                self.pool.pop()
                self.rs.pending -= self.out_reserve(r.cap)
                self.res.rejected_ladder += 1
                return
            self.queue.popleft()
            if self.cache is not None and r.a.prefix:
                self.cache.record(r.entry, r.a.prefix_tokens)
            r.first_admit = self.step if r.first_admit < 0 else r.first_admit
            if self.chunked:
                return
            budget = None if budget is None else budget - got

    def admission_demand(self, r: _Req, chunk: int | None) -> dict[str, int]:
        """Pages the queue head must find free (its prompt; the SGLang window estimate per window class)."""
        todo = r.input - (r.entry.tokens if r.entry is not None else 0)  # a cache hit's pages exist already
        if not (self.m.swa_admission and self.pg.windows):
            d = self.pg.prompt_demand(todo)
        else:
            new = self.out_reserve(r.cap)
            d = self.pg.prompt_demand(todo, {w: rules.swa_admission_tokens(r.input, new, n, self.pt, chunk)
                                             for w, n in self.pg.windows.items()})
        for c in self.pg.state:  # SGLang charges one state slot (rules.ADMISSION_STATE_SLOTS), allocates them all
            d[c] = min(d[c], self.m.admission_state_slots)
        return d

    def enqueue(self) -> None:
        for a in self.source.due(self.clock):
            r = _Req(len(self.reqs), a)
            self.reqs.append(r)
            self.queue.append(r)

    # ---- the forward pass and the clock ---------------------------------------------------------------

    def forward(self) -> None:
        pool, rng = self.pool, self.rng
        picks = {pool[rng.randrange(len(pool))].rid: None for _ in range(min(self.m.forward_requests, len(pool)))}
        reads, writes = [], []
        for rid in picks:
            rd, wr = self.pg.forward_pages(rid)
            reads += rd
            writes += wr
        for uid, kind, vids in ((f"fr{self.step}", UserKind.FORWARD_READ, reads),
                                (f"fw{self.step}", UserKind.FORWARD_WRITE, writes)):
            vids = list(dict.fromkeys(vids))
            if vids:
                self.alloc.acquire(uid, kind, vids)
                self.users.append(uid)
                self.res.operations += 1

    def advance(self, n_dec: int, ctx_dec: int) -> None:
        """The step's forward runs: the clock moves by its modeled time; latencies are stamped."""
        if self.cost is not None:
            moved = sum(self.alloc.stats.bytes_moved.values())
            dt = self.cost(StepWork(n_dec, ctx_dec, *self.step_prefill, moved - self.moved_before))
            self.moved_before = moved
        else:
            dt = 1.0
        self.clock += dt
        self.busy_clock += dt * len(self.active)
        res = self.res
        for r in self.just_prefilled:
            if r.ttft < 0:
                r.ttft = self.clock - r.arrival
                res.ttft.append(r.ttft)
        for r in self.just_finished:
            e2e = self.clock - r.arrival
            res.e2e.append(e2e)
            tpot = (e2e - r.ttft) / (r.orig_out - 1) if r.orig_out > 1 and r.ttft >= 0 else 0.0
            if r.orig_out > 1 and r.ttft >= 0:
                res.tpot.append(tpot)
            res.finished.append((r.ttft, tpot))
        self.just_prefilled.clear()
        self.just_finished.clear()
        self.step_prefill[:] = [0, 0, 0, 0]

    def do_check(self) -> None:
        try:
            self.check_fn(self.alloc)
        except InvariantViolation as e:
            raise SchedulerInvariantError(self.label, self.step, e) from e
        self.res.invariant_checks += 1

    # ---- the loop -------------------------------------------------------------------------------------

    def one_step(self) -> None:
        m = self.m
        if not self.active and not self.queue:
            if m.reset_ratio_when_idle:  # srt/managers/scheduler.py self_check_during_idle
                self.ratio = m.new_token_ratio[0]
            if (nt := self.source.next_time()) is not None:
                if self.cost is None:  # idle: jump to the next arrival
                    self.step = max(self.step, int(-(-nt // 1)))
                    self.clock = float(self.step)
                else:
                    self.clock = max(self.clock, nt)
        self.enqueue()
        for r in self.trims:
            if r.rid in self.pg.vids:  # still running (a retracted request holds nothing)
                self.res.operations += self.pg.trim(r.rid)
        self.trims.clear()
        self.retracted_this_step = False
        n_dec = ctx = 0
        if m.mixed_chunk:
            n_dec, ctx = self.decode()
            self.decoded_now = n_dec
            self.enqueue()
            if m.admit_after_retract or not self.retracted_this_step:
                self.admit()
        else:
            self.admit()
            if not self.step_prefill[2] and self.decoding:
                n_dec, ctx = self.decode()
        # last step's forward ran while this step's frees and moves were planned (an overlap
        # scheduler): it lets go of its pages only now, so pages it held were withheld meanwhile
        self.settle()
        if m.idle_flush_bytes is not None and len(self.active) <= m.idle_flush_running \
                and hasattr(self.alloc, "flush_idle"):  # between steps: no forward holds pages now
            self.alloc.flush_idle(m.idle_flush_bytes)
        if self.pool:
            self.forward()
        self.advance(n_dec, ctx)
        if not m.decay_on_decode_only:
            self.decay()

    def run(self) -> RunResult:
        t0 = time.perf_counter()
        m, res, source = self.m, self.res, self.source
        stall, last_check = (0, 0), -1  # (completed, step) at the last completion: a livelock guard
        while res.completed < source.total:  # one iteration = one scheduler step
            if res.completed != stall[0]:
                stall = (res.completed, self.step)
            elif self.step - stall[1] > m.stall_steps:
                raise RuntimeError(f"{self.label}: no request completed in {m.stall_steps} steps (step {self.step}, "
                                   f"{len(self.active)} running, {len(self.queue)} queued): the scheduler model "
                                   "livelocked")
            self.one_step()
            res.max_active = max(res.max_active, len(self.active))
            res.peak_utilization = max(res.peak_utilization, self.alloc.used_bytes() / self.alloc.capacity)
            if m.check_every and self.step // m.check_every != last_check:
                last_check = self.step // m.check_every
                self.do_check()
            if self.sampler is not None and self.sample_every and self.step % self.sample_every == 0:
                self.sampler(self.step, self.clock, self.pg, len(self.active))
            if self.progress is not None:
                self.progress(self.label, res.completed, source.total, self.step, len(self.active))
            self.step += 1
            if self.cost is None:
                self.clock = float(self.step)
        for uid in self.users:
            self.alloc.release(uid)
        if self.cache is not None:
            st = self.cache.stats
            res.prefix = {"lookups": st.lookups, "hits": st.hits, "tokens_hit": st.tokens_hit,
                          "tokens_asked": st.tokens_asked, "inserted": st.inserted, "evicted": st.evicted}
            self.cache.drop_all()
        self.do_check()  # the end state, ledger empty
        s = self.alloc.stats
        res.admitted, res.steps, res.clock = s.admitted - self.ckpt.admitted, self.step, self.clock
        res.checkpoints_refused, res.operations = self.ckpt.refused, res.operations + self.ckpt.frees
        res.moves, res.bytes_moved = {k: s.moves[k] for k in (2, 3)}, {k: s.bytes_moved[k] for k in (2, 3)}
        res.rung_used = dict(s.rung_used)
        res.mean_active = self.busy_clock / self.clock if self.clock else 0.0
        res.mean_wait_steps = sum(r.first_admit - r.arrival for r in self.reqs) / max(1, len(self.reqs))
        res.wall_s = time.perf_counter() - t0
        return res


def run(alloc, source, label: str, model: SchedulerModel = SGLANG, seed: int = 0,
        cost: Callable[[StepWork], float] | None = None, progress: Progress | None = None,
        check: Callable[[object], None] | None = None, sampler: Sampler | None = None,
        sample_every: int = 0) -> RunResult:
    """Drive ``alloc`` with the requests of ``source``; raises SchedulerInvariantError on a violation."""
    return Scheduler(alloc, source, label, model, seed, cost, progress, check, sampler, sample_every).run()
