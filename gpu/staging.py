"""Host -> device uploads through preallocated staging buffers, never a pageable copy or a sync.

``torch.tensor(list, device="cuda")`` copies from pageable memory: the host blocks until the copy is done,
which drains a stream an engine keeps busy (overlap scheduling). Here every upload writes into a host
buffer (pinned when CUDA is available), then ``dev[:n].copy_(host[:n], non_blocking=True)`` queues the copy
on the current stream and returns at once. The device side of a slot is a fixed-capacity buffer, so
consumers see a slice of preallocated memory (no allocation per call; what CUDA-graph capture needs).

The hazard is the host side: a pinned buffer rewritten before its queued copy ran would upload the new
bytes instead. Each slot therefore carries the event recorded behind its copy, and a slot is reused only
when ``event.query()`` says the copy completed — polled, never waited on; while every slot is in flight the
ring grows. On CPU and meta tensors the copy is synchronous and there is no event, unless a test injects
an event factory (``events=``) to drive the ring by hand (:func:`check`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

COPY_WORDS = 256  # a copied ring's slot size; it grows on demand like any ring


class _Slot:
    __slots__ = ("dev", "event", "host", "np", "views")

    def __init__(self, words: int, device: torch.device, pin: bool) -> None:
        self.host = torch.empty(words, dtype=torch.int64, pin_memory=pin)
        self.np = self.host.numpy()
        self.dev = torch.empty(words, dtype=torch.int64, device=device)
        self.event: Any = None
        self.views: dict[tuple[int, int], torch.Tensor] = {}  # (rows, n) -> host[:rows * n].view(rows, n)

    # A copied arena (kvarena explore copies states whole) stages through fresh small buffers of its own: a slot's
    # contents are scratch between calls, and the host array must be a view of the host tensor, not a copy of it.
    def __getstate__(self) -> dict[str, Any]:
        return {"words": min(len(self.np), COPY_WORDS), "device": self.dev.device, "pin": self.host.is_pinned()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["words"], state["device"], state["pin"])  # type: ignore[misc]


class Staging:
    """A ring of (host, device) buffer pairs; :meth:`upload` returns a device slice holding the data."""

    def __init__(self, device: torch.device, words: int = 1 << 15, slots: int = 4,
                 events: Callable[[], Any] | None = None) -> None:
        self.device = device
        self.pin = device.type == "cuda" and torch.cuda.is_available()
        self.words = words
        if events is None and device.type == "cuda":
            events = torch.cuda.Event
        self.events = events
        self.ring = [_Slot(words, device, self.pin) for _ in range(slots)]
        self.cursor = 0
        self.uploads = 0  # counters for bench/host_cost.py
        self.grown = 0

    def __setstate__(self, state: dict[str, Any]) -> None:  # a copy grows from small slots (COPY_WORDS)
        self.__dict__.update(state)
        self.words = min(self.words, COPY_WORDS)

    def _free_slot(self, n: int) -> _Slot:
        ring = self.ring
        for i in range(len(ring)):
            s = ring[(self.cursor + i) % len(ring)]
            if s.event is None or s.event.query():  # the copy that last used it has completed
                if len(s.np) < n:
                    break
                self.cursor = (self.cursor + i + 1) % len(ring)
                return s
        words = max(self.words, 1 << max(0, n - 1).bit_length())
        s = _Slot(words, self.device, self.pin)  # every slot is in flight (or too small): grow, never wait
        ring.insert(self.cursor, s)
        self.cursor = (self.cursor + 1) % len(ring)
        self.grown += 1
        return s

    def upload(self, data: np.ndarray) -> torch.Tensor:
        """``data`` (1-D int64) on the device, as a slice of a preallocated buffer; queued, not waited on."""
        return self.upload_parts([data])

    def upload_parts(self, parts: list[np.ndarray], adds: list[int] | None = None) -> torch.Tensor:
        """The concatenation of ``parts`` (1-D int64 arrays; ``adds[i]`` added to part ``i`` as it is written)
        on the device: written into the staging buffer part by part, no host temporary."""
        n = sum(len(p) for p in parts)
        s = self._free_slot(n)
        buf, a = s.np, 0
        for i, p in enumerate(parts):
            b = a + len(p)
            if adds is not None and adds[i]:
                np.add(p, adds[i], out=buf[a:b])
            else:
                buf[a:b] = p
            a = b
        out = s.dev[:n]
        out.copy_(s.host[:n], non_blocking=True)
        if self.events is not None:
            s.event = self.events()
            if hasattr(s.event, "record"):
                s.event.record()
        self.uploads += 1
        return out

    def copy_rows(self, dst: torch.Tensor, parts: list[np.ndarray]) -> None:
        """``dst`` (a ``(len(parts), n)`` device view, rows anywhere, e.g. slices of two tables as one strided
        view) gets ``parts`` (1-D int64, ``n`` each): written into one staging buffer, then **one** queued copy
        straight into ``dst``, no device staging buffer and no scatter. The host view of each shape is made once
        per buffer (a torch view costs as much as the copy on CPU)."""
        r, n = len(parts), len(parts[0])
        s = self._free_slot(r * n)
        buf = s.np
        for i, p in enumerate(parts):
            buf[i * n:(i + 1) * n] = p
        hv = s.views.get((r, n))
        if hv is None:
            hv = s.views[(r, n)] = s.host[:r * n].view(r, n)
        dst.copy_(hv, True)  # non_blocking (positional: torch parses keywords slower)
        if self.events is not None:
            s.event = self.events()
            if hasattr(s.event, "record"):
                s.event.record()
        self.uploads += 1


# ---------------------------------------------------------------------------------------------


class ManualEvent:
    """A stand-in for ``torch.cuda.Event`` whose completion a test decides (``done = True``)."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def check() -> None:
    """Drive the ring with events that have not completed: no slot whose copy is in flight is rewritten, and
    a completed slot is reused (the ring does not grow without bound)."""
    made: list[ManualEvent] = []

    def event() -> ManualEvent:
        made.append(ManualEvent())
        return made[-1]

    st = Staging(torch.device("cpu"), words=8, slots=2, events=event)
    seen: list[tuple[_Slot, np.ndarray]] = []
    for i in range(5):  # nothing completes: every upload needs a slot of its own
        data = np.arange(4, dtype=np.int64) + 10 * i
        st.upload(data)
        slot = next(s for s in st.ring if s.event is made[-1])
        seen.append((slot, data))
    for slot, data in seen:
        assert np.array_equal(slot.np[:4], data), "a staging buffer was rewritten before its copy completed"
    assert len({id(s) for s, _ in seen}) == 5, "two in-flight uploads shared a staging buffer"
    for e in made:
        e.done = True
    n = len(st.ring)
    for i in range(3 * n):
        st.upload(np.full(4, i, dtype=np.int64))
        made[-1].done = True
    assert len(st.ring) == n, "completed staging buffers were not reused"
