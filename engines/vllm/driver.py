"""vLLM 0.33.0's real v1 KV cache manager, driven on CPU as its scheduler drives it, checked after every step.

    make vllm          # pip install --no-deps vllm==0.33.0 (+ msgspec cbor2 regex), then tests/vllm

What runs is vLLM's own code from the installed wheel (``vllm_load.py`` lists every module that loads for
real and every stand-in, with why it is never executed): ``KVCacheManager`` (``get_computed_blocks``,
``allocate_slots``, ``free``, ``pop_blocks_for_free``, ``take_kv_cache_block_copies``, ``evict_blocks``,
``reset_prefix_cache``), the coordinator vLLM picks (``UnitaryKVCacheCoordinator`` for one group,
``HybridKVCacheCoordinator`` for several), the per-type managers (``FullAttentionManager``,
``SlidingWindowManager``, ``MambaManager``), ``BlockPool`` with its ``FreeKVCacheBlockQueue`` and prefix-cache
map, the real ``Request`` (block hashes from ``get_request_block_hasher`` with sha256_cbor), and a
``KVCacheConfig`` made by vLLM's own planning: ``get_kv_cache_groups`` -> ``get_kv_cache_config_from_groups``
-> ``resolve_kv_cache_block_sizes``, from one kv cache spec per layer of a kvarena model.

Why not kvarena's lockstep harness
----------------------------------
The harness speaks a byte arena: per-class page demands, virtual ids with a v->p map, spans, holes, row tags
read back after moves.  vLLM's manager has none of these: a request asks for *tokens* and every group
answers in blocks of one shared pool; pages never move; sharing happens through block hashes, not an
explicit ``share``.  Mapping kvarena's operations onto it would drive a narrow slice (no prefix hits, no
sliding-window release, no deferred frees) through an invented translation.  So :mod:`vllm_checks` runs a
Hypothesis state machine whose rules are the scheduler's own calls into the manager (``Scheduler.schedule``,
``update_from_output``, ``_free_request_blocks``, ``_preempt_request`` in v1/core/sched/scheduler.py), with
kvarena's operations as the vocabulary:

* **admit** = a new ``Request`` (prompt drawn from a few shared prefixes, so later requests hit the cache):
  ``get_computed_blocks`` then ``allocate_slots(..., num_new_computed_tokens, new_computed_blocks)``;
* **extend** = ``allocate_slots`` for the next prefill chunk or one decode token of a running request;
* **share** = the prefix-cache hit inside admit (blocks ``touch``-ed, ref counts raised);
* **acquire / release** = a step in flight: the requests scheduled in one iteration share a step
  (``sched_step_seq``, advanced only by a step that schedules tokens); ``complete`` finishes the oldest one
  (``processed_step_seq``) and drains the deferred frees whose fence it passed;
* **free** = finish or preempt: ``free`` when the request's last step is processed, otherwise
  ``pop_blocks_for_free`` and a deferred free fenced at the current step, as ``_free_request_blocks``
  does with ``defer_block_free`` on.  Those blocks are *withheld*: still referenced, not yet free.
* CoW endpoints of partial hits (``take_kv_cache_block_copies``) are withheld the same way, fenced at the
  step that runs the copies (``_free_cow_retained_blocks``);
* **drop / slide** have no counterpart a caller issues: vLLM releases out-of-window blocks itself inside
  ``allocate_slots`` (``remove_skipped_blocks``), which the machine reaches on every sliding-window step.

The checks (:func:`vllm_checks.check_pool`) are the conformance level this adapter is held to: ``block-pool``.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvarena.engines.vllm.checks import check_pool, check_writes
from kvarena.engines.vllm.load import STUBS, VLLM_VERSION, VLLMUnavailable, load_vllm
from kvarena.spec.layout import DTYPE_BYTES, Kind
from kvarena.spec.models import ModelSpec, preset

__all__ = ["STUBS", "VLLM_VERSION", "Driver", "Plan", "StrictConfig", "VLLMUnavailable", "build", "kv_cache_specs",
           "load_vllm"]

LEVEL = "block-pool"
HASH_ALGO = "sha256_cbor"  # CacheConfig.prefix_caching_hash_algo "sha256" hashes cbor-serialized keys
LAYOUT = "LBNHC"  # the legacy NHD layout FlashAttention reports first (layer-outermost)


class StrictConfig(SimpleNamespace):
    """The ``vllm_config`` the planning functions read: only the listed attributes exist (a typo or a new read
    in a later vLLM fails loudly instead of reading a default)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the adapter's vllm_config has no {name!r}: vLLM reads a field the adapter "
                             "does not model (add it to StrictConfig in engines/vllm/driver.py)")


