"""The GPU allocator: the adapter protocol (conformance/adapter/protocol.py) over a device-resident arena.

Host side, in numpy (``hoststate.py``) and the planner's bands (``planner.py``): the source of truth for
placement — p->v and v->p mirrors, lowest-free virtual ids, owners and reference counts, the ledger. Device
side: the arena's bytes and typed views (``arena.py``) and the v->p / p->v tables (``tables.py``), written
through the pinned staging ring (``staging.py``) and never read on the hot path. Each operation validates
everything and plans read-only first (spec/arena.md §Notation: an error leaves the state unchanged), then
applies the plan to the host state and issues the device work in plan order on the current stream: page moves
in batches no destination of which is a source (``kernels.move``), table remaps, binds, zeroing of every
handed-out page (``kernels.zero``). The batched engine calls (``admit_batch`` / ``extend_batch`` /
``free_batch``, ``batch.py``) are the same operations for a whole scheduler step.

``make(config, device)`` is the factory for ``kvarena conform --impl kvarena.gpu.allocator:make``;
``make(config, device="meta")`` builds every device tensor on torch's meta device (tests/fast/test_gpu_batch.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kvarena.gpu.arena import DeviceArena
from kvarena.gpu.batch import BatchOps
from kvarena.gpu.graph import GraphStep
from kvarena.gpu.hoststate import LiveMap, OwnerLog, VidPool
from kvarena.gpu.kernels.translate import translate_tokens
from kvarena.gpu.kernels.zero import zero_slots
from kvarena.gpu.moves import MoveOps
from kvarena.gpu.moveseq import MoveSeq
from kvarena.gpu.pagetable import PageTables
from kvarena.gpu.planner import Band, Ladder, Ledger, Role, View, place
from kvarena.gpu.results import BatchResult
from kvarena.gpu.staging import Staging
from kvarena.gpu.tables import Tables
from kvarena.spec.errors import (
    CapacityTooSmallError,
    InvalidArgumentError,
    InvariantViolation,
    UnknownPageError,
)
from kvarena.spec.guards import (
    ceil_div,
    check_below,
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
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, Shape, chain, worst_case_demand
from kvarena.spec.pools import float_hints  # where an empty float reopens: the spec's split-pool sizing
from kvarena.spec.types import Admission, Hold, Mode, Observation, Plan, Rung, User, UserKind

_NONE = np.zeros(0, dtype=np.int64)


def _is_id(x: object) -> bool:
    """A virtual id: an int (a numpy integer too: engines pass array elements), never a bool or a float."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


class _Held(Mapping):
    """An owner's pages per class, read from the owner log when the guard asks for a class (lazily: a decode
    step's extend reads only its recurrent classes)."""

    def __init__(self, arena: GpuArena, row: int) -> None:
        self.a, self.row = arena, row
        self._got: dict[str, set[int]] = {}  # a guard asks once per page id: one log scan per class

    def __getitem__(self, cls: str) -> set[int]:
        got = self._got.get(cls)
        if got is None:
            o = self.a.owners
            got = self._got[cls] = set(o.vid[o.entries(self.row, self.a.cidx[cls])].tolist())
        return got

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.a.order)

    def __len__(self) -> int:
        return len(self.a.order)


