"""A step's device work at fixed shapes: what a CUDA graph captures once and replays every decode step.

The eager path (``Tables.bind`` + ``zero_slots``) sizes its launches by the step's page count, which changes
every step. Here every step has the same shapes: up to ``width`` new pages per class, written by the host
into one pinned input buffer of fixed size; lanes that carry no page point at places no page uses (the
tables' spare column, which they set to -1, and the class's dump page past the arena, which they zero). The
device work is then the same ops on the same addresses every step:

1. one H2D copy of the input buffer (``non_blocking``, from pinned memory);
2. one ``index_copy_`` into the tables' flat tensor, v->p and p->v at once (the spare columns absorb the
   padding lanes);
3. one zero launch per class over ``width`` slots (padding lanes name the dump page, which the kernel skips).

On CUDA the first step of each of the two input buffers warms up and captures these ops into a
``torch.cuda.CUDAGraph``; later steps only fill the buffer and replay. Two buffers alternate so the host can
fill one while the other's copy may still be queued; each carries the event recorded behind its last replay,
and a buffer is refilled only after its event completed (polled). When both are in flight, or a step has more
than ``width`` pages of a class, the step runs eagerly instead (never a wait). Elsewhere (CPU, meta) the same
fixed-shape ops run eagerly, which is how CI checks them against the eager path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvarena.gpu.kernels.zero import zero_slots


class GraphStep:
    """Fixed-shape binds of new pages (tables and zeroing) for an arena; :meth:`bind` or False."""

    def __init__(self, arena: Any, width: int) -> None:
        self.a = arena
        self.width = width
        k = len(arena.order)
        self.k = k
        dev = arena.device
        self.cuda = dev.type == "cuda"
        pin = self.cuda and torch.cuda.is_available()
        n = 5 * k * width
        self.host = [torch.empty(n, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.np = [h.numpy() for h in self.host]
        self.dev = [torch.empty(n, dtype=torch.int64, device=dev) for _ in range(2)]
        self.events: list[Any] = [None, None]
        self.graphs: list[Any] = [None, None]
        self.turn = 0
        t = arena.tables
        cols_v, cols_p = t.cols_v, t.cols_p
        c = np.repeat(np.arange(k, dtype=np.int64), width)
        # the buffer: [v->p indices | p->v indices | their values (v->p, then p->v) | slots to zero], flat indices
        # into the tables' one tensor; the padding lanes: spare table columns (value -1), each class's dump page
        self.pad = np.concatenate([c * cols_v + t.n_vids, t.p_base + c * cols_p + t.width, np.full(2 * k * width, -1),
                                   np.repeat([arena.mem.dump_slot[n] for n in arena.order], width)]).astype(np.int64)
        self.cols = (cols_v, cols_p)
        self.binds = self.replays = self.eager_fallbacks = 0

    def __setstate__(self, state: dict[str, Any]) -> None:  # a copied arena (kvarena explore)
        self.__dict__.update(state)
        self.np = [h.numpy() for h in self.host]  # views of the host buffers again, not copies

    def _ops(self, b: int) -> None:
        """The device work of one step on buffer ``b``: the same shapes and addresses every time."""
        a, kw, d = self.a, self.k * self.width, self.dev[b]
        d.copy_(self.host[b], non_blocking=True)
        a.tables.flat.index_copy_(0, d[:2 * kw], d[2 * kw:4 * kw])
        for c, name in enumerate(a.order):
            lanes = d[4 * kw + c * self.width:4 * kw + (c + 1) * self.width]
            zero_slots(a.mem.words_all, lanes, a.mem.page_bytes[name], skip=a.mem.dump_slot[name])

    def _free_buffer(self) -> int | None:
        for i in range(2):
            b = (self.turn + i) % 2
            e = self.events[b]
            if e is None or e.query():
                return b
        return None

    def bind(self, classes: np.ndarray, vids: np.ndarray, slots: np.ndarray) -> bool:
        """Bind ``(class, vid, slot)`` pages with the fixed-shape ops; False (nothing done) if they do not fit
        ``width`` per class or both input buffers are still in flight."""
        counts = np.bincount(classes, minlength=self.k)
        if (counts > self.width).any():
            self.eager_fallbacks += 1
            return False
        b = self._free_buffer()
        if b is None:
            self.eager_fallbacks += 1
            return False
        order = np.argsort(classes, kind="stable")
        cs, vs, ss = classes[order], vids[order], slots[order]
        starts = np.concatenate([[0], np.cumsum(counts)])
        lane = cs * self.width + np.arange(len(cs)) - starts[cs]
        buf, kw = self.np[b], self.k * self.width
        buf[:] = self.pad
        cols_v, cols_p = self.cols
        buf[lane] = cs * cols_v + vs
        buf[kw + lane] = self.a.tables.p_base + cs * cols_p + ss
        buf[2 * kw + lane] = ss
        buf[3 * kw + lane] = vs
        buf[4 * kw + lane] = ss
        self._run(b)
        self.turn = (b + 1) % 2
        self.binds += 1
        return True

    def _run(self, b: int) -> None:
        if not self.cuda:
            self._ops(b)
            return
        if self.graphs[b] is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
                self._ops(b)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._ops(b)
            self.graphs[b] = g
        self.graphs[b].replay()
        self.replays += 1
        e = torch.cuda.Event()
        e.record()
        self.events[b] = e
