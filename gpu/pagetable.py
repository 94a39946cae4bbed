"""Per-request page tables on the device (FlashInfer-style), kept by the host's owner log.

``table(cls)[row, j]`` is the virtual page of the ``j``-th ``cls`` page owner ``row`` holds (in ``held``
order), -1 past its last; ``width`` columns per row. Virtual, not physical: a move changes v->p only, so
the table never needs a remap; ``physical(cls, rows)`` gathers the slots through the device v->p row (no host
read), which is what an attention kernel's page table holds.

The host mirror follows every acquisition the owner log records (one vectorized append: positions are the
owner's counts plus a rank within the batch) and every release (drop / slide / free: the owner's row rebuilt
from the log, rare); the device copy follows through one staged upload and one ``index_copy_`` per change. An
owner holding more than ``width`` pages of a class is marked overflowed for it: its row keeps the first
``width`` pages, and ``token_locs`` answers it from the log instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class PageTables:
    def __init__(self, arena: Any, width: int, rows: int = 1024) -> None:
        self.a = arena
        self.width = width
        self.k = len(arena.order)
        self.host = np.full((self.k, rows, width), -1, dtype=np.int64)
        self.count = np.zeros((self.k, rows), dtype=np.int64)
        self.dev = torch.full((self.k, rows, width), -1, dtype=torch.int64, device=arena.device)

    def _ensure(self, row_max: int) -> None:
        rows = self.host.shape[1]
        if row_max < rows:
            return
        new = max(2 * rows, row_max + 1)  # host-known growth (a new device buffer: capture again after it)
        host = np.full((self.k, new, self.width), -1, dtype=np.int64)
        host[:, :rows] = self.host
        count = np.zeros((self.k, new), dtype=np.int64)
        count[:, :rows] = self.count
        dev = torch.full((self.k, new, self.width), -1, dtype=torch.int64, device=self.a.device)
        dev[:, :rows] = self.dev
        self.host, self.count, self.dev = host, count, dev

    def table(self, cls: str) -> torch.Tensor:
        return self.dev[self.a.cidx[cls]]

    def _upload(self, flat: np.ndarray, vals: np.ndarray) -> None:
        if len(flat):
            d = self.a.staging.upload(np.concatenate([flat, vals]))
            self.dev.view(-1).index_copy_(0, d[:len(flat)], d[len(flat):])

    def appended(self, rows: np.ndarray, classes: np.ndarray, vids: np.ndarray) -> None:
        """Acquisitions in log order: each at its owner's next position of its class."""
        if not len(vids):
            return
        self._ensure(int(rows.max()))
        key = classes * self.host.shape[1] + rows
        order = np.argsort(key, kind="stable")
        ks = key[order]
        start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        rank = np.arange(len(ks)) - np.repeat(start, np.diff(np.r_[start, len(ks)]))
        c, r = classes[order], rows[order]
        pos = self.count[c, r] + rank
        np.add.at(self.count, (c, r), 1)
        fit = pos < self.width
        c, r, pos, v = c[fit], r[fit], pos[fit], vids[order][fit]
        self.host[c, r, pos] = v
        self._upload((c * self.host.shape[1] + r) * self.width + pos, v)

    def clear(self, rows: np.ndarray) -> None:
        """Freed owners: their rows back to -1 (one upload, one fill)."""
        rows = rows[rows < self.host.shape[1]]
        if len(rows):
            self.host[:, rows] = -1
            self.count[:, rows] = 0
            self.dev.index_fill_(1, self.a.staging.upload(rows), -1)

    def rebuild(self, rows: np.ndarray) -> None:
        """Rows whose holdings lost pages: rewritten from the log (host and device)."""
        rows = np.unique(rows)
        if not len(rows):
            return
        log = self.a.owners
        self.host[:, rows] = -1
        self.count[:, rows] = 0
        flat, vals = [], []
        for r in rows.tolist():
            idx = log.entries(r)
            for c in range(self.k):
                v = log.vid[idx[log.cls[idx] == c]]
                self.count[c, r] = len(v)
                v = v[:self.width]
                self.host[c, r, :len(v)] = v
                base = (c * self.host.shape[1] + r) * self.width
                flat.append(base + np.arange(self.width))
                vals.append(self.host[c, r])
        self._upload(np.concatenate(flat), np.concatenate(vals))

    def overflowed(self, cls: str, rows: np.ndarray) -> bool:
        return bool((self.count[self.a.cidx[cls], rows] > self.width).any())

    def physical(self, cls: str, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Slots of the owners' pages (rows on the device), -1 past their last: a gather through v->p."""
        c = self.a.cidx[cls]
        t = self.dev[c].index_select(0, rows)
        v2p = self.a.tables.v2p[c]
        spare = v2p.numel() - 1  # the tables' spare column holds -1
        got = v2p.index_select(0, torch.where(t >= 0, t, spare).view(-1)).view(t.shape)
        if out is None:
            return got
        out.copy_(got)
        return out
