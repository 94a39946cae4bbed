"""vLLM 0.33.0's real v1 KV cache manager as a simulator engine, on CPU.

What runs is vLLM's own code from the installed wheel (``engines/vllm/load.py`` lists every
module that loads for real and every ``sys.modules`` stand-in, with why it is never executed):
``KVCacheManager.allocate_slots`` / ``free`` / ``pop_blocks_for_free``, the coordinator vLLM picks
(``HybridKVCacheCoordinator`` for these models), the per-type managers (``FullAttentionManager``,
``SlidingWindowManager`` with its ``remove_skipped_blocks``, ``MambaManager``) and ``BlockPool``. The
configuration is vLLM's own planning: one kv cache spec per layer (``engines/vllm/driver.py``
``kv_cache_specs``) -> ``get_kv_cache_groups`` -> ``get_kv_cache_config_from_groups`` with the budget's
bytes as available memory (vLLM divides them into blocks) -> ``resolve_kv_cache_block_sizes``. No KV tensor
is allocated: the manager hands out block ids only.

Block size: with recurrent layers vLLM's ``_align_hybrid_block_size`` arithmetic over a 16-token kernel
block (``hybrid_block_size``: 528 tokens on Qwen3.5-4B); without, the simulator's page size (``--page-size``,
i.e. ``--block-size 64``; vLLM's CUDA default is 16, 4x the scheduler steps to simulate). Prefix caching is
on, vLLM's default (``CacheConfig.enable_prefix_caching``), so recurrent state runs in mamba cache mode
"align" (``MambaModelConfig.verify_and_update_config``); each prompt has token ids of its own, so nothing hits.
``prefix_caching=False`` runs mode "none" (one state block per group for the request's life).

How the scheduler's page API maps onto a manager that speaks tokens (docs/vllm-findings.md §8 measures what
each choice changes):

- ``describe(owner, prompt, max_tokens)`` (the pager calls it before ``admit``) builds the real ``Request``;
- ``admit`` / ``extend`` with ``n`` full-attention pages call ``allocate_slots(request, n x block)``: the
  request's computed tokens then end on a block boundary, so vLLM allocates exactly ``n`` blocks per
  full-attention group, the sliding-window blocks its own rule needs and, in align mode, a fresh state block
  per mamba group. Back come the full pages, the window pages vLLM now holds beyond what the scheduler
  counted (so its count is vLLM's, checked in ``check_invariants``) and, on admission, the state pages; a
  logical page is one block in every group of its class;
- vLLM's scheduler calls ``allocate_slots`` for every running request every step, and that call starts with
  ``remove_skipped_blocks``; here allocations happen only at block crossings, so that call is made where vLLM
  would have made it: on the scheduler's window trim (``slide``; once no in-flight forward reads the request),
  and after the forward that follows an allocation (align mode's superseded state block), on a processed-token
  count no larger than the request's;
- ``free`` is ``_free_request_blocks``: ``free`` at once, or, while an in-flight forward (a ledger user)
  holds one of its pages, ``pop_blocks_for_free`` and the blocks' ``free_blocks`` at that user's release;
- ``fits`` counts blocks as vLLM would (pages x groups per class against ``get_num_free_blocks``, plus align
  mode's state block per crossing for a decode step).
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from kvarena.reference.arena import Stats
from kvarena.spec.errors import (
    AdmissionRejectedError,
    CapacityTooSmallError,
    DuplicateOwnerError,
    InvariantViolation,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
)
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, chain

KERNEL_BLOCK = 16  # FlashAttention's kernel block: the base of vLLM's hybrid block alignment


def missing() -> str | None:
    """None when vLLM's manager loads; else the one line saying how to add it."""
    from kvarena.engines.vllm.load import VLLMUnavailable, load_vllm

    try:
        load_vllm()
    except VLLMUnavailable as e:
        return f"{e}: pip install --no-deps vllm==0.33.0 && pip install msgspec cbor2 regex (or make vllm)"
    return None


