"""Ladder theorems (spec/arena.md §Admission ladder; proofs/README.md): rung discipline, plan validity, completeness.

Two kinds of evidence, each named in the table ``kvarena prove`` prints:

* **Z3, unbounded**: the arithmetic of rung 3 (``reference/ladder.py`` ``float_span``, transcribed line by line
  in ``float_span_z3``) and of rung 1's retry after it (``place`` on the relaid views), for all integers and
  all page sizes: the span rung 3 picks is valid (R3-SPAN-VALID), rung 3 finds a span whenever any contiguous
  arrangement of the float exists (R3-EXACT), and rung 1 then places the whole demand (R3-THEN-PLACE,
  ENDS-ONLY-PLACE). Together: the completeness theorem below.
* **exhaustive, bounded**: the reference's own ``Arena.ladder`` on every state and demand of ``LADDER_BOUND``
  (toy-tri geometry): every plan decomposes into steps of the symbolic model with their guards met (so each is
  one of the transitions proven invariant-preserving for *all* states), rung 1 moves 0 bytes, rung 2 moves only
  end-band pages inside their own band, rung 3 moves only float pages (after rung 2's end-band moves), the
  applied plan leaves every predicate passing, and the completeness statement agrees with the ladder.

**Completeness (rung 3, one float band).** Let the compacted ends be what rung 2 leaves (``_plan_compact_ends``):
``L`` = the low band's frontier byte, ``H`` = the high band's, ``a = max(0, d_low - holes_low) * P_low`` and
``b = max(0, d_high - holes_high) * P_high`` the bytes the ends must still grow. Let ``F`` be the float (page
bytes ``P``), ``K = live_F + withheld_F + d_F``, ``O`` its immovable slots (withheld, or live with a ledger user)
and ``R = [ceil((L + a)/P), floor((H - b)/P))`` the aligned room. From any settled state (no band has a hole on
an edge it grows from, as every operation leaves it): if ``F`` is non-empty or demanded, rung 3 returns a plan
iff ``|R| >= K`` and ``O ⊆ R`` (iff any contiguous arrangement of ``F`` fits: rung 3 is exact), and then
``Arena.ladder(d)`` admits ``d``; if ``F`` is empty and not demanded, ``L + a <= H - b`` suffices. The naive
statement "``|R| >= K``" (free bytes between the compacted ends, minus the ends' needs, page-aligned, against
the float's pages and demand) is false: an immovable float page outside ``R`` blocks it; Z3 finds such a state
and the reference rejects it (NAIVE-IS-FALSE). The bound: one float band (the model's, and every preset's,
chain shape); with several floats rung 3 is local per float (spec/arena.md §Determinism, cost and limits).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

import z3
from sortedcontainers import SortedList

from kvarena.proofs.replay import use_plan
from kvarena.reference.arena import Arena, Hold, User
from kvarena.reference.bands import BandView
from kvarena.reference.invariants import check_all
from kvarena.spec.errors import AdmissionRejectedError, InvariantViolation
from kvarena.spec.models import ArenaConfig, preset
from kvarena.spec.types import Plan, Rung, UserKind


@dataclass
class Theorem:
    name: str
    statement: str
    status: str = ""  # "proven", "counterexample (expected)", or a failure
    seconds: float = 0.0
    bound: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("proven", "counterexample (expected)")


# ---------------------------------------------------------------------------------------------
# Z3: the arithmetic of rung 3


def _floor_div(x: z3.ArithRef, p: z3.ArithRef, name: str) -> tuple[z3.ArithRef, z3.BoolRef]:
    q = z3.Int(name)
    return q, z3.And(q * p <= x, x < (q + 1) * p)


def _ceil_div(x: z3.ArithRef, p: z3.ArithRef, name: str) -> tuple[z3.ArithRef, z3.BoolRef]:
    q = z3.Int(name)
    return q, z3.And((q - 1) * p < x, x <= q * p)


def _max(a, b):
    return z3.If(a >= b, a, b)


def _min(a, b):
    return z3.If(a <= b, a, b)


@dataclass
class Span:
    ok: z3.BoolRef
    t: z3.ArithRef
    t_end: z3.ArithRef
    need: z3.ArithRef
    defs: z3.BoolRef


def float_span_z3(p, win_lo, win_hi, need0, current, has_obs, omin, omax, tag: str = "fs") -> Span:
    """``reference/ladder.py`` ``float_span``, line by line (``ceil_div`` and ``//`` as defined integers)."""
    q_lo, d1 = _ceil_div(win_lo, p, f"{tag}.ceil_lo")  # t_min = ceil_div(win_lo, p)
    q_hi, d2 = _floor_div(win_hi, p, f"{tag}.floor_hi")  # win_hi // p
    need = z3.If(has_obs, _max(need0, omax - omin + 1), need0)  # need = max(need, omax - omin + 1)
    t_min = z3.If(has_obs, _max(q_lo, omax + 1 - need), q_lo)  # t_min = max(t_min, omax + 1 - need)
    t_max = z3.If(has_obs, _min(q_hi - need, omin), q_hi - need0)  # t_max = min(win_hi // p - need, omin)
    ok = t_min <= t_max  # if t_min > t_max: return None
    t = _max(t_min, _min(current, t_max))  # clamp(current, t_min, t_max)
    return Span(ok, t, t + need, need, z3.And(d1, d2))


def _prove(hyps: list[z3.BoolRef], goal: z3.BoolRef, timeout_ms: int) -> tuple[str, z3.ModelRef | None]:
    s = z3.Solver()
    s.set(timeout=timeout_ms)
    s.add(*hyps, z3.Not(goal))
    r = s.check()
    if r == z3.unsat:
        return "proven", None
    if r == z3.sat:
        return "counterexample", s.model()
    return f"unknown ({s.reason_unknown()})", None


def _symbols():
    p, win_lo, win_hi, need0, cur, omin, omax = z3.Ints("P win_lo win_hi K current omin omax")
    has_obs = z3.Bool("has_obstacles")
    pre = z3.And(p > 0, need0 > 0, win_lo >= 0, z3.Implies(has_obs, omin <= omax))
    return p, win_lo, win_hi, need0, cur, has_obs, omin, omax, pre


def fits_some_span(p, win_lo, win_hi, need0, has_obs, omin, omax, t, m) -> z3.BoolRef:
    """Any contiguous arrangement ``[t, t + m)`` of the float: long enough, in the window, covering O."""
    return z3.And(m >= need0, t * p >= win_lo, (t + m) * p <= win_hi,
                  z3.Implies(has_obs, z3.And(t <= omin, omax < t + m)))


def theorem_span_valid(timeout_ms: int) -> Theorem:
    th = Theorem("R3-SPAN-VALID", "the span rung 3 picks lies in its window, holds K slots, covers every "
                                  "immovable slot")
    p, win_lo, win_hi, need0, cur, has_obs, omin, omax, pre = _symbols()
    sp = float_span_z3(p, win_lo, win_hi, need0, cur, has_obs, omin, omax)
    goal = fits_some_span(p, win_lo, win_hi, need0, has_obs, omin, omax, sp.t, sp.t_end - sp.t)
    t0 = time.perf_counter()
    th.status, _ = _prove([pre, sp.defs, sp.ok], goal, timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "none (all integers, any page size)"
    return th


def theorem_exact(timeout_ms: int) -> Theorem:
    th = Theorem("R3-EXACT", "if any contiguous span of the float fits the room the compacted ends leave "
                             "(window, length >= K, covering O), rung 3 finds one")
    p, win_lo, win_hi, need0, cur, has_obs, omin, omax, pre = _symbols()
    sp = float_span_z3(p, win_lo, win_hi, need0, cur, has_obs, omin, omax)
    t, m = z3.Ints("t m")
    t0 = time.perf_counter()
    th.status, _ = _prove([pre, sp.defs, fits_some_span(p, win_lo, win_hi, need0, has_obs, omin, omax, t, m)],
                          sp.ok, timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "none (all integers, any page size)"
    return th


def theorem_room(timeout_ms: int) -> Theorem:
    th = Theorem("R3-ROOM", "rung 3 finds a span iff the aligned room [ceil((L+a)/P), floor((H-b)/P)) holds K slots "
                            "and contains every immovable slot")
    p, win_lo, win_hi, need0, cur, has_obs, omin, omax, pre = _symbols()
    sp = float_span_z3(p, win_lo, win_hi, need0, cur, has_obs, omin, omax)
    q_lo, c1 = _ceil_div(win_lo, p, "room.lo")
    q_hi, c2 = _floor_div(win_hi, p, "room.hi")
    room = z3.And(q_hi - q_lo >= need0, z3.Implies(has_obs, z3.And(q_lo <= omin, omax < q_hi)))
    t0 = time.perf_counter()
    th.status, _ = _prove([pre, sp.defs, c1, c2], sp.ok == room, timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "none (all integers, any page size)"
    return th


def _ends_symbols():
    P0, P2, hi0, lo2, e0, e2 = z3.Ints("P_low P_high low_hi high_lo grow_low grow_high")
    L, H = hi0 * P0, lo2 * P2
    pre = z3.And(P0 > 0, P2 > 0, hi0 >= 0, lo2 >= 0, e0 >= 0, e2 >= 0)
    return P0, P2, L, H, e0, e2, pre


def theorem_then_place(timeout_ms: int) -> Theorem:
    """After a rung-3 plan, ``place`` on the relaid views: the low band grows ``e0`` pages up into
    ``[L, t*P)``, the high band ``e2`` pages down into ``[t_end*P, H)``, the float takes its holes."""
    th = Theorem("R3-THEN-PLACE", "after a rung-3 plan, rung 1 places the whole demand: the ends grow into the "
                                  "room reserved for them and the float takes its own new holes")
    p, _wl, _wh, need0, cur, has_obs, omin, omax, pre = _symbols()
    P0, P2, L, H, e0, e2, pre_e = _ends_symbols()
    n_pages, d_f = z3.Ints("float_pages float_demand")  # live + withheld, and the float's demand
    win_lo, win_hi = L + e0 * P0, H - e2 * P2  # _plan_relayout: low.hi_byte + a, high.lo_byte - b
    sp = float_span_z3(p, win_lo, win_hi, need0, cur, has_obs, omin, omax)
    fit_low, d_low = _floor_div(sp.t * p - L, P0, "room_low")  # (gap.top - gap.bot) // page_bytes
    fit_high, d_high = _floor_div(H - sp.t_end * p, P2, "room_high")
    holes_f = sp.need - n_pages  # plan_float_relayout's view: the span's free slots not used by sources
    goal = z3.And(_min(e0, fit_low) == e0, _min(e2, fit_high) == e2, _min(d_f, holes_f) == d_f)
    hyps = [pre, pre_e, sp.defs, sp.ok, d_low, d_high, n_pages >= 0, d_f >= 0, need0 == n_pages + d_f]
    t0 = time.perf_counter()
    th.status, _ = _prove(hyps, goal, timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "none (all integers, any page sizes)"
    return th


def theorem_ends_only(timeout_ms: int) -> Theorem:
    th = Theorem("ENDS-ONLY-PLACE", "with the float empty and not demanded (K = 0), L + a <= H - b lets rung 1 "
                                    "place the ends' demand in the gap between them")
    P0, P2, L, H, e0, e2, pre_e = _ends_symbols()
    fit_low, d_low = _floor_div(H - L, P0, "room_low")  # low grows up first in [L, H)
    fit_high, d_high = _floor_div(H - (L + e0 * P0), P2, "room_high")  # then high grows down above it
    goal = z3.And(_min(e0, fit_low) == e0, _min(e2, fit_high) == e2)
    t0 = time.perf_counter()
    th.status, _ = _prove([pre_e, d_low, d_high, L + e0 * P0 <= H - e2 * P2], goal, timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "none (all integers, any page sizes)"
    return th


# ---------------------------------------------------------------------------------------------
# The naive statement and its counterexample, replayed in the reference

TOY = {"capacity": 2048, "page_size": 4, "max_context_len": 8}  # toy-tri: P = 64 | 512 | 256, top 8


def toy_config(capacity: int = TOY["capacity"]) -> ArenaConfig:
    return ArenaConfig(preset("toy-tri"), capacity=capacity, page_size=TOY["page_size"],
                       max_context_len=TOY["max_context_len"], recurrent_slots=32)  # demands of several states


def theorem_naive(timeout_ms: int) -> Theorem:
    th = Theorem("NAIVE-IS-FALSE", "'free bytes between the compacted ends, minus the ends' needs, aligned to "
                                   "the float's pages, hold the float's pages and demand' does NOT imply that "
                                   "rung 3 succeeds: immovable float pages must also lie in that room")
    p, win_lo, win_hi, need0, cur, has_obs, omin, omax, pre = _symbols()
    sp = float_span_z3(p, win_lo, win_hi, need0, cur, has_obs, omin, omax)
    q_lo, c1 = _ceil_div(win_lo, p, "naive.lo")
    q_hi, c2 = _floor_div(win_hi, p, "naive.hi")
    naive = q_hi - q_lo >= need0
    # look for a counterexample the toy-tri arena can hold: the low band compacted to hi0 state pages and
    # growing d0 more, the high band at lo2, the float holding exactly its pinned pages
    hi0, lo2, d0, n_pin = z3.Ints("low_hi high_lo low_demand pinned")
    toy = z3.And(p == 512, win_lo == (hi0 + d0) * 64, win_hi == lo2 * 256, hi0 >= 0, d0 >= 1, lo2 <= 8,
                 has_obs, n_pin == omax - omin + 1, need0 == n_pin, omin >= 0, omax <= 3, cur == omin,
                 hi0 * 64 <= omin * 512, (omax + 1) * 512 <= lo2 * 256)
    t0 = time.perf_counter()
    status, model = _prove([pre, sp.defs, c1, c2, toy, naive], sp.ok, timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "counterexample searched in the toy-tri geometry so the reference can replay it"
    if status != "counterexample" or model is None:
        th.status = f"no counterexample ({status})"
        return th
    v = {str(d): model.eval(d, model_completion=True).as_long() for d in (hi0, lo2, d0, omin, omax)}
    try:
        th.detail = replay_naive(v["low_hi"], v["high_lo"], v["low_demand"], v["omin"], v["omax"])
        th.status = "counterexample (expected)"
    except AssertionError as e:
        th.status = f"counterexample did not replay: {e}"
    return th


def replay_naive(low_hi: int, high_lo: int, low_demand: int, omin: int, omax: int) -> str:
    """The toy-tri arena of the counterexample: the low band ``[0, low_hi)`` and the high band ``[high_lo, 8)``
    full, the float's slots ``omin..omax`` live and written (pinned); demand ``low_demand`` state pages."""
    a = Arena(toy_config())
    order = a.order
    fill = {order[0]: range(0, low_hi), order[1]: range(omin, omax + 1), order[2]: range(high_lo, 8)}
    vids = itertools.count()
    for cls, slots in fill.items():
        band = a.bands[cls]
        if slots:
            band.lo, band.hi = slots.start, slots.stop
        for s in slots:
            v = next(vids)
            band.live[s] = v
            a.v2p[v], a.gen[v] = (cls, s), v
    a._next_vid = a._next_gen = len(a.v2p)
    a.owners = {"r": {c: {v: None for v, (cc, _s) in a.v2p.items() if cc == c} for c in order}}
    a.refs = Counter(dict.fromkeys(a.v2p, 1))
    pinned = tuple(Hold(order[1], s, a.bands[order[1]].live[s], a.gen[a.bands[order[1]].live[s]])
                   for s in range(omin, omax + 1))
    a.users = {"w": User(UserKind.FORWARD_WRITE, pinned)}
    a.writers = Counter({(h.cls, h.slot): 1 for h in pinned})
    check_all(a)
    P = a.bands[order[1]].page_bytes
    L = (low_hi + low_demand) * a.bands[order[0]].page_bytes
    H = high_lo * a.bands[order[2]].page_bytes
    q_lo, q_hi = -(-L // P), H // P
    naive_room = q_hi - q_lo
    assert naive_room >= omax - omin + 1, "the naive statement does not predict success here"
    assert not q_lo <= omin, "the pinned pages lie in the room: not a counterexample"
    try:
        plan = a.ladder({order[0]: low_demand})
    except AdmissionRejectedError as e:
        return (f"toy-tri 2048 B: {order[0]} band [0, {low_hi}) needs {low_demand} more pages, {order[1]} slots "
                f"{omin}..{omax} held by a writer, {order[2]} band [{high_lo}, 8): the aligned room "
                f"[{q_lo}, {q_hi}) holds {naive_room} >= K = {omax - omin + 1} float pages but not the pinned "
                f"slots; Arena.ladder rejects, short {e.shortfall} (rightly: the low band cannot grow past them)")
    raise AssertionError(f"the ladder admitted it ({plan.rung.name}): not a counterexample")


# ---------------------------------------------------------------------------------------------
# Exhaustive, bounded: the reference's ladder on every small state


@dataclass(frozen=True)
class Bound:
    """States of the toy-tri arena (capacity 2048 B, page_size 4): each band a pattern of slot states from its
    anchor outward (L live, R live + reader, W live + writer, H hole, X withheld), settled (no hole on an edge
    a band grows from), and every demand of the grid."""

    end_patterns: int = 2  # longest pattern of each end band
    float_patterns: int = 2  # longest float pattern (at every position of its 4-slot grid)
    low_fill: tuple[int, ...] = (0, 7)  # live pages below the low band's pattern
    demands: tuple[tuple[int, ...], ...] = ((0, 1, 6), (0, 1, 2), (0, 1, 3))  # low, float, high
    symbols: str = "LRWHX"

    def describe(self) -> str:
        return (f"toy-tri 2048 B: end patterns <= {self.end_patterns} slots over {self.symbols} (low band "
                f"after {self.low_fill} live pages), float patterns <= {self.float_patterns} at every position, "
                f"demands {self.demands}")


# CI: two sweeps, one around rung 3 (every float pattern up to 2 slots) and one around rung 2 (end patterns up
# to 2 slots next to a low band grown close to the float); nightly: everything at once.
LADDER_BOUNDS = (Bound(end_patterns=1, float_patterns=2, low_fill=(0, 7), demands=((0, 6), (0, 2), (0, 3))),
                 Bound(end_patterns=2, float_patterns=1, low_fill=(7,), demands=((0, 6), (0, 1), (0, 3))))
NIGHTLY_BOUND = Bound()
LADDER_BOUND = NIGHTLY_BOUND


def _patterns(n: int, symbols: str, inner_holes: bool = True) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    for k in range(1, n + 1):
        for pat in itertools.product(symbols, repeat=k):
            if pat[-1] != "H":
                out.append(pat)
    return out


class _Builder:
    """Sets a toy arena's fields to a pattern state (much faster than driving the API)."""

    def __init__(self) -> None:
        self.a = Arena(toy_config())

    def build(self, low: tuple[str, ...], flt: tuple[int, tuple[str, ...]] | None, high: tuple[str, ...]) -> Arena:
        a = self.a
        order = a.order
        a.v2p, a.gen, a.refs = {}, {}, Counter()
        a.users, a.readers, a.writers, a.content = {}, Counter(), Counter(), {}
        a._free_vids, held = [], {c: {} for c in order}
        reads, writes = [], []
        nv = itertools.count()
        spans = {order[0]: (0, len(low), list(enumerate(low))),
                 order[2]: (8 - len(high), 8, [(7 - i, s) for i, s in enumerate(high)])}
        if flt is not None:
            lo, pat = flt
            spans[order[1]] = (lo, lo + len(pat), [(lo + i, s) for i, s in enumerate(pat)])
        else:
            spans[order[1]] = (0, 0, [])
        for cls, (lo, hi, slots) in spans.items():
            b = a.bands[cls]
            b.lo, b.hi, b.live, b.withheld = lo, hi, {}, set()
            b.holes.clear()
            for s, sym in slots:
                if sym == "H":
                    b.holes.add(s)
                elif sym == "X":
                    b.withheld.add(s)
                    v = next(nv)
                    a._free_vids.append(v)
                    reads.append(Hold(cls, s, v, 10_000 + v))
                else:
                    v = next(nv)
                    b.live[s] = v
                    a.v2p[v], a.gen[v] = (cls, s), v
                    held[cls][v] = None
                    a.refs[v] = 1
                    if sym == "R":
                        reads.append(Hold(cls, s, v, v))
                    elif sym == "W":
                        writes.append(Hold(cls, s, v, v))
        a._next_vid = a._next_gen = 20_000
        a.owners = {"o": held}
        if reads:
            a.users["r"] = User(UserKind.FORWARD_READ, tuple(reads))
            a.readers = Counter((h.cls, h.slot) for h in reads)
        if writes:
            a.users["w"] = User(UserKind.FORWARD_WRITE, tuple(writes))
            a.writers = Counter((h.cls, h.slot) for h in writes)
        a.stats = type(a.stats)()
        return a


def fits(a: Arena, views: list[BandView], demand: dict[str, int]) -> bool:
    """The completeness statement's ``Fits``, by brute force over every start slot of the float's grid."""
    order = a.order
    low, high, f = views[0], views[-1], a.bands[order[1]]
    L = low.hi_byte + max(0, demand.get(order[0], 0) - low.hole_count) * low.page_bytes
    H = high.lo_byte - max(0, demand.get(order[2], 0) - high.hole_count) * high.page_bytes
    K = len(f.live) + len(f.withheld) + demand.get(order[1], 0)
    if K == 0:
        return L <= H
    obstacles = sorted(f.withheld | {s for s in f.live if a.readers[(f.name, s)] or a.writers[(f.name, s)]})
    P = f.page_bytes
    for t in range(0, f.top + 1):
        for m in range(K, f.top - t + 1):
            if t * P >= L and (t + m) * P <= H and all(t <= o < t + m for o in obstacles):
                return True
    return False


def clone(a: Arena) -> Arena:
    """A copy of ``a``'s mutable state (far cheaper than ``copy.deepcopy``; configuration and layouts shared)."""
    b = copy.copy(a)
    b.bands = {}
    for n, band in a.bands.items():
        nb = copy.copy(band)
        nb.live, nb.holes, nb.withheld = dict(band.live), SortedList(band.holes), set(band.withheld)
        b.bands[n] = nb
    b.v2p, b.gen, b.refs = dict(a.v2p), dict(a.gen), Counter(a.refs)
    b.owners = {o: {c: dict(vs) for c, vs in held.items()} for o, held in a.owners.items()}
    b.users, b.readers, b.writers = dict(a.users), Counter(a.readers), Counter(a.writers)
    b.content = {k: dict(v) for k, v in a.content.items()}
    b._free_vids = list(a._free_vids)
    b.stats = copy.deepcopy(a.stats)
    return b


def check_plan(a: Arena, plan: Plan, demand: dict[str, int]) -> str | None:
    """The plan as steps of the symbolic model, each guard checked, applied to a copy; then the rung rules and
    every predicate. Returns the first problem, or None."""
    order = a.order
    ends = {order[0], order[-1]}
    if plan.rung is Rung.REUSE and (plan.moves or plan.total_bytes_moved):
        return "rung 1 moved pages"
    if plan.rung is Rung.COMPACT and any(m.cls not in ends for m in plan.moves):
        return "rung 2 moved a float page"
    if plan.rung is Rung.RELAYOUT and any(m.cls not in ends and m.cls not in plan.spans for m in plan.moves):
        return "rung 3 moved a page of a band without a target span"
    if any(cls in ends for cls in plan.spans):
        return "a target span for an end band"
    b = clone(a)
    for m in plan.moves:  # rung-2 moves: `move` / `compact` steps
        if m.cls in plan.spans:
            continue
        band = b.bands[m.cls]
        if m.cls not in ends or plan.rung is Rung.REUSE:
            return f"{m} is not an end-band move of rung 2"
        if m.src not in band.live or b.writers[(m.cls, m.src)] or m.dst not in band.holes:
            return f"{m}: not a move step (source live without writer, destination a hole)"
        b._move(m)
    for cls in (order[0], order[-1]):  # `absorb` steps
        b.bands[cls].absorb_boundary_holes()
    for cls, (t, t_end) in plan.spans.items():  # rung 3: relayout_grow, relayout_move, relayout_trim steps
        band = b.bands[cls]
        P = band.page_bytes
        below, above = b.bands[order[0]].hi_byte, b.bands[order[-1]].lo_byte
        # the model grows the span one adjacent gap slot at a time up to the union of current and target spans
        # (Arena._retarget_float takes the union at once and skips the slots between them, which end as gap)
        lo_u, hi_u = (t, t_end) if band.empty else (min(band.lo, t), max(band.hi, t_end))
        new = [s for s in range(lo_u, hi_u) if not band.in_span(s)]
        if new and not (min(new) * P >= below and (max(new) + 1) * P <= above):
            return f"{cls}: target [{t}, {t_end}) grows outside the gap [{below}, {above})"
        moves = [m for m in plan.moves if m.cls == cls]
        for m in moves:
            if b.readers[(cls, m.src)] or b.writers[(cls, m.src)]:
                return f"{m}: rung 3 moves a page with a user"
            if m.src not in band.live or not (m.dst in band.holes or (t <= m.dst < t_end
                                                                     and not band.in_span(m.dst))):
                return f"{m}: not a relayout move (live source, free destination in the target)"
        band.holes.update(new)  # relayout_grow steps
        band.lo, band.hi = lo_u, hi_u
        for m in moves:
            b._move(m)
        outside = [s for s in range(band.lo, band.hi) if not t <= s < t_end]
        if any(s not in band.holes for s in outside):
            return f"{cls}: the trim to [{t}, {t_end}) drops a slot that is not a hole"
        b._retarget_float(band, t, t_end, [])  # relayout_trim: only holes are left outside the target
    new: dict[str, dict[int, None]] = {c: {} for c in order}
    for cls in order:  # admit / extend steps: a hole, or the slot next to a frontier inside the gap
        for s in plan.placements.get(cls, ()):
            band = b.bands[cls]
            if band.in_span(s):
                if s not in band.holes or b.readers[(cls, s)] or b.writers[(cls, s)]:
                    return f"{cls}:{s}: placement on a slot that is not a free hole"
            else:
                P = band.page_bytes
                lo_n = max((x.hi_byte for x in b._chain()[:order.index(cls)] if not x.empty), default=0)
                hi_n = min((x.lo_byte for x in b._chain()[order.index(cls) + 1:] if not x.empty),
                           default=b.capacity)
                adjacent = band.empty or s in (band.hi, band.lo - 1)
                if not adjacent or s * P < lo_n or (s + 1) * P > hi_n:
                    return f"{cls}:{s}: placement outside the gap next to the frontier"
            v = b._bind_new(band, s)
            new[cls][v] = None
            b.refs[v] += 1
    for band in b._chain():
        band.absorb_boundary_holes()
    b.owners["new"] = new
    real = clone(a)
    use_plan(real, plan)
    real.admit("new", demand)  # the arena's own admit: plan validation, application, bookkeeping
    if real.snapshot() != b.snapshot():
        return "the staged steps and Arena.admit disagree"
    try:
        check_all(real)
    except InvariantViolation as e:
        return f"the applied plan breaks {e.inv}: {e}"
    return None


@dataclass
class Sweep:
    states: int = 0
    cases: int = 0
    by_rung: Counter = field(default_factory=Counter)
    rejected: int = 0
    relayout_none: int = 0
    full_compact: int = 0  # cases full-compaction admits at rung 2 (the default then admits too, moving no more)
    moves_saved: int = 0  # end-band moves the default skips in those cases
    problems: list[str] = field(default_factory=list)


def check_state(state: Arena, demands: list[dict[str, int]], out: Sweep, where0: str,
                limit_problems: int = 5) -> bool:
    """Every demand on one state: Fits against rung 3, the ladder against the full-compaction policy, each plan as
    the model's steps (``check_plan``).  Problems go to ``out``; False once there are ``limit_problems``."""
    order = state.order
    flt = None if state.bands[order[1]].empty else True
    low_p, high_p = state._end_packs()  # the default's whole rung-2 sequences: rung 3's views
    mid = [BandView.of(b) for b in state._chain()[1:-1]]
    views_c = [low_p.view(low_p.extend()), *mid, high_p.view(high_p.extend())]
    for demand in demands:
        out.cases += 1
        ok_fit = fits(state, views_c, demand)
        where = f"{where0}, demand {demand}"
        if flt is not None or demand.get(order[1]):
            exact = state._plan_relayout(list(views_c), demand, fewest=True) is not None
            if exact != ok_fit:
                out.problems.append(f"rung 3 {'found' if exact else 'missed'} a plan but Fits is {ok_fit}: {where}")
            out.relayout_none += not exact
        try:
            plan = state.ladder(demand)
        except AdmissionRejectedError:
            plan = None
        full = None
        if plan is None or plan.rung is not Rung.REUSE:  # (rung 1 is the same in both policies)
            with contextlib.suppress(AdmissionRejectedError):
                full = state.ladder(demand, full=True)  # the full-compaction policy's plan
        if plan is None:
            out.rejected += 1
            if ok_fit or full is not None:
                out.problems.append(f"{'Fits' if ok_fit else 'full-compaction admits'} but the ladder rejects: "
                                    f"{where}")
        else:
            out.by_rung[plan.rung.name] += 1
            if full is not None and full.rung is Rung.COMPACT:
                out.full_compact += 1
                ends = {order[0], order[-1]}
                sized = [m for m in plan.moves if m.cls in ends]
                flush = [m for m in full.moves if m.cls in ends]
                if len(sized) > len(flush) or any(m not in flush for m in sized):
                    out.problems.append(f"the default's rung-2 moves are not a subset of the full flush's: {where}")
                out.moves_saved += len(flush) - len(sized)
            problem = check_plan(state, plan, demand)
            if problem:
                out.problems.append(f"{problem}: {where}")
        if len(out.problems) >= limit_problems:
            return False
    return True


def sweep(bound: Bound = LADDER_BOUND, limit_problems: int = 5) -> Sweep:
    """Every state and demand of the bound through ``Arena.ladder``."""
    out = Sweep()
    builder = _Builder()
    a = builder.a
    order = a.order
    P = {c: a.bands[c].page_bytes for c in order}
    lows = [("L",) * k + p for k in bound.low_fill for p in _patterns(bound.end_patterns, bound.symbols)]
    highs = _patterns(bound.end_patterns, bound.symbols)
    floats: list[tuple[int, tuple[str, ...]] | None] = [None]
    for pat in _patterns(bound.float_patterns, bound.symbols):
        if pat and pat[0] != "H":
            floats += [(lo, pat) for lo in range(0, a.bands[order[1]].top - len(pat) + 1)]
    demands = [d for d in itertools.product(*bound.demands) if any(d)]
    for low in lows:
        for high in highs:
            for flt in floats:
                lo_f, hi_f = (flt[0], flt[0] + len(flt[1])) if flt else (None, None)
                low_b, high_b = len(low) * P[order[0]], (8 - len(high)) * P[order[2]]
                if low_b > high_b or (flt and (low_b > lo_f * P[order[1]] or hi_f * P[order[1]] > high_b)):
                    continue
                state = builder.build(low, flt, high)
                try:
                    check_all(state)
                except InvariantViolation as e:
                    out.problems.append(f"bound state {low} {flt} {high} is invalid: {e}")
                    continue
                out.states += 1
                if not check_state(state, [{c: n for c, n in zip(order, d3) if n} for d3 in demands], out,
                                   f"low {low}, float {flt}, high {high}", limit_problems):
                    return out
    return out


def theorem_sweep(bounds: tuple[Bound, ...] = LADDER_BOUNDS, jobs: int = 2) -> Theorem:
    th = Theorem("LADDER-EXHAUSTIVE",
                 "the reference's ladder on every state and demand of the bound: each plan is a sequence of the "
                 "model's proven steps (guards met, equal to Arena.admit), rung 1 moves 0 B, rung 2 only end-band "
                 "pages within their band, rung 3 only float pages; the applied plan passes every predicate; "
                 "Fits => admitted, and rung 3 finds a plan iff Fits")
    t0 = time.perf_counter()
    sweeps = None
    if jobs > 1 and len(bounds) > 1:
        import multiprocessing as mp

        try:
            ctx = mp.get_context("fork")
        except ValueError:  # pragma: no cover - no fork on this platform
            ctx = None
        if ctx is not None:
            with ctx.Pool(min(jobs, len(bounds))) as pool:
                sweeps = pool.map(sweep, bounds)
    if sweeps is None:
        sweeps = [sweep(b) for b in bounds]
    th.seconds = time.perf_counter() - t0
    th.bound = " + ".join(b.describe() for b in bounds)
    by_rung: Counter = Counter()
    for sw in sweeps:
        by_rung.update(sw.by_rung)
    problems = [p for sw in sweeps for p in sw.problems]
    rungs = ", ".join(f"{k} {v}" for k, v in sorted(by_rung.items()))
    th.detail = (f"{sum(s.states for s in sweeps)} states, {sum(s.cases for s in sweeps)} cases: admitted by rung "
                 f"{rungs}; rejected {sum(s.rejected for s in sweeps)}; rung 3 found no span in "
                 f"{sum(s.relayout_none for s in sweeps)}; full-compaction admits {sum(s.full_compact for s in sweeps)}"
                 f" at rung 2, the default too, {sum(s.moves_saved for s in sweeps)} moves fewer")
    cases = sum(s.cases for s in sweeps)
    th.status = "proven" if not problems and cases else "FAILED: " + " | ".join(problems[:3])
    return th
