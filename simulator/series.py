"""Time series of a run for the plots: active requests, bytes per class, band spans and the gap."""

from __future__ import annotations

from kvarena.reference.arena import Arena

PLOT_SAMPLES = 1500  # time-series points per configuration: between this and twice this


class Series:
    """A scheduler sampler. Called every step; keeps every ``stride``-th, and halves itself (doubling the
    stride) when it holds twice ``limit`` points, so a run of any length keeps ``limit``..2 x ``limit``."""

    def __init__(self, limit: int = PLOT_SAMPLES) -> None:
        self.data: dict[str, list] = {"t": [], "active": [], "occupancy": [], "spans": [], "gap": []}
        self.limit, self.stride = limit, 1

    def __call__(self, step: int, clock: float, pager, active: int) -> None:
        if step % self.stride:
            return
        d, alloc = self.data, pager.alloc
        if len(d["t"]) >= 2 * self.limit:
            for k in d:
                d[k] = d[k][::2]
            self.stride *= 2
        d["t"].append(clock)
        d["active"].append(active)
        d["occupancy"].append(pager.occupancy())
        if hasattr(alloc, "bands"):
            d["spans"].append({n: (b.lo_byte, b.hi_byte) for n, b in alloc.bands.items()})
            d["gap"].append(alloc.gap_bytes() if isinstance(alloc, Arena) and alloc.ANCHORED_ENDS else 0)
