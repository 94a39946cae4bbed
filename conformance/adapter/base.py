"""A base class for adapters: everything the protocol asks that is not your allocator's business.

Every adapter repeats the same work around the pool it wraps: the argument checks the reference makes
(in its order, with its error classes), virtual page ids, owners and shared pages, the ledger (a freed
page that a forward pass, a host copy or a network transfer still uses is *withheld*, not handed out),
and the observation.  :class:`PoolAdapter` does all of it; a subclass maps a handful of primitives to
its pool, in physical terms (class, slot):

===================================  ==============================================================
``place(demand)``                    new slots per class for a demand, all or nothing; ``None`` when
                                     it does not fit (the base raises AdmissionRejectedError)
``release_slots(cls, slots)``        give slots back to the pool (only slots no user holds)
``layout()``                         ``{class: (lo, hi)}`` spans and ``{class: [free slots]}`` holes
``write_row`` / ``read_row``         store / load a row's tag in the pool's own bytes
``compact_pool(max_moves, pinned)``  optional: ``[(class, src, dst)]`` moves the pool made (default:
                                     none); ``pinned`` are slots no move may touch
===================================  ==============================================================

A fresh slot must read 0 in every row, every class (zero pages on hand-out).  The refusals a
``safety`` adapter must reproduce are the ones the base raises, listed in conformance/README.md.
conformance/example/ is a worked example: a third-party two-ended pool and its ~70-line adapter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping, Sequence
from itertools import islice
from types import SimpleNamespace
from typing import Any

from kvarena.spec.errors import (
    AdmissionRejectedError,
    DoubleFreeError,
    DuplicateOwnerError,
    DuplicateUserError,
    InvalidArgumentError,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
    UnknownPageError,
)
from kvarena.spec.guards import check_hashable_id, check_ids, check_not_state, check_state_slots, check_tag, is_int
from kvarena.spec.layout import Kind, entries_per_page, entry_layout
from kvarena.spec.models import ArenaConfig, chain
from kvarena.spec.types import Mode, Observation, Plan, Rung, UserKind

Page = tuple[str, int]  # (class, slot)


def check_demand(demand: Any, order: Sequence[str], top: Mapping[str, int], page_bytes: Mapping[str, int],
                 capacity: int) -> dict[str, int]:
    """The reference's demand refusals, in its order: a mapping of known classes to ints >= 0, each within its
    class's grid, the whole within the arena's bytes. Returns the non-zero part."""
    if not isinstance(demand, Mapping):
        raise InvalidArgumentError(f"demand must be a mapping class -> pages, got {type(demand).__name__}")
    out = {}
    for cls, n in demand.items():
        if cls not in top:
            raise InvalidArgumentError(f"demand names class {cls!r}; use one of {list(order)}")
        if not is_int(n) or n < 0:
            raise InvalidArgumentError(f"demand for {cls!r} must be an int >= 0 pages, got {n!r}")
        if n > top[cls]:
            raise InvalidArgumentError(f"demand of {n} {cls!r} pages exceeds the {top[cls]} pages the whole arena "
                                       "holds; split the request or raise capacity")
        if n:
            out[cls] = n
    if sum(n * page_bytes[c] for c, n in out.items()) > capacity:
        raise InvalidArgumentError("demand exceeds the arena's bytes and can never fit; split the request or raise "
                                   "capacity")
    return out


def check_vids(vids: Sequence[int], bound: Container[int], what: str,
               hint: str = "; pass only pages returned by admit/extend and still owned") -> list[int]:
    """Ints only (a bool or a float hashes like an int and would name a page), no id twice, every id bound
    (``bound``: the live virtual ids) — the reference's order of checks."""
    vids = check_ids(vids, what)
    if len(set(vids)) != len(vids):
        raise InvalidArgumentError(f"{what}: duplicate virtual page ids {sorted(vids)}; name each page once")
    for v in vids:
        if v not in bound:
            raise UnknownPageError(f"{what}: virtual page {v} is not bound{hint}")
    return vids


