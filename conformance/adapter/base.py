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
from collections.abc import Mapping, Sequence
from itertools import islice
from types import SimpleNamespace
from typing import Any

from kvarena.spec import guards
from kvarena.spec.errors import (
    AdmissionRejectedError,
)
from kvarena.spec.guards import check_tag
from kvarena.spec.layout import entries_per_page, entry_layout
from kvarena.spec.models import ArenaConfig, Shape, chain
from kvarena.spec.types import Mode, Observation, Plan, Rung, UserKind

Page = tuple[str, int]  # (class, slot)


class PoolAdapter:
    """The adapter protocol (kvarena.conformance.adapter.protocol.Allocator) around a pool's primitives."""

    def __init__(self, config: ArenaConfig) -> None:
        config.validate()  # ConfigError / MisalignedRowError exactly as the reference raises them
        self.config = config
        self.shape = Shape.of(config)  # what the guards (spec/guards.py) read of the configuration
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

    # -- what the guards ask (spec/guards.py: one ordered sequence per operation, shared with the reference) ------
    def class_of(self, vid: int) -> str | None:
        page = self.v2p.get(vid)
        return None if page is None else page[0]

    def pages_of(self, owner: object) -> Mapping[str, Mapping[int, None]] | None:
        return self.owners.get(owner)  # type: ignore[call-overload]

    def user_live(self, user: object) -> bool:
        return user in self.users

    def _demand(self, demand: Mapping[str, int]) -> dict[str, int]:
        return guards.check_demand(self.shape, demand)

    def _owner(self, owner: str) -> dict[str, dict[int, None]]:
        guards.guard_free(self.shape, self, owner)  # a known owner
        return self.owners[owner]

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
        d, shared, _limits = guards.guard_admit(self.shape, self, owner, demand, shared, None)
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
        d, _limits = guards.guard_extend(self.shape, self, owner, demand, None)
        held = self.owners[owner]
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
        vids = guards.guard_share(self.shape, self, owner, vids)
        held = self.owners.get(owner)
        if held is None:
            held = self.owners[owner] = {c: {} for c in self.order}
        for v in vids:
            held[self.v2p[v][0]][v] = None
            self.refs[v] += 1

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        vids = guards.guard_drop(self.shape, self, owner, vids)
        held = self.owners[owner]
        for v in vids:
            del held[self.v2p[v][0]][v]
        return self._unref(vids)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        n = guards.guard_slide(self.shape, self, owner, cls, n)
        held = self.owners[owner]
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
        pages = tuple(self.v2p[v] for v in guards.guard_acquire(self.shape, self, user, kind, vids))
        self.users[user] = (kind.mode, pages)
        for p in pages:
            self.holders[p] += 1
            if kind.mode is Mode.WRITE:
                self.writers[p] += 1

    def release(self, user: str) -> None:
        guards.guard_release(self, user)
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

    def _row(self, vid: int, entry: int, row: int) -> Page:
        guards.guard_row(self.shape, self, vid, entry, row, "write/read")
        return self.v2p[vid]

    def translate(self, vid: int) -> Page:
        guards.check_bound(self, [vid], "translate")
        return self.v2p[vid]

    def compact(self, max_moves: int | None = None) -> Plan:
        guards.guard_max_moves(max_moves)
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
