"""Host state of the GPU allocator in numpy: the source of truth for placement, never read from the device.

Three structures, each sized so that a batch of pages is one vectorized update, not a Python loop per page:

* :class:`LiveMap` — a band's p->v on the host: ``arr[slot]`` is the virtual page bound there, -1 for none
  (the planner asks ``slot in band.live`` and ``len(band.live)``, as of a dict).
* :class:`VidPool` — virtual ids, lowest unbound first (spec/arena.md §Virtual pages): the unbound ids below
  ``next`` in a sorted array, so the ``k`` lowest are one slice.
* :class:`OwnerLog` — who holds what: an append-only log of ``(owner row, class, vid)`` acquisitions with an
  ``alive`` flag. An owner's holdings per class, in acquisition order, are its alive entries in log order;
  a batch of extends is one append of arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np


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
            self.free = np.sort(np.concatenate([self.free, *self.pending]), kind="stable")
            self.pending = []
        m = min(k, len(self.free))
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
        self.names: list[str] = []
        self.live_rows = np.zeros(1024, dtype=bool)
        self.listener: Any = None  # per-request page tables (pagetable.py), told of every acquisition
        cap = 1024
        self.row = np.empty(cap, dtype=np.int64)
        self.cls = np.empty(cap, dtype=np.int64)
        self.vid = np.empty(cap, dtype=np.int64)
        self.alive = np.zeros(cap, dtype=bool)
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
        if r >= len(self.live_rows):
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
        return np.fromiter(map(self.rows.get, owners, repeat(-1, n)), dtype=np.int64, count=n)  # type: ignore

    def name(self, owners: object, k: int) -> str:
        o = owners[k]  # type: ignore[index]
        return self.names[int(o)] if isinstance(o, np.integer) and 0 <= o < len(self.names) else str(o)

    # -- the log ------------------------------------------------------------------------------
    def append(self, rows: np.ndarray, classes: np.ndarray, vids: np.ndarray) -> None:
        """Acquisitions in order (one vectorized append)."""
        k = len(vids)
        if self.n + k > len(self.row):
            self._grow(self.n + k)
        sl = slice(self.n, self.n + k)
        self.row[sl], self.cls[sl], self.vid[sl] = rows, classes, vids
        self.alive[sl] = True
        self.n += k
        if self.listener is not None:
            self.listener.appended(rows, classes, vids)

    def _grow(self, need: int) -> None:
        live = np.flatnonzero(self.alive[:self.n])
        cap = max(1024, 2 * (len(live) + need - self.n))
        new = {}
        for name in ("row", "cls", "vid"):
            a = np.empty(cap, dtype=np.int64)
            a[:len(live)] = getattr(self, name)[live]
            new[name] = a
        self.row, self.cls, self.vid = new["row"], new["cls"], new["vid"]
        self.alive = np.zeros(cap, dtype=bool)
        self.alive[:len(live)] = True
        self.n, self.dead = len(live), 0

    def entries(self, row: int, cls: int | None = None) -> np.ndarray:
        """Log indices of ``row``'s alive holdings (of class ``cls``), in acquisition order."""
        m = self.alive[:self.n] & (self.row[:self.n] == row)
        if cls is not None:
            m &= self.cls[:self.n] == cls
        return np.flatnonzero(m)

    def entries_of_rows(self, rows: np.ndarray) -> np.ndarray:
        m = self.alive[:self.n] & np.isin(self.row[:self.n], rows)
        return np.flatnonzero(m)

    def kill(self, idx: np.ndarray) -> None:
        self.alive[idx] = False
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
