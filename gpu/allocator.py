"""The GPU allocator: the adapter protocol (conformance/adapter.py) over a device-resident arena.

Host side: the bands and the ladder (``planner.py``), virtual ids (lowest unbound first), owners with
reference counts, and the ledger of users. Device side: the arena's bytes and typed views (``arena.py``) and
the v->p / p->v tables (``tables.py``). Each operation validates everything and plans read-only first
(spec/arena.md §Notation: an error leaves the state unchanged), then applies the plan to the host bands and
issues the device work in plan order on the current stream: page moves in batches no destination of which is
a source (``kernels.move``), table remaps, binds through the batched allocation kernel (``kernels.alloc``),
zeroing of new recurrent slots (``kernels.zero``). On CPU tensors the kernels run under Triton's interpreter
(``TRITON_INTERPRET=1``) or as plain torch.

``make(config, device)`` is the factory for ``kvarena conform --impl kvarena.gpu.allocator:make``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from kvarena.gpu.arena import DeviceArena
from kvarena.gpu.kernels.move import move_pages
from kvarena.gpu.kernels.translate import translate_tokens
from kvarena.gpu.kernels.zero import zero_pages
from kvarena.gpu.planner import Band, Ladder, Ledger, Role, View, cdiv, float_hints, place
from kvarena.gpu.tables import Tables
from kvarena.spec.errors import (
    CapacityTooSmallError,
    DoubleFreeError,
    DuplicateOwnerError,
    DuplicateUserError,
    InvalidArgumentError,
    InvariantViolation,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
    UnknownPageError,
)
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand
from kvarena.spec.types import Mode, Move, Observation, Plan, Rung, UserKind


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Admission:
    """What admit / extend return: the new virtual pages per class and the plan that placed them."""

    pages: dict[str, tuple[int, ...]]
    plan: Plan


@dataclass(frozen=True)
class Hold:
    cls: str
    slot: int  # where the page was when acquired (a hold does not follow a move)
    vid: int


@dataclass(frozen=True)
class User:
    kind: UserKind
    holds: tuple[Hold, ...]


class GpuArena:
    """The unified arena on a torch device; the same observable behaviour as the spec, to the slot."""

    def __init__(self, config: ArenaConfig, device: str | torch.device = "cpu") -> None:
        config.validate()
        self.config = config
        self.capacity = config.capacity
        classes = chain(config.model)
        self.order = [c.name for c in classes]
        self.bands: dict[str, Band] = {}
        for i, c in enumerate(classes):
            role = Role.LOW if i == 0 else Role.HIGH if i == len(classes) - 1 else Role.FLOAT
            self.bands[c.name] = Band(c.name, role, config.page_bytes(c.name), config.capacity)
        self._chain = [self.bands[n] for n in self.order]
        self.ledger = Ledger()
        self.ladder = Ladder(self._chain, float_hints(config), self.ledger)
        self._check_floor()  # before any device memory is taken
        self.device = torch.device(device)
        self.mem = DeviceArena(config, self.device)
        self.tables = Tables(self.order, self.mem.top, self.device)
        self.v2p: dict[int, tuple[str, int]] = {}  # host mirror of the device tables, for validation
        self._free_ids: list[int] = []  # min-heap of unbound ids below _next_id
        self._next_id = 0
        self.owners: dict[str, dict[str, dict[int, None]]] = {}  # owner -> class -> ordered set of vids
        self.refs: dict[int, int] = {}
        self.users: dict[str, User] = {}
        self._written: dict[int, set[tuple[int, int]]] = {}  # token rows written: None vs a tag only
        self.stats = {"moves": {2: 0, 3: 0}, "bytes_moved": {2: 0, 3: 0}, "move_launches": 0}

    def _check_floor(self) -> None:
        worst = worst_case_demand(self.config)
        if not place(self.ladder.views(), worst, self.ladder.hints).ok:
            need = sum(n * self.bands[c].page_bytes for c, n in worst.items())
            raise CapacityTooSmallError(
                f"the arena of {self.capacity} B cannot hold one worst-case request of {self.config.context_len} "
                f"tokens ({need} B: {worst}); raise capacity to at least "
                f"{need + max(b.page_bytes for b in self._chain)} B or lower max_context_len")

    # =========================================================================================
    # Validation (raises before anything changes)

    def _demand(self, demand: Mapping[str, int]) -> dict[str, int]:
        if not isinstance(demand, Mapping):
            raise InvalidArgumentError(f"demand must be a mapping class -> pages, got {type(demand).__name__}")
        out: dict[str, int] = {}
        for cls, n in demand.items():
            if cls not in self.bands:
                raise InvalidArgumentError(f"demand names class {cls!r}; use one of {self.order}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise InvalidArgumentError(f"demand for {cls!r} must be an int >= 0 pages, got {n!r}")
            if n > self.bands[cls].top:
                raise InvalidArgumentError(f"demand of {n} {cls!r} pages exceeds the {self.bands[cls].top} pages "
                                           "the whole arena holds; split the request or raise capacity")
            if n:
                out[cls] = n
        total = sum(n * self.bands[c].page_bytes for c, n in out.items())
        if total > self.capacity:
            raise InvalidArgumentError(f"demand of {total} B exceeds the arena's {self.capacity} B and can never "
                                       "fit; split the request or raise capacity")
        return out

    def _bound(self, vids: Sequence[int], what: str) -> list[int]:
        vids = list(vids)
        if len(set(vids)) != len(vids):
            raise InvalidArgumentError(f"{what}: duplicate virtual page ids {sorted(vids)}; name each page once")
        for v in vids:
            if v not in self.v2p:
                raise UnknownPageError(f"{what}: virtual page {v} is not bound (never allocated or already "
                                       "freed); pass only pages returned by admit/extend and still owned")
        return vids

    def plan_admission(self, demand: Mapping[str, int]) -> Plan:
        """What admitting ``demand`` would do, without doing it (read-only)."""
        return self.ladder.admission(self._demand(demand))

    def _owner(self, owner: str) -> dict[str, dict[int, None]]:
        held = self.owners.get(owner)
        if held is None:
            raise UnknownOwnerError(f"owner {owner!r} holds no pages; admit it first")
        return held

    # =========================================================================================
    # Admission

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Admission:
        """A new owner with new pages per ``demand`` plus existing ``shared`` pages (a prefix-cache hit)."""
        if owner in self.owners:
            raise DuplicateOwnerError(f"owner {owner!r} is already admitted; use extend() to grow it, or free() "
                                      "it first")
        d = self._demand(demand)
        shared = self._bound(shared, f"admit({owner!r}) shared")
        plan = self.ladder.admission(d)
        pages = self._apply(plan)
        held: dict[str, dict[int, None]] = {c: {} for c in self.order}
        for v in (*shared, *(v for vs in pages.values() for v in vs)):
            held[self.v2p[v][0]][v] = None
            self.refs[v] = self.refs.get(v, 0) + 1
        self.owners[owner] = held
        return Admission({c: tuple(vs) for c, vs in pages.items()}, plan)

    def extend(self, owner: str, demand: Mapping[str, int]) -> Admission:
        """More pages for an existing owner (decode growth, a longer prefill)."""
        held = self._owner(owner)
        plan = self.ladder.admission(self._demand(demand))
        pages = self._apply(plan)
        for c, vs in pages.items():
            for v in vs:
                held[c][v] = None
                self.refs[v] = self.refs.get(v, 0) + 1
        return Admission({c: tuple(vs) for c, vs in pages.items()}, plan)

    def compact(self, max_moves: int | None = None) -> Plan:
        """Rung 2 alone (idle-time flush): pack the end bands, at most ``max_moves`` moves."""
        if max_moves is not None and (not isinstance(max_moves, int) or isinstance(max_moves, bool)
                                      or max_moves < 0):
            raise InvalidArgumentError(f"compact: max_moves must be None or an int >= 0, got {max_moves!r}")
        moves, _ = self.ladder.compact_ends(self.ladder.views(), max_moves)
        plan = self.ladder.plan(Rung.COMPACT if moves else Rung.NONE, moves)
        self._apply(plan)
        return plan

    def relayout(self, demand: Mapping[str, int]) -> Plan:
        """Rung 3 alone, on the current ends: move the floats to open room for ``demand`` (not placed)."""
        d = self._demand(demand)
        if not any(not b.empty or d.get(b.name) for b in self._chain[1:-1]):
            return Plan(Rung.NONE)  # no float band to move
        relaid = self.ladder.relayout(self.ladder.views(), d)
        if relaid is None:
            raise self.ladder.rejection(d, d)
        moves, _, spans = relaid
        plan = self.ladder.plan(Rung.RELAYOUT if moves else Rung.NONE, [], None, moves, spans)
        self._apply(plan)
        return plan

    # -- applying a plan: host bands first, then the device work in plan order ----------------------
    def _apply(self, plan: Plan) -> dict[str, list[int]]:
        for m in plan.moves:
            if m.cls not in plan.spans:
                self._move(m)
        self._chain[0].absorb()
        self._chain[-1].absorb()
        for cls, (t, end) in plan.spans.items():
            self._retarget(self.bands[cls], t, end, [m for m in plan.moves if m.cls == cls])
        self._device_moves(plan.moves)
        pages: dict[str, list[int]] = {}
        for cls in self.order:
            slots = plan.placements.get(cls, ())
            if slots:
                pages[cls] = [self._bind(self.bands[cls], s) for s in slots]
                self.tables.bind(cls, pages[cls], slots)
                if self.mem.is_recurrent(cls):  # a fresh recurrent slot reads as zeroed state
                    zero_pages(self.mem.words, slots, self.bands[cls].page_bytes)
        for b in self._chain:
            b.absorb()
        return pages

    def _retarget(self, band: Band, t: int, end: int, moves: list[Move]) -> None:
        """A float's span becomes [t, end): widened with holes, its pages outside moved in, the rest trimmed."""
        if end <= t:
            return
        if band.empty:
            band.lo = band.hi = t
        band.holes.update([*range(t, min(end, band.lo)), *range(max(t, band.hi), end)])
        band.lo, band.hi = min(band.lo, t), max(band.hi, end)
        for m in moves:
            self._move(m)
        for s in [*band.holes.irange(band.lo, t - 1), *band.holes.irange(end, band.hi - 1)]:
            band.holes.remove(s)
        band.lo, band.hi = t, end

    def _move(self, m: Move) -> None:
        band = self.bands[m.cls]
        vid = band.live.pop(m.src)
        band.holes.remove(m.dst)
        band.live[m.dst] = vid
        self.v2p[vid] = (m.cls, m.dst)
        self._vacate(band, m.src)

    def _device_moves(self, moves: Sequence[Move]) -> None:
        """Bytes and tables of the plan's moves, in plan order, batched: a batch is one class and no slot in it
        is both a source and a destination (rung-3 destinations may reuse bytes rung-2 sources left)."""
        i = 0
        while i < len(moves):
            cls, srcs, dsts = moves[i].cls, set(), set()
            j = i
            while j < len(moves) and moves[j].cls == cls and moves[j].src not in dsts and moves[j].dst not in srcs:
                srcs.add(moves[j].src)
                dsts.add(moves[j].dst)
                j += 1
            batch = moves[i:j]
            src, dst = [m.src for m in batch], [m.dst for m in batch]
            move_pages(self.mem.words, src, dst, self.bands[cls].page_bytes)
            self.tables.remap(cls, [self.bands[cls].live[d] for d in dst], src, dst)
            rung = 3 if self.bands[cls].role is Role.FLOAT else 2  # floats move only at rung 3, ends at 2
            self.stats["moves"][rung] += len(batch)
            self.stats["bytes_moved"][rung] += len(batch) * self.bands[cls].page_bytes
            self.stats["move_launches"] += 1
            i = j

    def _vacate(self, band: Band, slot: int) -> None:
        """A slot whose page left: withheld while a ledger user still holds it, else a hole."""
        if self.ledger.in_use(band.name, slot):
            band.withheld.add(slot)
        else:
            band.holes.add(slot)

    def _bind(self, band: Band, slot: int) -> int:
        if band.lo <= slot < band.hi:
            band.holes.remove(slot)
        else:
            band.grow_onto(slot)
        if self._free_ids:
            vid = heapq.heappop(self._free_ids)
        else:
            vid, self._next_id = self._next_id, self._next_id + 1
        band.live[slot] = vid
        self.v2p[vid] = (band.name, slot)
        self._written.pop(vid, None)
        return vid

    # =========================================================================================
    # Ownership

    def share(self, owner: str, vids: Sequence[int]) -> None:
        """``owner`` (e.g. the prefix cache) also holds ``vids``; creates the owner if new."""
        vids = self._bound(vids, f"share({owner!r})")
        held = self.owners.get(owner)
        if held is not None:
            dup = [v for v in vids if v in held[self.v2p[v][0]]]
            if dup:
                raise InvalidArgumentError(f"share({owner!r}): already holds {dup}; an owner holds a page once")
        else:
            held = self.owners[owner] = {c: {} for c in self.order}
        for v in vids:
            held[self.v2p[v][0]][v] = None
            self.refs[v] += 1

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        """``owner`` lets go of ``vids``; returns the pages whose last owner that was (now freed)."""
        held = self._owner(owner)
        vids = list(vids)
        if len(set(vids)) != len(vids):
            raise InvalidArgumentError(f"drop({owner!r}): duplicate ids {sorted(vids)}; name each page once")
        missing = [v for v in vids if v not in self.v2p or v not in held[self.v2p[v][0]]]
        if missing:
            raise DoubleFreeError(f"drop({owner!r}): owner does not hold {missing} (double free, or another "
                                  "owner's page); drop only pages this owner holds")
        for v in vids:
            del held[self.v2p[v][0]][v]
        return self._unref(vids)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        """Drop the ``n`` oldest ``cls`` pages ``owner`` holds (window pages that slid out)."""
        held = self._owner(owner)
        if cls not in self.bands:
            raise InvalidArgumentError(f"slide: unknown class {cls!r}; use one of {self.order}")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(held[cls]):
            raise InvalidArgumentError(f"slide({owner!r}, {cls!r}, {n!r}): owner holds {len(held[cls])} {cls} "
                                       f"pages; n must be in [0, {len(held[cls])}]")
        out = list(held[cls])[:n]
        for v in out:
            del held[cls][v]
        return self._unref(out)

    def free(self, owner: str) -> list[int]:
        """``owner`` lets go of every page it holds, all classes; the owner is forgotten."""
        held = self._owner(owner)
        vids = [v for c in self.order for v in held[c]]
        del self.owners[owner]
        return self._unref(vids)

    def _unref(self, vids: Sequence[int]) -> list[int]:
        freed, unbound = [], []
        for v in vids:
            self.refs[v] -= 1
            if self.refs[v]:
                continue
            del self.refs[v]
            freed.append(v)
            cls, slot = self.v2p.pop(v)
            band = self.bands[cls]
            del band.live[slot]
            self._written.pop(v, None)
            heapq.heappush(self._free_ids, v)
            self._vacate(band, slot)
            unbound.append((cls, v, slot))
        self.tables.unbind(unbound)
        for b in self._chain:
            b.absorb()
        return freed

    # =========================================================================================
    # Ledger

    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None:
        """``user`` (a forward pass, host copy or transfer) holds the physical pages ``vids`` are bound to now."""
        if user in self.users:
            raise DuplicateUserError(f"ledger user {user!r} is live; release it first or pick a fresh id")
        if not isinstance(kind, UserKind):
            raise InvalidArgumentError(f"acquire: kind must be a UserKind, got {kind!r}")
        vids = self._bound(vids, f"acquire({user!r})")
        holds = tuple(Hold(*self.v2p[v], v) for v in vids)
        self.users[user] = User(kind, holds)
        counts = self.ledger.writers if kind.mode is Mode.WRITE else self.ledger.readers
        for h in holds:
            counts[(h.cls, h.slot)] += 1

    def release(self, user: str) -> None:
        """``user`` finished: withheld slots it was the last to hold become holes."""
        u = self.users.pop(user, None)
        if u is None:
            raise ReleaseWithoutAcquireError(f"release({user!r}): no such live ledger user (never acquired, or "
                                             "already released); release each acquire exactly once")
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

    def _row(self, vid: int, entry: int, row: int) -> tuple[str, int]:
        if vid not in self.v2p:
            raise UnknownPageError(f"virtual page {vid} is not bound; write/read only live pages")
        cls, slot = self.v2p[vid]
        n_e, n_r = self.mem.epp[cls], len(self.mem.layouts[cls].slots)
        if not (_is_int(entry) and _is_int(row) and 0 <= entry < n_e and 0 <= row < n_r):
            raise InvalidArgumentError(f"page {vid} ({cls}) got entry {entry!r}, row {row!r}; pass an int entry in "
                                       f"[0, {n_e}) and an int row in [0, {n_r})")
        return cls, slot

    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        """Write ``tag``'s bytes into one row of one entry of page ``vid``, through the row's typed view."""
        cls, slot = self._row(vid, entry, row)
        if not _is_int(tag):
            raise InvalidArgumentError(f"write: tag must be an int (a content fingerprint), got {tag!r}")
        if not -(1 << 63) <= tag < 1 << 63:  # the row holds the tag's bytes: 64 of them
            raise InvalidArgumentError(f"write: tag {tag} is outside the int64 range this implementation stores")
        self.mem.write_tag(cls, slot, vid, entry, row, tag)
        if not self.mem.is_recurrent(cls):
            self._written.setdefault(vid, set()).add((entry, row))

    def read(self, vid: int, entry: int, row: int) -> int | None:
        """The tag decoded from the row's bytes; None for a token row never written since the page was bound
        (an unwritten recurrent row decodes to 0 from its zeroed bytes)."""
        cls, slot = self._row(vid, entry, row)
        if not self.mem.is_recurrent(cls) and (entry, row) not in self._written.get(vid, ()):
            return None
        return self.mem.read_tag(cls, slot, vid, entry, row)

    def views(self, cls: str) -> dict[tuple[int, str], torch.Tensor]:
        """Typed views of every row of class ``cls`` (what attention kernels read), see ``DeviceArena.views``."""
        return self.mem.views(cls)

    # =========================================================================================
    # Queries

    def translate(self, vid: int) -> tuple[str, int]:
        if vid not in self.v2p:
            raise UnknownPageError(f"translate: virtual page {vid} is not bound")
        return self.v2p[vid]

    def translate_token(self, cls: str, vtoken: int) -> int:
        """Physical entry index (on ``cls``'s grid) of virtual token ``vtoken``, by the translation kernel."""
        if cls not in self.bands:
            raise InvalidArgumentError(f"unknown class {cls!r}; use one of {self.order}")
        epp = self.mem.epp[cls]
        if not _is_int(vtoken) or vtoken < 0:
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

    def translate_tokens(self, cls: str, vtokens: torch.Tensor) -> torch.Tensor:
        """Batched: physical entry indices of ``vtokens`` on ``cls``'s grid, -1 where unmapped (no checks)."""
        return translate_tokens(vtokens, self.tables.row(cls), self.mem.epp[cls])

    def held(self, owner: str) -> dict[str, tuple[int, ...]]:
        return {c: tuple(v) for c, v in self._owner(owner).items()}

    def page_offset(self, cls: str, slot: int) -> int:
        if cls not in self.bands:
            raise InvalidArgumentError(f"unknown class {cls!r}; use one of {self.order}")
        band = self.bands[cls]
        if not _is_int(slot) or not 0 <= slot < band.top:
            raise InvalidArgumentError(f"page_offset: slot {slot!r} is off the {cls!r} grid; pass a slot in "
                                       f"[0, {band.top})")
        return slot * band.page_bytes

    def used_bytes(self) -> int:
        return sum((len(b.live) + len(b.withheld)) * b.page_bytes for b in self._chain)

    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes()

    def ceil_pages(self, cls: str, tokens: int) -> int:
        return cdiv(tokens, self.mem.epp[cls])

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


def make(config: ArenaConfig, device: str | torch.device = "cpu") -> GpuArena:
    """Factory for ``kvarena conform --impl kvarena.gpu.allocator:make``."""
    return GpuArena(config, device)


__all__ = ["Admission", "GpuArena", "View", "make"]