def _cache_config(block_size: int, mamba_cache_mode: str, enable_prefix_caching: bool, num_blocks: int | None,
                  prefix_match_unit: int | None) -> StrictConfig:
    V = load_vllm()
    layout = V.layout.KVCacheLayout[LAYOUT]
    return StrictConfig(block_size=block_size, prefix_match_unit=prefix_match_unit,
                        enable_prefix_caching=enable_prefix_caching,
                        mamba_cache_mode=mamba_cache_mode, prefix_cache_retention_interval=0,
                        num_gpu_blocks_override=num_blocks, kv_cache_layout=LAYOUT,
                        get_resolved_kv_cache_layout=lambda: layout)


def vllm_config(block_size: int, *, mamba_cache_mode: str = "none", enable_prefix_caching: bool = True,
                num_blocks: int | None = None, prefix_match_unit: int | None = None) -> StrictConfig:
    """The fields of ``VllmConfig`` that get_kv_cache_groups / get_kv_cache_config_from_groups /
    resolve_kv_cache_block_sizes read, with vLLM's defaults (one GPU, no HiSparse, no KV connector)."""
    return StrictConfig(
        cache_config=_cache_config(block_size, mamba_cache_mode, enable_prefix_caching, num_blocks,
                                   prefix_match_unit),
        parallel_config=StrictConfig(decode_context_parallel_size=1, tensor_parallel_size=1),
        scheduler_config=StrictConfig(disable_hybrid_kv_cache_manager=False),
        attention_config=StrictConfig(hisparse_config=None),
        kv_transfer_config=None,
        speculative_config=None,
    )


# ---------------------------------------------------------------------------------------------
# kvarena models as vLLM kv cache specs


_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "float8_e4m3fn"}


def kv_cache_specs(model: ModelSpec, block_size: int, max_model_len: int, mamba_cache_mode: str = "none"
                   ) -> dict[str, Any]:
    """One vLLM spec per layer of ``model``: full attention -> ``FullAttentionSpec``, a window class ->
    ``SlidingWindowSpec`` (its window), a recurrent class -> ``MambaSpec`` (GDN: conv and ssm state shapes,
    block size ``max_model_len`` in mamba cache mode "none", as vLLM's hybrid model config sets it)."""
    import torch
    V = load_vllm()
    iface = V.iface
    specs: dict[str, Any] = {}
    for cls in model.classes:
        by_layer: dict[int, list[Any]] = {}
        for row in cls.rows:
            by_layer.setdefault(row.layer, []).append(row)
        for layer, rows in sorted(by_layer.items()):
            name = f"model.layers.{layer}.{cls.name}"
            dtypes = {r.dtype for r in rows}
            if cls.kind in (Kind.FULL, Kind.WINDOW):
                k = next(r for r in rows if r.part.endswith("k") or r.part == "latent")
                if len(dtypes) != 1 or len(k.shape) != 2:
                    raise ValueError(f"{model.name}:{name}: only K/V rows of one dtype map onto an AttentionSpec")
                dtype = getattr(torch, _TORCH_DTYPE[k.dtype])
                v = next((r for r in rows if r.part.endswith("v")), None)
                common = dict(block_size=block_size, num_kv_heads=k.shape[0], head_size=k.shape[1],
                              head_size_v=v.shape[1] if v is not None else k.shape[1], dtype=dtype)
                if cls.kind is Kind.FULL:
                    specs[name] = iface.FullAttentionSpec(**common)
                else:
                    specs[name] = iface.SlidingWindowSpec(**common, sliding_window=cls.window)
            else:
                shapes = tuple(r.shape for r in rows)
                torch_dtypes = tuple(getattr(torch, _TORCH_DTYPE[r.dtype]) for r in rows)
                assert sum(DTYPE_BYTES[r.dtype] * _prod(r.shape) for r in rows) == sum(r.nbytes for r in rows)
                mamba_block = max_model_len if mamba_cache_mode == "none" else block_size
                specs[name] = iface.MambaSpec(block_size=mamba_block, shapes=shapes, dtypes=torch_dtypes,
                                          mamba_type=V.registry.MambaAttentionBackendEnum.GDN_ATTN,
                                          mamba_cache_mode=mamba_cache_mode)
    return specs


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class Plan:
    """What vLLM's planning decided for a model: the config, its groups and the block sizes."""

    model: str
    kv_cache_config: Any
    scheduler_block_size: int
    hash_block_size: int
    max_model_len: int
    manager_kinds: tuple[str, ...] = ()

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks

    def group_block_sizes(self) -> tuple[int, ...]:
        return tuple(g.kv_cache_spec.block_size for g in self.kv_cache_config.kv_cache_groups)


