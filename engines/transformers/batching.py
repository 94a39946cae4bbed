"""transformers' continuous-batching engine with kvarena's arena as its paged cache.

``generate_batch(model, inputs, generation_config, capacity)`` runs ``model.generate_batch`` unchanged except for
its cache: an :class:`ArenaPagedCache` (a ``PagedAttentionCache`` subclass) over one ``GpuArena`` of ``capacity``
bytes built from ``model_layout(model.config)``. The engine's scheduler, preemption (soft reset) and attention
code stay transformers'; what the arena replaces, hook by hook:

* admission (``can_store_request_tokens``, called per request): ``admit_batch`` / ``extend_batch`` with one lane
  (int handles) of the pages the step needs, through the arena's ladder (reuse, compaction, relayout); a
  refusal is transformers' "cache full", so its own scheduler starves and preempts (``offload_requests``: soft
  reset) as it does on its sectors. No sectors, no fixed split between full and window pages.
* storage: each layer's K and V are the arena's typed views (``views(cls)[(layer, "k"/"v")]``, one row per
  token entry); transformers' allocators' own ``update`` writes and reads them by index.
* indices (``extend_read_and_write_indices``): ``token_locs`` of the step's pages, one call per class for every
  request of the step (taken after scheduling, so compaction moves are already done). Full layers keep tokens
  ``[0, len)``; window layers keep pages in token order (not transformers' ring: a window of W tokens touches
  ``ceil(W / page) + 1`` pages at most alignments) and read the last ``window - 1`` tokens, so the pages the
  window has passed are ``slide``-d out at the start of the next scheduling round.
* padding lanes and transformers' write trash / sliding sentinel: ``pad_entry(cls)``, an entry past the
  arena's bytes that no page covers.
* frees: ``free`` when a request finishes or is preempted.

How it plugs in: :class:`ArenaBatchingManager` (a ``ContinuousBatchingManager``) builds the cache when it is
created (so a capacity too small for one request raises there, in the caller's thread) and, while its batch
processor is made, sets ``continuous_api.PagedAttentionCache`` (the one name that function constructs) to hand
that cache over, under a lock, restored at once. ``generate_batch`` shadows ``model.init_continuous_batching``
with an instance attribute for the duration of one ``model.generate_batch`` call (one call per model at a time).

Not supported on the arena (refused with a ConfigError naming the fix): CPU offloading (transformers copies
blocks by id; arena pages move), asynchronous batching (admission may move pages while a forward is in
flight), parallel sampling (forks copy blocks by id), tensor parallelism. Prefix sharing is off (transformers
turns it off for sliding models too).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch
from transformers.generation.continuous_batching import continuous_api
from transformers.generation.continuous_batching.cache import PagedAttentionCache, group_layers_by_attn_type
from transformers.generation.continuous_batching.cache_allocators import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    FullAttentionCacheAllocator,
    SlidingAttentionCacheAllocator,
)
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
from transformers.generation.continuous_batching.utils import WorkloadHints

from kvarena.engines.transformers.layout import dtype_name, model_layout
from kvarena.gpu.allocator import GpuArena, make
from kvarena.spec.errors import (
    AdmissionRejectedError,
    ArenaError,
    CapacityTooSmallError,
    ConfigError,
    InvalidArgumentError,
)
from kvarena.spec.models import ArenaConfig

CLASS_OF = {FULL_ATTENTION: "full", SLIDING_ATTENTION: "window"}  # transformers' layer groups -> arena classes
_PATCH_LOCK = threading.Lock()  # one batch processor built at a time while the module attribute is swapped


@dataclass
class CacheStats:
    """What the cache layer saw in one run, the same counters on the arena and on transformers' own cache."""

    steps: int = 0  # forward passes
    peak_batch: int = 0  # most requests in one forward pass
    preemptions: int = 0  # requests transformers soft-reset because the cache refused a step
    host_s: float = 0.0  # host seconds inside the cache's admission, index and free hooks
    arena: GpuArena | None = field(default=None, repr=False)  # the arena of the run (None on transformers' cache)


