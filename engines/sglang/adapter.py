"""kvarena's adapter protocol over SGLang 0.5.23's real unified-memory allocator, on CPU torch.

    pip install --no-deps sglang==0.5.23 msgspec==0.22.0      # msgspec: one of sglang's own dependencies
    kvarena conform --impl kvarena.engines.sglang.adapter:make --level safety --examples 200

What runs is SGLang's own code, imported from the installed wheel (never copied here):
``UnifiedKVPool`` (the one byte arena, its chain ordering, its reserved sink floor),
``MultiEndedAllocator`` (the two ENDs, lazy compaction), ``FloatMultiEndedAllocator`` (a float
middle: holes, boundary absorption, ``make_room``), their shortfall ladder ``_relieve_for_alloc``,
the float policy ``_float_open_short_side``, ``install_move_gate``, the CPU paths of the
``virtual_slot`` bind/unbind/translate kernels and the ``copy_pages`` / ``zero_pages`` page-envelope
kernels.  Every tag the harness writes lives in SGLang's own ``UnifiedKVPool._raw`` byte buffer, at
the byte its ``translate_kv_loc`` resolves; moves copy it with their ``copy_pages``.  So two bands
that overlap in bytes corrupt each other's data (INV-PAGE-ATOMIC), not just an observation.

How kvarena's model is laid onto theirs
---------------------------------------

* **Chain.**  kvarena's chain ``[low | floats | high]`` is SGLang's ``[up END | float middles | down
  END]`` (``UnifiedKVPool.__init__`` re-orders specs exactly so): toy-tri is their tri-pool
  (``init_unified_mamba_swa_pools``: mamba up, swa float, full down), toy-swa their SWA pair, toy-state
  their Mamba pair.  Peers are wired as their composites wire them (``bind_peer`` for a pair,
  ``bind_low_peer`` / ``bind_high_peer`` around floats, unified_hybrid_swa.py:1394-1397).
* **Entries.**  Token classes become ``MHASubPoolSpec`` / ``MLASubPoolSpec`` with the same rows; the
  recurrent class a ``MambaSubPoolSpec`` (conv + temporal rows), plus one padding conv stream when
  kvarena pads the entry to 32 B (SGLang keeps a mamba entry unaligned; spec/arena.md §Diff against SGLang 0.5.23).  The
  factory checks that every entry has kvarena's byte size.  The state sub-pool uses page_size 1, as
  SGLang's does.
* **Byte grid.**  SGLang anchors every sub-pool at byte 0 (as kvarena does) but reserves a sink floor
  ``[0, _reserved_floor_bytes)`` that kvarena does not have (no sink: spec/arena.md §Diff against SGLang
  0.5.23).  The adapter gives
  SGLang ``capacity + S`` bytes, ``S`` the smallest multiple of every page size that covers the floor,
  and reports their page ``p`` of class ``c`` as slot ``p - S / P_c``; the factory checks that each
  sub-pool's ``min_page_index`` is exactly ``S / P_c``, so SGLang's usable range is kvarena's
  ``[0, capacity)`` on the same page grids.
* **Virtual ids.**  Every sub-pool is its own id owner (``is_id_owner=True``, as in their Mamba pair).
  kvarena's demands per class are independent, which the SWA composites' shared id space (full mints,
  swa rebinds the same virtual page) cannot express.  kvarena's vid is ``vpage * K + class index``.
* **Owners and references** are the adapter's: SGLang's allocator has none (the radix tree's lock
  references and the scheduler own them).  A page is freed in SGLang (``free`` with its token ids)
  when its last owner lets go.
* **admit / extend.**  Per class, in SGLang's order (the state slot at request admission, then full,
  then SWA pages), the sub-pool's own ``alloc`` (which runs their shortfall ladder); if it returns
  None, the composite step of ``UnifiedMambaSWATokenToKVPoolAllocator.ensure_capacity``'s asymmetric
  branch (every member's ``flush_for_allocation``, floats first, then ``_float_open_short_side`` with the
  demand vector) and one retry.  SGLang's allocs are not transactional across sub-pools (their
  composites pre-check, then assert), and a refused ``alloc`` may already have compacted; kvarena's
  contract is that a refused call changes nothing.  So the adapter snapshots SGLang's state (allocator
  tables and byte buffer) before an admission and restores it if any sub-pool refuses, after running
  every observation check on the abandoned state: a violation there is raised, not hidden
  (:class:`SGLangStateError`).  A recurrent page's envelope is zeroed on hand-out, which in SGLang is the
  caller's job (``UnifiedMambaPool.clear_slots``); token envelopes are zeroed by SGLang's own
  ``_maybe_zero_pages`` (the adapter sets ``_zero_pages_on_alloc`` as their MHA/MLA pools would).
* **compact(max_moves)** is the scheduler's idle-time ``flush_opportunistic()`` on every member (floats
  first, then the low END, then the high END), with ``_lazy_max_moves_per_call`` (their
  ``SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL``) set to what is left of ``max_moves``.  A member is not
  flushed when nothing is left: their cap is checked after a move is taken, so a cap of 0 still moves
  one page.  The returned plan lists the moves their ``_inverse_history`` recorded.
* **relayout(demand)** is ``_float_open_short_side(float, demand vector)`` (their ``make_room``); a
  model without a non-empty float is a no-op, as in kvarena.  It never refuses: ``make_room`` reports
  an impossible ask by leaving the state unchanged (allowed at ``safety``).
* **translate / read / write** go through their ``translate_kv_loc``.  kvarena refuses an unbound id
  (``UnknownPageError``); SGLang maps it to the sink page 0.  The adapter checks its own id map first.
* **Ledger users** map onto SGLang's event and gate machinery:

  - ``FORWARD_READ`` / ``FORWARD_WRITE`` (and, conservatively, every other live user): a stand-in for
    ``torch.cuda.Event`` that fires when every user live at the time has released.  The adapter calls
    ``set_latest_forward_done_event`` with it on every member after each acquire and release
    (compaction sources go to ``_pending_reuse`` until it fires), and ``set_inflight_forward(event,
    tokens)`` with the pages of every live writer (the write set a non-urgent flush must not move; one
    forward in flight stands for all live users).
  - ``HOST_SAVE`` / ``HOST_LOAD``: ``host_transfer_move_gate`` (closed while one is live);
    ``NET_SEND`` / ``NET_RECV``: ``disagg_move_gate``; both installed with their ``install_move_gate``.
  - Waiting.  An urgent flush, ``make_room`` and an urgent pending-reuse drain *wait* on the forward
    event (``torch.cuda.current_stream().wait_event``): the schedule stream stalls until the forward
    finishes.  A synchronous trace cannot let a user finish inside another operation, so the stand-in
    stream raises :class:`WouldBlock` on an unfired event: an admission that needs it is refused
    (state restored), a relayout that needs it does nothing.
  - What SGLang's allocator cannot express: a page freed while a user still holds it.  SGLang does not
    withhold freed pages; ``free`` assumes "a freed v has no live reader" (unified_sub_pool.py:1330, :1411)
    and the scheduler (WAR barrier, radix lock references) keeps it so.  The adapter plays that caller:
    the free of a page some live user holds at its current slot is deferred (the page stays bound in
    SGLang and is reported withheld) and issued when no live user holds it any more.  What is tested of
    SGLang is what its allocator is responsible for: moves and reuse under live users.
  - Observation of the ledger: a slot in SGLang's ``_pending_reuse`` is reported withheld when a live
    user holds it and as a hole otherwise (it is free, only not yet handed out again); a slot in their
    free list ``_free_phys_pages`` is a hole, whoever holds it (that is how a violation shows).
* **Construction.**  SGLang's own bs=1 floor (``_check_bs1_feasibility_floor``, with the terms of the
  matching factory) and ``UnifiedKVPool``'s "no room past the sink" refusal become
  ``CapacityTooSmallError``.  SGLang's floor charges the window and state only (the full side is left to
  ``max_req_len``), so it accepts configurations kvarena refuses; under ``make`` the adapter also refuses
  what kvarena's floor refuses (``strict_floor``), so the harness's construction comparison is not
  exercised here.  tests/sglang measures the difference on its own (docs/sglang-findings.md).
* **Self-check.**  ``observe()`` first runs SGLang's own idle-time diagnostic
  (``_chain_byte_accounting_violations``) and raises :class:`SGLangStateError` on anything it reports.
* Lazy compaction is on (``make``): SGLang serving requires it (``handle_unified_memory_pool``), and move
  gates assert it.  ``make_eager`` builds eager ENDs; it has no protection for users (eager compaction
  runs inside ``free``), so it is for traces without users only.  ``make_forwarding_double_free`` hands a
  drop of an already-freed page to SGLang's ``free`` before refusing it (a caller with a double-free bug);
  ``SGLangArena(config, skip_zero_cap=False)`` hands ``compact(0)`` to SGLang as is.

Stubs (``sys.modules`` entries installed before the first import; the allocator path never executes them)
------------------------------------------------------------------------------------------------------

1. ``sglang`` (package): a bare package whose ``__path__`` is the installed wheel, so
   ``sglang/__init__.py`` (the ``sglang.lang`` API, HF transformers patches, IPython, pydantic, requests,
   aiohttp) never runs.  Sub-packages without an ``__init__`` (``sglang.srt``, ``srt.mem_cache``) resolve
   normally.
2. ``sglang.kernels``, ``sglang.kernels.ops``, ``sglang.kernels.ops.memory``, ``sglang.kernels.ops.kvcache``
   (packages): their ``__init__`` files build the kernel registry (platform detection, every kernel
   group).  The allocator imports the leaf modules ``virtual_slot``, ``copy_pages`` and ``zero_pages``
   directly; those load for real.
3. ``sglang.srt.utils`` (package): its ``__init__`` star-imports ``utils.common``.
4. ``sglang.srt.utils.common`` (orjson, psutil, pybase64, requests, PIL, starlette, zmq): ``is_xpu``
   (False; read by the real ``torch_memory_saver_adapter`` only when torch_memory_saver imports),
   ``get_num_new_pages`` and ``next_power_of_2`` (read only by ``alloc_extend`` / ``alloc_decode``; they
   raise if called).
5. ``sglang.srt.mem_cache.allocator`` (package): its ``__init__`` imports ``paged`` and ``token`` (triton
   kernels, ``srt.platforms``).  The stub carries the real ``BaseTokenToKVPoolAllocator`` from
   ``allocator/base.py``, which loads for real (torch only).
6. ``sglang.srt.mem_cache.allocator.paged``: ``alloc_extend_kernel`` / ``alloc_decode_kernel``, launched
   only by ``MultiEndedAllocator.alloc_extend`` / ``alloc_decode`` (page-size>1 batch paths with no CPU
   fallback); placeholders that raise if launched.
7. ``sglang.srt.mem_cache.memory_pool`` (radix attention, dp attention, quantization, transformers,
   ``tvm_ffi``): empty stand-ins for the classes ``unified_memory_pool`` subclasses (``MHATokenToKVPool``,
   ``MLATokenToKVPool``, ``MambaPool``, ``HybridLinearKVPool``, ``HybridReqToTokenPool``) or names
   (``KvBufferDesc``, ``KVWriteLoc``, ``unwrap_write_loc``, ``write_loc_is_physical``).  No Unified*Pool is
   built: the adapter's page-envelope caches stand in (they call SGLang's ``copy_pages`` / ``zero_pages``
   on the real buffer, as ``UnifiedMHATokenToKVPool.move_physical_pages`` / ``zero_physical_pages`` and
   ``UnifiedMambaPool.move_kv_cache`` do).  The one executed use, the ``isinstance`` test in
   ``MultiEndedAllocator.__init__``, is False for them either way.
8. ``sglang.srt.mem_cache.swa_memory_pool``: ``SWAKVPool``, a base class of ``UnifiedSWAKVPool`` (not built).
9. ``sglang.srt.mem_cache.kv_vmm_backing``: ``KvVmmBufferOwner`` (CUDA VMM post-capture backing; with
   ``post_capture_active=False`` it is never touched).

Executed stand-in (not a module): ``torch.cuda.current_stream``, only inside the adapter's calls into
SGLang, returns a stream whose ``wait_event`` is a no-op on a fired event and raises :class:`WouldBlock`
on an unfired one (CPU torch has no streams; see "Waiting").  Loaded for real: ``environ``, ``constants``,
``runtime_context`` (+ ``arg_groups``), ``layout.token_major``, ``layout.fused_draft``,
``allocator.base``, ``unified_memory_pool``, ``allocator.unified_sub_pool`` and the three kernel
modules; third-party: torch, triton (imported, never launched) and msgspec.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import math
import sys
import types
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvarena.conformance.adapter.protocol import Observation
from kvarena.conformance.machine.checks import (
    Geometry,
    HeldPage,
    check_band_order,
    check_conservation,
    check_ledger,
    check_no_overlap,
)
from kvarena.spec import guards
from kvarena.spec.errors import (
    AdmissionRejectedError,
    CapacityTooSmallError,
    ConfigError,
    DoubleFreeError,
    InvalidArgumentError,
    InvariantViolation,
    UnknownPageError,
)
from kvarena.spec.layout import DTYPE_BYTES, Kind, entries_per_page, entry_layout
from kvarena.spec.models import ArenaConfig, Shape, chain, worst_case_demand
from kvarena.spec.types import Mode, Move, Plan, Rung, UserKind

SGLANG_VERSION = "0.5.23"
_ALLOC_MOD = "sglang.srt.mem_cache.allocator.unified_sub_pool"
# Every sys.modules entry load_sglang() stubs (the module docstring says why each is safe).
STUBS = ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.memory", "sglang.kernels.ops.kvcache",
         "sglang.srt.utils", "sglang.srt.utils.common", "sglang.srt.mem_cache.allocator",
         "sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.memory_pool",
         "sglang.srt.mem_cache.swa_memory_pool", "sglang.srt.mem_cache.kv_vmm_backing")
_POOL_MOD = "sglang.srt.mem_cache.unified_memory_pool"
_HOST_KINDS = (UserKind.HOST_SAVE, UserKind.HOST_LOAD)  # host_transfer_move_gate
_NET_KINDS = (UserKind.NET_SEND, UserKind.NET_RECV)  # disagg_move_gate
# What the adapters of this process did (tests/sglang prints them as the run's figures).
STATS: Counter = Counter()


def _count(moves: Sequence[Move], what: str) -> None:
    STATS[what] += len(moves)
    for m in moves:
        STATS[f"{what}, {m.cls}"] += 1


class SGLangUnavailable(ImportError):
    """sglang (or msgspec) is not installed: ``pip install --no-deps sglang==0.5.23 msgspec``."""


class WouldBlock(Exception):
    """SGLang would stall the schedule stream until an in-flight forward finishes."""


class SGLangStateError(AssertionError):
    """SGLang's state broke an invariant inside a refused admission (before the adapter restored it)."""