class PoolAdapter:
    """The adapter protocol (kvarena.conformance.adapter.protocol.Allocator) around a pool's primitives."""

    def __init__(self, config: ArenaConfig) -> None:
        config.validate()  # ConfigError / MisalignedRowError exactly as the reference raises them
        self.config = config
        classes = chain(config.model)
        self.order = [c.name for c in classes]
        self.kind = {c.name: c.kind for c in classes}
        self.page_bytes = {c.name: config.page_bytes(c.name) for c in classes}
        self.top = {n: config.capacity // p for n, p in self.page_bytes.items()}
        self.entries = {c.name: entries_per_page(c, config.page_size) for c in classes}
        self.rows = {c.name: len(entry_layout(c).slots) for c in classes}
        self.v2p: dict[int, Page] = {}
        self._next_vid = 0
        self.owners: dict[str, dict[str, dict[int, None]]] = {}  # owner -> class -> ordered vids
        self.refs: Counter[int] = Counter()
        self.users: dict[str, tuple[Mode, tuple[Page, ...]]] = {}
        self.holders: Counter[Page] = Counter()  # users per physical page
        self.writers: Counter[Page] = Counter()
        self.withheld: set[Page] = set()

    # -- the primitives a subclass provides -------------------------------------------------------
    def place(self, demand: Mapping[str, int]) -> dict[str, list[int]] | None:
        raise NotImplementedError

    def release_slots(self, cls: str, slots: Sequence[int]) -> None:
        raise NotImplementedError

    def layout(self) -> tuple[dict[str, tuple[int, int]], dict[str, list[int]]]:
        raise NotImplementedError

    def write_row(self, cls: str, slot: int, entry: int, row: int, tag: int) -> None:
        raise NotImplementedError

    def read_row(self, cls: str, slot: int, entry: int, row: int) -> int:
        raise NotImplementedError

    def compact_pool(self, max_moves: int | None, pinned: set[Page]) -> list[tuple[str, int, int]]:
        return []

    # -- argument checks, in the reference's order ------------------------------------------------
    def _demand(self, demand: Mapping[str, int]) -> dict[str, int]:
        return check_demand(demand, self.order, self.top, self.page_bytes, self.config.capacity)

    def _vids(self, vids: Sequence[int], what: str) -> list[int]:
        return check_vids(vids, self.v2p, what)

    def _not_state(self, vids: Sequence[int], what: str) -> None:
        check_not_state(vids, lambda v: self.v2p[v][0], lambda c: self.kind[c] is Kind.RECURRENT, what)

    def _state_slots(self, owner: str, held: Mapping[str, Mapping[int, None]] | None,
                     demand: Mapping[str, int]) -> None:
        check_state_slots(owner, held, demand, lambda c: self.kind[c] is Kind.RECURRENT, self.config.recurrent_slots)

    def _owner(self, owner: str) -> dict[str, dict[int, None]]:
        check_hashable_id(owner, "owner")
        if owner not in self.owners:
            raise UnknownOwnerError(f"owner {owner!r} holds no pages; admit it first")
        return self.owners[owner]

    def _row(self, vid: int, entry: int, row: int) -> Page:
        check_vids([vid], self.v2p, "write/read", "; write/read only live pages")
        cls, slot = self.v2p[vid]
        if not (is_int(entry) and is_int(row) and 0 <= entry < self.entries[cls] and 0 <= row < self.rows[cls]):
            raise InvalidArgumentError(f"page {vid} ({cls}) got entry {entry!r}, row {row!r}; pass an int entry in "
                                       f"[0, {self.entries[cls]}) and an int row in [0, {self.rows[cls]})")
        return cls, slot

    # -- admission ----------------------------------------------------------------------------------
    def _admit_pages(self, demand: dict[str, int]) -> dict[str, list[int]]:
        if not demand:
            return {}
        slots = self.place(demand)
        if slots is None:
            raise AdmissionRejectedError(f"the pool cannot place {demand}", dict(demand),
                                         sum(n * self.page_bytes[c] for c, n in demand.items()))
        pages: dict[str, list[int]] = {}
        for c in self.order:
            for s in slots.get(c, ()):
                v = self._next_vid
                self._next_vid += 1
                self.v2p[v] = (c, s)
                self.refs[v] += 1
                pages.setdefault(c, []).append(v)
        return pages

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Any:
        check_hashable_id(owner, "owner")
        if owner in self.owners:
            raise DuplicateOwnerError(f"owner {owner!r} is already admitted; use extend() to grow it, or free() it "
                                      "first")
        d = self._demand(demand)
        shared = self._vids(shared, f"admit({owner!r}) shared")
        self._not_state(shared, f"admit({owner!r}) shared")
        self._state_slots(owner, None, d)
        pages = self._admit_pages(d)
        held: dict[str, dict[int, None]] = {c: {} for c in self.order}
        for v in shared:
            held[self.v2p[v][0]][v] = None
            self.refs[v] += 1
        for c, vs in pages.items():
            held[c].update(dict.fromkeys(vs))
        self.owners[owner] = held
        return SimpleNamespace(pages=pages)

    def extend(self, owner: str, demand: Mapping[str, int]) -> Any:
        held = self._owner(owner)
        d = self._demand(demand)
        self._state_slots(owner, held, d)
        pages = self._admit_pages(d)
        for c, vs in pages.items():
            held[c].update(dict.fromkeys(vs))
        return SimpleNamespace(pages=pages)

    def relayout(self, demand: Mapping[str, int]) -> Plan:
        """A pool that never moves a band: the demand is checked, nothing moves (allowed at ``safety``)."""
        self._demand(demand)
        return Plan(Rung.NONE)

    # -- owners and freeing ---------------------------------------------------------------------------
    def share(self, owner: str, vids: Sequence[int]) -> None:
        check_hashable_id(owner, "owner")
        vids = self._vids(vids, f"share({owner!r})")
        self._not_state(vids, f"share({owner!r})")
        held = self.owners.get(owner)
        if held is not None:
            dup = [v for v in vids if v in held[self.v2p[v][0]]]
            if dup:
                raise InvalidArgumentError(f"share({owner!r}): already holds {dup}; an owner holds a page once, so "
                                           "drop it first or pass only pages it does not hold")
        else:
            held = self.owners[owner] = {c: {} for c in self.order}
        for v in vids:
            held[self.v2p[v][0]][v] = None
            self.refs[v] += 1

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        held = self._owner(owner)
        vids = check_ids(vids, f"drop({owner!r})")
        if len(set(vids)) != len(vids):
            raise InvalidArgumentError(f"drop({owner!r}): duplicate ids {sorted(vids)}")
        missing = [v for v in vids if v not in self.v2p or v not in held[self.v2p[v][0]]]
        if missing:
            raise DoubleFreeError(f"drop({owner!r}): owner does not hold {missing}")
        for v in vids:
            del held[self.v2p[v][0]][v]
        return self._unref(vids)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        held = self._owner(owner)
        if cls not in self.kind:
            raise InvalidArgumentError(f"slide: unknown class {cls!r}; use one of {self.order}")
        if not is_int(n) or not 0 <= n <= len(held[cls]):
            raise InvalidArgumentError(f"slide({owner!r}, {cls!r}, {n!r}): n must be in [0, {len(held[cls])}]")
        out = list(islice(held[cls], n))
        for v in out:
            del held[cls][v]
        return self._unref(out)

    def free(self, owner: str) -> list[int]:
        held = self._owner(owner)
        del self.owners[owner]
        return self._unref([v for c in self.order for v in held[c]])

    def _unref(self, vids: Sequence[int]) -> list[int]:
        freed = []
        for v in vids:
            self.refs[v] -= 1
            if self.refs[v] == 0:
                del self.refs[v]
                freed.append(v)
                page = self.v2p.pop(v)
                if self.holders[page]:
                    self.withheld.add(page)  # a user still reads or writes it: not reusable yet
                else:
                    self.release_slots(page[0], [page[1]])
        return freed

    # -- the ledger -------------------------------------------------------------------------------------
    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None:
        check_hashable_id(user, "ledger user")
        if user in self.users:
            raise DuplicateUserError(f"ledger user {user!r} is live; release it first or pick a fresh id")
        if not isinstance(kind, UserKind):
            raise InvalidArgumentError(f"acquire: kind must be a UserKind, got {kind!r}")
        pages = tuple(self.v2p[v] for v in self._vids(vids, f"acquire({user!r})"))
        self.users[user] = (kind.mode, pages)
        for p in pages:
            self.holders[p] += 1
            if kind.mode is Mode.WRITE:
                self.writers[p] += 1

    def release(self, user: str) -> None:
        check_hashable_id(user, "ledger user")
        if user not in self.users:
            raise ReleaseWithoutAcquireError(f"release({user!r}): no such live ledger user")
        mode, pages = self.users.pop(user)
        for p in pages:
            self.holders[p] -= 1
            if mode is Mode.WRITE:
                self.writers[p] -= 1
            if not self.holders[p] and p in self.withheld:
                self.withheld.discard(p)
                self.release_slots(p[0], [p[1]])

    # -- data, queries, compaction ------------------------------------------------------------------------
    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        cls, slot = self._row(vid, entry, row)
        check_tag(tag)  # [-2**63, 2**63), as the reference: a pool that stores 8 bytes per row keeps every valid tag
        self.write_row(cls, slot, entry, row, tag)

    def read(self, vid: int, entry: int, row: int) -> int | None:
        cls, slot = self._row(vid, entry, row)
        return self.read_row(cls, slot, entry, row)

    def translate(self, vid: int) -> Page:
        check_vids([vid], self.v2p, "translate")
        return self.v2p[vid]

    def compact(self, max_moves: int | None = None) -> Plan:
        if max_moves is not None and (not is_int(max_moves) or max_moves < 0):
            raise InvalidArgumentError(f"compact: max_moves must be None or an int >= 0, got {max_moves!r}")
        # pages a user holds never move here, and withheld slots are not the pool's to reuse: simple and safe
        pinned = {p for p, n in self.holders.items() if n} | self.withheld
        moves = self.compact_pool(max_moves, pinned)
        by_page = {p: v for v, p in self.v2p.items()}
        for cls, src, dst in moves:
            self.v2p[by_page.pop((cls, src))] = (cls, dst)
        return Plan(Rung.COMPACT if moves else Rung.NONE)

    def held(self, owner: str) -> dict[str, list[int]]:
        return {c: list(vs) for c, vs in self._owner(owner).items()}

    def observe(self) -> Observation:
        spans, holes = self.layout()
        withheld = {c: tuple(sorted(s for k, s in self.withheld if k == c)) for c in self.order}
        return Observation(dict(sorted(self.v2p.items())), {c: tuple(spans[c]) for c in self.order},
                           {c: tuple(sorted(holes.get(c, ()))) for c in self.order}, withheld)
