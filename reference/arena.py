"""§Operations: the unified arena (spec/arena.md §Operations).

One byte range ``[0, capacity)``; bands in chain order (low end, floats, high
end); virtual page ids bound to physical slots; owners (requests, the prefix
cache) holding virtual pages with reference counts; a ledger of users that hold
physical addresses.  Every operation validates everything first and mutates
only once it cannot fail, so a raised ``ArenaError`` leaves the state
bit-identical (INV-REFUSAL-IS-NOOP).  The one write that precedes a check is a
free followed by the policy's free-time plan, which the policy plans on the
freed state: that free works on copies and puts the originals back if the plan
is refused.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from sortedcontainers import SortedList

from kvarena.reference.bands import Band, BandView
from kvarena.reference.ladder import (
    EndPack,
    Placement,
    place,
    plan_compaction,
    plan_float_fewest,
    plan_float_relayout,
)
from kvarena.reference.policy import Ladder, Policy, takes_below
from kvarena.reference.validate import policy_call, validate_plan
from kvarena.spec.errors import (
    AdmissionRejectedError,
    CapacityTooSmallError,
    InvalidArgumentError,
    UnknownPageError,
)
from kvarena.spec.guards import (
    ceil_div,
    check_below,
    check_bound,
    check_class,
    check_demand,
    check_hashable_id,
    check_ids,
    check_out_width,
    check_tag,
    check_tokens,
    guard_acquire,
    guard_admit,
    guard_budget,
    guard_copy_state,
    guard_drop,
    guard_extend,
    guard_free,
    guard_max_moves,
    guard_release,
    guard_row,
    guard_share,
    guard_slide,
    is_int,
)
from kvarena.spec.layout import Kind, entries_per_page, entry_layout
from kvarena.spec.models import ArenaConfig, Shape, chain, worst_case_demand
from kvarena.spec.pools import float_hints  # the split-pool sizing (§Split-pool baseline): where a float reopens
from kvarena.spec.sizing import least, size_ends
from kvarena.spec.types import Admission, Hold, Mode, Move, Plan, Role, Rung, User, UserKind

PhysPage = tuple[str, int]  # (class name, slot on the class's page grid)


@dataclass
class Stats:
    admitted: int = 0
    pages_placed: int = 0
    moves: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})
    bytes_moved: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})
    rung_used: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0, 2: 0, 3: 0})


class Arena:
    """The reference allocator.  Deterministic: same state and operation, same result."""

    ANCHORED_ENDS = True  # the end bands sit on the arena's ends (False for the split baseline)

    def __init__(self, config: ArenaConfig, policy: Policy | None = None) -> None:
        config.validate()
        self.config = config
        self.policy: Policy = policy if policy is not None else Ladder()
        self.capacity = config.capacity
        self.classes = {c.name: c for c in config.model.classes}
        self.shape = Shape.of(config)  # what the guards read of the configuration
        self.layouts = {n: entry_layout(c) for n, c in self.classes.items()}
        order = chain(config.model)
        self.bands: dict[str, Band] = {}
        for i, c in enumerate(order):
            role = Role.LOW if i == 0 else Role.HIGH if i == len(order) - 1 else Role.FLOAT
            self.bands[c.name] = Band(c.name, role, config.page_bytes(c.name), config.capacity)
        self.order = [c.name for c in order]
        self.hints = self._float_hints()
        # virtual pages
        self.v2p: dict[int, PhysPage] = {}
        self.gen: dict[int, int] = {}  # vid -> allocation serial (tells a moved page from a reused id)
        self._next_vid = 0
        self._free_vids: list[int] = []
        self._next_gen = 0
        # owners
        self.owners: dict[str, dict[str, dict[int, None]]] = {}  # owner -> class -> ordered set of vids
        self.refs: Counter[int] = Counter()
        # ledger
        self.users: dict[str, User] = {}
        self.readers: Counter[PhysPage] = Counter()
        self.writers: Counter[PhysPage] = Counter()
        # data: content tags per physical page, {(entry, row): tag}
        self.content: dict[PhysPage, dict[tuple[int, int], int]] = {}
        self.stats = Stats()
        self._check_floor()

    # =========================================================================================
    # Construction helpers

    def _float_hints(self) -> dict[str, int]:
        """Where an empty float starts: the byte where the split-pool layout would put it."""
        return float_hints(self.config)

    def _check_floor(self) -> None:
        worst = worst_case_demand(self.config)
        fit = place([BandView.of(b) for b in self._chain()], worst, self.hints)
        if not fit.ok:
            need = sum(n * self.bands[c].page_bytes for c, n in worst.items())
            raise CapacityTooSmallError(
                f"the arena of {self.capacity} B cannot hold one worst-case request of "
                f"{self.config.context_len} tokens ({need} B: {worst}); raise capacity to at least "
                f"{need + max(b.page_bytes for b in self.bands.values())} B or lower max_context_len")

    def _chain(self) -> list[Band]:
        return [self.bands[n] for n in self.order]

    # =========================================================================================
    # The guards (spec/guards.py, one sequence per operation for every implementation) ask these

    def class_of(self, vid: int) -> str | None:
        page = self.v2p.get(vid)
        return None if page is None else page[0]

    def pages_of(self, owner: object) -> dict[str, dict[int, None]] | None:
        return self.owners.get(owner)

    def user_live(self, user: object) -> bool:
        return user in self.users

    def _check_demand(self, demand: Mapping[str, int]) -> dict[str, int]:
        return check_demand(self.shape, demand)

    def _check_vids(self, vids: Sequence[int], what: str) -> list[int]:
        return check_bound(self, vids, what)

    def _is_state(self, cls: str) -> bool:
        return self.classes[cls].kind is Kind.RECURRENT

    def _owner(self, owner: str) -> dict[str, dict[int, None]]:
        guard_free(self.shape, self, owner)  # a known owner: the one check every owner lookup makes
        return self.owners[owner]

    # =========================================================================================
    # Admission: admit / extend

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = (),
              below: Mapping[str, int] | None = None) -> Admission:
        """Register ``owner`` with new pages per ``demand`` plus existing ``shared`` pages (prefix hit); ``below``:
        the engine's placement limit per end-band class, in bytes (§Placement limit)."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        d, shared, limits = guard_admit(self.shape, self, owner, demand, shared, below)
        plan = self._plan_admission(d, limits)
        pages = self._apply(plan)
        held: dict[str, dict[int, None]] = {c: {} for c in self.order}
        for v in shared:
            held[self.v2p[v][0]][v] = None
            self.refs[v] += 1
        for c, vs in pages.items():
            held[c].update(dict.fromkeys(vs))
            self.refs.update(vs)
        self.owners[owner] = held
        self.stats.admitted += 1
        return Admission({c: tuple(vs) for c, vs in pages.items()}, plan)

    def extend(self, owner: str, demand: Mapping[str, int], below: Mapping[str, int] | None = None) -> Admission:
        """More pages for an existing owner (decode growth); ``below`` as in ``admit``."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        d, limits = guard_extend(self.shape, self, owner, demand, below)
        held = self.owners[owner]
        plan = self._plan_admission(d, limits)
        pages = self._apply(plan)
        for c, vs in pages.items():
            held[c].update(dict.fromkeys(vs))
            self.refs.update(vs)
        return Admission({c: tuple(vs) for c, vs in pages.items()}, plan)

    def plan_admission(self, demand: Mapping[str, int], below: Mapping[str, int] | None = None) -> Plan:
        """What admitting ``demand`` would do, without doing it (read-only)."""
        d = check_demand(self.shape, demand)
        return self._plan_admission(d, check_below(below, self.shape.ends, self.capacity))

    def _plan_admission(self, demand: dict[str, int], limits: dict[str, int] | None = None) -> Plan:
        """The policy's plan for a validated demand, checked against the spec's rules before use; ``limits``
        (checked placement-limit slots) go to the policy as its ``below`` argument (one that takes none ignores
        them, as ``best-fit`` does)."""
        if not demand:
            return Plan(Rung.NONE)
        below = limits or {}
        if takes_below(self.policy):
            plan = policy_call("plan", lambda: self.policy.plan(self, demand, below))  # a crash: a typed PlanError
        else:
            plan = policy_call("plan", lambda: self.policy.plan(self, demand))
        validate_plan(self, plan, demand)
        return plan

    def ladder(self, demand: dict[str, int], below: Mapping[str, int] | None = None, *,
               max_rung: Rung = Rung.RELAYOUT, relayout_budget: int | None = None, full: bool = False) -> Plan:
        """The spec's ladder (read-only). Raises AdmissionRejectedError with the shortfall if no rung fits.

        ``below``: placement-limit slots per end-band class (checked; §Placement limit), rung 1's alone.
        ``max_rung`` and ``relayout_budget`` (bytes a relayout may move) let policies cut the ladder short;
        ``full`` packs the end bands whole and relayouts by the nearest span (the ``full-compaction`` policy).
        """
        limits = {} if full or below is None else below  # the full flush is SGLang's: it takes no placement limit
        views = [BandView.of(b, limits.get(b.name)) for b in self._chain()]
        fit = place(views, demand, self.hints)
        if fit.ok:
            return self._plan(Rung.REUSE, [], fit)
        if limits:  # the limit is rung 1's alone: rungs 2-3 plan on the bands as they are
            views = [BandView.of(b) for b in self._chain()]
        if full:
            return self._full_ladder(views, demand, max_rung, relayout_budget)

        low, high = self._end_packs()

        def at(vs: list[BandView], k_low: int, k_high: int) -> list[BandView]:
            return [low.view(k_low), *vs[1:-1], high.view(k_high)]

        def fits(vs: list[BandView]):
            return lambda k_low, k_high: place(at(vs, k_low, k_high), demand, self.hints).ok

        if max_rung >= Rung.COMPACT:
            k = size_ends(fits(views), low, high)
            if k is not None:
                return self._plan(Rung.COMPACT, self._end_moves(low, high, *k),
                                  place(at(views, *k), demand, self.hints))
        n_low, n_high = low.extend(), high.extend()
        views = at(views, n_low, n_high)
        fit = place(views, demand, self.hints)
        relayout = self._plan_relayout(views, demand, fewest=True) if max_rung >= Rung.RELAYOUT else None
        if relayout is not None:
            moves3, views3, spans = relayout
            fit3 = place(views3, demand, self.hints)
            within = relayout_budget is None or sum(self.bands[m.cls].page_bytes for m in moves3) <= relayout_budget
            if fit3.ok and within:  # the ends move only what the relaid float still needs of them
                ok = fits(views3)
                k_high = least(lambda k: ok(n_low, k), high, first=0)
                k_low = least(lambda k: ok(k, k_high), low, first=0)
                return self._plan(Rung.RELAYOUT, self._end_moves(low, high, k_low, k_high),
                                  place(at(views3, k_low, k_high), demand, self.hints), moves3, spans)
            fit = fit3
        raise self._rejection(demand, fit)

    def _full_ladder(self, views: list[BandView], demand: dict[str, int], max_rung: Rung,
                     relayout_budget: int | None) -> Plan:
        """Rungs 2 and 3 as SGLang's urgent flush: both end bands packed whole, then the nearest float span."""
        moves2, views = self._plan_compact_ends(views, budget=None)
        fit = place(views, demand, self.hints)
        if moves2 and max_rung >= Rung.COMPACT and fit.ok:
            return self._plan(Rung.COMPACT, moves2, fit)
        relayout = self._plan_relayout(views, demand) if max_rung >= Rung.RELAYOUT else None
        if relayout is not None:
            moves3, views3, spans = relayout
            fit3 = place(views3, demand, self.hints)
            within = relayout_budget is None or sum(self.bands[m.cls].page_bytes for m in moves3) <= relayout_budget
            if fit3.ok and within:
                return self._plan(Rung.RELAYOUT, moves2, fit3, moves3, spans)
            fit = fit3
        raise self._rejection(demand, fit)

    def _end_packs(self) -> tuple[EndPack, EndPack]:
        """The end bands' move sequences for shortfall-sized compaction: sources beyond the barrier, farthest
        first, up to the first with a reader (the moves that retract a frontier now)."""
        low, high = self.bands[self.order[0]], self.bands[self.order[-1]]
        return (EndPack(low, self._barrier(low), self._has_readers(low.name), stop_at_readers=True),
                EndPack(high, self._barrier(high), self._has_readers(high.name), stop_at_readers=True))

    @staticmethod
    def _end_moves(low: EndPack, high: EndPack, k_low: int, k_high: int) -> list[Move]:
        return [Move(low.band.name, s, d) for s, d in low.pairs[:k_low]] + \
            [Move(high.band.name, s, d) for s, d in high.pairs[:k_high]]

    def _rejection(self, demand: Mapping[str, int], fit: Placement) -> AdmissionRejectedError:
        short = {c: n for c, n in fit.shortfall.items() if n}
        nbytes = sum(n * self.bands[c].page_bytes for c, n in short.items())
        return AdmissionRejectedError(
            f"no rung of the ladder fits {dict(demand)}: short {short} pages ({nbytes} B) after "
            "compaction and relayout; evict cache-only pages (drop) or retract a request, then retry",
            short, nbytes)

    def _plan(self, rung: Rung, moves2: list[Move], fit: Placement, moves3: Sequence[Move] = (),
              spans: Mapping[str, tuple[int, int]] | None = None) -> Plan:
        bytes_moved = {}
        if moves2:
            bytes_moved[2] = sum(self.bands[m.cls].page_bytes for m in moves2)
        if moves3:
            bytes_moved[3] = sum(self.bands[m.cls].page_bytes for m in moves3)
        return Plan(rung, tuple(moves2) + tuple(moves3),
                    {c: tuple(s) for c, s in fit.slots.items() if s}, bytes_moved, dict(spans or {}))

    # -- rung 2 / rung 3 planning over views ----------------------------------------------------

    def _barrier(self, band: Band) -> int | None:
        """The farthest slot from the band's anchor that cannot move: withheld, or held by a writer."""
        pinned = [s for (c, s) in self.writers if c == band.name] + list(band.withheld)
        if not pinned:
            return None
        return max(pinned) if band.role is Role.LOW else min(pinned)

    def _has_readers(self, cls: str):
        return lambda s: self.readers[(cls, s)] > 0

    def _plan_compact_ends(self, views: list[BandView], budget: int | None) -> tuple[list[Move], list[BandView]]:
        moves: list[Move] = []
        views = list(views)
        for i in (0, len(views) - 1):
            band = self.bands[views[i].name]
            left = None if budget is None else budget - len(moves)
            comp = plan_compaction(band, self._barrier(band), self._has_readers(band.name), left)
            moves.extend(Move(band.name, s, d) for s, d in comp.moves)
            views[i] = comp.view
        return moves, views

    def _plan_relayout(self, views: list[BandView], demand: Mapping[str, int], fewest: bool = False):
        """Rung 3: float bands move within the room the compacted ends leave them (``fewest``: the default's
        target span, which moves the fewest float pages; else the full-compaction policy's nearest span)."""
        floats = [i for i in range(1, len(views) - 1)
                  if not views[i].empty or demand.get(views[i].name, 0)]
        if not floats:
            return None
        low, high = views[0], views[-1]
        a = max(0, demand.get(low.name, 0) - low.hole_count) * low.page_bytes
        b = max(0, demand.get(high.name, 0) - high.hole_count) * high.page_bytes
        win_lo = low.hi_byte + a
        views = list(views)
        moves: list[Move] = []
        spans: dict[str, tuple[int, int]] = {}
        for k, i in enumerate(floats):
            band = self.bands[views[i].name]
            nxt = next((views[j] for j in floats[k + 1:] if not views[j].empty), None)
            win_hi = nxt.lo_byte if nxt is not None else high.lo_byte - b
            if win_hi < win_lo:
                return None
            obstacles = sorted(band.withheld | self._used_live(band))
            r = (plan_float_fewest if fewest else plan_float_relayout)(
                band, win_lo, win_hi, demand.get(band.name, 0), self.hints.get(band.name, 0), obstacles)
            if r is None:
                return None
            moves.extend(Move(band.name, s, d) for s, d in r.moves)
            views[i] = r.view
            spans[band.name] = r.span
            win_lo = r.span[1] * band.page_bytes if r.span[1] > r.span[0] else win_lo
        return moves, views, spans

    def _used_live(self, band: Band) -> set[int]:
        """Live slots of ``band`` that a ledger user holds (from the use counts: O(pages in use))."""
        return {s for (c, s) in (*self.readers, *self.writers) if c == band.name and s in band.live}

    def _in_use(self, page: PhysPage) -> bool:
        return self.readers[page] > 0 or self.writers[page] > 0

    # =========================================================================================
    # Applying a plan (the only place pages are placed and moved)

    def _apply(self, plan: Plan) -> dict[str, list[int]]:
        spans = plan.spans
        rung3 = {m for m in plan.moves if m.cls in spans}
        for m in plan.moves:
            if m not in rung3:
                self._move(m)
        for b in (self.bands[self.order[0]], self.bands[self.order[-1]]) if plan.moves else ():
            b.absorb_boundary_holes()
        for cls, (t, t_end) in spans.items():
            self._retarget_float(self.bands[cls], t, t_end, [m for m in plan.moves if m.cls == cls])
        for m in plan.moves:
            rung = 3 if m in rung3 else 2
            self.stats.moves[rung] += 1
            self.stats.bytes_moved[rung] += self.bands[m.cls].page_bytes
        pages: dict[str, list[int]] = {}
        for cls in self.order:
            slots = plan.placements.get(cls, ())
            if slots:
                pages[cls] = self._bind_all(self.bands[cls], slots)
        for b in self._chain():
            b.absorb_boundary_holes()
        self.stats.rung_used[int(plan.rung)] += 1
        self.stats.pages_placed += sum(len(v) for v in pages.values())
        return pages

    def _retarget_float(self, band: Band, t: int, t_end: int, moves: list[Move]) -> None:
        """Set a float's span to [t, t_end): new slots start as holes, its pages outside move in."""
        if t_end <= t:
            return
        if band.empty:
            band.lo, band.hi = t, t
        for s in range(t, min(t_end, band.lo)):
            band.holes.add(s)
        for s in range(max(t, band.hi), t_end):
            band.holes.add(s)
        band.lo, band.hi = min(band.lo, t), max(band.hi, t_end)
        for m in moves:
            self._move(m)
        for s in list(band.holes.irange(band.lo, t - 1)) + list(band.holes.irange(t_end, band.hi - 1)):
            band.holes.remove(s)
        band.lo, band.hi = t, t_end

    def _move(self, m: Move) -> None:
        band = self.bands[m.cls]
        vid = band.live.pop(m.src)
        band.holes.remove(m.dst)
        band.live[m.dst] = vid
        self.v2p[vid] = (m.cls, m.dst)
        data = self.content.pop((m.cls, m.src), None)
        if data is not None:
            self.content[(m.cls, m.dst)] = data
        self._vacate(band, m.src)

    def _vacate(self, band: Band, slot: int) -> None:
        """A slot whose page left: withheld while a ledger user still holds it, else a hole."""
        if self._in_use((band.name, slot)):
            band.withheld.add(slot)
        else:
            band.holes.add(slot)

    def _bind_new(self, band: Band, slot: int) -> int:
        """One placement: ``_bind_all`` of one slot (the proofs' replay places pages one at a time)."""
        return self._bind_all(band, (slot,))[0]

    def _bind_all(self, band: Band, slots: Sequence[int]) -> list[int]:
        """Bind each slot in order: take it from the holes or grow the band onto it, bind the smallest free id
        with a new serial, drop stale content. One loop with the lookups hoisted (the small-extend path: a
        decode step binds one or a few pages, and the per-call overhead was most of its cost). Same state."""
        name, live, holes, v2p, gen, content, free = (band.name, band.live, band.holes, self.v2p, self.gen,
                                                      self.content, self._free_vids)
        grow_up, grow_down = band.role is Role.LOW, band.role is Role.HIGH
        serial, out = self._next_gen, []
        for slot in slots:
            if band.lo <= slot < band.hi:
                holes.remove(slot)
            elif grow_up and slot == band.hi:
                band.hi += 1
            elif grow_down and slot == band.lo - 1:
                band.lo -= 1
            else:
                band.extend_to(slot)
            vid = heapq.heappop(free) if free else self._new_vid()
            live[slot] = vid
            v2p[vid] = (name, slot)
            gen[vid] = serial
            serial += 1
            if content:  # (no tuple and no call when no page holds content, as in a scheduler's run)
                content.pop((name, slot), None)
            out.append(vid)
        self._next_gen = serial
        return out

    def _new_vid(self) -> int:
        self._next_vid += 1
        return self._next_vid - 1

    # =========================================================================================
    # Ownership: share / drop / slide / free

    def share(self, owner: str, vids: Sequence[int]) -> None:
        """``owner`` (e.g. the prefix cache) also holds ``vids``; creates the owner if new."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        vids = guard_share(self.shape, self, owner, vids)
        held = self.owners.get(owner)
        if held is None:
            held = {c: {} for c in self.order}
            self.owners[owner] = held
        for v in vids:
            held[self.v2p[v][0]][v] = None
            self.refs[v] += 1

    def copy_state(self, owner: str, src: int) -> int:
        """``owner`` (created if new) gets a new recurrent page holding a copy of every row of page ``src``
        (prefix caching of recurrent state: SGLang's mamba-pool fork). Placed like ``extend(owner, {cls: 1})``."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        src, cls = guard_copy_state(self.shape, self, owner, src)
        held = self.owners.get(owner)
        plan = self._plan_admission({cls: 1})
        (vid,) = self._apply(plan)[cls]
        rows = self.content.get(self.v2p[src])  # after the plan's moves: src may have moved, its rows with it
        if rows:
            self.content[self.v2p[vid]] = dict(rows)
        if held is None:
            held = self.owners[owner] = {c: {} for c in self.order}
        held[cls][vid] = None
        self.refs[vid] += 1
        return vid

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        """``owner`` lets go of ``vids``; pages whose last owner let go are freed. Returns those."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        vids = guard_drop(self.shape, self, owner, vids)
        return self._unref(owner, vids)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        """Drop the ``n`` oldest pages of ``cls`` that ``owner`` holds (window pages that slid out)."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        n = guard_slide(self.shape, self, owner, cls, n)
        return self._unref(owner, list(islice(self.owners[owner][cls], n)))

    def free(self, owner: str) -> list[int]:
        """``owner`` lets go of every page it holds (all classes); the owner is forgotten."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        guard_free(self.shape, self, owner)
        held = self.owners[owner]
        vids = [v for c in self.order for v in held[c]]
        return self._unref(owner, vids, forget=True)

    def _unref(self, owner: str, vids: list[int], forget: bool = False) -> list[int]:
        """``owner`` lets go of ``vids`` (validated; with ``forget``, of everything, and is forgotten). The free
        and the policy's free-time plan commit together or not at all: a refused plan restores the state."""
        undo = self._checkpoint(owner, vids)
        held = self.owners[owner]  # after the checkpoint: the working copy
        if forget:
            del self.owners[owner]
        else:
            for v in vids:
                del held[self.v2p[v][0]][v]
        freed = []
        for v in vids:
            self.refs[v] -= 1
            if self.refs[v] == 0:
                del self.refs[v]
                freed.append(v)
                self._free_page(v)
        for b in self._chain():
            b.absorb_boundary_holes()
        if undo is not None:
            try:
                after = policy_call("after_free", lambda: self.policy.after_free(self))  # (undone below too)
                if after is not None:
                    validate_plan(self, after, {})  # a free-time plan places nothing
                    if after.moves:
                        self._apply(after)
            except BaseException:
                self._rollback(undo)
                raise
        return freed

    def _checkpoint(self, owner: str, vids: list[int]) -> tuple | None:
        """Before a free that the policy's free-time hook follows: keep the containers a free and a plan touch
        and work on copies, so a refused plan can put the originals back untouched (bit-identical).  None when
        nothing is freed or the hook is the ladder's (which plans nothing): then nothing can be refused."""
        if getattr(self.policy.after_free, "__func__", None) is Ladder.after_free:
            return None
        if not any(self.refs[v] == 1 for v in vids):
            return None
        names = ("v2p", "gen", "owners", "refs", "content", "_free_vids", "stats")
        kept = {n: getattr(self, n) for n in names}
        bands = {n: (b.lo, b.hi, b.live, b.holes, b.withheld) for n, b in self.bands.items()}
        self.v2p, self.gen, self.refs, self.content = dict(self.v2p), dict(self.gen), Counter(self.refs), \
            dict(self.content)
        self.owners = dict(self.owners)
        self.owners[owner] = {c: dict(vs) for c, vs in self.owners[owner].items()}
        self._free_vids = list(self._free_vids)
        self.stats = Stats(self.stats.admitted, self.stats.pages_placed, dict(self.stats.moves),
                           dict(self.stats.bytes_moved), dict(self.stats.rung_used))
        for b in self.bands.values():
            b.live, b.holes, b.withheld = dict(b.live), SortedList(b.holes), set(b.withheld)
        return kept, bands

    def _rollback(self, undo: tuple) -> None:
        kept, bands = undo
        for n, v in kept.items():
            setattr(self, n, v)
        for n, (lo, hi, live, holes, withheld) in bands.items():
            b = self.bands[n]
            b.lo, b.hi, b.live, b.holes, b.withheld = lo, hi, live, holes, withheld

    def _free_page(self, vid: int) -> None:
        cls, slot = self.v2p.pop(vid)
        del self.gen[vid]
        band = self.bands[cls]
        del band.live[slot]
        self.content.pop((cls, slot), None)
        heapq.heappush(self._free_vids, vid)
        self._vacate(band, slot)

    # =========================================================================================
    # Ledger: acquire / release

    def acquire(self, user: str, kind: UserKind, vids: Sequence[int], event: object = None) -> None:
        """``user`` (a forward pass, host copy or transfer) holds the physical pages of ``vids``."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        vids = guard_acquire(self.shape, self, user, kind, vids, event)
        holds = tuple(Hold(*self.v2p[v], v, self.gen[v]) for v in vids)
        self.users[user] = User(kind, holds, event)
        counter = self.writers if kind.mode is Mode.WRITE else self.readers
        for h in holds:
            counter[(h.cls, h.slot)] += 1

    def poll(self) -> list[str]:
        """Release every event user whose ``event.query()`` is true, in acquisition order; their names. Never
        refuses; every call that can change pages or the ledger starts with it (spec §Ledger, Event users)."""
        done = [u for u, x in self.users.items() if x.event is not None and x.event.query()]
        for u in done:
            self._release(u)
        return done

    def release(self, user: str) -> None:
        """``user`` finished: its pages may move again; withheld ones it was last to hold become holes. A live
        user is released first (an event user by hand, once), then the others are polled; a user that is not live
        is refused after the poll."""
        check_hashable_id(user, "ledger user")
        if user not in self.users:
            self.poll()
        guard_release(self, user)
        self._release(user)
        self.poll()

    def _release(self, user: str) -> None:
        u = self.users.pop(user)  # live: release() guarded it, poll() releases only live users
        counter = self.writers if u.mode is Mode.WRITE else self.readers
        for h in u.holds:
            page = (h.cls, h.slot)
            counter[page] -= 1
            if counter[page] == 0:
                del counter[page]
            band = self.bands[h.cls]
            if h.slot in band.withheld and not self._in_use(page):
                band.withheld.discard(h.slot)
                band.holes.add(h.slot)
        for b in self._chain():
            b.absorb_boundary_holes()

    # =========================================================================================
    # Data: content tags per row

    def _row_check(self, vid: int, entry: int, row: int) -> PhysPage:
        # the common case first, tested without building the guard's arguments (the invariant check reads every
        # page's corners through here): exactly the cases in which guard_row passes
        page = self.v2p.get(vid) if type(vid) is int else None
        if page is not None and type(entry) is int and type(row) is int \
                and 0 <= entry < self.shape.entries[page[0]] and 0 <= row < self.shape.rows[page[0]]:
            return page
        guard_row(self.shape, self, vid, entry, row, "write/read")  # raises, with the spec's message
        return self.v2p[vid]  # (a subclass of int as an id: the guard accepts it)

    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        page = self._row_check(vid, entry, row)
        check_tag(tag)  # [-2**63, 2**63): what a row's 8 bytes hold, so every implementation stores the same tags
        self.content.setdefault(page, {})[(entry, row)] = tag

    def read(self, vid: int, entry: int, row: int) -> int:
        """The last tag written; 0 for a row never written since the page was handed out (every hand-out
        zeroes the page, every class: bands of different classes share bytes)."""
        page = self._row_check(vid, entry, row)
        return self.content.get(page, {}).get((entry, row), 0)

    # =========================================================================================
    # Idle-time compaction and stand-alone relayout

    def compact(self, max_moves: int | None = None) -> Plan:
        """Rung 2 on its own: pack the end bands toward their anchors, at most ``max_moves`` moves."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        self._check_max_moves(max_moves)
        plan = self.plan_compact(max_moves)
        validate_plan(self, plan, {})
        self._apply(plan)
        return plan

    def plan_compact(self, max_moves: int | None = None) -> Plan:
        """The compaction ``compact`` would do (read-only)."""
        moves, _ = self._plan_compact_ends([BandView.of(b) for b in self._chain()], max_moves)
        return self._plan(Rung.COMPACT if moves else Rung.NONE, moves, Placement())

    def flush_idle(self, budget_bytes: int) -> Plan:
        """The idle-time flush under a move budget (SGLang's ``flush_opportunistic``, which its scheduler calls
        between steps, unified_sub_pool.py): the full flush of the end bands, low band first, moving at most
        ``budget_bytes`` of pages in this call.  The admission ladder itself never waits for it."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        guard_budget(budget_bytes)
        moves: list[Move] = []
        left = budget_bytes
        for band in (self.bands[self.order[0]], self.bands[self.order[-1]]):
            comp = plan_compaction(band, self._barrier(band), self._has_readers(band.name), left // band.page_bytes)
            moves.extend(Move(band.name, s, d) for s, d in comp.moves)
            left -= len(comp.moves) * band.page_bytes
        plan = self._plan(Rung.COMPACT if moves else Rung.NONE, moves, Placement())
        validate_plan(self, plan, {})
        self._apply(plan)
        return plan

    @staticmethod
    def _check_max_moves(max_moves: int | None) -> None:
        guard_max_moves(max_moves)

    def relayout(self, demand: Mapping[str, int]) -> Plan:
        """Rung 3 on its own: move float bands to open room for ``demand`` without placing it."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        d = self._check_demand(demand)
        floats = [b for b in self._chain()[1:-1] if not b.empty or d.get(b.name)]
        if not floats:
            return Plan(Rung.NONE)  # no float band to move
        r = self._plan_relayout([BandView.of(b) for b in self._chain()], d)
        if r is None:
            raise self._rejection(d, Placement(shortfall={c: n for c, n in d.items()}))
        moves, _views, spans = r
        if not moves:  # nothing moves: the float keeps its span (a NONE plan carries no spans)
            return Plan(Rung.NONE)
        plan = self._plan(Rung.RELAYOUT, [], Placement(), moves, spans)
        validate_plan(self, plan, {})
        self._apply(plan)
        return plan

    # =========================================================================================
    # Queries

    def translate(self, vid: int) -> PhysPage:
        check_ids([vid], "translate")
        if vid not in self.v2p:
            raise UnknownPageError(f"translate: virtual page {vid} is not bound; translate only pages returned "
                                   "by admit/extend and still owned")
        return self.v2p[vid]

    def _cls(self, cls: str, what: str) -> str:
        return check_class(cls, self.order, what)

    def page_offset(self, cls: str, slot: int) -> int:
        """Byte offset of a physical page in the arena."""
        band = self.bands[self._cls(cls, "page_offset")]
        if not is_int(slot) or not 0 <= slot < band.top:
            raise InvalidArgumentError(f"page_offset: slot {slot!r} is off the {cls!r} grid; pass a slot in "
                                       f"[0, {band.top})")
        return slot * band.page_bytes

    def translate_token(self, cls: str, vtoken: int) -> int:
        """Physical entry index (class-local) of virtual token ``vtoken`` = vpage * page_size + i."""
        n = entries_per_page(self.classes[self._cls(cls, "translate_token")], self.config.page_size)
        if not is_int(vtoken) or vtoken < 0:
            raise InvalidArgumentError(f"translate_token: virtual token {vtoken!r} must be an int >= 0 "
                                       "(vpage * entries_per_page + i)")
        vid, i = divmod(vtoken, n)
        c, slot = self.translate(vid)
        if c != cls:
            raise InvalidArgumentError(f"virtual page {vid} is a {c!r} page, not {cls!r}; pass the class "
                                       "the page belongs to")
        return slot * n + i

    def pad_entry(self, cls: str) -> int:
        """The padding entry of ``cls`` (spec §Padding lanes): the first entry of its grid that starts at or past
        byte ``capacity``. No page of any class reaches that byte, so a write there touches no page."""
        return ceil_div(self.capacity, self.layouts[self._cls(cls, "pad_entry")].entry_bytes)

    def translate_tokens(self, cls: str, vtokens: Sequence[int], out_width: int | None = None) -> list[int]:
        """``translate_token`` of every id bound as a ``cls`` page; ``pad_entry(cls)`` for every other lane: an id
        this arena does not bind as a ``cls`` page (a foreign id: unbound, negative, another class's page) and the
        lanes ``[len(vtokens), out_width)`` of a fixed-width (CUDA-graph) step. Read-only."""
        pad = self.pad_entry(self._cls(cls, "translate_tokens"))
        vtokens = list(vtokens)
        if not all(is_int(t) for t in vtokens):
            raise InvalidArgumentError(f"translate_tokens: virtual tokens must be ints, got {vtokens!r}")
        width = check_out_width(out_width, len(vtokens))
        n = entries_per_page(self.classes[cls], self.config.page_size)
        out = []
        for t in vtokens:
            page = self.v2p.get(t // n) if t >= 0 else None
            out.append(page[1] * n + t % n if page is not None and page[0] == cls else pad)
        return out + [pad] * (width - len(vtokens))

    def held(self, owner: str) -> dict[str, tuple[int, ...]]:
        return {c: tuple(v) for c, v in self._owner(owner).items()}

    def used_bytes(self) -> int:
        return sum((len(b.live) + len(b.withheld)) * b.page_bytes for b in self.bands.values())

    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes()

    def gap_bytes(self) -> int:
        present = [b for b in self._chain() if b.role is not Role.FLOAT or not b.empty]
        return sum(a.lo_byte - b.hi_byte for b, a in zip(present, present[1:]))

    def snapshot(self) -> dict:
        """Every observable field, canonical (sorted): equal snapshots mean equal states."""
        return {
            "bands": {n: {"lo": b.lo, "hi": b.hi, "live": sorted(b.live.items()), "holes": list(b.holes),
                          "withheld": sorted(b.withheld)} for n, b in self.bands.items()},
            "v2p": sorted(self.v2p.items()),
            "owners": {o: {c: list(v) for c, v in h.items()} for o, h in sorted(self.owners.items())},
            "gen": sorted(self.gen.items()),
            "next_gen": self._next_gen,
            "refs": sorted(self.refs.items()),
            "users": {u: (x.kind.value, [(h.cls, h.slot, h.vid, h.gen) for h in x.holds])
                      for u, x in sorted(self.users.items())},
            "free_vids": sorted(self._free_vids),
            "next_vid": self._next_vid,
            "content": {f"{c}:{s}": sorted(d.items()) for (c, s), d in sorted(self.content.items())},
        }

    def ceil_pages(self, cls: str, tokens: int) -> int:
        """Pages of class ``cls`` that ``tokens`` tokens fill."""
        n = entries_per_page(self.classes[self._cls(cls, "ceil_pages")], self.config.page_size)
        return ceil_div(check_tokens(tokens, "ceil_pages"), n)