# ---------------------------------------------------------------------------------------------
# Loading SGLang's allocator without its import chain


def _unreached(name: str) -> Any:
    def fail(*_a: Any, **_k: Any) -> Any:
        raise NotImplementedError(f"{name} is a stub of the kvarena SGLang adapter: the allocator path it "
                                  "exercises never calls it (see kvarena.engines.sglang.adapter)")
    fail.__name__ = name
    return fail


def load_sglang() -> SimpleNamespace:
    """SGLang's ``unified_memory_pool`` and ``unified_sub_pool`` modules (real), behind the stubs listed in
    this module's docstring.  Idempotent; raises :class:`SGLangUnavailable` when sglang is not installed."""
    if _ALLOC_MOD in sys.modules and _POOL_MOD in sys.modules:
        return SimpleNamespace(pool=sys.modules[_POOL_MOD], alloc=sys.modules[_ALLOC_MOD])
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):  # ValueError: sys.modules["sglang"] is None (import blocked)
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SGLangUnavailable(f"sglang is not installed: pip install --no-deps sglang=={SGLANG_VERSION}")
    if importlib.util.find_spec("msgspec") is None:
        raise SGLangUnavailable("msgspec (an sglang dependency its layout module imports) is not installed: "
                                "pip install msgspec")
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / "srt/mem_cache/allocator/unified_sub_pool.py").is_file():
        raise SGLangUnavailable(f"{root} has no srt/mem_cache/allocator/unified_sub_pool.py: install "
                                f"sglang=={SGLANG_VERSION}")
    installed: list[str] = []

    def package(name: str, rel: str) -> types.ModuleType:
        m = types.ModuleType(name, "kvarena stub: package path only, its __init__ is not run")
        m.__path__ = [str(root / rel)]
        m.__package__ = name
        sys.modules[name] = m
        installed.append(name)
        return m

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name, "kvarena stub (see kvarena.engines.sglang.adapter)")
        m.__dict__.update(attrs)
        sys.modules[name] = m
        installed.append(name)
        return m

    def stand_in(name: str) -> type:
        return type(name, (), {"__doc__": "kvarena stand-in: never instantiated by the adapter"})

    if "sglang" not in sys.modules:
        package("sglang", ".")
    for rel in ("kernels", "kernels/ops", "kernels/ops/memory", "kernels/ops/kvcache", "srt/utils",
                "srt/mem_cache/allocator"):
        name = "sglang." + rel.replace("/", ".")
        if name not in sys.modules:
            package(name, rel)
    module("sglang.srt.utils.common", is_xpu=lambda: False, get_num_new_pages=_unreached("get_num_new_pages"),
           next_power_of_2=_unreached("next_power_of_2"))
    module("sglang.srt.mem_cache.allocator.paged", alloc_extend_kernel=_unreached("alloc_extend_kernel"),
           alloc_decode_kernel=_unreached("alloc_decode_kernel"))
    module("sglang.srt.mem_cache.memory_pool",
           **{n: stand_in(n) for n in ("HybridLinearKVPool", "HybridReqToTokenPool", "KvBufferDesc", "KVWriteLoc",
                                       "MambaPool", "MHATokenToKVPool", "MLATokenToKVPool")},
           unwrap_write_loc=_unreached("unwrap_write_loc"), write_loc_is_physical=_unreached("write_loc_is_physical"))
    module("sglang.srt.mem_cache.swa_memory_pool", SWAKVPool=stand_in("SWAKVPool"))
    module("sglang.srt.mem_cache.kv_vmm_backing", KvVmmBufferOwner=stand_in("KvVmmBufferOwner"))
    try:
        base = importlib.import_module("sglang.srt.mem_cache.allocator.base")
        sys.modules["sglang.srt.mem_cache.allocator"].BaseTokenToKVPoolAllocator = base.BaseTokenToKVPoolAllocator
        pool = importlib.import_module(_POOL_MOD)
        alloc = importlib.import_module(_ALLOC_MOD)
    except ImportError as e:
        for name in installed:
            sys.modules.pop(name, None)
        raise SGLangUnavailable(f"importing SGLang's allocator failed: {e}") from e
    return SimpleNamespace(pool=pool, alloc=alloc)