class _Metered:
    """Timers and counters around the hooks the engine calls; mixed in front of either cache."""

    stats: CacheStats
    _batch: int = 0

    def can_store_request_tokens(self, state: Any, request_len: int, dry_run: bool = False) -> bool:
        t = perf_counter()
        try:
            return super().can_store_request_tokens(state, request_len, dry_run)  # type: ignore[misc]
        finally:
            self.stats.host_s += perf_counter() - t

    def extend_read_and_write_indices(self, request_id: str, past_length: int, query_length: int,
                                      read_index: list[list[int]] | None, write_index: list[list[int]]) -> None:
        t = perf_counter()
        self._batch += 1
        try:
            super().extend_read_and_write_indices(  # type: ignore[misc]
                request_id, past_length, query_length, read_index, write_index)
        finally:
            self.stats.host_s += perf_counter() - t

    def free_blocks(self, request_id: str, no_cache: bool = False) -> None:
        t = perf_counter()
        self.stats.preemptions += no_cache  # only the offloading manager frees with no_cache (a soft reset)
        try:
            super().free_blocks(request_id, no_cache)  # type: ignore[misc]
        finally:
            self.stats.host_s += perf_counter() - t

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if self._batch:  # the first attention call after a batch's indices: one forward pass
            self.stats.steps += 1
            self.stats.peak_batch = max(self.stats.peak_batch, self._batch)
            self._batch = 0
        return super().update(key_states, value_states, layer_idx, kwargs)  # type: ignore[misc]


class MeteredPagedCache(_Metered, PagedAttentionCache):
    """transformers' own paged cache (its sectors), unchanged but for the same meter: the baseline."""

    def __init__(self, *args: Any, stats: CacheStats | None = None, **kwargs: Any) -> None:
        self.stats = stats if stats is not None else CacheStats()
        super().__init__(*args, **kwargs)


# ---- the arena's side of transformers' allocators ------------------------------------------------------------

class _Group:
    """A transformers allocator whose K/V are the arena's views of one class: its ``update`` (write, then read by
    index; the sliding one reads before it writes) and ``get_seqlen_k`` run unchanged on them."""

    cache: ArenaPagedCache
    cls: str

    def bind(self, cache: ArenaPagedCache, cls: str) -> None:
        self.cache, self.cls = cache, cls
        views = cache.arena.views(cls)
        self._kv_token_views = {i: (views[(i, "k")], views[(i, "v")]) for i in self.layer_indices}
        pad = cache.arena.pad_entry(cls)
        # padding lanes write past the arena's bytes; padded reads (graph padding only) take entry 0, finite
        # bytes the mask hides; the sliding sentinel must be an entry no token ever maps to: the pad entry
        self.write_trash_index = self.sentinel_index = pad
        self.read_trash_index = 0
        self.num_blocks = cache.arena.bands[cls].top

    def needs_new_blocks(self, request_id: str, past_length: int, query_length: int) -> int:
        """Pages of this class the step needs (the offloading manager's count, for ``count_storable_requests``)."""
        return int(self.cache.step_demand(request_id, past_length, query_length)[self.cache.arena.cidx[self.cls]])


class _FullGroup(_Group, FullAttentionCacheAllocator):
    pass


class _WindowGroup(_Group, SlidingAttentionCacheAllocator):
    pass


def layer_groups(config: Any) -> dict[str, list[int]]:
    """transformers' layer groups (full_attention / sliding_attention), or a ConfigError for other kinds."""
    try:
        return group_layers_by_attn_type(config)
    except ValueError as e:
        raise ConfigError(f"{getattr(config, 'model_type', type(config).__name__)}: transformers' continuous "
                          f"batching serves full_attention and sliding_attention layers only ({e}); use a family "
                          "such as gpt_oss or gemma3, or model.generate with kvarena's ArenaCache") from None


class _NoSectors:
    """The scheduler frees empty sectors before it checks the safety margin; the arena has none."""

    def try_to_free_sectors(self) -> None:
        return None