# kvarena's presets are all hybrid; one full-attention model drives the single-group path
# (``UnitaryKVCacheCoordinator``).
SINGLE_GROUP = {"toy-full": lambda: ModelSpec("toy-full", (preset("toy-swa").cls("full"),), max_context_len=32,
                                              source="toy-swa's full-attention class alone")}


def hybrid_block_size(model: ModelSpec, kernel_block: int) -> int:
    """The attention block size vLLM picks for a model with recurrent state: the smallest multiple of the
    kernel block whose attention page (one full-attention layer) covers one layer's state page.

    This is the arithmetic of ``Platform._align_hybrid_block_size`` (vllm/platforms/interface.py:1097-1103),
    re-done here because its inputs (the attention backend's kernel block sizes, the model class from
    ``ModelRegistry``) need the model executor; everything after it is vLLM's own planning.  Qwen3.5-4B:
    528 tokens with a 16-token kernel block (FlashAttention), 576 with 64 (FlashInfer GDN on Hopper)."""
    state = [c for c in model.classes if c.kind is Kind.RECURRENT]
    full = [c for c in model.classes if c.kind is Kind.FULL]
    if not state or not full:
        return kernel_block
    layer = min(r.layer for r in full[0].rows)
    attn_1_token = sum(r.nbytes for r in full[0].rows if r.layer == layer)
    state_layer = min(r.layer for r in state[0].rows)
    state_page = sum(r.nbytes for r in state[0].rows if r.layer == state_layer)
    return kernel_block * -(-state_page // (kernel_block * attn_1_token))


def build(model: str | ModelSpec, *, num_blocks: int = 24, block_size: int = 4, max_model_len: int | None = None,
          mamba_cache_mode: str | None = None, enable_caching: bool = True, prefix_match_unit: int | None = None
          ) -> Plan:
    """vLLM's own planning for ``model``: groups, a config with ``num_blocks`` blocks, the block sizes.

    ``block_size`` is the attention kernel block; a model with recurrent state gets
    :func:`hybrid_block_size`, and mamba cache mode "align" when prefix caching is on (what
    ``MambaModelConfig.verify_and_update_config`` sets, vllm/model_executor/models/config.py:763-779)."""
    V = load_vllm()
    spec = (SINGLE_GROUP[model]() if model in SINGLE_GROUP else preset(model)) if isinstance(model, str) else model
    max_len = max_model_len or spec.max_context_len
    if mamba_cache_mode is None:
        mamba_cache_mode = "align" if enable_caching else "none"
    block_size = hybrid_block_size(spec, block_size)
    cfg = vllm_config(block_size, mamba_cache_mode=mamba_cache_mode, enable_prefix_caching=enable_caching,
                      num_blocks=num_blocks, prefix_match_unit=prefix_match_unit)
    layer_specs = kv_cache_specs(spec, block_size, max_len, mamba_cache_mode)
    groups = V.planning.get_kv_cache_groups(cfg, layer_specs)
    V.planning._check_exact_partition(groups, layer_specs)
    bytes_per_block = V.planning._get_kv_cache_bytes_per_block(groups, V.layout.KVCacheLayout[LAYOUT])
    config = V.planning.get_kv_cache_config_from_groups(cfg, groups, bytes_per_block * num_blocks)
    sched_bs, hash_bs = V.utils.resolve_kv_cache_block_sizes(config, cfg)
    kinds = tuple(type(g.kv_cache_spec).__name__ for g in groups)
    return Plan(spec.name, config, sched_bs, hash_bs, max_len, kinds)


# ---------------------------------------------------------------------------------------------
# The driver: the scheduler's calls into the manager


@dataclass
class Sampling:
    """What ``Request.__init__`` reads of a ``SamplingParams`` (the real one needs pydantic)."""

    max_tokens: int
    extra_args: None = None
    structured_outputs: None = None
    prompt_logprobs: None = None
    skip_reading_prefix_cache: bool | None = None


@dataclass
class Step:
    seq: int
    rid: str
    tokens: int
    reads: list[Any] = field(default_factory=list)


@dataclass
class Driver:
    """One ``KVCacheManager`` and the scheduler state around it that decides when blocks may be reused.

    ``check`` (default :func:`vllm_checks.check_pool`) runs after every operation; ``defer_block_free`` is the
    scheduler's flag of the same name (on: an in-flight step keeps the blocks of a freed request withheld)."""

    plan: Plan
    manager: Any = None
    defer_block_free: bool = True
    check: Any = None
    requests: dict[str, Any] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    in_flight: deque[Step] = field(default_factory=deque)
    deferred: deque[tuple[int, list[Any], str, str]] = field(default_factory=deque)  # fence, blocks, why, rid
    epoch: dict[int, int] = field(default_factory=dict)  # block id -> the step that last got it as a new block
    sched_seq: int = 0  # the scheduler's sched_step_seq: the last non-empty step
    processed_seq: int = 0  # processed_step_seq: the last step whose output was processed
    step_open: bool = False  # a step is being assembled (new_step), its seq taken by its first request
    step_seq: int | None = None
    counts: Counter = field(default_factory=Counter)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.V = load_vllm()
        logging.getLogger("vllm").setLevel(logging.ERROR)  # "failed to reset prefix cache" is an answer here
        if self.manager is None:
            self.manager = self.V.manager.KVCacheManager(
                self.plan.kv_cache_config, max_model_len=self.plan.max_model_len,
                scheduler_block_size=self.plan.scheduler_block_size, hash_block_size=self.plan.hash_block_size,
                enable_caching=True)
        hash_fn = self.V.hashing.get_hash_fn_by_name(HASH_ALGO)
        self.V.utils.init_none_hash(hash_fn)
        self._hasher = self.V.utils.get_request_block_hasher(self.plan.hash_block_size, hash_fn)
        self._status = self.V.request.RequestStatus
        if self.check is None:
            self.check = check_pool

    @property
    def pool(self) -> Any:
        return self.manager.block_pool

    # -- requests ------------------------------------------------------------------------------

    def add(self, prompt: Sequence[int], max_tokens: int) -> str:
        rid = f"r{next(self._ids)}"
        self.requests[rid] = self.V.request.Request(rid, list(prompt), Sampling(max_tokens), None,
                                                    block_hasher=self._hasher)
        return rid

    def waiting(self) -> list[str]:
        return [r for r in self.requests if r not in self.running]

    def new_step(self) -> None:
        """A scheduler iteration begins (``KVCacheManager.new_step_starts``).  Its requests share one sequence
        number, taken when the first of them is scheduled: an empty step does not advance it (as
        ``sched_step_seq`` does not, scheduler.py:1777-1780)."""
        self.manager.new_step_starts()
        self.step_open, self.step_seq = True, None

    def schedule(self, rid: str, chunk: int, *, same_step: bool = False) -> Any:
        """``rid``'s part of a step: admission (with a prefix-cache lookup) if it waits, else its next prefill
        chunk or decode token.  A step of its own unless ``same_step`` (then it joins the step begun last).
        Returns the new blocks, or None when the manager refuses (nothing scheduled)."""
        if not (same_step and self.step_open):
            self.new_step()
        req = self.requests[rid]
        computed, num_hit = None, 0
        if rid not in self.running:
            computed, num_hit, _ = self.manager.get_computed_blocks(req)
            self.counts["lookups"] += 1
        remaining = req.num_tokens - req.num_computed_tokens - num_hit
        num_new = max(1, min(chunk, remaining)) if remaining > 0 else 1
        if req.num_computed_tokens + num_hit + num_new > self.plan.max_model_len:
            return None
        blocks = self.manager.allocate_slots(req, num_new, num_new_computed_tokens=num_hit,
                                             new_computed_blocks=computed)
        if blocks is None:
            self.counts["refused"] += 1
            self.check(self)
            return None
        if self.step_seq is None:
            self.step_seq = self.sched_seq = self.sched_seq + 1
        seq = self.step_seq
        for group in blocks.blocks:
            for b in group:
                if not b.is_null:
                    self.epoch[b.block_id] = seq
        if rid not in self.running:
            self.running.add(rid)
            req.status = self._status.RUNNING
            req.num_computed_tokens += num_hit
            if num_hit:
                self.counts["prefix hits"] += 1
                self.counts["tokens hit"] += num_hit
        copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:  # _free_cow_retained_blocks: fenced at the step that runs the copies (this one)
            self.deferred.append((seq, list(retained), "cow", rid))
            self.counts["cow copies"] += len(copies)
        start = req.num_computed_tokens
        reads = check_writes(self, rid, start, start + num_new)
        req.num_computed_tokens += num_new
        req.num_in_flight_tokens += num_new
        req.last_sched_seq = seq
        self.in_flight.append(Step(seq, rid, num_new, reads))
        self.counts["steps"] += 1
        self.counts["blocks allocated"] += sum(len(g) for g in blocks.blocks)
        self.check(self)
        return blocks

    def complete(self) -> None:
        """The oldest in-flight step finishes (``update_from_output``): its tokens are processed, a request
        past its prompt samples one token, and the deferred frees it fenced go back to the pool."""
        seq = self.in_flight[0].seq
        self.processed_seq = seq
        self.step_open = False
        self._drain()
        while self.in_flight and self.in_flight[0].seq == seq:
            step = self.in_flight.popleft()
            req = self.requests.get(step.rid)
            if req is None:
                continue  # finished while in flight: its output is dropped
            req.num_in_flight_tokens -= step.tokens
            if req.num_stale_output_tokens > 0:  # output of an incarnation preempted since: not appended
                req.num_stale_output_tokens -= step.tokens
            elif step.rid in self.running and req.num_tokens <= req.num_computed_tokens < self.plan.max_model_len:
                req.append_output_token_ids(1000 + len(req.output_token_ids))
        self.check(self)

    def _drain(self) -> None:
        while self.deferred and self.deferred[0][0] <= self.processed_seq:
            _, blocks, why, _rid = self.deferred.popleft()
            self.pool.free_blocks(reversed(blocks) if why == "request" else blocks)
            self.counts["deferred frees drained"] += 1

    def finish(self, rid: str, preempt: bool = False) -> None:
        """``_free_request_blocks``: free now if the request's last step was processed, else pop its blocks
        and defer the free to that step.  A preempted request goes back to waiting with nothing computed."""
        req = self.requests[rid]
        if not self.defer_block_free or req.last_sched_seq <= self.processed_seq:
            self.manager.free(req)
        else:
            blocks = self.manager.pop_blocks_for_free(req)
            if blocks:
                self.deferred.append((self.sched_seq, list(blocks), "request", rid))
                self.counts["deferred frees"] += 1
        self.running.discard(rid)
        if preempt:  # _preempt_request: in-flight tokens stay counted, their output marked stale
            req.status = self._status.PREEMPTED
            req.num_computed_tokens = 0
            req.num_stale_output_tokens = req.num_in_flight_tokens
            self.counts["preemptions"] += 1
        else:
            del self.requests[rid]
            self.counts["finished"] += 1
        self.check(self)

    def evict(self, block_ids: set[int]) -> None:
        """``evict_blocks`` (a KV connector reporting blocks it invalidated)."""
        self.manager.evict_blocks(block_ids)
        self.counts["evictions"] += 1
        self.check(self)

    def reset(self) -> bool:
        ok = self.manager.reset_prefix_cache()
        self.counts["prefix cache resets" if ok else "refused resets"] += 1
        self.check(self)
        return ok

    def idle(self) -> None:
        """Every in-flight step completes."""
        while self.in_flight:
            self.complete()

    # -- what the checks read --------------------------------------------------------------------

    def tables(self) -> Iterator[tuple[int, str, list[Any]]]:
        """(group, request, block table) for every table the managers hold."""
        for mgr in self.manager.coordinator.single_type_managers:
            for rid, blocks in mgr.req_to_blocks.items():
                yield mgr.kv_cache_group_id, rid, blocks

    def withheld(self, but: str | None = None) -> list[Any]:
        """Blocks of deferred frees (all, or all but those of request ``but``)."""
        return [b for _, blocks, _, rid in self.deferred if rid != but for b in blocks]