# ---------------------------------------------------------------------------------------------
# Stand-ins for CUDA events and streams


class _Ledger:
    """The live ledger users (shared by every snapshot: events and gates read it)."""

    def __init__(self) -> None:
        self.live: dict[str, UserKind] = {}

    def any_of(self, kinds: Sequence[UserKind]) -> bool:
        return any(k in kinds for k in self.live.values())

    def __deepcopy__(self, memo: dict) -> _Ledger:
        return self  # one ledger for every copy of SGLang's state


class _UserEvent:
    """Stands in for the ``torch.cuda.Event`` recorded after a forward: fires once every user that was
    live when it was made has released."""

    def __init__(self, ledger: _Ledger, users: Sequence[str]) -> None:
        self.ledger = ledger
        self.users = frozenset(users)

    def query(self) -> bool:
        return not any(u in self.ledger.live for u in self.users)

    def __repr__(self) -> str:
        return f"_UserEvent({sorted(self.users)})"


class _Stream:
    def wait_event(self, event: Any) -> None:
        if event is not None and not event.query():
            raise WouldBlock(f"the schedule stream would wait for {event!r}")

    def wait_stream(self, _stream: Any) -> None:  # only with a forward_stream, which the adapter never passes
        raise WouldBlock("the schedule stream would wait for the forward stream")