@dataclass
class _Req:
    row: int = -1  # the arena's handle of the request (admit_batch's rows)
    full: int = 0  # full pages held
    end: int = 0  # tokens in the cache once the step it was last admitted for has run
    window: list[int] = field(default_factory=list)  # absolute page indices of the window pages held, ascending


class ArenaCore(PagedAttentionCache):
    """The arena as transformers' paged cache (see the module docstring); :class:`ArenaPagedCache` adds the meter."""

    def __init__(self, config: Any, continuous_batching_config: Any, device: torch.device | str,
                 dtype: torch.dtype, capacity: int, max_context_len: int) -> None:
        # PagedAttentionCache.__init__ sizes sectors from free memory and allocates them: not called
        cb = continuous_batching_config
        self.config, self.dtype, self.device = config, dtype, device
        self.page_size = ps = cb.page_size
        self.max_batch_tokens = cb.max_batch_tokens or 8192  # transformers' default when unset
        layout = model_layout(config, max_context_len=max_context_len)
        rows = {r.dtype for c in layout.classes for r in c.rows}
        if rows != {dtype_name(dtype)}:
            raise ConfigError(f"the model computes in {dtype} but its config says {config.dtype!r} (rows {rows}); "
                              "set model.config.dtype to the model's dtype")
        groups = layer_groups(config)
        by_class = {c.name: c for c in layout.classes}
        self.window = by_class["window"].window if "window" in by_class else 0
        self.max_context_len = max_context_len
        arena_config = ArenaConfig(layout, capacity, page_size=ps, max_context_len=max_context_len)
        peaks = self.peak_demands(max_context_len, list(by_class))
        try:
            self.arena = make(arena_config, device=device)
            for pages in peaks:
                self.arena.plan_admission(pages)
        except (CapacityTooSmallError, AdmissionRejectedError, InvalidArgumentError) as e:
            size = {c: arena_config.page_bytes(c) for c in by_class}
            pages = max(peaks, key=lambda d: sum(n * size[c] for c, n in d.items()))
            need = sum(n * size[c] for c, n in pages.items())
            raise CapacityTooSmallError(
                f"an arena of {capacity} B cannot hold one request of {max_context_len} tokens (prompt + "
                f"max_new_tokens) on its own: at its peak step it holds {pages} pages of {ps} tokens ({need} B); "
                f"pass capacity >= {need + max(size.values())} B, or shorter requests, or a smaller "
                "max_batch_tokens (the prefill chunk)") from e
        self.cache_allocators: dict[str, Any] = {}
        self.layer_to_allocator: dict[int, Any] = {}
        heads = layout.classes[0].rows[0].shape[0]
        for index, (attn_type, layers) in enumerate(groups.items()):
            kind = _FullGroup if attn_type == FULL_ATTENTION else _WindowGroup
            group = kind(index=index, config=config, num_key_value_heads=heads, cache_dtype=dtype, page_size=ps,
                         layer_indices=layers, allow_block_sharing=False)
            group.bind(self, CLASS_OF[attn_type])
            self.cache_allocators[attn_type] = group
            self.layer_to_allocator |= dict.fromkeys(layers, group)
        self.pool = _NoSectors()
        self.max_blocks_per_request = 0  # the decode fast path's block tables hold block ids; indices only here
        self.max_decode_fast_path_length = 0
        self.allow_block_sharing = self.use_prefix_sharing = False
        self.read_cache_limit = self._infer_read_cache_limit()
        # read buffers: every full token the arena can hold (the whole arena as full pages), as transformers does
        self.max_tokens_read = max(g.tokens_per_page * g.num_blocks for g in self.cache_allocators.values())
        self.bytes_per_sector = capacity  # read by the offloading manager only to size a CPU pool (refused)
        self.num_blocks = capacity // (config.num_hidden_layers * FullAttentionCacheAllocator.get_bytes_per_page(
            heads, layout.classes[0].rows[0].shape[1], dtype, ps))
        self._order = self.arena.order
        self._reqs: dict[str, _Req] = {}
        self._round: dict[str, tuple[int, int]] = {}  # requests admitted since the last step: (past, q)
        self._step: dict[str, tuple[Any, ...]] | None = None  # this step's entries per request (_step_locs)

    # ---- what a step needs ----------------------------------------------------------------------------------
    def _window_ranges(self, past: int, q: int) -> tuple[int, int]:
        """Window tokens a step reads from the cache ``[r0, past)`` and writes ``[w0, past + q)``: the last
        ``window - 1`` before it, and the last ``window - 1`` of its own (the token before those is never read
        again: the next step reads ``window - 1`` back). transformers' ring writes ``window``; same reads."""
        keep = max(self.window - 1, 1)
        return max(0, past - keep), past + q - min(q, keep)

    def _window_pages(self, past: int, q: int) -> list[int]:
        ps = self.page_size
        r0, w0 = self._window_ranges(past, q)
        pages = list(range(r0 // ps, (past - 1) // ps + 1)) if past > r0 else []
        return pages + [p for p in range(w0 // ps, (past + q - 1) // ps + 1) if not pages or p > pages[-1]]

    def step_demand(self, request_id: str, past: int, q: int) -> np.ndarray:
        """New pages per class (arena order) the step ``[past, past + q)`` needs beyond what the request holds
        after its passed window pages are slid out."""
        req = self._reqs.get(request_id) or _Req()
        d = np.zeros(len(self._order), dtype=np.int64)
        if "full" in self.arena.cidx:
            d[self.arena.cidx["full"]] = max(0, -(-(past + q) // self.page_size) - req.full)
        if self.window:
            last = req.window[-1] if req.window else -1
            d[self.arena.cidx["window"]] = sum(p > last for p in self._window_pages(past, q))
        return d

    def peak_demands(self, length: int, classes: list[str]) -> list[dict[str, int]]:
        """The pages per class one request of ``length`` tokens holds at its largest steps when served alone
        (the steps no other step covers): prefilled in chunks of ``max_batch_tokens`` (a preempted request is
        prefilled again, generated tokens and all), then decoded a token at a step (every page alignment)."""
        m, ps = self.max_batch_tokens, self.page_size
        steps = [(p, min(m, length - p)) for p in range(0, length, m)]
        steps += [(p, 1) for p in range(max(1, length - ps - self.window), length)]
        pairs = {(-(-(p + q) // ps), len(self._window_pages(p, q)) if self.window else 0) for p, q in steps}
        front = [a for a in pairs if not any(b != a and b[0] >= a[0] and b[1] >= a[1] for b in pairs)]
        return [{c: n for c, n in zip(("full", "window"), fw) if c in classes} for fw in front]

    # ---- the engine's hooks ---------------------------------------------------------------------------------
    def can_store_request_tokens(self, state: Any, request_len: int, dry_run: bool = False) -> bool:
        """The step's new pages from the arena (the ladder may compact: indices are taken after scheduling).
        Window pages the request no longer reads go back first."""
        rid, past = state.request_id, state.current_len()
        if self._step is not None:  # a new scheduling round: what the last step's window passed goes back first
            self._step = None
            if self.window:
                for other, r in self._reqs.items():
                    self._slide(other, r, r.end)
        req = self._reqs.get(rid)
        if req is not None and self.window and not dry_run:
            self._slide(rid, req, past)
        demand = self.step_demand(rid, past, request_len)
        if dry_run:
            try:
                self.arena.plan_admission({c: int(n) for c, n in zip(self._order, demand.tolist()) if n})
            except AdmissionRejectedError:
                return False
            return True
        if req is None:  # the batched calls with one lane: int handles and an int64 demand take the lean path
            res = self.arena.admit_batch([rid], demand[None])
            if res.errors:
                return self._refused(res.errors[0])
            req = self._reqs[rid] = _Req(row=int(res.rows[0]))
        elif demand.any():
            res = self.arena.extend_batch(np.array([req.row], dtype=np.int64), demand[None])
            if res.errors:
                return self._refused(res.errors[0])
        if self.window:
            last = req.window[-1] if req.window else -1
            req.window += [p for p in self._window_pages(past, request_len) if p > last]
        if "full" in self.arena.cidx:
            req.full += int(demand[self.arena.cidx["full"]])
        self._round[rid] = (past, request_len)
        req.end = past + request_len
        return True

    @staticmethod
    def _refused(error: ArenaError) -> bool:
        if not isinstance(error, AdmissionRejectedError):
            raise error  # a malformed demand is a bug here, not a full cache
        return False

    def _slide(self, rid: str, req: _Req, past: int) -> None:
        """Window pages wholly before the tokens the next step reads go back to the arena (the oldest first)."""
        first = self._window_ranges(past, 0)[0] // self.page_size
        n = bisect_left(req.window, first)
        if n:
            self.arena.slide(rid, "window", n)
            del req.window[:n]

    def count_storable_requests(self, list_blocks_needed: list[dict[str, int]]) -> int:
        """How many of these demands fit one after the other. The ladder compacts the two end bands, so the pages
        fit while the live bytes stay within the high band's whole-page grid (every page on its class's grid)."""
        top = self.arena.bands[self._order[-1]]
        room = self.arena.capacity // top.page_bytes * top.page_bytes - self.arena.used_bytes()
        for k, blocks in enumerate(list_blocks_needed):
            room -= sum(n * self.arena.bands[CLASS_OF[g]].page_bytes for g, n in blocks.items())
            if room < 0:
                return k
        return len(list_blocks_needed)

    def extend_read_and_write_indices(self, request_id: str, past_length: int, query_length: int,
                                      read_index: list[list[int]] | None, write_index: list[list[int]]) -> None:
        if self._step is None:  # the step's first request: every request admitted this round at once
            self._step, self._round = self._step_locs(self._round), {}
        locs = self._step.get(request_id)
        if locs is None or locs[0] != (past_length, query_length):  # not admitted this round (e.g. warmup)
            locs = self._step_locs({request_id: (past_length, query_length)})[request_id]
        q = query_length
        for i, group in enumerate(self.cache_allocators.values()):
            if group.cls == "full":
                write_index[i].extend(locs[1][-q:])
                if read_index is not None:
                    read_index[i].extend(locs[1])
            else:
                reads, writes = locs[2], locs[3]
                write_index[i].extend([group.write_trash_index] * (q - len(writes)) + writes)
                if read_index is not None:
                    read_index[i].extend(reads + [group.sentinel_index] * q)

    def _step_locs(self, steps: dict[str, tuple[int, int]]) -> dict[str, tuple[Any, ...]]:
        """Per request ``((past, q), full entries [0, past + q), window entries read, window entries written)``,
        from one ``token_locs`` call per class and range for the whole step. Window tokens are counted from the
        first page the request still holds (``token_locs`` counts a request's pages in the order it holds them):
        the tokens a step reads lie on consecutive held pages, and so do the ones it writes."""
        names = list(steps)
        past = np.array([p for p, _ in steps.values()], dtype=np.int64)
        end = past + np.array([q for _, q in steps.values()], dtype=np.int64)
        none: list[list[int]] = [[] for _ in names]
        full = self._split(self.arena.token_locs("full", names, np.zeros_like(end), end), end) \
            if "full" in self.arena.cidx else none
        reads = writes = none
        if self.window:
            r0, w0 = (np.array(x, dtype=np.int64) for x in zip(*(self._window_ranges(p, q) for p, q in steps.values())))
            reads = self._window_split(names, r0, past)
            writes = self._window_split(names, w0, end)
        return {n: (step, full[k], reads[k], writes[k]) for k, (n, step) in enumerate(steps.items())}

    def _window_split(self, names: list[str], a: np.ndarray, b: np.ndarray) -> list[list[int]]:
        ps = self.page_size
        held = [bisect_left(self._reqs[n].window, x) for n, x in zip(names, (a // ps).tolist())]
        base = np.array(held, dtype=np.int64) * ps - a // ps * ps  # token a's place on the pages still held
        return self._split(self.arena.token_locs("window", names, a + base, b + base), b - a)

    @staticmethod
    def _split(locs: torch.Tensor, lens: np.ndarray) -> list[list[int]]:
        flat, out, a = locs.tolist(), [], 0
        for n in lens.tolist():
            out.append(flat[a:a + n])
            a += n
        return out

    def free_blocks(self, request_id: str, no_cache: bool = False) -> None:
        self._round.pop(request_id, None)
        if self._reqs.pop(request_id, None) is not None:
            self.arena.free(request_id)

    def free_all_requests(self, clear_ledgers: bool = False) -> None:
        for rid in list(self._reqs):
            self.free_blocks(rid)

    def reset(self) -> None:
        self.free_all_requests()

    def evict_cached_blocks(self) -> bool:
        return False  # no prefix cache on the arena: nothing kept but live requests

    def compute_free_capacity(self, relative: bool = True) -> int | float:
        free = self.arena.free_bytes()
        return free / self.arena.capacity if relative else free

    def prepare_fork_request(self, *args: Any, **kwargs: Any) -> list[str]:
        raise ConfigError("parallel sampling (num_return_sequences > 1) forks copy blocks by id; the arena cache "
                          "does not fork: use num_return_sequences=1")


class ArenaPagedCache(_Metered, ArenaCore):
    """The arena cache with the meter of :class:`MeteredPagedCache`."""

    def __init__(self, *args: Any, stats: CacheStats | None = None, **kwargs: Any) -> None:
        self.stats = stats if stats is not None else CacheStats()
        super().__init__(*args, **kwargs)
        self.stats.arena = self.arena


# ---- the manager and the entry points --------------------------------------------------------------------------

class _CacheManager(ContinuousBatchingManager):
    """A manager whose batch processor gets the cache ``make_cache(**transformers' cache kwargs)`` returns."""

    make_cache: Callable[..., Any]

    def _create_batch_processor(self) -> Any:
        with _PATCH_LOCK:  # the one name _create_batch_processor constructs; put back before anyone else builds
            continuous_api.PagedAttentionCache = self.make_cache  # type: ignore[misc, assignment]
            try:
                return super()._create_batch_processor()
            finally:
                continuous_api.PagedAttentionCache = PagedAttentionCache  # type: ignore[misc]


class ArenaBatchingManager(_CacheManager):
    """transformers' ``ContinuousBatchingManager`` on an arena of ``capacity`` bytes (built here, so a capacity too
    small for one request of ``max_context_len`` tokens raises ``CapacityTooSmallError`` at once)."""

    def __init__(self, model: Any, generation_config: Any, continuous_batching_config: Any, capacity: int,
                 workload_hints: WorkloadHints | None = None, max_context_len: int | None = None,
                 stats: CacheStats | None = None) -> None:
        cpu = continuous_batching_config.cpu_offload_space
        if cpu is None or cpu > 0:
            raise ConfigError(f"cpu_offload_space={cpu}: transformers offloads blocks by id and arena pages move; "
                              "pass ContinuousBatchingConfig(cpu_offload_space=0) (preempted requests are recomputed)")
        if continuous_batching_config.use_async_batching:
            raise ConfigError("use_async_batching=True: admission may move arena pages while the previous forward "
                              "is in flight; pass use_async_batching=False")
        if (generation_config.num_return_sequences or 1) > 1:
            raise ConfigError("num_return_sequences > 1 forks requests by copying blocks by id; the arena cache "
                              "does not fork: generate each sequence as its own request")
        layer_groups(model.config.get_text_config())  # before transformers' own ValueError for other kinds
        super().__init__(model, generation_config, continuous_batching_config, workload_hints)
        if self.distributed_helper.tp_size > 1:
            raise ConfigError("tensor parallelism: the arena cache holds every KV head; run with tp_size=1")
        cb = self.continuous_batching_config  # resolved: decided defaults the arena cannot take are turned off
        cb.use_async_batching, cb.max_blocks_per_request = False, 0
        if max_context_len is None and workload_hints is not None and workload_hints.max_prompt_length:
            max_context_len = workload_hints.max_prompt_length + workload_hints.max_generated_length
        if max_context_len is None:
            max_context_len = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 131072)
        self.arena_cache = ArenaPagedCache(model.config.get_text_config(), cb, model.device, model.dtype,
                                           capacity=capacity, max_context_len=max_context_len, stats=stats)

        def make_cache(**_: Any) -> ArenaPagedCache:
            return self.arena_cache

        self.make_cache = make_cache  # type: ignore[method-assign]


def init_continuous_batching(model: Any, capacity: int, generation_config: Any = None,
                             continuous_batching_config: Any = None, workload_hints: WorkloadHints | None = None,
                             max_context_len: int | None = None, stats: CacheStats | None = None
                             ) -> ArenaBatchingManager:
    """``model.init_continuous_batching`` on an arena of ``capacity`` bytes: the manager (``start``,
    ``add_request``, ``get_result``, ``stop``). ``max_context_len``: the longest request (prompt +
    max_new_tokens) it must hold alone; default the workload hints', else the config's max_position_embeddings."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = generation_config if generation_config is not None else model.generation_config
    if gen.eos_token_id is None:
        gen.eos_token_id = -1  # what transformers' init_continuous_batching does (with a warning)
    return ArenaBatchingManager(model, gen, continuous_batching_config or ContinuousBatchingConfig(), capacity,
                                workload_hints, max_context_len, stats)


def _run(model: Any, inputs: list[list[int]], generation_config: Any, make_manager: Callable[..., Any],
         kw: dict[str, Any]) -> dict[str, Any]:
    """``model.generate_batch`` with ``model.init_continuous_batching`` shadowed for this call only."""
    made: list[Any] = []

    def init(generation_config: Any = None, continuous_batching_config: Any = None,
             workload_hints: WorkloadHints | None = None) -> Any:
        made.append(make_manager(generation_config, continuous_batching_config, workload_hints))
        return made[-1]

    if "init_continuous_batching" in vars(model):
        raise ConfigError("model.init_continuous_batching is already shadowed: one generate_batch per model at a time")
    model.init_continuous_batching = init
    try:
        out = model.generate_batch(inputs, generation_config, **kw)
    finally:
        del model.init_continuous_batching
    fatal = made[-1].background_thread_status.fatal_error if made else None
    if isinstance(fatal, ArenaError):  # the engine logs a failed loop and returns partial results: not ours
        raise fatal
    return out


def generate_batch(model: Any, inputs: list[list[int]], generation_config: Any = None, capacity: int | None = None,
                   *, stats: CacheStats | None = None, **kw: Any) -> dict[str, Any]:
    """``model.generate_batch(inputs, generation_config, **kw)`` with kvarena's arena of ``capacity`` bytes as the
    paged cache; returns what it returns (request id -> ``GenerationOutput``). ``stats``: filled with the run's
    counters (steps, peak batch, preemptions, host time in the cache layer) and its arena."""
    if capacity is None:
        raise ConfigError("generate_batch needs capacity=<bytes of the arena> (the KV cache budget)")

    def make_manager(gen: Any, cb: Any, hints: WorkloadHints | None) -> ArenaBatchingManager:
        return init_continuous_batching(model, capacity, gen, cb, hints, stats=stats)

    return _run(model, inputs, generation_config, make_manager, kw)


def paged_generate_batch(model: Any, inputs: list[list[int]], generation_config: Any = None, *,
                         stats: CacheStats | None = None, **kw: Any) -> dict[str, Any]:
    """transformers' own ``model.generate_batch`` on its own sectors, with the arena cache's meter in ``stats``:
    the baseline the tests and ``bench/transformers_cb.py`` compare with."""

    def make_manager(gen: Any, cb: Any, hints: WorkloadHints | None) -> _CacheManager:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        gen = gen if gen is not None else model.generation_config
        if gen.eos_token_id is None:
            gen.eos_token_id = -1
        manager = _CacheManager(model, gen, cb or ContinuousBatchingConfig(), hints)
        manager.make_cache = lambda **kwargs: MeteredPagedCache(stats=stats, **kwargs)  # type: ignore[method-assign]
        return manager

    return _run(model, inputs, generation_config, make_manager, kw)


__all__ = ["ArenaBatchingManager", "ArenaPagedCache", "CacheStats", "MeteredPagedCache", "generate_batch",
           "init_continuous_batching", "paged_generate_batch"]
