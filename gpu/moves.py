"""Moves on the host and the device: a plan's page moves applied to the numpy mirrors, then to the arena.

Host: a run of moves of one class in which no slot is both a source and a destination (every rung-2 run) is
three vectorized stores into the p->v / v->p mirrors and one rebuild of the holes; other runs go move by
move. Device: the plan's moves in plan order, in batches no slot of which is both a source and a destination
(``kernels.move.check_moves`` refuses anything else), each batch one staged upload and one launch of the
fused move kernel, which copies the pages' bytes and remaps both tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvarena.gpu.hoststate import distinct
from kvarena.gpu.kernels.move import check_moves, move_slots
from kvarena.gpu.moveseq import MoveSeq
from kvarena.gpu.planner import Band, Role
from kvarena.spec.types import Move


class MoveOps:
    """Mixed into :class:`kvarena.gpu.allocator.GpuArena` (it owns the state these methods use)."""

    bands: dict[str, Band]
    vslot: np.ndarray
    mem: Any
    staging: Any
    tables: Any
    cidx: dict[str, int]
    stats: dict

    def _move(self, m: Move) -> None:
        band = self.bands[m.cls]
        vid = band.live.pop(m.src)
        band.holes.remove(m.dst)
        band.live[m.dst] = vid
        self.vslot[vid] = m.dst
        self._vacate(band, m.src)

    def _move_many(self, cls: str, src: np.ndarray, dst: np.ndarray) -> None:
        """Host side of a run of moves of one class in which no slot is both a source and a destination: the
        p->v and v->p mirrors in three vectorized stores, the holes rebuilt once (a run that is not like that
        goes move by move)."""
        if len(src) < 8 or not distinct(np.concatenate([src, dst])):  # a source twice is no bulk run either
            for s, d in zip(src.tolist(), dst.tolist()):
                self._move(Move(cls, s, d))
            return
        band = self.bands[cls]
        arr = band.live.arr  # type: ignore[attr-defined]
        vids = arr[src]
        arr[dst] = vids
        arr[src] = -1
        self.vslot[vids] = dst
        holes = np.asarray(band.holes, dtype=np.int64)
        band.holes.clear()
        band.holes.update(holes[~np.isin(holes, dst)].tolist())
        self._vacate_many(band, src)

    def _device_moves(self, moves: Sequence[Move] | MoveSeq) -> None:
        """Bytes and tables of the plan's moves, in plan order, batched: a batch is one class and no slot in it
        is both a source and a destination (rung-3 destinations may reuse bytes rung-2 sources left)."""
        for cls, src, dst in MoveSeq.of(moves).runs():
            self._device_run(cls, src, dst)

    def _device_run(self, cls: str, src_all: np.ndarray, dst_all: np.ndarray) -> None:
        i, n_all = 0, len(src_all)
        while i < n_all:
            if distinct(np.concatenate([src_all[i:], dst_all[i:]])):
                j = n_all  # the rest is one batch (the rung-2 case: sources live, destinations holes)
            else:
                srcs: set[int] = set()
                dsts: set[int] = set()
                j = i
                while j < n_all and int(src_all[j]) not in dsts and int(dst_all[j]) not in srcs \
                        and int(dst_all[j]) not in dsts:
                    srcs.add(int(src_all[j]))
                    dsts.add(int(dst_all[j]))
                    j += 1
            self._device_batch(cls, src_all[i:j], dst_all[i:j])
            i = j

    def _device_batch(self, cls: str, src: np.ndarray, dst: np.ndarray) -> None:
        """One launch: the pages' bytes and both tables (the fused remap), after the host refused a batch one
        launch cannot run correctly."""
        band = self.bands[cls]
        check_moves(src, dst, band.page_bytes, self.mem.words.numel() * 8 // band.page_bytes)
        n = len(src)
        dev = self.staging.upload(np.concatenate([src, dst, band.live.arr[dst]]))  # type: ignore[attr-defined]
        c = self.cidx[cls]
        move_slots(self.mem.words, dev[:n], dev[n:2 * n], band.page_bytes,
                   remap=(dev[2 * n:], self.tables.v2p[c], self.tables.p2v[c]))
        rung = 3 if band.role is Role.FLOAT else 2  # floats move only at rung 3, ends at 2
        self.stats["moves"][rung] += n
        self.stats["bytes_moved"][rung] += n * band.page_bytes
        self.stats["move_launches"] += 1