_STREAM = _Stream()


@contextlib.contextmanager
def _cpu_streams() -> Iterator[None]:
    import torch

    saved = torch.cuda.current_stream
    torch.cuda.current_stream = lambda *_a, **_k: _STREAM  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_stream = saved  # type: ignore[assignment]


class _EnvelopeKV:
    """The page-move contract SGLang's allocator calls on its KV pool: whole page envelopes of one sub-pool
    copied / zeroed in the shared byte buffer with SGLang's own kernels (CPU paths)."""

    def __init__(self, pool: Any, num_pages: int, page_bytes: int, page_size: int) -> None:
        self.pool = pool
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.page_size = page_size

    def move_physical_pages(self, tgt_pages: Any, src_pages: Any, page_size: int) -> None:
        from sglang.kernels.ops.kvcache.copy_pages import copy_pages

        assert page_size == self.page_size, (page_size, self.page_size)
        copy_pages(self.pool._raw, tgt_pages, src_pages, self.num_pages, self.page_bytes)

    def zero_physical_pages(self, phys_pages: Any) -> None:
        from sglang.kernels.ops.kvcache.zero_pages import zero_pages

        zero_pages(self.pool._raw, phys_pages, self.num_pages, self.page_bytes)


# ---------------------------------------------------------------------------------------------
# Building SGLang's pools from a kvarena configuration