def plan(config: ArenaConfig, prefix_caching: bool = True) -> Any:
    """vLLM's planning for ``config``'s model and budget: (kv cache config, scheduler block, hash block, groups
    per class, bytes per block). ``prefix_caching`` (vLLM's default on) decides the mamba cache mode."""
    from kvarena.engines.vllm.driver import LAYOUT, hybrid_block_size, kv_cache_specs, load_vllm, vllm_config

    V = load_vllm()
    spec = config.model
    has_state = any(c.kind is Kind.RECURRENT for c in spec.classes)
    block = hybrid_block_size(spec, KERNEL_BLOCK) if has_state else config.page_size
    # MambaModelConfig.verify_and_update_config (model_executor/models/config.py): "align" with prefix caching
    mode = "align" if has_state and prefix_caching else "none"
    cfg = vllm_config(block, mamba_cache_mode=mode, enable_prefix_caching=prefix_caching, num_blocks=None)
    layer_specs = kv_cache_specs(spec, block, config.context_len, mode)
    groups = V.planning.get_kv_cache_groups(cfg, layer_specs)
    V.planning._check_exact_partition(groups, layer_specs)
    per_block = V.planning._get_kv_cache_bytes_per_block(groups, V.layout.KVCacheLayout[LAYOUT])
    kv = V.planning.get_kv_cache_config_from_groups(cfg, groups, config.capacity)
    sched_bs, hash_bs = V.utils.resolve_kv_cache_block_sizes(kv, cfg)
    per_class: Counter[str] = Counter()
    for g in kv.kv_cache_groups:
        per_class[g.layer_names[0].rsplit(".", 1)[1]] += 1
    return SimpleNamespace(config=kv, scheduler_block=sched_bs, hash_block=hash_bs, groups=dict(per_class),
                           bytes_per_block=per_block, block=block)


class _Sampling(SimpleNamespace):
    """What ``Request.__init__`` reads of a ``SamplingParams`` (engines/vllm/driver.py ``Sampling``)."""