class GpuArena(BatchOps, MoveOps):
    """The unified arena on a torch device; the same observable behaviour as the spec, to the slot."""

    def __init__(self, config: ArenaConfig, device: str | torch.device = "cpu",
                 events: Any = None, graph_width: int | None = None, page_width: int | None = None) -> None:
        config.validate()
        self.config = config
        self.shape = Shape.of(config)  # what the guards read of the configuration
        self.capacity = config.capacity
        classes = chain(config.model)
        self.order = [c.name for c in classes]
        self.cidx = {c: i for i, c in enumerate(self.order)}
        self.bands: dict[str, Band] = {}
        for i, c in enumerate(classes):
            role = Role.LOW if i == 0 else Role.HIGH if i == len(classes) - 1 else Role.FLOAT
            band = Band(c.name, role, config.page_bytes(c.name), config.capacity)
            band.live = LiveMap(band.top)  # type: ignore[assignment]
            self.bands[c.name] = band
        self._chain = [self.bands[n] for n in self.order]
        self._state_cols = {i for i, c in enumerate(classes) if c.kind is Kind.RECURRENT}
        self.ledger = Ledger()
        self.ladder = Ladder(self._chain, float_hints(config), self.ledger)
        self._check_floor()  # before any device memory is taken
        self.device = torch.device(device)
        self.mem = DeviceArena(config, self.device)
        self.staging = Staging(self.device, events=events)
        self.tables = Tables(self.order, self.mem.top, self.device, self.staging)
        self.graph = GraphStep(self, graph_width) if graph_width else None  # fixed-shape (capturable) binds
        n_vids = self.tables.n_vids
        self.vcls = np.full(n_vids, -1, dtype=np.int64)  # host v->p: class index (-1 unbound) and slot
        self.vslot = np.full(n_vids, -1, dtype=np.int64)
        self.refs = np.zeros(n_vids, dtype=np.int64)
        self.pool = VidPool()
        self.owners = OwnerLog(len(self.order))
        self.ptab = PageTables(self, page_width) if page_width else None  # per-request page tables
        self.owners.listener = self.ptab
        self.users: dict[str, User] = {}
        self.stats = {"moves": {2: 0, 3: 0}, "bytes_moved": {2: 0, 3: 0}, "move_launches": 0, "zero_launches": 0,
                      "released_by_event": 0, "lean_steps": 0}

    def _check_floor(self) -> None:
        worst = worst_case_demand(self.config)
        if not place(self.ladder.views(), worst, self.ladder.hints).ok:
            need = sum(n * self.bands[c].page_bytes for c, n in worst.items())
            raise CapacityTooSmallError(
                f"the arena of {self.capacity} B cannot hold one worst-case request of {self.config.context_len} "
                f"tokens ({need} B: {worst}); raise capacity to at least "
                f"{need + max(b.page_bytes for b in self._chain)} B or lower max_context_len")

    # =========================================================================================
    # Host mirrors

    def _loc(self, v: object) -> tuple[str, int] | None:
        """(class, slot) of bound virtual page ``v`` from the host mirror; None if unbound."""
        if not isinstance(v, (int, np.integer)) or not 0 <= v < len(self.vcls) or self.vcls[v] < 0:
            return None
        return self.order[self.vcls[v]], int(self.vslot[v])

    @property
    def v2p(self) -> dict[int, tuple[str, int]]:
        """The host mirror as a dict (diagnostics; the hot path never builds it)."""
        vids = np.flatnonzero(self.vcls >= 0)
        return {v: (self.order[c], s) for v, c, s in zip(vids.tolist(), self.vcls[vids].tolist(),
                                                          self.vslot[vids].tolist())}

    # =========================================================================================
    # Validation (raises before anything changes)

    # -- what the guards (spec/guards.py: one sequence per operation, every implementation) ask ------------
    def class_of(self, vid: int) -> str | None:
        loc = self._loc(vid)
        return None if loc is None else loc[0]

    def pages_of(self, owner: object) -> Mapping[str, set[int]] | None:
        row = self.owners.rows.get(owner)  # type: ignore[call-overload]
        return None if row is None else _Held(self, row)

    def user_live(self, user: object) -> bool:
        return user in self.users

    def _demand(self, demand: Mapping[str, int]) -> dict[str, int]:
        return check_demand(self.shape, demand, _is_id)

    def _below(self, below: Mapping[str, int] | None) -> dict[str, int] | None:
        """The placement limit as limit slots per class; None for none (spec/arena.md §Placement limit)."""
        return check_below(below, self.shape.ends, self.capacity, _is_id) or None

    def plan_admission(self, demand: Mapping[str, int], below: Mapping[str, int] | None = None) -> Plan:
        """What admitting ``demand`` would do, without doing it (read-only); ``below`` as for ``admit``."""
        d = check_demand(self.shape, demand, _is_id)
        return self.ladder.admission(d, self._below(below))

    def _row(self, owner: str) -> int:
        guard_free(self.shape, self, owner)  # a known owner: the one check every owner lookup makes
        return self.owners.rows[owner]

    # =========================================================================================
    # Admission

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = (),
              below: Mapping[str, int] | None = None) -> Admission:
        """A new owner with new pages per ``demand`` plus existing ``shared`` pages (a prefix-cache hit).
        ``below``: class -> byte offset, the placement limit: rung 1 takes that end band's holes on the anchor
        side of the byte first, nearest it first (spec/arena.md §Placement limit)."""
        self.poll()  # first: a refused call changes nothing beyond it (spec §Ledger, Event users)
        d, shared, limits = guard_admit(self.shape, self, owner, demand, shared, below, _is_id)
        plan = self.ladder.admission(d, limits or None)
        pages = self._apply(plan)
        row = self.owners.add(owner)
        new = [v for c in self.order for v in pages.get(c, ())]
        self._hold(row, np.array([*shared, *new], dtype=np.int64))
        return Admission({c: tuple(vs) for c, vs in pages.items()}, plan)

    def extend(self, owner: str, demand: Mapping[str, int], below: Mapping[str, int] | None = None) -> Admission:
        """More pages for an existing owner (decode growth, a longer prefill); ``below`` as for ``admit``."""
        self.poll()
        d, limits = guard_extend(self.shape, self, owner, demand, below, _is_id)
        row = self.owners.rows[owner]
        plan = self.ladder.admission(d, limits or None)
        pages = self._apply(plan)
        self._hold(row, np.array([v for c in self.order for v in pages.get(c, ())], dtype=np.int64))
        return Admission({c: tuple(vs) for c, vs in pages.items()}, plan)

    def _hold(self, row: int, vids: np.ndarray) -> None:
        """``row`` acquires ``vids`` (in order): one log append, one reference each."""
        if len(vids):
            self.owners.append(np.full(len(vids), row, dtype=np.int64), self.vcls[vids], vids)
            np.add.at(self.refs, vids, 1)

    def compact(self, max_moves: int | None = None) -> Plan:
        """Rung 2 alone (idle-time flush): pack the end bands, at most ``max_moves`` moves."""
        self.poll()
        guard_max_moves(max_moves)
        moves, _ = self.ladder.compact_ends(self.ladder.views(), max_moves)
        plan = self.ladder.plan(Rung.COMPACT if moves else Rung.NONE, moves)
        self._apply(plan)
        return plan

    def flush_idle(self, budget_bytes: int) -> Plan:
        """The idle-time flush (SGLang's ``flush_opportunistic``, called between steps): the full flush of the end
        bands, low band first, moving at most ``budget_bytes`` of pages (each move costs its page's bytes)."""
        self.poll()
        guard_budget(budget_bytes)
        moves, _ = self.ladder.compact_ends(self.ladder.views(), None, budget_bytes)
        plan = self.ladder.plan(Rung.COMPACT if moves else Rung.NONE, moves)
        self._apply(plan)
        return plan

    def relayout(self, demand: Mapping[str, int]) -> Plan:
        """Rung 3 alone, on the current ends: move the floats to open room for ``demand`` (not placed)."""
        self.poll()
        d = self._demand(demand)
        if not any(not b.empty or d.get(b.name) for b in self._chain[1:-1]):
            return Plan(Rung.NONE)  # no float band to move
        relaid = self.ladder.relayout(self.ladder.views(), d)
        if relaid is None:
            raise self.ladder.rejection(d, d)
        moves, _, spans = relaid
        if not moves:  # nothing moves: the float keeps its span (a NONE plan carries no spans)
            return Plan(Rung.NONE)
        plan = self.ladder.plan(Rung.RELAYOUT, [], None, moves, spans)
        self._apply(plan)
        return plan

    # -- applying a plan: host bands first, then the device work in plan order ----------------------
    def _apply(self, plan: Plan) -> dict[str, list[int]]:
        moves = MoveSeq.of(plan.moves)
        for cls, src, dst in moves.without(plan.spans).runs():
            self._move_many(cls, src, dst)
        self._chain[0].absorb()
        self._chain[-1].absorb()
        for cls, (t, end) in plan.spans.items():
            run = moves.of_class(cls).runs()
            self._retarget(self.bands[cls], t, end, *(run[0][1:] if run else (_NONE, _NONE)))
        self._device_moves(moves)
        pages: dict[str, list[int]] = {}
        cls_parts, vid_parts, slot_parts = [], [], []
        for cls in self.order:
            slots = plan.placements.get(cls, ())
            if slots:
                band = self.bands[cls]
                for s in slots:
                    self._claim(band, s)
                vids = self.pool.take(len(slots))
                sl = np.asarray(slots, dtype=np.int64)
                band.live.put(sl, vids)  # type: ignore[attr-defined]
                c = self.cidx[cls]
                self.vcls[vids], self.vslot[vids] = c, sl
                pages[cls] = vids.tolist()
                cls_parts.append(np.full(len(vids), c, dtype=np.int64))
                vid_parts.append(vids)
                slot_parts.append(sl)
        if vid_parts:
            self._device_bind(np.concatenate(cls_parts), np.concatenate(vid_parts), np.concatenate(slot_parts))
        for b in self._chain:
            b.absorb()
        return pages

    def _device_bind(self, classes: np.ndarray, vids: np.ndarray, slots: np.ndarray) -> None:
        """New pages on the device: both tables (one upload, two scatters), then every new page zeroed, one
        launch per class (a fresh page reads as zeros: no bytes of its previous owner leak). With a graph width,
        the same work at fixed shapes (``graph.py``: replayed as a CUDA graph), when the step fits it."""
        if self.graph is not None and self.graph.bind(classes, vids, slots):
            return
        counts = np.bincount(classes, minlength=len(self.order))
        ss = slots if np.count_nonzero(counts) == 1 else slots[np.argsort(classes, kind="stable")]
        dev = self.tables.bind(classes, vids, slots, extra=ss)  # one upload: the tables' pairs, the zero list
        assert dev is not None
        a = 0
        for c, k in enumerate(counts.tolist()):
            if k:
                zero_slots(self.mem.words, dev[a:a + k], self._chain[c].page_bytes)
                self.stats["zero_launches"] += 1
                a += k

    def _claim(self, band: Band, slot: int) -> None:
        if band.lo <= slot < band.hi:
            band.holes.remove(slot)
        else:
            band.grow_onto(slot)

    def _retarget(self, band: Band, t: int, end: int, src: np.ndarray, dst: np.ndarray) -> None:
        """A float's span becomes [t, end): its pages outside moved into free slots of it (``src`` outside the
        span, ``dst`` holes or gap slots in it), the holes those left trimmed with the rest outside the span.
        Vectorized: no source is in use (every page a ledger user holds is an obstacle inside the span), so
        every vacated slot is a hole, and it lies outside the span."""
        if end <= t:
            return
        arr = band.live.arr  # type: ignore[attr-defined]
        vids = arr[src]
        arr[src] = -1
        arr[dst] = vids
        self.vslot[vids] = dst
        lo, hi = (band.lo, band.hi) if not band.empty else (t, t)
        old = np.asarray(band.holes, dtype=np.int64)
        free = np.concatenate([old[(old >= t) & (old < end)], np.arange(t, min(end, lo), dtype=np.int64),
                               np.arange(max(t, hi), end, dtype=np.int64)])
        band.holes.clear()
        band.holes.update(free[~np.isin(free, dst)].tolist())
        band.lo, band.hi = t, end

    def _vacate(self, band: Band, slot: int) -> None:
        """A slot whose page left: withheld while a ledger user still holds it, else a hole."""
        if self.ledger.in_use(band.name, slot):
            band.withheld.add(slot)
        else:
            band.holes.add(slot)

    def _vacate_many(self, band: Band, slots: np.ndarray) -> None:
        if not self.ledger.readers and not self.ledger.writers:  # no users: every slot is a hole
            band.holes.update(slots.tolist())
            return
        for s in slots.tolist():
            self._vacate(band, s)

    # =========================================================================================
    # Ownership

    def share(self, owner: str, vids: Sequence[int]) -> None:
        """``owner`` (e.g. the prefix cache) also holds ``vids``; creates the owner if new."""
        self.poll()
        vids = guard_share(self.shape, self, owner, vids, _is_id)
        row = self.owners.rows.get(owner)
        if row is None:
            row = self.owners.add(owner)
        self._hold(row, np.array(vids, dtype=np.int64))

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        """``owner`` lets go of ``vids``; returns the pages whose last owner that was (now freed)."""
        self.poll()
        vids = guard_drop(self.shape, self, owner, vids, _is_id)
        row = self.owners.rows[owner]
        idx = self.owners.entries(row)
        arr = np.array(vids, dtype=np.int64)
        self.owners.kill(idx[np.isin(self.owners.vid[idx], arr)])
        if self.ptab is not None:
            self.ptab.rebuild(np.array([row]))
        return self._unref(arr)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        """Drop the ``n`` oldest ``cls`` pages ``owner`` holds (window pages that slid out)."""
        self.poll()
        n = guard_slide(self.shape, self, owner, cls, n)
        row = self.owners.rows[owner]
        idx = self.owners.entries(row, self.cidx[cls])[:n]
        out = self.owners.vid[idx].copy()
        self.owners.kill(idx)
        if self.ptab is not None:
            self.ptab.rebuild(np.array([row]))
        return self._unref(out)

    def free(self, owner: str) -> list[int]:
        """``owner`` lets go of every page it holds, all classes; the owner is forgotten."""
        self.poll()
        guard_free(self.shape, self, owner)
        row = self.owners.rows[owner]
        idx = self.owners.held_sorted(row)
        vids = self.owners.vid[idx].copy()
        self.owners.kill(idx)
        self.owners.forget(owner)
        if self.ptab is not None:
            self.ptab.clear(np.array([row]))
        return self._unref(vids)

    def _unref(self, vids: np.ndarray) -> list[int]:
        """One reference less on each of ``vids`` (distinct); pages left with none are freed, in order."""
        if not len(vids):
            for b in self._chain:
                b.absorb()
            return []
        self.refs[vids] -= 1
        freed = vids[self.refs[vids] == 0]
        self._free_pages(freed)
        return freed.tolist()

    def _free_pages(self, freed: np.ndarray) -> None:
        if len(freed):
            classes, slots = self.vcls[freed].copy(), self.vslot[freed].copy()
            self.vcls[freed] = -1
            for c, band in enumerate(self._chain):
                mine = slots[classes == c]
                if len(mine):
                    band.live.clear(mine)  # type: ignore[attr-defined]
                    self._vacate_many(band, mine)
            self.pool.give(freed)
            if self.tag_vids:  # a freed copy's id starts afresh (copy_state)
                for v in freed.tolist():
                    self.tag_vids.pop(v, None)
            self.tables.unbind(classes, freed, slots)
        for b in self._chain:
            b.absorb()

    # =========================================================================================
    # Ledger

    def acquire(self, user: str, kind: UserKind, vids: Sequence[int], event: Any = None) -> None:
        """``user`` (a forward pass, host copy or transfer) holds the physical pages ``vids`` are bound to now.

        With ``event`` (a ``torch.cuda.Event`` recorded behind the user's work, or anything with ``query()``),
        the user is released by the allocator itself at the first call after ``event.query()`` is true:
        polled, never waited on (overlap scheduling)."""
        self.poll()
        vids = guard_acquire(self.shape, self, user, kind, vids, event, _is_id)
        holds = tuple(Hold(*self._loc(v), v) for v in vids)  # type: ignore[misc]
        self.users[user] = User(kind, holds, event)
        counts = self.ledger.writers if kind.mode is Mode.WRITE else self.ledger.readers
        for h in holds:
            counts[(h.cls, h.slot)] += 1

    def poll(self) -> list[str]:
        """Release every user whose event has completed (acquisition order); returns their names."""
        done = [u for u, x in self.users.items() if x.event is not None and x.event.query()]
        for u in done:
            self._release(u)
        self.stats["released_by_event"] += len(done)
        return done

    def release(self, user: str) -> None:
        """``user`` finished: withheld slots it was the last to hold become holes. An event user may be released
        by hand too (before its event is polled); then the others whose events completed. An unknown user is refused
        after the poll, as every refused call is (spec/arena.md §Ledger, Event users)."""
        check_hashable_id(user, "ledger user")
        if user not in self.users:
            self.poll()
        guard_release(self, user)
        self._release(user)
        self.poll()

    def _release(self, user: str) -> None:
        u = self.users.pop(user)  # live: release() guarded it, poll() releases only live users
        counts = self.ledger.writers if u.kind.mode is Mode.WRITE else self.ledger.readers
        for h in u.holds:
            page = (h.cls, h.slot)
            counts[page] -= 1
            if not counts[page]:
                del counts[page]
            band = self.bands[h.cls]
            if h.slot in band.withheld and not self.ledger.in_use(*page):
                band.withheld.discard(h.slot)
                band.holes.add(h.slot)
        for b in self._chain:
            b.absorb()

    # =========================================================================================
    # Data: tags as real bytes in the rows

    def _page_row(self, vid: int, entry: int, row: int) -> tuple[str, int]:
        guard_row(self.shape, self, vid, entry, row, "write/read", _is_id)
        return self._loc(vid)  # type: ignore[return-value]

    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        """Write ``tag``'s bytes into one row of one entry of page ``vid``, through the row's typed view."""
        cls, slot = self._page_row(vid, entry, row)
        check_tag(tag)  # the row holds the tag's 8 bytes: [-2**63, 2**63), the spec's range for every implementation
        self.mem.write_tag(cls, slot, self._tag_vid(vid), entry, row, tag)

    def read(self, vid: int, entry: int, row: int) -> int:
        """The tag decoded from the row's bytes: what the bytes say, 0 for a row never written since the page
        was handed out (every hand-out zeroes the page, every class)."""
        cls, slot = self._page_row(vid, entry, row)
        return self.mem.read_tag(cls, slot, self._tag_vid(vid), entry, row)

    def views(self, cls: str) -> dict[tuple[int, str], torch.Tensor]:
        """Typed views of every row of class ``cls`` (what attention kernels read), see ``DeviceArena.views``."""
        return self.mem.views(cls)

    # =========================================================================================
    # Queries

    def translate(self, vid: int) -> tuple[str, int]:
        check_ids([vid], "translate", _is_id)
        loc = self._loc(vid)
        if loc is None:
            raise UnknownPageError(f"translate: virtual page {vid} is not bound; translate only pages returned by "
                                   "admit/extend and still owned")
        return loc

    def translate_token(self, cls: str, vtoken: int) -> int:
        """Physical entry index (on ``cls``'s grid) of virtual token ``vtoken``, by the translation kernel (reads
        the result back: a query, not the hot path; that is ``translate_tokens(out=)``)."""
        epp = self.mem.epp[check_class(cls, self.order, "translate_token")]
        if not is_int(vtoken) or vtoken < 0:
            raise InvalidArgumentError(f"translate_token: virtual token {vtoken!r} must be an int >= 0 "
                                       "(vpage * entries_per_page + i)")
        vid, i = divmod(vtoken, epp)
        c, slot = self.translate(vid)
        if c != cls:
            raise InvalidArgumentError(f"virtual page {vid} is a {c!r} page, not {cls!r}; pass the class the page "
                                       "belongs to")
        got = int(self.translate_tokens(cls, torch.tensor([vtoken], dtype=torch.int64, device=self.device))[0])
        if got != slot * epp + i:
            raise InvariantViolation("INV-VMAP-BIJECTIVE", f"device v2p translates token {vtoken} to {got}, the "
                                                           f"planner bound it to {slot * epp + i}")
        return got

    def translate_tokens(self, cls: str, vtokens: torch.Tensor, out: torch.Tensor | None = None,
                         out_width: int | None = None) -> torch.Tensor:
        """Batched: physical entry indices of ``vtokens`` on ``cls``'s grid, ``pad_entry(cls)`` where unmapped (an
        unbound, negative or out-of-range id, another class's page: spec/arena.md §Padding lanes; no per-id check,
        no read). With ``out_width`` (a graph's fixed width), lanes past the ids hold ``pad_entry(cls)``.

        The hot path: the guards read host ints only (the class name, the tensor's dtype, shape and numel), never
        device memory, so a malformed call is refused without a sync."""
        check_class(cls, self.order, "translate_tokens")
        if not isinstance(vtokens, torch.Tensor) or vtokens.dim() != 1 or vtokens.dtype not in (torch.int32,
                                                                                               torch.int64):
            raise InvalidArgumentError(f"translate_tokens: virtual tokens must be a 1-D int32 or int64 tensor, got "
                                       f"{getattr(vtokens, 'dtype', type(vtokens).__name__)} "
                                       f"{tuple(getattr(vtokens, 'shape', ()))}; pass the ids as such a tensor")
        width = check_out_width(out_width, vtokens.numel())
        if out is not None and not (isinstance(out, torch.Tensor) and out.dim() == 1 and out.dtype == torch.int64
                                    and out.numel() >= width):
            raise InvalidArgumentError(f"translate_tokens: out must be a 1-D int64 tensor of at least {width} lanes; "
                                       "pass a buffer as wide as the step (or none)")
        return translate_tokens(vtokens, self.tables.row(cls), self.mem.epp[cls], out=out, out_width=out_width,
                                pad=self.mem.pad_entry(cls))

    def page_table(self, cls: str) -> torch.Tensor:
        """The device page table of ``cls`` (``page_width`` needed): ``[row, j]`` the virtual page of owner
        ``row``'s ``j``-th ``cls`` page, -1 past its last. ``physical_pages`` gives the slots."""
        if self.ptab is None:
            raise InvalidArgumentError("page tables are off; build the arena with page_width=<pages per request>")
        return self.ptab.table(cls)

    def physical_pages(self, cls: str, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Slots of the pages of owners ``rows`` (a device int64 tensor of handles), gathered through v->p on
        the device: a FlashInfer-style page table, no host read."""
        if self.ptab is None:
            raise InvalidArgumentError("page tables are off; build the arena with page_width=<pages per request>")
        return self.ptab.physical(cls, rows, out)

    def pad_entry(self, cls: str) -> int:
        """Where a padding lane points: an entry past the arena's last byte that no page covers."""
        return self.mem.pad_entry(check_class(cls, self.order, "pad_entry"))

    def held(self, owner: str) -> dict[str, tuple[int, ...]]:
        return self.owners.held(self._row(owner), self.order)

    def page_offset(self, cls: str, slot: int) -> int:
        band = self.bands[check_class(cls, self.order, "page_offset")]
        if not is_int(slot) or not 0 <= slot < band.top:
            raise InvalidArgumentError(f"page_offset: slot {slot!r} is off the {cls!r} grid; pass a slot in "
                                       f"[0, {band.top})")
        return slot * band.page_bytes

    def used_bytes(self) -> int:
        return sum((len(b.live) + len(b.withheld)) * b.page_bytes for b in self._chain)

    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes()

    def ceil_pages(self, cls: str, tokens: int) -> int:
        """Pages of class ``cls`` that ``tokens`` tokens fill; the reference's guards (a numpy int is a count too)."""
        epp = self.mem.epp[check_class(cls, self.order, "ceil_pages")]
        return ceil_div(check_tokens(tokens, "ceil_pages", _is_id), epp)

    def observe(self) -> Observation:
        """Placement-level state: v->p read back from the device tables (checked against p->v), the bands'
        spans, holes and withheld slots from the host."""
        v2p = self.tables.host_v2p()
        p2v = self.tables.host_p2v()
        if {page: v for v, page in v2p.items()} != p2v:
            raise InvariantViolation("INV-VMAP-BIJECTIVE", "device p2v is not the inverse of device v2p")
        return Observation(v2p=v2p, spans={n: (b.lo, b.hi) for n, b in self.bands.items()},
                           holes={n: tuple(b.holes) for n, b in self.bands.items()},
                           withheld={n: tuple(sorted(b.withheld)) for n, b in self.bands.items()})

    # =========================================================================================
    # Recurrent state (spec/arena.md §INV-STATE-PRIVATE)

    def copy_state(self, owner: str, src: int) -> int:
        """``owner`` (created if new) gets a new recurrent page holding a copy of every byte of page ``src``
        (prefix caching of recurrent state: SGLang's mamba-pool fork), placed like ``extend(owner, {cls: 1})``:
        the ladder's plan, then one page copy (``kernels.copy``) from wherever the plan left ``src``."""
        from kvarena.gpu.kernels.copy import copy_pages
        self.poll()
        src, cls = guard_copy_state(self.shape, self, owner, src, _is_id)
        row = self.owners.rows.get(owner)
        plan = self.ladder.admission({cls: 1})
        (vid,) = self._apply(plan)[cls]
        copy_pages(self.mem.words, [int(self.vslot[src])], [int(self.vslot[vid])], self.bands[cls].page_bytes)
        self.tag_vids[int(vid)] = self._tag_vid(src)  # the copied bytes encode tags under src's key
        if row is None:
            row = self.owners.add(owner)
        self._hold(row, np.array([vid], dtype=np.int64))
        return int(vid)

    @property
    def tag_vids(self) -> dict[int, int]:
        """copy -> the page whose key its tag bytes use (``write_tag`` keys a row's bytes to a page, which is how
        a misplaced page is caught; a byte-exact copy keeps the source's key, and writes to it use that key)."""
        return self.__dict__.setdefault("_tag_vids", {})

    def _tag_vid(self, vid: int) -> int:
        return self.tag_vids.get(vid, vid) if self.tag_vids else vid


def make(config: ArenaConfig, device: str | torch.device = "cpu", graph_width: int | None = None,
         page_width: int | None = None) -> GpuArena:
    """Factory for ``kvarena conform --impl kvarena.gpu.allocator:make``; ``graph_width``: new pages per class a
    step binds at fixed shapes (CUDA-graph replay on CUDA), more fall back to the eager launches;
    ``page_width``: columns of the per-request page tables on the device (off when None)."""
    return GpuArena(config, device, graph_width=graph_width, page_width=page_width)


__all__ = ["Admission", "BatchResult", "GpuArena", "View", "make"]