_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "uint8", "uint8": "uint8",
                 "int32": "int32"}


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def _spec_for(ump: Any, cls: Any, direction: str, want_entry: int) -> Any:
    """SGLang's sub-pool spec with the same rows (and entry bytes) as kvarena's class."""
    rows = list(cls.rows)
    layers = sorted({r.layer for r in rows})
    parts = {r.part for r in rows}
    if cls.kind is Kind.RECURRENT:
        conv = [r for r in rows if r.part == "conv"]
        ssm = [r for r in rows if r.part == "ssm"]
        if len(conv) != len(layers) or len(ssm) != len(layers) or len({(r.shape, r.dtype) for r in conv}) != 1 \
                or len({(r.shape, r.dtype) for r in ssm}) != 1:
            raise ConfigError(f"the SGLang adapter expresses a recurrent class as one conv and one ssm row per "
                              f"layer; {cls.name} has {sorted(parts)}")
        shapes = [tuple(conv[0].shape)]
        raw = sum(r.nbytes for r in rows)
        pad = want_entry - raw
        itemsize = DTYPE_BYTES[conv[0].dtype]
        if pad:  # kvarena pads the entry to 32 B; SGLang keeps it raw: carry the padding as a conv stream
            if pad % (len(layers) * itemsize):
                raise ConfigError(f"{cls.name}: cannot express {pad} B of entry padding as a conv stream")
            shapes.append((pad // (len(layers) * itemsize),))
        return ump.MambaSubPoolSpec(name=cls.name, layer_num=len(layers), conv_state_shapes=tuple(shapes),
                                    conv_dtype=_dtype(conv[0].dtype), temporal_state_shape=tuple(ssm[0].shape),
                                    temporal_dtype=_dtype(ssm[0].dtype), grow_direction=direction)
    if parts == {"latent"}:
        (shape, dt), = {(tuple(r.shape), r.dtype) for r in rows}
        return ump.MLASubPoolSpec(name=cls.name, layer_num=len(layers), kv_lora_rank=shape[-1] - 64,
                                  qk_rope_head_dim=64, store_dtype=_dtype(dt), grow_direction=direction)
    if parts == {"k", "v"}:
        ks = {(tuple(r.shape), r.dtype) for r in rows if r.part == "k"}
        vs = {(tuple(r.shape), r.dtype) for r in rows if r.part == "v"}
        if len(ks) == 1 and len(vs) == 1:
            (kshape, dt), = ks
            (vshape, _), = vs
            return ump.MHASubPoolSpec(name=cls.name, layer_num=len(layers), head_num=kshape[0], head_dim=kshape[1],
                                      v_head_dim=vshape[1], store_dtype=_dtype(dt), grow_direction=direction)
    raise ConfigError(f"the SGLang adapter cannot express class {cls.name} (parts {sorted(parts)}) as an SGLang "
                      "sub-pool spec")


def _floor_terms(ump: Any, config: ArenaConfig, specs: dict[str, Any]) -> list[tuple[str, int]]:
    """The bs=1 floor terms of the SGLang factory matching this chain (unified_memory_pool.py:1696-1702,
    :2214-2232, :2433-2445)."""
    ps = config.page_size
    terms = []
    window = [c for c in config.model.classes if c.kind is Kind.WINDOW]
    state = [c for c in config.model.classes if c.kind is Kind.RECURRENT]
    for w in window:
        tokens = min(config.context_len, w.window + ps)
        terms.append((f"{w.name}_window_kv", tokens * specs[w.name].entry_bytes()))
    for s in state:
        terms.append(("bs1_state_slots", 3 * specs[s.name].entry_bytes()))
    terms.append(("sink", ump._reserved_floor_bytes(list(specs.values()), ps)))
    return terms


def _strict_floor(config: ArenaConfig) -> None:
    from kvarena.reference.arena import Arena

    Arena(config)  # raises CapacityTooSmallError where kvarena's floor refuses


# ---------------------------------------------------------------------------------------------
# The adapter


@dataclass
class _User:
    kind: UserKind
    holds: tuple[tuple[int, str, int], ...]  # (vid, class, slot at acquire)


class _Short(Exception):
    def __init__(self, cls: str) -> None:
        super().__init__(cls)
        self.cls = cls


class SGLangArena:
    """kvarena's adapter protocol over SGLang's ``UnifiedKVPool`` + ``MultiEndedAllocator`` chain."""

    def __init__(self, config: ArenaConfig, *, lazy: bool = True, strict_floor: bool = True,
                 forward_double_free: bool = False, skip_zero_cap: bool = True, device: str = "cpu",
                 own_grid: bool = False) -> None:
        # device: where SGLang's byte buffer lives ("meta" for the simulator: sizes without the bytes).
        # own_grid (the simulator): SGLang gets capacity + its own sink floor (256-B aligned) and keeps its own
        # page grids (slot = page - min_page_index), instead of kvarena's grids behind an lcm-of-pages shift
        config.validate()  # kvarena's ConfigError refusals (a page size of 0, ...) come before SGLang's asserts
        sg = load_sglang()
        self.sg = sg
        ump, usp = sg.pool, sg.alloc
        self.config = config
        self.lazy = lazy
        self.forward_double_free = forward_double_free
        self.skip_zero_cap = skip_zero_cap
        self.geo = Geometry.of(config)
        self.shape = Shape.of(config)  # what the guards (spec/guards.py) read of the configuration
        classes = chain(config.model)
        self.order = [c.name for c in classes]
        self.classes = {c.name: c for c in classes}
        self.kind = {c.name: c.kind for c in classes}
        self.K = len(classes)
        self.idx = {c: i for i, c in enumerate(self.order)}
        ps = config.page_size
        self.page_size = {c.name: (1 if c.kind is Kind.RECURRENT else ps) for c in classes}
        self.entry_bytes = {c.name: entry_layout(c).entry_bytes for c in classes}
        self.row_offset = {c.name: [s.offset for s in entry_layout(c).slots] for c in classes}
        self.page_bytes = dict(self.geo.page_bytes)
        self.n_entries = {c.name: entries_per_page(c, ps) for c in classes}

        dirs = {c: ("up" if i == 0 else "down" if i == self.K - 1 else "float") for i, c in enumerate(self.order)}
        specs = {c.name: _spec_for(ump, c, dirs[c.name], self.entry_bytes[c.name]) for c in classes}
        for c, s in specs.items():
            if s.entry_bytes() != self.entry_bytes[c]:
                raise ConfigError(f"SGLang's {c} entry is {s.entry_bytes()} B, kvarena's {self.entry_bytes[c]} B")
        floor = ump._reserved_floor_bytes(list(specs.values()), ps)
        lcm = math.lcm(*self.page_bytes.values())
        self.shift_bytes = -(-floor // 256) * 256 if own_grid else -(-floor // lcm) * lcm
        self.shift = {c: self.shift_bytes // p for c, p in self.page_bytes.items()}
        total = config.capacity + self.shift_bytes
        try:
            ump._check_bs1_feasibility_floor(total_bytes=total, floor_terms=_floor_terms(ump, config, specs),
                                             factory="kvarena SGLang adapter")
        except RuntimeError as e:
            raise CapacityTooSmallError(f"SGLang's bs=1 feasibility floor refuses {total} B: {e}") from None
        if strict_floor:
            _strict_floor(config)
        try:
            self.pool = ump.UnifiedKVPool(total_bytes=total, sub_pool_specs=list(specs.values()), device=device,
                                          enable_memory_saver=False, page_size=ps)
        except RuntimeError as e:
            if "leaves no room for real data" not in str(e):
                raise
            raise CapacityTooSmallError(f"SGLang's UnifiedKVPool refuses {total} B: {e}") from None

        self.ledger = _Ledger()
        self.allocs: dict[str, Any] = {}
        for c in self.order:
            page_size = self.page_size[c]
            num_pages = self.pool.max_slots(c) // page_size
            kv = _EnvelopeKV(self.pool, num_pages, self.page_bytes[c], page_size)
            kw = dict(kvcache=kv, unified_buffer=self.pool, sub_pool_name=c, device="cpu", is_id_owner=True,
                      page_size=page_size)
            if dirs[c] == "float":
                a = usp.FloatMultiEndedAllocator(**kw)
            else:
                a = usp.MultiEndedAllocator(**kw, lazy_compaction=lazy)
            # SGLang's UnifiedMHA/MLA pools zero page envelopes on hand-out (their isinstance test in __init__)
            a._zero_pages_on_alloc = self.kind[c] is not Kind.RECURRENT
            if own_grid:
                self.shift[c] = a.min_page_index
            elif a.num_pages - self.shift[c] != self.geo.top[c] or a.min_page_index != self.shift[c]:
                raise ConfigError(f"{c}: SGLang's pages [{a.min_page_index}, {a.num_pages}) do not map onto kvarena's "
                                  f"[0, {self.geo.top[c]}) with a shift of {self.shift[c]} pages")
            self.allocs[c] = a
        chain_allocs = [self.allocs[c] for c in self.order]
        if self.K == 2:
            chain_allocs[0].bind_peer(chain_allocs[1])
            chain_allocs[1].bind_peer(chain_allocs[0])
        else:
            for lo, hi in zip(chain_allocs, chain_allocs[1:]):
                lo.bind_high_peer(hi)
                hi.bind_low_peer(lo)
        if lazy:
            usp.install_move_gate(chain_allocs, slot="host_transfer_move_gate",
                                  gate=lambda: not self.ledger.any_of(_HOST_KINDS), feature="HiCache",
                                  lazy_compaction=True)
            usp.install_move_gate(chain_allocs, slot="disagg_move_gate",
                                  gate=lambda: not self.ledger.any_of(_NET_KINDS), feature="PD disaggregation",
                                  lazy_compaction=True)

        self.owners: dict[str, dict[str, dict[int, None]]] = {}
        self.refs: Counter = Counter()
        self.bound: dict[int, None] = {}  # logically live vids
        self.users: dict[str, _User] = {}
        self.zombies: dict[int, None] = {}  # freed by their owners, free deferred while a user holds them
        self._held_memo: tuple[tuple[_User, ...], set[tuple[str, int]]] | None = None  # _held_slots' cache
        self.alloc_order = ([c for c in self.order if self.kind[c] is Kind.RECURRENT]
                            + [c for c in self.order if self.kind[c] is Kind.FULL]
                            + [c for c in self.order if self.kind[c] is Kind.WINDOW])

    # -- ids ----------------------------------------------------------------------------------
    def _vid(self, cls: str, vpage: int) -> int:
        return vpage * self.K + self.idx[cls]

    def _decode(self, vid: int) -> tuple[str, int]:
        return self.order[vid % self.K], vid // self.K

    def _tokens(self, cls: str, vpages: Sequence[int]) -> Any:
        """The token ids of virtual pages ``vpages``, page by page (one tensor op, not a Python loop)."""
        import torch

        ps = self.page_size[cls]
        v = torch.tensor(list(vpages), dtype=torch.int64)
        return v if ps == 1 else (v[:, None] * ps + torch.arange(ps, dtype=torch.int64)).reshape(-1)

    def _slot(self, vid: int) -> tuple[str, int]:
        cls, vp = self._decode(vid)
        return cls, int(self.allocs[cls].virtual_to_physical[vp]) - self.shift[cls]

    def _slots(self, vids: Sequence[int]) -> list[tuple[str, int]]:
        """``[self._slot(v) for v in vids]`` with one ``virtual_to_physical`` gather per class."""
        if len(vids) < 4:
            return [self._slot(v) for v in vids]
        import torch

        out: list[tuple[str, int]] = [("", 0)] * len(vids)
        at: dict[int, list[int]] = {}
        for i, v in enumerate(vids):
            at.setdefault(v % self.K, []).append(i)
        for ci, idx in at.items():
            cls = self.order[ci]
            sh = self.shift[cls]
            vps = torch.tensor([vids[i] // self.K for i in idx], dtype=torch.int64)
            for i, p in zip(idx, self.allocs[cls].virtual_to_physical[vps].tolist()):
                out[i] = (cls, p - sh)
        return out

    # -- what the guards ask (spec/guards.py: the reference's ordered refusals, one sequence for every side) --
    # kvarena's recurrent-state rules (spec/arena.md §INV-STATE-PRIVATE) are kept here, by the guards: SGLang's pool
    # has no owners, and its radix cache forks mamba state (fork_from / copy_from) rather than sharing a slot
    def class_of(self, vid: int) -> str | None:
        return self._decode(vid)[0] if vid in self.bound else None

    def pages_of(self, owner: object) -> Mapping[str, Mapping[int, None]] | None:
        return self.owners.get(owner)  # type: ignore[call-overload]

    def user_live(self, user: object) -> bool:
        return user in self.users

    def _check_demand(self, demand: Any) -> dict[str, int]:
        return guards.check_demand(self.shape, demand)

    def _owner(self, owner: str) -> dict[str, dict[int, None]]:
        guards.guard_free(self.shape, self, owner)
        return self.owners[owner]

    # -- admission ----------------------------------------------------------------------------
    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> SimpleNamespace:
        d, shared, _limits = guards.guard_admit(self.shape, self, owner, demand, shared, None)
        pages = self._place(d)
        held: dict[str, dict[int, None]] = {c: {} for c in self.order}
        for v in shared:
            held[self._decode(v)[0]][v] = None
            self.refs[v] += 1
        for c, vs in pages.items():
            held[c].update(dict.fromkeys(vs))
            for v in vs:
                self.refs[v] += 1
        self.owners[owner] = held
        return SimpleNamespace(pages=pages)

    def extend(self, owner: str, demand: Mapping[str, int]) -> SimpleNamespace:
        d, _limits = guards.guard_extend(self.shape, self, owner, demand, None)
        held = self.owners[owner]
        pages = self._place(d)
        for c, vs in pages.items():
            held[c].update(dict.fromkeys(vs))
            for v in vs:
                self.refs[v] += 1
        return SimpleNamespace(pages=pages)

    def _snapshot(self) -> tuple[dict[str, Any], Any]:
        memo = {id(self.pool): self.pool}
        return copy.deepcopy(self.allocs, memo), self.pool._raw.clone()

    def _restore(self, snap: tuple[dict[str, Any], Any]) -> None:
        allocs, raw = snap
        self.allocs = allocs
        self.pool._raw.copy_(raw)

    def _alloc_one(self, cls: str, n: int, rest: Mapping[str, int]) -> Any:
        a = self.allocs[cls]
        need = n * a.page_size
        ids = a.alloc(need)  # the member's own shortfall ladder (_relieve_for_alloc)
        if ids is None:
            # the composite step (ensure_capacity, asymmetric branch): flush every member, floats first,
            # then open the float's short side for the whole demand vector, and retry once
            floats = [self.allocs[c] for c in self.order[1:-1]]
            for m in [*floats, self.allocs[self.order[0]], self.allocs[self.order[-1]]]:
                m.flush_for_allocation()
            for f in floats:
                self.sg.alloc._float_open_short_side(f, {self.allocs[c]: rest.get(c, 0) for c in self.order})
            ids = a.alloc(need)
        return ids

    def _place(self, d: Mapping[str, int]) -> dict[str, list[int]]:
        if not d:
            return {}
        snap = self._snapshot()
        marks = self._history_marks()
        before = self._envelopes()
        got: dict[str, list[int]] = {}
        rest = dict(d)
        try:
            with _cpu_streams():
                for c in self.alloc_order:
                    if not rest.get(c):
                        continue
                    ids = self._alloc_one(c, rest[c], rest)
                    if ids is None:
                        raise _Short(c)
                    ps = self.page_size[c]
                    got[c] = [t // ps for t in ids[::ps].tolist()]
                    del rest[c]
            self._free_moved_zombies()
        except (_Short, WouldBlock) as e:
            why = "would stall until an in-flight forward finishes" if isinstance(e, WouldBlock) else \
                f"SGLang's {e.cls} sub-pool returned None"
            STATS["admissions refused, would wait" if isinstance(e, WouldBlock) else "admissions refused"] += 1
            _count(self._moves_since(marks), "moves undone with a refused admission")
            self._audit(f"a refused admission of {dict(d)} ({why})",
                        [self._vid(c, vp) for c, vps in got.items() for vp in vps], before)
            self._restore(snap)
            short = {c: n for c, n in d.items() if c not in got}
            raise AdmissionRejectedError(f"SGLang cannot place {dict(d)}: {why}", short,
                                         sum(n * self.page_bytes[c] for c, n in short.items())) from None
        STATS["admissions"] += 1
        _count(self._moves_since(marks), "moves in admissions")
        out: dict[str, list[int]] = {}
        for c in self.order:
            if c in got:
                out[c] = [self._vid(c, vp) for vp in got[c]]
                self.bound.update(dict.fromkeys(out[c]))
                if self.kind[c] is Kind.RECURRENT:  # the caller's UnifiedMambaPool.clear_slots (page = slot)
                    import torch

                    a = self.allocs[c]
                    a._kvcache.zero_physical_pages(a.virtual_to_physical[torch.tensor(got[c], dtype=torch.int64)])
        return out

    def _envelopes(self) -> dict[int, bytes]:
        """Every bound page's whole page envelope (its bytes in SGLang's buffer)."""
        raw = self.pool._raw
        out = {}
        for v in [*self.bound, *self.zombies]:
            c, s = self._slot(v)
            lo = (s + self.shift[c]) * self.page_bytes[c]
            out[v] = bytes(raw[lo:lo + self.page_bytes[c]].tolist()) if s >= 0 else b""
        return out

    def _audit(self, what: str, placed: Sequence[int], before: Mapping[int, bytes]) -> None:
        """Every check the harness would run, on a state the adapter is about to throw away: the observation
        invariants (``placed``: pages this admission had already allocated, live in SGLang), the holds of
        live users, and the bytes of every page that was bound before (moves must carry them)."""
        try:
            obs = self._observe(placed)
            check_no_overlap(obs, self.geo)
            check_band_order(obs, self.geo)
            check_ledger(obs, self._holds())
            check_conservation(obs, self.geo)
            after = self._envelopes()
            lost = [v for v, b in before.items() if after.get(v) != b]
            if lost:
                raise InvariantViolation("INV-PAGE-ATOMIC", f"pages {lost[:6]} do not carry their bytes")
        except InvariantViolation as e:
            raise SGLangStateError(f"SGLang's state after {what} breaks {e.inv}: {e}") from None

    def _holds(self) -> list[HeldPage]:
        out = []
        for u, x in self.users.items():
            for v, c, s in x.holds:
                out.append(HeldPage(u, x.kind.mode, c, s, self._slot(v) if v in self.bound else None))
        return out

    # -- freeing ------------------------------------------------------------------------------
    def copy_state(self, owner: str, src: int) -> int:
        """A new slot of the recurrent sub-pool from SGLang's own allocator (zeroed, as clear_slots does), then
        src's whole page envelope copied into it with SGLang's copy_pages: its radix cache's mamba fork."""
        import torch

        src, cls = guards.guard_copy_state(self.shape, self, owner, src)
        held = self.owners.get(owner)
        (vid,) = self._place({cls: 1})[cls]
        a = self.allocs[cls]
        phys = a.virtual_to_physical[torch.tensor([self._decode(vid)[1], self._decode(src)[1]], dtype=torch.int64)]
        with _cpu_streams():
            a._kvcache.move_physical_pages(phys[:1], phys[1:], a.page_size)  # copy_pages(tgt, src): src is kept
        if held is None:
            held = self.owners[owner] = {c: {} for c in self.order}
        held[cls][vid] = None
        self.refs[vid] += 1
        return vid

    def share(self, owner: str, vids: Sequence[int]) -> None:
        vids = guards.guard_share(self.shape, self, owner, vids)
        held = self.owners.get(owner)
        if held is None:
            held = {c: {} for c in self.order}
            self.owners[owner] = held
        for v in vids:
            held[self._decode(v)[0]][v] = None
            self.refs[v] += 1

    def drop(self, owner: str, vids: Sequence[int]) -> list[int]:
        try:
            vids = guards.guard_drop(self.shape, self, owner, vids)
        except DoubleFreeError:
            if self.forward_double_free:  # a caller with a double-free bug hands SGLang the ids before the refusal
                self._raw_double_free([v for v in vids if v not in self.bound and v not in self.zombies])
            raise
        held = self.owners[owner]
        for v in vids:
            del held[self._decode(v)[0]][v]
        return self._unref(vids)

    def _raw_double_free(self, vids: Sequence[int]) -> None:
        """``forward_double_free``: hand SGLang's ``free`` the token ids of pages that are already free (their
        v2p is -1), as a caller with a double-free bug would, before refusing the call."""
        for v in vids:
            if not isinstance(v, int) or v < 0:
                continue
            cls, vp = self._decode(v)
            a = self.allocs[cls]
            if a.min_page_index <= vp < a.num_virtual_ids and int(a.virtual_to_physical[vp]) == -1:
                with _cpu_streams():
                    try:
                        a.free(self._tokens(cls, [vp]))
                    except AssertionError as e:  # refused (eager ENDs; docs/sglang-fixes/01, 02): the
                        if "double-free" not in str(e):  # harness checks that the refusal changed nothing
                            raise

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        n = guards.guard_slide(self.shape, self, owner, cls, n)
        held = self.owners[owner]
        out = list(held[cls])[:n]
        for v in out:
            del held[cls][v]
        return self._unref(out)

    def free(self, owner: str) -> list[int]:
        held = self._owner(owner)
        vids = [v for c in self.order for v in held[c]]
        del self.owners[owner]
        return self._unref(vids)

    def _unref(self, vids: Sequence[int]) -> list[int]:
        freed = []
        for v in vids:
            self.refs[v] -= 1
            if self.refs[v] == 0:
                del self.refs[v]
                freed.append(v)
        for v in freed:
            del self.bound[v]
            self.zombies[v] = None
        self._free_unheld_zombies()
        STATS["frees deferred while a user holds the page"] += sum(1 for v in freed if v in self.zombies)
        return freed

    def _held_slots(self) -> set[tuple[str, int]]:
        """Every (class, slot) a live user holds; recomputed only when the live users change (a user's
        holds never change: the cache is keyed on the very ``_User`` objects, which it keeps alive)."""
        key = tuple(self.users.values())
        memo = self._held_memo
        if memo is None or len(memo[0]) != len(key) or any(a is not b for a, b in zip(memo[0], key)):
            memo = self._held_memo = (key, {(c, s) for u in key for _v, c, s in u.holds})
        return memo[1]

    def _free_unheld_zombies(self) -> None:
        """Free in SGLang every logically freed page that no live user holds at its current slot."""
        if not self.zombies:
            return
        held = self._held_slots()
        by_cls: dict[str, list[int]] = {}
        zs = list(self.zombies)
        for v, slot in zip(zs, self._slots(zs) if held else [None] * len(zs)):
            if slot not in held:
                del self.zombies[v]
                c, vp = self._decode(v)
                by_cls.setdefault(c, []).append(vp)
        marks = self._history_marks()
        with _cpu_streams():
            for c in self.order:
                if by_cls.get(c):
                    self.allocs[c].free(self._tokens(c, by_cls[c]))
        _count(self._moves_since(marks), "moves in frees (eager compaction)")

    _free_moved_zombies = _free_unheld_zombies

    # -- the ledger ---------------------------------------------------------------------------
    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None:
        vids = guards.guard_acquire(self.shape, self, user, kind, vids)
        self.users[user] = _User(kind, tuple((v, *cs) for v, cs in zip(vids, self._slots(vids))))
        self.ledger.live[user] = kind
        self._sync_events()
        STATS["users " + kind.value] += 1

    def release(self, user: str) -> None:
        guards.guard_release(self, user)
        del self.users[user]
        del self.ledger.live[user]
        self._sync_events()
        self._free_unheld_zombies()

    def _sync_events(self) -> None:
        live = list(self.users)
        ev = _UserEvent(self.ledger, live) if live else None
        writers = [u for u, x in self.users.items() if x.kind.mode is Mode.WRITE]
        wev = _UserEvent(self.ledger, writers) if writers else None
        for c, a in self.allocs.items():
            a.set_latest_forward_done_event(ev)
            pages = sorted({self._decode(v)[1] for u in writers for v, cc, _s in self.users[u].holds if cc == c})
            a.set_inflight_forward(wev, self._tokens(c, pages) if pages else None)

    # -- moves --------------------------------------------------------------------------------
    def _history_marks(self) -> dict[str, int]:
        return {c: len(a._inverse_history) for c, a in self.allocs.items()}

    def _moves_since(self, marks: Mapping[str, int]) -> tuple[Move, ...]:
        out = []
        for c in self.order:
            for src, dst, _v in self.allocs[c]._inverse_history[marks[c]:]:
                out += [Move(c, int(s) - self.shift[c], int(t) - self.shift[c])
                        for s, t in zip(src.tolist(), dst.tolist())]
        return tuple(out)

    def _plan(self, rung: Rung, moves: tuple[Move, ...]) -> Plan:
        if not moves:
            return Plan(Rung.NONE)
        return Plan(rung, moves, bytes_moved={int(rung): sum(self.page_bytes[m.cls] for m in moves)})

    def compact(self, max_moves: int | None = None) -> Plan:
        guards.guard_max_moves(max_moves)
        marks = self._history_marks()
        left = max_moves
        with _cpu_streams():
            for c in [*self.order[1:-1], self.order[0], self.order[-1]]:
                a = self.allocs[c]
                if c in self.order[1:-1]:
                    a.flush_opportunistic()  # a float only absorbs its boundary holes
                    continue
                if left == 0 and self.skip_zero_cap:
                    continue
                saved = a._lazy_max_moves_per_call
                if left is not None:
                    a._lazy_max_moves_per_call = left
                try:
                    n = a.flush_opportunistic()
                finally:
                    a._lazy_max_moves_per_call = saved
                if left is not None:
                    left -= n
        self._free_moved_zombies()
        moves = self._moves_since(marks)
        STATS["compactions"] += 1
        _count(moves, "moves in compactions")
        return self._plan(Rung.COMPACT, moves)

    def relayout(self, demand: Mapping[str, int]) -> Plan:
        d = self._check_demand(demand)
        floats = [c for c in self.order[1:-1] if not self.allocs[c]._is_frontier_transparent() or d.get(c)]
        if not floats:
            return Plan(Rung.NONE)
        marks = self._history_marks()
        vec = {self.allocs[c]: d.get(c, 0) for c in self.order}
        with _cpu_streams():
            for c in floats:
                try:
                    self.sg.alloc._float_open_short_side(self.allocs[c], vec)
                except WouldBlock:  # make_room would wait for the forward first: nothing moves
                    STATS["relayouts that would wait"] += 1
        self._free_moved_zombies()
        moves = self._moves_since(marks)
        STATS["relayouts"] += 1
        _count(moves, "moves in relayouts")
        return self._plan(Rung.RELAYOUT, moves)

    # -- data ---------------------------------------------------------------------------------
    def _row_byte(self, vid: int, entry: int, row: int) -> int:
        cls = guards.guard_row(self.shape, self, vid, entry, row, "write/read")
        vp = self._decode(vid)[1]
        import torch

        a = self.allocs[cls]
        phys = int(a.translate_kv_loc(torch.tensor([vp * a.page_size + entry], dtype=torch.int64))[0])
        return phys * self.entry_bytes[cls] + self.row_offset[cls][row]

    def write(self, vid: int, entry: int, row: int, tag: int) -> None:
        b = self._row_byte(vid, entry, row)
        guards.check_tag(tag)
        import torch

        self.pool._raw[b:b + 8].copy_(torch.tensor([tag], dtype=torch.int64).view(torch.uint8))

    def read(self, vid: int, entry: int, row: int) -> int:
        b = self._row_byte(vid, entry, row)
        import torch

        return int(self.pool._raw[b:b + 8].clone().view(torch.int64)[0])

    def translate(self, vid: int) -> tuple[str, int]:
        if vid not in self.bound:
            raise UnknownPageError(f"translate: virtual page {vid} is not bound")
        return self._slot(vid)

    def held(self, owner: str) -> dict[str, list[int]]:
        return {c: list(vs) for c, vs in self._owner(owner).items()}

    # -- observation --------------------------------------------------------------------------
    def observe(self) -> Observation:
        """kvarena's observation of SGLang's state; first runs SGLang's own idle-time diagnostic
        (``_chain_byte_accounting_violations``: per-pool conservation, capacity memos, frontier order) and
        raises :class:`SGLangStateError` on anything it reports."""
        bad = self.sg.alloc._chain_byte_accounting_violations([self.allocs[c] for c in self.order])
        if bad:
            raise SGLangStateError(f"SGLang's own byte accounting reports: {bad}")
        return self._observe(())

    def _observe(self, extra: Sequence[int]) -> Observation:
        held = self._held_slots()
        v2p = {v: self._slot(v) for v in [*self.bound, *extra]}
        spans: dict[str, tuple[int, int]] = {}
        holes: dict[str, tuple[int, ...]] = {}
        withheld: dict[str, tuple[int, ...]] = {}
        for i, c in enumerate(self.order):
            a, sh = self.allocs[c], self.shift[c]
            if i == 0:
                lo, hi = a.min_page_index, a.watermark_physical
            elif i == self.K - 1:
                lo, hi = a.watermark_physical + 1, a.num_pages
            else:
                lo, hi = a.low_wm_page, a.high_wm_page
            spans[c] = (lo - sh, hi - sh)
            free = [int(p) - sh for p in a._free_phys_pages.tolist()]
            pending = [p - sh for p in sorted(a._pending_reuse_pages_cpu)]
            zombie = [self._slot(v)[1] for v in self.zombies if self._decode(v)[0] == c]
            wh = [s for s in pending + zombie if (c, s) in held]
            holes[c] = tuple(free + [s for s in pending + zombie if (c, s) not in held])
            withheld[c] = tuple(wh)
        return Observation(dict(sorted(v2p.items())), spans, holes, withheld)

    def close(self) -> None:
        pass


def make(config: ArenaConfig) -> SGLangArena:
    """``--impl kvarena.engines.sglang.adapter:make``: lazy compaction, as SGLang serves."""
    return SGLangArena(config)


def make_eager(config: ArenaConfig) -> SGLangArena:
    """Eager ENDs (``lazy_compaction=False``): compaction inside ``free``; no protection for ledger users."""
    return SGLangArena(config, lazy=False)


def make_forwarding_double_free(config: ArenaConfig) -> SGLangArena:
    """As :func:`make`, but a drop of an already-freed page reaches SGLang's ``free`` before it is refused."""
    return SGLangArena(config, forward_double_free=True)


def worst_case_fits(config: ArenaConfig, *, lazy: bool = True) -> bool:
    """Whether SGLang's allocator, freshly built (SGLang's own floor only), places kvarena's worst-case request."""
    arena = SGLangArena(config, lazy=lazy, strict_floor=False)
    try:
        arena.admit("worst", worst_case_demand(config))
    except (AdmissionRejectedError, InvalidArgumentError):  # InvalidArgument: more bytes than the arena has
        return False
    return True
