"""Host state of the GPU allocator in numpy: the source of truth for placement, never read from the device.

Three structures, each sized so that a batch of pages is one vectorized update, not a Python loop per page:

* :class:`LiveMap` — a band's p->v on the host: ``arr[slot]`` is the virtual page bound there, -1 for none
  (the planner asks ``slot in band.live`` and ``len(band.live)``, as of a dict).
* :class:`VidPool` — virtual ids, lowest unbound first (spec/arena.md §Virtual pages): the unbound ids below
  ``next`` in a sorted array, so the ``k`` lowest are one slice.
* :class:`OwnerLog` — who holds what: an append-only log of ``(owner row, class, vid)`` acquisitions; a
  released entry's row becomes -1 (dead). An owner's holdings per class, in acquisition order, are its entries
  in log order; a batch of extends is one append of arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from kvarena.spec.errors import ArenaError, InvalidArgumentError, UnknownOwnerError
from kvarena.spec.guards import check_hashable_id


def distinct(a: np.ndarray) -> bool:
    """No value twice (a sort: ``np.unique`` hashes and is ~10x slower on int64 in numpy 2.x)."""
    if len(a) < 2:
        return True
    x = np.sort(a)
    return bool((x[1:] != x[:-1]).all())


def first_occurrence(a: np.ndarray) -> np.ndarray:
    """Mask of the elements that are the first of their value (``[7, 3, 7] -> [T, T, F]``)."""
    order = np.argsort(a, kind="stable")
    x = a[order]
    first = np.zeros(len(a), dtype=bool)
    first[order[np.r_[True, x[1:] != x[:-1]]] if len(a) else order] = True
    return first


class LiveMap:
    """slot -> virtual page of one band (numpy, -1 = none), with the dict operations the planner uses."""

    __slots__ = ("arr", "n")

    def __init__(self, top: int) -> None:
        self.arr = np.full(max(top, 1), -1, dtype=np.int64)
        self.n = 0

    def __contains__(self, s: object) -> bool:
        return isinstance(s, (int, np.integer)) and 0 <= s < len(self.arr) and self.arr[s] >= 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, s: int) -> int:
        v = int(self.arr[s])
        if v < 0:
            raise KeyError(s)
        return v

    def __setitem__(self, s: int, v: int) -> None:
        if self.arr[s] < 0:
            self.n += 1
        self.arr[s] = v

    def pop(self, s: int) -> int:
        v = self[s]
        self.arr[s] = -1
        self.n -= 1
        return v

    def __delitem__(self, s: int) -> None:
        self.pop(s)

    def put(self, slots: np.ndarray, vids: np.ndarray) -> None:
        """Bind unbound ``slots`` to ``vids`` (one vectorized store)."""
        self.arr[slots] = vids
        self.n += len(slots)

    def put_run(self, first: int, vids: np.ndarray) -> None:
        """Bind the unbound slots ``first, first + 1, ...`` to ``vids`` (one slice store)."""
        self.arr[first:first + len(vids)] = vids
        self.n += len(vids)

    def clear(self, slots: np.ndarray) -> None:
        self.arr[slots] = -1
        self.n -= len(slots)

    def items(self) -> list[tuple[int, int]]:
        s = np.flatnonzero(self.arr >= 0)
        return list(zip(s.tolist(), self.arr[s].tolist()))


class VidPool:
    """Virtual ids, lowest unbound first: the freed ids below ``next`` as a sorted numpy array (plus the ids
    freed since, merged at the next take: two sorted runs, one stable sort), then fresh ids from ``next``."""

    def __init__(self) -> None:
        self.free = np.zeros(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []
        self.next = 0

    def take(self, k: int) -> np.ndarray:
        """The ``k`` lowest unbound ids, ascending (bound from now on)."""
        if self.pending:
            if len(self.pending) == 1 and not len(self.free):  # one sorted run: nothing to merge
                self.free = self.pending[0]
            else:
                self.free = np.sort(np.concatenate([self.free, *self.pending]), kind="stable")
            self.pending = []
        m = min(k, len(self.free))
        if m == k:  # a view of the free run (never written in place: ``free`` is only ever replaced)
            out = self.free[:k]
            self.free = self.free[k:]
            return out
        out = np.empty(k, dtype=np.int64)
        out[:m] = self.free[:m]
        self.free = self.free[m:]
        out[m:] = np.arange(self.next, self.next + k - m, dtype=np.int64)
        self.next += k - m
        return out

    def give(self, vids: Sequence[int] | np.ndarray) -> None:
        self.pending.append(np.sort(np.asarray(vids, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self.free) + sum(len(p) for p in self.pending)


class OwnerLog:
    """Owners and what they hold: rows for owner names, and an append-only log of acquisitions."""

    def __init__(self, n_classes: int) -> None:
        self.k = n_classes
        self.rows: dict[str, int] = {}
        self.names: list[str] = [""]  # row 0 is never an owner's: ``all_live`` clips negative handles to it
        self.live_rows = np.zeros(1024, dtype=bool)
        self._ones: dict[int, bytes] = {}  # n -> n one bytes (all_live)
        self._stamp = np.zeros(0, dtype=np.int64)  # scratch of distinct_rows, one entry per row
        self.listener: Any = None  # per-request page tables (pagetable.py), told of every acquisition
        cap = 1024
        self.row = np.empty(cap, dtype=np.int64)
        self.cls = np.empty(cap, dtype=np.int64)
        self.vid = np.empty(cap, dtype=np.int64)
        self.n = 0
        self.dead = 0

    # -- owners -------------------------------------------------------------------------------
    def __contains__(self, owner: object) -> bool:
        return owner in self.rows

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows)

    def add(self, owner: str) -> int:
        r = len(self.names)
        self.names.append(owner)
        self.rows[owner] = r
        if r >= len(self.live_rows) - 1:  # the last entry stays False: ``all_live`` clips to it
            grown = np.zeros(2 * len(self.live_rows), dtype=bool)
            grown[:len(self.live_rows)] = self.live_rows
            self.live_rows = grown
        self.live_rows[r] = True
        return r

    def forget(self, owner: str) -> None:
        self.live_rows[self.rows.pop(owner)] = False

    def lookup(self, owners: object) -> np.ndarray:
        """Rows of ``owners`` (names, or the int rows an earlier call returned: an engine's request handles,
        checked in one vectorized test); -1 for an owner that is not admitted."""
        if isinstance(owners, np.ndarray) and np.issubdtype(owners.dtype, np.integer):
            rows = owners.astype(np.int64)
            ok = (rows >= 0) & (rows < len(self.names))
            ok[ok] = self.live_rows[rows[ok]]
            return np.where(ok, rows, -1)
        n = len(owners)  # type: ignore[arg-type]
        try:
            return np.fromiter(map(self.rows.get, owners, repeat(-1, n)), dtype=np.int64, count=n)  # type: ignore
        except TypeError:  # an unhashable name is no owner; ``missing`` says why that lane is refused
            return np.array([self._row(o) for o in owners], dtype=np.int64)  # type: ignore[attr-defined]

    def _row(self, owner: object) -> int:
        try:
            return self.rows.get(owner, -1)  # type: ignore[call-overload]
        except TypeError:
            return -1

    def missing(self, owners: object, k: int, what: str = "") -> ArenaError:
        """The refusal of lane ``k``, whose owner ``lookup`` found no row for: ``InvalidArgument`` for an
        unhashable id (as ``extend``/``free`` raise it, spec/guards.py ``check_hashable_id``), else
        ``UnknownOwner``. ``what``: the call's name prefixed to the message, if any."""
        o = owners[k]  # type: ignore[index]
        try:
            check_hashable_id(o, "owner")
        except InvalidArgumentError as e:
            return InvalidArgumentError(f"{what}{e}")
        return UnknownOwnerError(f"{what}owner {self.name(owners, k)!r} holds no pages; admit it first (a freed "
                                 "owner is forgotten)")

    def distinct_rows(self, rows: np.ndarray) -> bool:
        """No row twice among admitted owners' rows, in O(n) without a sort: each row's position is scattered
        into a scratch array, then gathered back; a row named twice reads back only one of its positions."""
        n = len(rows)
        if n < 2:
            return True
        if len(self._stamp) < len(self.live_rows):
            self._stamp = np.zeros(len(self.live_rows), dtype=np.int64)
        pos = np.arange(n)
        self._stamp[rows] = pos
        return bool((self._stamp[rows] == pos).all())

    def all_live(self, rows: np.ndarray) -> bool:
        """Every int64 handle in ``rows`` is an admitted owner's row, in two numpy calls and no ufunc (on CPU
        each numpy call after other work costs a few µs cold, a ufunc reduction ~10): ``take(mode="clip")``
        sends a negative handle to row 0 and one past the table to its last entry, neither ever live
        (``__init__``, ``add``), and the picked flags are compared with ``n`` ones as bytes."""
        n = len(rows)
        ones = self._ones.get(n)
        if ones is None:
            ones = self._ones[n] = b"\x01" * n
            if len(self._ones) > 16:
                del self._ones[next(iter(self._ones))]
        return self.live_rows.take(rows, mode="clip").tobytes() == ones

    def name(self, owners: object, k: int) -> str:
        o = owners[k]  # type: ignore[index]
        return self.names[int(o)] if isinstance(o, np.integer) and 0 < o < len(self.names) else str(o)

    # -- the log ------------------------------------------------------------------------------
    def append(self, rows: np.ndarray, classes: np.ndarray | int, vids: np.ndarray) -> None:
        """Acquisitions in order (one vectorized append); ``classes`` one per entry, or one int for all."""
        k = len(vids)
        if self.n + k > len(self.row):
            self._grow(self.n + k)
        a, b = self.n, self.n + k
        self.row[a:b] = rows
        self.cls[a:b] = classes
        self.vid[a:b] = vids
        self.n = b
        if self.listener is not None:
            self.listener.appended(rows, np.broadcast_to(np.asarray(classes, dtype=np.int64), (k,)), vids)

    def _grow(self, need: int) -> None:
        """Room for ``need`` entries: the alive ones compacted to the front, in place while that leaves the log at
        most half full (no new arrays: fresh pages would be faulted in on the hot path), else into arrays
        four times the alive entries (compacted again only every few batches)."""
        live = np.flatnonzero(self.row[:self.n] >= 0)
        m = len(live)
        want = m + need - self.n
        if 2 * want <= len(self.row):
            for a in (self.row, self.cls, self.vid):
                a[:m] = a[live]
        else:
            cap = max(1024, 4 * want)
            new = []
            for a in (self.row, self.cls, self.vid):
                b = np.empty(cap, dtype=np.int64)
                b[:m] = a[live]
                new.append(b)
            self.row, self.cls, self.vid = new
        self.n, self.dead = m, 0

    def entries(self, row: int, cls: int | None = None) -> np.ndarray:
        """Log indices of ``row``'s holdings (of class ``cls``), in acquisition order (dead entries have row -1)."""
        m = self.row[:self.n] == row
        if cls is not None:
            m &= self.cls[:self.n] == cls
        return np.flatnonzero(m)

    def entries_of_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.isin(self.row[:self.n], rows))

    def kill(self, idx: np.ndarray) -> None:
        self.row[idx] = -1
        self.dead += len(idx)

    def held(self, row: int, order: Sequence[str]) -> dict[str, tuple[int, ...]]:
        idx = self.entries(row)
        c, v = self.cls[idx], self.vid[idx]
        return {name: tuple(v[c == i].tolist()) for i, name in enumerate(order)}

    def held_sorted(self, row: int) -> np.ndarray:
        """``row``'s vids in the order ``free`` lets go of them: class (chain order), then acquisition."""
        idx = self.entries(row)
        idx = idx[np.argsort(self.cls[idx], kind="stable")]
        return idx