class VllmReal:
    """vLLM's ``KVCacheManager`` behind the simulator's engine interface."""

    ANCHORED_ENDS = False

    def __init__(self, config: ArenaConfig, prefix_caching: bool = True) -> None:
        from kvarena.engines.vllm.driver import HASH_ALGO, Sampling, load_vllm

        config.validate()
        self.V = V = load_vllm()
        logging.getLogger("vllm").setLevel(logging.ERROR)
        self.config = config
        self.capacity = config.capacity
        self.order = [c.name for c in chain(config.model)]
        self.kind = {c.name: c.kind for c in config.model.classes}
        self.full = next(c for c, k in self.kind.items() if k is Kind.FULL)
        self.plan = p = plan(config, prefix_caching)
        # tokens per block of the attention groups (resolve_kv_cache_block_sizes' scheduler block is the lcm with
        # the state groups' max_model_len-token blocks: a prefix-cache granule, not an allocation unit)
        self.page_tokens = p.block
        self.groups = {c: p.groups.get(c, 0) for c in self.order}
        self.page_bytes = p.bytes_per_block
        self.num_blocks = p.config.num_blocks
        worst = self._blocks_for(config.context_len)
        if worst > self.num_blocks - 1:
            raise CapacityTooSmallError(f"vLLM's pool of {self.num_blocks} blocks of {p.bytes_per_block} B cannot hold "
                                        f"one request of {config.context_len} tokens ({worst} blocks)")
        self.manager = V.manager.KVCacheManager(p.config, max_model_len=config.context_len,
                                                scheduler_block_size=p.scheduler_block, hash_block_size=p.hash_block,
                                                enable_caching=prefix_caching)
        hash_fn = V.hashing.get_hash_fn_by_name(HASH_ALGO)
        V.utils.init_none_hash(hash_fn)
        self._hasher = V.utils.get_request_block_hasher(p.hash_block, hash_fn)
        self._sampling = Sampling
        self._status = V.request.RequestStatus
        self.requests: dict[str, Any] = {}
        self.pending: dict[str, tuple[int, int]] = {}  # owner -> (prompt, max tokens), before its admit
        self.owners: dict[str, dict[str, list[int]]] = {}  # owner -> class -> its logical pages
        self.owner_of: dict[int, str] = {}
        self.users: dict[str, set[str]] = {}  # ledger user -> owners whose pages it holds
        self.held: Counter[str] = Counter()  # owner -> live users holding it
        self.deferred: dict[str, list[Any]] = {}  # freed owner -> blocks popped, freed when no user holds it
        # owners whose out-of-window / superseded state blocks vLLM's next allocate_slots would free: after the
        # forward that follows their allocation (``_after_forward``), or once no in-flight forward holds them
        # (each with the processed-token count it had then: the free must not reach tokens allocated since)
        self._allocated: dict[str, int] = {}
        self._after_forward: dict[str, dict[str, int]] = {}
        self._skip_when_unheld: dict[str, int] = {}
        self.first_group = {c: next(i for i, g in enumerate(p.config.kv_cache_groups)
                                    if g.layer_names[0].rsplit(".", 1)[1] == c) for c in self.order if self.groups[c]}
        self.align = prefix_caching and any(k is Kind.RECURRENT for k in self.kind.values())
        self.state_groups = sum(self.groups[c] for c, k in self.kind.items() if k is Kind.RECURRENT)
        self._ids = itertools.count()
        self._tokens = itertools.count(1)
        self.stats = Stats()

    # -- sizes ----------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        full = -(-tokens // self.page_tokens)
        out = 0
        for c in self.config.model.classes:
            g = self.groups[c.name]
            if c.kind is Kind.FULL:
                out += g * full
            elif c.kind is Kind.WINDOW:
                out += g * min(full, -(-c.window // self.page_tokens) + 1)
            else:
                out += g
        return out

    def page_bytes_of(self, cls: str) -> int:
        return max(1, self.groups[cls]) * self.page_bytes

    def free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    def fits(self, demand: Mapping[str, int], reserve_full_pages: int) -> bool:
        """Blocks as vLLM counts them. A demand without state pages is a decode step's block crossings: in mamba
        "align" mode each crossing also takes a new state block per mamba group (``MambaManager
        .allocate_new_blocks``; the previous one is freed by the next step's ``remove_skipped_blocks``)."""
        need = sum(n * self.groups[c] for c, n in demand.items()) + reserve_full_pages * self.groups[self.full]
        if self.align and not any(self.kind[c] is Kind.RECURRENT for c in demand):
            need += demand.get(self.full, 0) * self.state_groups
        return need <= self.free_blocks()

    def used_bytes(self) -> int:
        return (self.num_blocks - 1 - self.free_blocks()) * self.page_bytes  # block 0 is vLLM's null block

    def _live(self, gid: int, owner: str) -> int:
        mgr = self.manager.coordinator.single_type_managers[gid]
        return sum(1 for b in mgr.req_to_blocks.get(owner, ()) if not b.is_null)

    def occupancy(self) -> dict[str, int]:
        out = Counter()
        for mgr in self.manager.coordinator.single_type_managers:
            name = self.plan.config.kv_cache_groups[mgr.kv_cache_group_id].layer_names[0].rsplit(".", 1)[1]
            out[name] += sum(1 for bs in mgr.req_to_blocks.values() for b in bs if not b.is_null) * self.page_bytes
        return {c: out[c] for c in self.order}

    # -- requests -------------------------------------------------------------------------------
    def describe(self, owner: str, prompt_tokens: int, max_tokens: int) -> None:
        self.pending[owner] = (prompt_tokens, max_tokens)

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> SimpleNamespace:
        if owner in self.owners:
            raise DuplicateOwnerError(f"owner {owner!r} is already admitted")
        prompt, max_tokens = self.pending.get(owner, (demand.get(self.full, 0) * self.page_tokens, 1))
        # a token id of its own per request: no two prompts share a block hash (the traffic shares no prefix)
        tok = next(self._tokens)
        req = self.V.request.Request(owner, [tok] * max(1, prompt), self._sampling(max(1, max_tokens)), None,
                                     block_hasher=self._hasher)
        got = self._allocate(req, demand.get(self.full, 0), waiting=True, first=True)
        self.pending.pop(owner, None)
        req.status = self._status.RUNNING
        self.requests[owner] = req
        self.owners[owner] = {c: [] for c in self.order}
        self._bind(owner, got)
        self.stats.admitted += 1
        return SimpleNamespace(pages={c: tuple(v) for c, v in got.items() if v})

    def _allocate(self, req: Any, pages: int, waiting: bool, first: bool = False) -> dict[str, list[int]]:
        """``allocate_slots`` for ``pages`` more attention blocks. Returns the new logical pages per class: one
        per new block of the class's first group (window blocks; state blocks on admission only: align mode's
        per-crossing state blocks replace the previous one and stay vLLM's own)."""
        n = pages * self.page_tokens
        if n == 0:
            return {}
        if req.num_computed_tokens + n > req.num_tokens:  # decode: the tokens it will write are its output
            req.append_output_token_ids([req.prompt_token_ids[0]] * (req.num_computed_tokens + n - req.num_tokens))
        owner = req.request_id
        blocks = self.manager.allocate_slots(req, n, has_scheduled_reqs=bool(self.requests) and waiting)
        if blocks is None:
            raise AdmissionRejectedError(f"vLLM's allocate_slots refused {n} tokens ({self.free_blocks()} free "
                                         "blocks)", {self.full: pages}, pages * self.page_bytes_of(self.full))
        req.num_computed_tokens += n
        self._allocated[req.request_id] = self._processed(req)
        self.stats.rung_used[1] += 1
        self.stats.pages_placed += sum(len(g) for g in blocks.blocks)
        got = {self.full: pages}
        for c, gid in self.first_group.items():
            if self.kind[c] is Kind.WINDOW:  # the scheduler's count follows vLLM's (allocate_slots frees first)
                seen = len(self.owners[owner][c]) if owner in self.owners else 0
                got[c] = max(0, self._live(gid, owner) - seen)
            elif self.kind[c] is Kind.RECURRENT and first:
                got[c] = sum(1 for b in blocks.blocks[gid] if not b.is_null)  # align mode pads with null blocks
        return {c: [next(self._ids) for _ in range(k)] for c, k in got.items()}


    def _processed(self, req: Any) -> int:
        """The tokens ``remove_skipped_blocks`` counts as processed: every allocated block but the newest is full,
        plus one token in the newest (never more than the request computed, so no block vLLM keeps is freed)."""
        return max(0, req.num_computed_tokens - self.page_tokens + 1)

    def _remove_skipped(self, owner: str, processed: int) -> None:
        req = self.requests.get(owner)
        if req is not None:
            self.manager.remove_skipped_blocks(owner, processed, num_prompt_tokens=req.num_prompt_tokens)

    def _bind(self, owner: str, got: Mapping[str, list[int]]) -> None:
        held = self.owners[owner]
        for c, vids in got.items():
            held[c] += vids
            for v in vids:
                self.owner_of[v] = owner

    def _owner(self, owner: str) -> Any:
        try:
            return self.requests[owner]
        except KeyError:
            raise UnknownOwnerError(f"owner {owner!r} holds no blocks; admit it first") from None

    def extend(self, owner: str, demand: Mapping[str, int]) -> SimpleNamespace:
        req = self._owner(owner)
        got = self._allocate(req, demand.get(self.full, 0), waiting=False)
        self._bind(owner, got)
        return SimpleNamespace(pages={c: tuple(v) for c, v in got.items() if v})

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        """The pager's window trim is the moment vLLM's next ``allocate_slots`` frees out-of-window blocks
        (``remove_skipped_blocks``): run it now, or after the in-flight forward that holds the request."""
        req = self._owner(owner)
        held = self.owners[owner][cls]
        out, held[:n] = held[:n], []
        for v in out:
            del self.owner_of[v]
        if self.held[owner]:
            self._skip_when_unheld[owner] = self._processed(req)
        else:
            self._remove_skipped(owner, self._processed(req))
        return out

    def free(self, owner: str) -> list[int]:
        req = self._owner(owner)
        del self.requests[owner]
        vids = [v for vs in self.owners.pop(owner).values() for v in vs]
        for v in vids:
            del self.owner_of[v]
        self._allocated.pop(owner, None)
        self._skip_when_unheld.pop(owner, None)
        if self.held[owner]:  # _free_request_blocks with defer_block_free: the in-flight step still reads them
            self.deferred[owner] = list(self.manager.pop_blocks_for_free(req))
        else:
            self.manager.free(req)
        return vids

    # -- ledger ---------------------------------------------------------------------------------
    def acquire(self, user: str, kind: Any, vids: Sequence[int]) -> None:
        """A forward pass starts: it follows every allocation since the last one (``_after_forward``)."""
        owners = {self.owner_of[v] for v in vids if v in self.owner_of}
        self.users[user] = owners
        for o in owners:
            self.held[o] += 1
        if self._allocated:
            self._after_forward[user], self._allocated = self._allocated, {}

    def release(self, user: str) -> None:
        owners = self.users.pop(user, None)
        if owners is None:
            raise ReleaseWithoutAcquireError(f"release({user!r}): no such live ledger user")
        for o in owners:
            self.held[o] -= 1
            if not self.held[o]:
                del self.held[o]
                blocks = self.deferred.pop(o, None)
                if blocks:
                    self.manager.block_pool.free_blocks(reversed(blocks))
                if o in self._skip_when_unheld:
                    self._remove_skipped(o, self._skip_when_unheld.pop(o))
        # the step after an allocation: vLLM's allocate_slots for it starts with remove_skipped_blocks, which in
        # align mode frees the state block the previous crossing superseded (MambaManager.remove_skipped_blocks)
        for o, processed in self._after_forward.pop(user, {}).items():
            self._remove_skipped(o, processed)

    def check_invariants(self) -> None:
        """Block conservation: free + in block tables + popped for a deferred free = every block but the null one;
        no block in two tables; the window pages the scheduler sees are the window blocks vLLM holds (more only
        while a trim waits for an in-flight forward)."""
        seen: list[int] = []
        for mgr in self.manager.coordinator.single_type_managers:
            seen += [b.block_id for bs in mgr.req_to_blocks.values() for b in bs if not b.is_null]
        seen += [b.block_id for bs in self.deferred.values() for b in bs]
        if len(set(seen)) != len(seen):
            raise InvariantViolation("INV-VMAP-BIJECTIVE", "a vLLM block is in two block tables")
        if len(seen) + self.free_blocks() != self.num_blocks - 1:
            raise InvariantViolation("INV-BYTE-CONSERVATION", f"{len(seen)} used + {self.free_blocks()} free blocks "
                                     f"!= {self.num_blocks - 1}")
        for owner, held in self.owners.items():
            for c, gid in self.first_group.items():
                if self.kind[c] is not Kind.WINDOW:
                    continue
                live, mine = self._live(gid, owner), len(held[c])
                if live < mine or (live > mine and owner not in self._skip_when_unheld):
                    raise InvariantViolation("INV-VMAP-BIJECTIVE", f"{owner} holds {live} vLLM blocks of window "
                                             f"class {c!r}, the scheduler counts {mine}")
