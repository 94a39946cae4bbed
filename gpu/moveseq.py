"""A plan's moves as arrays: ``Plan.moves`` without a Python object per move.

Compaction moves thousands of pages; building one frozen ``Move`` per page for the returned plan (and walking
them again to apply it) cost more host time than planning them. :class:`MoveSeq` keeps the moves as runs of
``(class, sources, destinations)`` numpy arrays, in plan order, and is a ``Sequence[Move]``: ``len``,
indexing and iteration build ``Move`` objects only for what is looked at, and it compares equal to any
sequence of the same moves (a tuple from the reference included). The allocator applies a plan from its runs
directly (``runs``: O(runs) Python, the rest numpy).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from kvarena.spec.types import Move

_EMPTY = np.zeros(0, dtype=np.int64)


class MoveSeq(Sequence):
    """Moves in plan order as runs ``(cls, src, dst)`` of one class each (consecutive runs of one class merged)."""

    __slots__ = ("_n", "_runs", "_starts")

    def __init__(self, runs: Iterable[tuple[str, np.ndarray, np.ndarray]] = ()) -> None:
        merged: list[tuple[str, np.ndarray, np.ndarray]] = []
        for cls, src, dst in runs:
            if not len(src):
                continue
            src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
            if merged and merged[-1][0] == cls:
                _, s, d = merged.pop()
                src, dst = np.concatenate([s, src]), np.concatenate([d, dst])
            merged.append((cls, src, dst))
        self._runs = merged
        self._starts = np.cumsum([0, *(len(s) for _, s, _ in merged)])
        self._n = int(self._starts[-1])

    @classmethod
    def of(cls, moves: Iterable[Move] | MoveSeq) -> MoveSeq:
        """``moves`` as a MoveSeq (a MoveSeq is returned as is)."""
        if isinstance(moves, MoveSeq):
            return moves
        ms = list(moves)
        out: list[tuple[str, list[int], list[int]]] = []
        for m in ms:
            if not out or out[-1][0] != m.cls:
                out.append((m.cls, [], []))
            out[-1][1].append(m.src)
            out[-1][2].append(m.dst)
        return cls((c, np.array(s, dtype=np.int64), np.array(d, dtype=np.int64)) for c, s, d in out)

    @classmethod
    def concat(cls, *parts: Iterable[Move] | MoveSeq) -> MoveSeq:
        seqs = [s for s in (cls.of(p) for p in parts) if len(s)]
        if len(seqs) == 1:
            return seqs[0]  # immutable: shared, not copied
        return cls(r for s in seqs for r in s.runs())

    def runs(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """``(cls, sources, destinations)`` per run of one class, in plan order (the arrays are the plan's: read
        only)."""
        return self._runs

    def of_class(self, cls: str) -> MoveSeq:
        return MoveSeq(r for r in self._runs if r[0] == cls)

    def without(self, classes: Iterable[str]) -> MoveSeq:
        skip = set(classes)
        if not any(r[0] in skip for r in self._runs):
            return self
        return MoveSeq(r for r in self._runs if r[0] not in skip)

    def bytes(self, page_bytes: dict[str, int]) -> int:
        return sum(len(s) * page_bytes[c] for c, s, _ in self._runs)

    # -- Sequence[Move] ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self._n)))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        r = int(np.searchsorted(self._starts, i, side="right")) - 1
        cls, src, dst = self._runs[r]
        j = i - int(self._starts[r])
        return Move(cls, int(src[j]), int(dst[j]))

    def __iter__(self) -> Iterator[Move]:
        for cls, src, dst in self._runs:
            for s, d in zip(src.tolist(), dst.tolist()):
                yield Move(cls, s, d)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MoveSeq):  # runs are merged on construction: equal moves, equal runs
            return self._n == other._n and len(self._runs) == len(other._runs) and all(
                a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
                for a, b in zip(self._runs, other._runs))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == self._n and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


EMPTY = MoveSeq()


def as_runs(moves: Sequence[Move] | MoveSeq) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Consecutive moves of one class as (class, sources, destinations), in plan order."""
    return MoveSeq.of(moves).runs()


__all__ = ["EMPTY", "MoveSeq", "as_runs"]
