"""SGLang 0.5.23's admission and retraction rules, one named function (or constant) each.

Read from the installed wheel (``pip install sglang==0.5.23``); paths are relative to its ``sglang/``
package. The scheduler model (``scheduler.py``) calls these; each is also a documented option of
:class:`SchedulerModel` (at the end) whose default is SGLang's value, so a rule can be
switched off to see what it is worth. Nothing here imports sglang: the values are copied and cited.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- constants (srt/environ.py unless said otherwise) -----------------------------------------------
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (srt/managers/schedule_policy.py)
SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL
# srt/arg_groups/memory_hook.py _handle_gpu_memory_settings: "H20, H200 (chunked_prefill_size 8k ...)"
CHUNKED_PREFILL_SIZE_H200 = 8192
ENABLE_MIXED_CHUNK = False  # srt/arg_groups/fields/schedule.py: enable_mixed_chunk ... = False
# srt/mem_cache/kv_cache_configurator.py: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_BASE_SLOTS_RATIO = 3
MAMBA_MAX_RUNNING_RATIO = 5  # 3 + get_mamba_tracking_slots(extra_buffer=True, overlap=True) = 3 + 2


# ---- the decode reserve (new_token_ratio) -----------------------------------------------------------


def new_token_ratio_schedule(conservativeness: float = 1.0) -> tuple[float, float, float]:
    """(initial, floor, decay per decode step) of the decode reserve ratio.

    srt/managers/scheduler_components/new_token_ratio_tracker.py ``NewTokenRatioTracker.from_config``:
    init = min(0.7 x schedule_conservativeness, 1), min = min(init x 0.14, 1),
    decay = (init - min) / 600. With the default conservativeness 1.0: (0.7, 0.098, 0.001003)."""
    init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
    floor = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    return init, floor, (init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS


def running_reserve_ratio(ignore_eos: bool, new_token_ratio: float) -> float:
    """Share of a running request's remaining output that admission keeps free.

    srt/managers/schedule_policy.py ``PrefillAdder._get_running_request_total_token_offset``:
    "Fixed-length requests cannot benefit from the early-EOS estimate": ratio 1.0 when the request
    has ``ignore_eos`` (bench_serving sets it by default), else the decaying ``new_token_ratio``.
    The remaining output is clipped at CLIP_MAX_NEW_TOKENS (``min(max_new - decoded, CLIP)``)."""
    return 1.0 if ignore_eos else new_token_ratio


def new_request_reserve_tokens(max_new_tokens: int, page_size: int, clip: int | None = CLIP_MAX_NEW_TOKENS) -> int:
    """Tokens a new request reserves besides its prompt: its own output *in full* (clipped), plus one
    page of alignment overhead.

    srt/managers/schedule_policy.py ``PrefillAdder.add_one_req``: ``total_tokens = extend_input_len +
    min(max_new_tokens, CLIP_MAX_NEW_TOKENS) + per_req_token_overhead`` (= page_size), admitted while
    ``total_tokens < remaining_total`` (srt/mem_cache/prefill_budget.py ``PrefillBudget.check_prefill``);
    ``_update_prefill_budget`` then charges the same ``max_new_tokens`` at ratio 1 (``reserve``)."""
    return (max_new_tokens if clip is None else min(max_new_tokens, clip)) + page_size


def ratio_after_retract(decoded_tokens: int, max_new_tokens: int, requests: int) -> float:
    """The reserve ratio after a retraction, over the requests kept in the batch.

    srt/managers/scheduler_components/new_token_ratio_tracker.py
    ``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``:
    min(1, (sum decoded + SGLANG_RETRACT_DECODE_STEPS x n) / (sum max_new_tokens + 1)).
    srt/managers/scheduler.py ``update_running_batch`` sets it after ``retract_decode`` and calls
    ``decay_step`` only on decode steps *without* a retraction; ``self_check_during_idle`` resets it
    to the initial value when the server is idle."""
    return min(1.0, (decoded_tokens + RETRACT_DECODE_STEPS * requests) / (max_new_tokens + 1))


def retraction_key(decoded_tokens: int, input_tokens: int) -> tuple[int, int]:
    """Sort key of the retraction order: the request with the *smallest* key is retracted first.

    srt/managers/schedule_batch.py ``ScheduleBatch._get_decode_retraction_order``: sorted by
    ``(len(output_ids), -len(origin_input_ids))`` descending and popped from the end, so the victim
    has the fewest decoded tokens, ties broken by the longest prompt. ``retract_decode`` pops until
    ``check_decode_mem`` passes and "always keep[s] at least one request"."""
    return decoded_tokens, -input_tokens


def retraction_victim(keys: list[tuple[int, int]]) -> int:
    """Index (in running-batch order) of the request ``retract_decode`` pops first.

    srt/managers/schedule_batch.py ``_get_decode_retraction_order``: ``sorted_indices.sort(key=length_key,
    reverse=True)`` is stable, so requests with equal keys keep their batch order, and ``pop()`` takes the
    *last* of them: among ties, the request that joined the running batch last (``merge_batch`` appends)."""
    return min(range(len(keys)), key=lambda i: (keys[i], -i))


# ``retract_decode``'s victims go to the *back* of the waiting queue: srt/managers/scheduler.py
# ``update_running_batch`` -> ``_add_request_to_queue(req, is_retracted=True)`` -> ``self.waiting_queue.append``,
# and FCFS (``schedule_policy`` default, srt/arg_groups/fields/schedule.py) does not reorder the queue.
RETRACTED_REQUEUE = "back"

# A refusal for memory (``AddReqResult.NO_TOKEN``) sets ``running_batch.batch_is_full``, and no admission is tried
# again (a chunked prefill continues) until the running batch shrinks (a request finishes or is retracted):
# srt/managers/scheduler.py ``_get_new_batch_prefill_raw`` returns early while it is set; ``get_next_batch_to_run``
# and ``update_running_batch`` clear it when the batch got smaller. A hybrid-SWA model clears it every pass.
BATCH_IS_FULL = True

# State slots a new request must find free at admission: one. srt/managers/schedule_policy.py
# ``PrefillAdder._mamba_gap_budget_for_req`` charges ``int(not req.kv.holds_mamba)`` slots ("Tracking buffers
# and radix CoW headroom are not included here"); the split pools' budget charges none (``PrefillBudget``
# counts full tokens only; the running cap leaves the state pool 5 slots per request).
ADMISSION_STATE_SLOTS = 1

# The grid a prefill checkpoint lands on: ``mamba_cache_chunk_size`` = max(FLA chunk 64, page 1)
# (srt/arg_groups/overrides.py), lcm'd with the tree page by srt/runtime_context.py ``mamba_checkpoint_grid``.
MAMBA_CHECKPOINT_GRID = 64


def mamba_radix_checkpoint_slots(radix_cache: bool = True, skip_decode_lock: bool = False) -> int:
    """State slots the radix tree holds *locked* for each running request: its prompt's checkpoint.

    After a prefill chunk the scheduler publishes the request's prefix (srt/mem_cache/common.py
    ``checkpoint_kv_cache``); the mamba component donates the ping-pong slot holding the tracked state to the
    tree and gives the request a fresh one (srt/mem_cache/unified_cache/components/mamba.py
    ``prepare_for_caching_req``: ``_alloc_mamba_slot`` + ``donate_mamba_ping_pong_slot``), and the request
    then locks that node, state included (srt/mem_cache/unified_radix_cache.py ``checkpoint_into_tree``:
    ``skip_lock_components`` is empty unless ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``, off in srt/environ.py).
    So a running request has 1 + 2 + 1 state slots resident (srt/mem_cache/kv_cache_configurator.py: the skip
    "frees one resident slot per running request"). Unlocked (evictable) once it stops running."""
    return 1 if radix_cache and not skip_decode_lock else 0


def mamba_chunk_checkpoints(extra_buffer: bool = True, dcp: bool = False) -> bool:
    """Whether *every* prefill chunk donates a state checkpoint, leaving the earlier ones in the tree.

    Each chunk's extend is tracked relative to the request's prefix ("Without DCP, keep tracking snapshots
    relative to that request prefix so later chunks can continue donating states": srt/managers/
    schedule_batch.py ``_mamba_radix_cache_v2_req_prepare_for_extend``), and each chunk is checkpointed
    (``stash_chunked_request`` / ``process_batch_result_prefill`` -> ``checkpoint_kv_cache``). The
    request's lock then moves to the new node (srt/mem_cache/unified_radix_cache.py
    ``checkpoint_into_tree``: ``unlock(req.lock)``, ``lock(new_last_node)``); the full-attention lock
    covers the path, the mamba lock only that node (unified_cache/components/mamba.py
    ``acquire_component_lock``), so the previous chunk's state stays resident as an *interior* state,
    unlocked, above locked KV. Only a state allocation reclaims it: ``_alloc_mamba_slot`` ->
    ``evict_for_alloc(mamba_num=1)`` tombstones interior states; a full-attention shortfall evicts
    evictable *leaves* only (components/full.py ``_evict_device_next_node``), and the full side's
    capacity, ``available_size() + full_evictable_size()`` (srt/mem_cache/prefill_budget.py
    ``PrefillBudget._available_and_evictable``), does not count it. In the split pools it costs a state
    slot; in the unified pool (``UnifiedMambaTokenToKVPoolAllocator.available_size`` is the full side's
    gap) bytes the full-attention KV cannot get back. The default path cap keeps every state
    (``mamba_max_states_per_path`` = -1, srt/arg_groups/fields/exec_.py). With DCP (or no extra_buffer)
    the donation lands on an absolute grid instead: not modeled, False."""
    return extra_buffer and not dcp


def radix_checkpoint_taken(extend_tokens: int, grid: int = MAMBA_CHECKPOINT_GRID) -> bool:
    """Whether a prefill chunk of ``extend_tokens`` leaves a state checkpoint to donate: srt/managers/
    schedule_batch.py ``_mamba_radix_cache_v2_req_prepare_for_extend``: ``mask = req.extend_len >= grid``."""
    return extend_tokens >= grid


# ---- capacity limits ---------------------------------------------------------------------------------


def mamba_tracking_slots(extra_buffer: bool = True, overlap: bool = True, lazy: bool = False) -> int:
    """State slots a running request holds besides its own (ping-pong tracking buffers).

    srt/mem_cache/allocation_sizing.py ``get_mamba_tracking_slots``: 0 without extra_buffer, 1 lazy,
    else 2 with the overlap scheduler. Qwen3.5 resolves to extra_buffer with radix cache and overlap
    on (srt/arg_groups/overrides.py ``_mamba_radix_cache_resolution``, the arch is in
    ``_MAMBA_EXTRA_BUFFER_ARCHS``): 1 + 2 slots per running request."""
    if not extra_buffer:
        return 0
    if lazy:
        return 1
    return 2 if overlap else 1


def mamba_max_running(max_mamba_cache_size: int, tracking_slots: int = 2) -> int:
    """Running requests allowed by the state pool: ``max_mamba_cache_size // ratio``.

    srt/mem_cache/kv_cache_configurator.py ``KVCacheConfigurator.resolve_max_num_reqs`` with
    ``_calculate_mamba_ratio`` = MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (3) + tracking slots (2)."""
    return max_mamba_cache_size // (MAMBA_BASE_SLOTS_RATIO + tracking_slots)


def max_running_requests(token_capacity: int, context_len: int) -> int:
    """The default running-request cap from the token capacity.

    srt/mem_cache/kv_cache_configurator.py ``resolve_max_num_reqs``: estimated = clamp(token_capacity
    / context_len x 512, 2048, 4096); max = min(estimated, token_capacity // 2)."""
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    return min(estimated, token_capacity // 2)


def swa_eviction_due(seqlen: int, window: int, evicted: int, interval: int = SWA_EVICTION_INTERVAL) -> bool:
    """Whether a decoding request frees its out-of-window KV this step.

    srt/managers/schedule_batch.py ``ScheduleBatch._swa_eviction_trigger``: only once ``seqlen - 1 -
    window >= evicted + SGLANG_SWA_EVICTION_INTERVAL``, so a request holds between W and W + interval
    (+ a page) window tokens: W..2W only for W = 128. The pager applies it in pages."""
    return seqlen - 1 - window >= evicted + interval


def swa_admission_tokens(extend: int, max_new: int, window: int, page_size: int, chunk: int | None) -> int:
    """Window-pool tokens a new request must find free to be admitted (split SWA pool or the shared arena).

    srt/mem_cache/prefill_budget.py ``estimate_swa_kv_tokens`` (called by ``SWAPrefillBudget.check_prefill``
    and ``SharedSWAPrefillBudget``): the prompt tail this pass allocates beyond the window
    (``max(min(extend, chunk) - W, 0)``), plus ``min(extend + max_new, W)``, plus a page."""
    allocated = extend if chunk is None else min(extend, chunk)
    return max(allocated - window, 0) + min(extend + max_new, window) + page_size


def page_size_on_hopper(model: str) -> int:
    """The page size SGLang picks on an H100/H200 (sm90) when --page-size is not given.

    srt/arg_groups/overrides.py ``_page_size_default``: 1 on CUDA (64 only on MUSA or a ROCm layout);
    GPT-OSS gets the fa3 backend on sm90 (srt/arg_groups/model_overrides/gpt_oss.py
    ``_gpt_oss_overrides``), which keeps page 1; Qwen3.5's override only acts on sm100
    (model_overrides/qwen3_5.py). So 1 for every preset here."""
    del model
    return 1


# ---- SGLang's mamba strategies (--mamba-radix-cache-strategy) ------------------------------------------

MAMBA_STRATEGIES = ("extra_buffer", "no_buffer")


def mamba_strategy(strategy: str = "extra_buffer") -> dict[str, object]:
    """The :class:`SchedulerModel` fields of one mamba radix-cache strategy.

    ``auto`` resolves to ``extra_buffer`` with the overlap scheduler on (srt/arg_groups/overrides.py
    ``_mamba_radix_cache_resolution``), else to ``no_buffer`` (which also turns the overlap scheduler off).
    extra_buffer: 1 + 2 ping-pong slots per running request (``mamba_tracking_slots``), the tree's locked
    checkpoint, one more per later prefill chunk, running cap ``// (3 + 2)``. no_buffer: one slot per running
    request (``get_mamba_tracking_slots`` returns 0), the tree's checkpoint a copy into a fresh slot
    (srt/mem_cache/unified_cache/components/mamba.py ``prepare_for_caching_req``: ``_alloc_mamba_slot`` +
    ``copy_from``), no per-chunk donations, running cap ``// 3`` (kv_cache_configurator.py
    ``_calculate_mamba_ratio``: no additional ratio without extra_buffer)."""
    if strategy not in MAMBA_STRATEGIES:
        raise ValueError(f"mamba strategy {strategy!r}: choose one of {', '.join(MAMBA_STRATEGIES)}")
    extra = strategy == "extra_buffer"
    return {"state_slots": 1 + mamba_tracking_slots(extra), "radix_state_slots": mamba_radix_checkpoint_slots(),
            "chunk_checkpoints": mamba_chunk_checkpoints(extra)}


# ---- vLLM 0.33.0's scheduler (paths relative to the wheel's ``vllm/`` package) ---------------------------

# engine/arg_utils.py ``EngineArgs.get_batch_defaults``: a GPU of >= 70 GiB that is not an A100 (H100, H200),
# the OpenAI API server's usage context: 1,024 running requests, 8,192 tokens per step
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_WATERMARK = 0.0  # config/scheduler.py SchedulerConfig.watermark: "0.0 (the default) disables the watermark"
# ``_preempt_request``: ``self.waiting.prepend_request(request)``, ``num_computed_tokens = 0`` (recompute)
VLLM_REQUEUE = "front"
# ``schedule``: "Next, schedule the WAITING requests. ``if not preempted_reqs`` ...": none after a preemption
VLLM_ADMIT_AFTER_PREEMPTION = False


def vllm_step_budget(decoding: int, max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS) -> int:
    """Prompt tokens a step may prefill after its decodes.

    v1/core/sched/scheduler.py ``Scheduler.schedule``: "There's no decoding phase nor prefill phase"; the
    RUNNING requests are scheduled first, each decode taking one token of ``token_budget``
    (``max_num_scheduled_tokens``), then the WAITING ones ``while token_budget > 0``."""
    return max(0, max_num_batched_tokens - decoding)


def vllm_admission_tokens(prompt_tokens: int) -> int:
    """Tokens a waiting request must find blocks for to be admitted: its whole input, nothing for its output.

    config/scheduler.py ``scheduler_reserve_full_isl = True``: ``allocate_slots(..., full_sequence_must_fit=
    True)`` (v1/core/kv_cache_manager.py) refuses unless ``get_num_blocks_to_allocate(num_tokens=
    request.num_tokens)`` blocks are free, plus the watermark (0). No decode reserve: running requests'
    remaining output is not counted."""
    return prompt_tokens


def vllm_preemption_victim(running: int) -> int:
    """Index in the running list of the request vLLM preempts when an ``allocate_slots`` fails: the last.

    ``schedule``: ``preempted_req = self.running[-1]`` ... ``self.running.pop()`` (FCFS, the default policy),
    repeated until the allocation fits or the request preempted itself; admission appends to ``running``, so
    the last is the newest admitted (a re-admitted request counts as new)."""
    return running - 1


def vllm_rules() -> dict[str, object]:
    """vLLM 0.33.0's scheduler as :class:`SchedulerModel` fields (the wheel's defaults on an H200)."""
    return {"prefill_chunk": VLLM_MAX_NUM_BATCHED_TOKENS, "mixed_chunk": True, "decode_in_budget": True,
            "max_num_seqs": VLLM_MAX_NUM_SEQS, "new_token_ratio": (0.0, 0.0, 0.0), "ignore_eos_at_one": False,
            "new_request_in_full": False, "batch_is_full": False, "retraction": "newest",
            "requeue_retracted": VLLM_REQUEUE, "admit_after_retract": VLLM_ADMIT_AFTER_PREEMPTION,
            # allocate_slots starts with remove_skipped_blocks: out-of-window blocks go every step
            "swa_eviction_interval": None, "swa_admission": False,
            # one state block per request (align mode's per-crossing block is the vLLM manager's own), no tree
            "state_slots": 1, "radix_state_slots": 0, "chunk_checkpoints": False}


# ---- the KV budget -------------------------------------------------------------------------------------


def kv_budget_bytes(pre_load_bytes: float, mem_fraction: float, weight_bytes: float) -> int:
    """KV pool bytes as SGLang profiles them, without any further reserve.

    srt/mem_cache/kv_cache_configurator.py ``_profile_available_bytes``: rest = free memory after the
    weights load - pre_model_load_memory x (1 - mem_fraction_static) = pre x mem_fraction - weights
    (the mamba state pool is then carved out of ``rest`` by ``_handle_max_mamba_cache``)."""
    return int(pre_load_bytes * mem_fraction - weight_bytes)


def state_pool_fraction(mamba_full_memory_ratio: float) -> float:
    """Share of ``rest`` the state pool gets: r / (1 + r) (``_handle_max_mamba_cache``)."""
    return mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- the rules as options of the scheduler model ---------------------------------------------------


@dataclass(frozen=True)
class SchedulerModel:
    """The rules of the scheduler model. Defaults are SGLang 0.5.23's (``py`` cites each);
    :data:`SIMPLE` is ``kvarena replay``'s deliberately simple model."""

    prefill_chunk: int | None = CHUNKED_PREFILL_SIZE_H200  # prompt tokens per step; None: whole prompts
    mixed_chunk: bool = ENABLE_MIXED_CHUNK  # decode in prefill steps too (SGLang: off)
    transient_window: bool = True  # a prefill chunk holds window pages for all its tokens during its forward
    swa_eviction_interval: int | None = SWA_EVICTION_INTERVAL  # None: free window pages at once
    swa_admission: bool = True  # window headroom per new request: swa_admission_tokens (else its pages)
    evict_before_alloc: bool = True  # a decode step frees out-of-window pages before it allocates
    new_token_ratio: tuple[float, float, float] = new_token_ratio_schedule()  # initial, floor, decay
    ratio_after_retract: str = "estimate"  # "estimate": ratio_after_retract; "reset": back to initial
    decay_on_decode_only: bool = True  # decay on decode steps without retraction only (else every step)
    reset_ratio_when_idle: bool = True  # back to the initial ratio when nothing runs or waits
    ignore_eos_at_one: bool = True  # ignore_eos requests reserved at ratio 1.0 (running_reserve_ratio)
    new_request_in_full: bool = True  # the new request's own output (+ a page) reserved in full
    batch_is_full: bool = BATCH_IS_FULL  # refused for memory: no admission till the batch shrinks
    retraction: str = "fewest_decoded"  # victim order: "fewest_decoded" (retraction_victim) or "newest"
    requeue_retracted: str = RETRACTED_REQUEUE  # "back" of the waiting queue (SGLang) or "front"
    check_decode_mem: bool = True  # retract before the step until its page needs fit, keeping one
    clip_new_tokens: int | None = CLIP_MAX_NEW_TOKENS  # cap on one request's reserved output
    state_slots: int = 1 + mamba_tracking_slots()  # recurrent slots a running request holds
    admission_state_slots: int = ADMISSION_STATE_SLOTS  # of those, what admission must find free
    radix_state_slots: int = mamba_radix_checkpoint_slots()  # + its prompt's checkpoint, held by the tree
    chunk_checkpoints: bool = mamba_chunk_checkpoints()  # each later prefill chunk's too (checkpoints.py)
    # not SGLang's: what the scheduler tells kvarena's arena (ceiling.py), the full band's planned peak per window page
    placement_limit: bool = True
    max_running: int | None = None  # running-request cap (max_running_requests / mamba_max_running)
    max_num_seqs: int | None = None  # a fixed running cap instead (vLLM's max_num_seqs); None: SGLang's
    decode_in_budget: bool = False  # a step's decodes take tokens of its prefill budget (vLLM)
    admit_after_retract: bool = True  # admit in a step that retracted (vLLM: no, `if not preempted_reqs`)
    prefix_cache: bool = True  # SGLang's radix cache (on unless --disable-radix-cache): prefix.py
    forward_requests: int = 4  # requests whose pages a forward pass holds in the ledger
    check_every: int = 200  # steps between full invariant checks (O(arena) each); 0: at the end only
    # the idle-time flush (Arena.flush_idle, SGLang's flush_opportunistic from Scheduler.on_idle,
    # srt/managers/scheduler.py:5277): bytes it may move per step, when at most idle_flush_running requests run
    idle_flush_bytes: int | None = 1 << 30  # None: never
    idle_flush_running: int = 0  # 0: only when fully idle, as SGLang's on_idle
    stall_steps: int = 50_000  # steps without a completion that mean the model livelocked


# kvarena replay: whole prompts, decode and prefill in one step, retract the newest, ratio 0.7 -> 0.1
# decaying every step and reset by a retraction, eager window freeing, one state slot, no cap.
SIMPLE = SchedulerModel(prefill_chunk=None, mixed_chunk=True, transient_window=False, swa_eviction_interval=None,
                        new_token_ratio=(0.7, 0.1, 0.001), ratio_after_retract="reset", decay_on_decode_only=False,
                        reset_ratio_when_idle=False, ignore_eos_at_one=False, new_request_in_full=False,
                        retraction="newest", check_decode_mem=False, clip_new_tokens=None, state_slots=1,
                        swa_admission=False, evict_before_alloc=False, idle_flush_bytes=None,
                        requeue_retracted="front", radix_state_slots=0, batch_is_full=False, placement_limit=False)


# The rule sets ``kvarena simulate --matrix`` runs every allocator under.
RULE_SETS: dict[str, SchedulerModel] = {
    "sglang": SchedulerModel(),  # SGLang 0.5.23, mamba strategy extra_buffer (what Qwen3.5 resolves to)
    "sglang-no_buffer": SchedulerModel(**mamba_strategy("no_buffer")),  # type: ignore[arg-type]
    "vllm": SchedulerModel(**vllm_rules()),  # type: ignore[arg-type]
}

# Where SGLang's rules and vLLM's differ, grouped as they move together: switching one group of the SGLang set to
# vLLM's values at a time separates what each costs (simulator/matrix.py ``decompose``).
RULE_GROUPS: dict[str, tuple[str, ...]] = {
    "state slots": ("state_slots", "radix_state_slots", "chunk_checkpoints"),
    "running cap": ("max_num_seqs",),
    "decode reserve": ("new_token_ratio", "ignore_eos_at_one", "new_request_in_full"),
    "window eviction": ("swa_eviction_interval", "swa_admission"),
    "batch_is_full": ("batch_is_full",),
    "mixed batches": ("mixed_chunk", "decode_in_budget"),
    "preemption": ("retraction", "requeue_retracted", "admit_after_retract"),
}
