"""The allocator as the scheduler sees it: per-request page bookkeeping, tokens in, page demands out.

The allocator is any engine behind the page API of ``engines.py`` (``admit / extend / slide / free /
acquire / release``, ``stats``, ``used_bytes``). The pager turns "request r now holds T tokens" into
page demands per state class: full-attention pages for every token, window pages for the newest W
tokens (plus the out-of-window pages SGLang has not evicted yet), and ``state_slots`` recurrent-state
slots (1, or 1 + the mamba tracking slots of SGLang's extra_buffer strategy).

Window retention is page-granular: at 64-token pages, W = 128 and SGLANG_SWA_EVICTION_INTERVAL 128 a
decoding request holds 3, 4, 5 window pages in turn (192-320 tokens), where SGLang at page size 1 holds
W + 1 to W + 128 tokens (sglang/srt/mem_cache/common.py ``free_swa_out_of_window_slots`` at the
``_swa_eviction_trigger``; with its radix cache on, the tree also keeps the prompt's last W tokens locked,
``SWAComponent.acquire_component_lock``, not modeled). Finer pages raise gpt-oss-20b-ratio's split
throughput 0.1 over 0.8 (published 0.88): 0.808 / 0.814 / 0.868 / 0.940 at 64 / 32 / 16 / 8-token pages
(retractions per 1,000: 1,921 / 1,983 / 1,601 / 1,079; commits 7e56d22-0201525, fitted cost model); with
retracted requests requeued at the front, 64 / 32 / 16: 0.844 / 0.844 / 0.819 (1,447 / 1,633 / 1,841), and
at the datasheet bandwidth 0.617 / 0.583 / 0.550 (kvarena's split pools, 2026-12-01). Page size 1 runs
> 10 min. The pager keeps the allocator's pages for every class: the page grid is a known error there,
until the split column gets a token-granular window pool (SGLang's free-list counter at page size 1).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvarena.reference.split import SplitPools
from kvarena.spec.layout import Kind


class Pager:
    """Per-request page bookkeeping over one allocator.

    ``swa_eviction_interval``: tokens past the window a request may hold before its out-of-window pages
    are freed (SGLang's ``SGLANG_SWA_EVICTION_INTERVAL``, rules.swa_eviction_due); None frees every
    page as soon as it leaves the window (vLLM's ``remove_skipped_blocks``)."""

    def __init__(self, alloc, swa_eviction_interval: int | None = None, state_slots: int = 1,
                 evict_first: bool = False) -> None:
        self.alloc, self.evict_first = alloc, evict_first
        cfg = alloc.config
        self.pt = getattr(alloc, "page_tokens", cfg.page_size)  # tokens per page of token classes
        self.full = next(c.name for c in cfg.model.classes if c.kind is Kind.FULL)
        windows = [c for c in cfg.model.classes if c.kind is Kind.WINDOW]
        self.windows = {c.name: c.window for c in windows}
        # a window of W tokens touches at most ceil(W / pt) + 1 pages: keep the newest that many
        self.keep = {c.name: -(-c.window // self.pt) + 1 for c in windows}
        # lazy: out-of-window pages go only once the interval's worth piled up past the window
        self.slack = {c.name: -(-swa_eviction_interval // self.pt) if swa_eviction_interval else 0 for c in windows}
        self.state = [c.name for c in cfg.model.classes if c.kind is Kind.RECURRENT]
        self.state_slots = state_slots
        self.split = isinstance(alloc, SplitPools)
        self.page_bytes = {c: alloc.page_bytes_of(c) if hasattr(alloc, "page_bytes_of")
                           else alloc.bands[c].page_bytes for c in alloc.order}
        self.vids: dict[int, dict[str, list[int]]] = {}

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.pt)

    def prompt_demand(self, tokens: int, window_tokens: dict[str, int] | None = None) -> dict[str, int]:
        """Pages a prompt of ``tokens`` holds once prefilled (window pages trimmed to the window), or
        with ``window_tokens`` the window-class tokens admission must find free (rules.swa_admission_tokens)."""
        full = self.pages(tokens)
        win = ({w: self.pages(n) for w, n in window_tokens.items()} if window_tokens is not None
               else {w: min(full, k) for w, k in self.keep.items()})
        return {self.full: full, **win, **dict.fromkeys(self.state, self.state_slots)}

    def step_demand(self, crossing: list[int]) -> dict[str, int]:
        """Pages a decode step needs when the requests ``crossing`` cross a page boundary (net of the
        window pages they free first, with ``evict_first``)."""
        out = {self.full: len(crossing), **dict.fromkeys(self.keep, len(crossing))}
        if self.evict_first:
            for rid in crossing:
                for w, n in self.due(rid).items():
                    out[w] -= n
        return {c: max(0, n) for c, n in out.items()}

    def fits(self, demand: dict[str, int], reserve_tokens: int) -> bool:
        """Admission headroom: free memory covers ``demand`` plus a decode reserve of full-attention tokens."""
        reserve = self.pages(reserve_tokens)
        if hasattr(self.alloc, "fits"):
            return self.alloc.fits(demand, reserve)
        if self.split:
            return all(demand.get(c, 0) + (reserve if c == self.full else 0) <= len(self.alloc.bands[c].holes)
                       for c in self.alloc.order)
        need = sum(n * self.page_bytes[c] for c, n in demand.items()) + reserve * self.page_bytes[self.full]
        return need <= self.alloc.free_bytes()

    def _chunk_demand(self, held_full: int, tokens: int, transient: bool, first: bool) -> dict[str, int]:
        add = self.pages(tokens) - held_full
        out = {self.full: add}
        for w, k in self.keep.items():
            out[w] = add if transient else min(add, k)
        if first:
            out.update(dict.fromkeys(self.state, self.state_slots))
        return out

    def admit(self, rid: int, tokens: int, transient: bool = False, request: tuple[int, int] | None = None,
              shared: list[int] = (), state_src: int | None = None) -> None:
        """Admit ``rid`` holding ``tokens``; ``request`` = (prompt, max new tokens) for an engine that builds
        its own request object (``describe``: the vLLM manager counts tokens, not pages). A prefix-cache hit
        passes the cached full pages as ``shared`` and its state page as ``state_src`` (copied, not shared)."""
        if request is not None and hasattr(self.alloc, "describe"):
            self.alloc.describe(f"r{rid}", *request)
        owner = f"r{rid}"
        demand = self._chunk_demand(len(shared), tokens, transient, True)
        if state_src is not None:
            for c in self.state:
                demand[c] -= 1
        got = self.alloc.admit(owner, demand, shared=list(shared)).pages
        v = {c: list(got.get(c, ())) for c in self.alloc.order}
        v[self.full][:0] = shared
        if state_src is not None:
            try:
                v[self.state[0]].insert(0, self.alloc.copy_state(owner, state_src))
            except Exception:
                self.alloc.free(owner)
                raise
        self.vids[rid] = v

    def extend_to(self, rid: int, tokens: int, transient: bool = False) -> int:
        """Hold ``tokens`` of context: extend the full pages (and window pages alongside). Returns ops."""
        v = self.vids[rid]
        demand = self._chunk_demand(len(v[self.full]), tokens, transient, False)
        if not demand[self.full]:
            return 0
        got = self.alloc.extend(f"r{rid}", demand).pages
        for c, vs in got.items():
            v[c].extend(vs)
        return 1 + (0 if transient else self.trim(rid))

    def grow_one(self, rid: int, below: Mapping[str, int] | None = None) -> int:
        """One more full page (and one page per window class). Out-of-window pages go first (SGLang's
        ``alloc_for_decode_default`` runs ``maybe_evict_swa`` before allocating) with ``evict_first``, else
        after. ``below``: a placement limit for an engine that takes one (ceiling.py). Returns allocator calls."""
        ops = self.trim(rid, extra=1) if self.evict_first else 0
        demand = {self.full: 1, **dict.fromkeys(self.keep, 1)}
        got = (self.alloc.extend(f"r{rid}", demand) if below is None
               else self.alloc.extend(f"r{rid}", demand, below=below)).pages
        v = self.vids[rid]
        for c, vs in got.items():
            v[c].extend(vs)
        return 1 + ops + (0 if self.evict_first else self.trim(rid))

    def due(self, rid: int) -> dict[str, int]:
        """Window pages the next page crossing of ``rid`` frees before it allocates."""
        v = self.vids[rid]
        return {w: n for w, k in self.keep.items() if (n := len(v[w]) + 1 - k) > self.slack[w]}

    def trim(self, rid: int, extra: int = 0) -> int:
        """Slide out window pages wholly outside the window (once past the slack), counting ``extra`` pages
        about to be added. Returns allocator calls."""
        v, ops = self.vids[rid], 0
        for w, k in self.keep.items():
            if (n := len(v[w]) + extra - k) > self.slack[w] and n <= len(v[w]):
                self.alloc.slide(f"r{rid}", w, n)
                del v[w][:n]
                ops += 1
        return ops

    def free(self, rid: int) -> None:
        self.alloc.free(f"r{rid}")
        del self.vids[rid]

    def forward_pages(self, rid: int) -> tuple[list[int], list[int]]:
        """What a forward pass touches: reads the first full page and every non-full page, writes the newest."""
        v = self.vids[rid]
        return [v[self.full][0]] + [x for c in self.alloc.order if c != self.full for x in v[c]], [v[self.full][-1]]

    def occupancy(self) -> dict[str, int]:
        """Bytes of live pages per class."""
        if hasattr(self.alloc, "occupancy"):
            return self.alloc.occupancy()
        return {c: len(b.live) * b.page_bytes for c, b in self.alloc.bands.items()}
