"""Loading vLLM 0.33.0's v1 KV cache manager without its import chain (engines/vllm/driver.py).

    pip install --no-deps vllm==0.33.0 && pip install msgspec cbor2 regex    # what the chain needs

What loads for real, from the installed wheel: ``v1/core/kv_cache_manager.py``, ``kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``, ``block_pool.py``, ``kv_cache_utils.py``, ``kv_cache_planning.py``,
``kv_cache_config_builder.py``, ``kv_cache_metrics.py``, ``v1/kv_cache_interface.py``,
``v1/kv_cache_spec_registry.py``, ``v1/kv_cache_layout.py``, ``v1/request.py``, ``v1/metrics/stats.py``,
``v1/hisparse/layout.py`` and ``block_pool.py``, ``distributed/kv_events.py``, ``v1/attention/backends/registry.py``,
``utils/{hashing,math_utils,torch_utils,mem_utils,import_utils}``, ``envs``, ``logger``, ``platforms``
(CPU detection); third-party: torch, numpy, msgspec, cbor2, regex.

Stand-ins (``sys.modules`` entries installed before the first import).  None is executed on the paths the
adapter drives; each placeholder class raises if instantiated and each placeholder function if called:

1. ``vllm`` (package): a bare package whose ``__path__`` is the wheel, so ``vllm/__init__.py`` does not run
   ``vllm.env_override`` (imports ``torch._inductor``: ~5 s, and sets CUDA/NCCL environment variables).
2. ``vllm.distributed`` (package): its ``__init__`` imports ``communication_op`` / ``parallel_state``
   (torch.distributed process groups, NCCL communicators).  ``distributed/kv_events.py`` loads for real.
2b. ``vllm.distributed.parallel_state`` (process groups, NCCL, network utils): ``vllm.logger``'s
   ``info_once`` / ``warning_once`` ask it whether this is the first rank.  Executed: the stand-ins
   return True, as the real ones do with no world group and ``torch.distributed`` not initialized.
3. ``vllm.config``: the pydantic config classes (``VllmConfig``, ``SpeculativeConfig``).  The driven modules
   use them as annotations only; the functions that take a ``vllm_config`` get the adapter's
   :class:`StrictConfig` instead, which answers only the attributes it was given.  One function is
   executed: ``get_current_vllm_config_or_none`` returns None, as the real one does outside a
   ``set_current_vllm_config`` context (``KVCacheSpecRegistry`` then registers the built-in specs).
3b. ``vllm.v1.attention.backend`` (the attention backend ABC: quantization, model_executor, distributed):
   ``KVCacheSpec.get_block_stride_alignment`` imports ``MultipleOf`` only for an ``isinstance`` test; every
   spec here has ``block_stride_alignment=None``, so the test is False for the placeholder as for the real.
4. ``vllm.config.kv_events`` (``KVEventsConfig``) and ``vllm.config.kv_transfer`` (``hisparse_host_pool_gib``):
   pydantic; read only by the ZMQ event publisher factory and by HiSparse planning (``hisparse_config``
   is None here, so ``get_hisparse_kv_cache_groups`` returns before the call).
5. ``vllm.utils.network_utils`` (psutil, zmq, urllib3): ``get_ip`` & co. are used by the ZMQ event publisher
   only (``enable_kv_cache_events`` is off).
6. ``zmq`` (third-party, only when pyzmq is not installed): ``kv_events.py`` imports it at the top and
   names ``zmq.Socket`` in annotations of the publisher, never built.
7. ``psutil`` (third-party, only when not installed): ``utils/mem_utils.py`` reads it in GPU memory
   profiling only.
8. ``vllm.multimodal`` (package): its ``__init__`` builds the multimodal registry (PIL, media loaders).
9. ``vllm.multimodal.utils`` (``get_mm_features_in_window``) and ``vllm.multimodal.inputs``
   (``MultiModalFeatureSpec``): called / built only for requests with multimodal features (none here).
10. ``vllm.pooling_params`` / ``vllm.sampling_params`` (pydantic, tokenizers): annotations; a request
    takes the adapter's :class:`Sampling` (the five fields ``Request.__init__`` reads).
11. ``vllm.v1.engine`` (``FinishReason`` & co., msgspec structs of the engine protocol): ``request.py``
    reads four ``FinishReason`` members at import to build ``_FINISHED_REASON_MAP``, used only by
    ``get_finished_reason`` (never called); the placeholder's members are their names.
12. ``vllm.v1.kv_hints`` (``KvHintsEnvelope``): annotation.
13. ``vllm.v1.structured_output.request`` (``StructuredOutputRequest``): ``from_sampling_params`` is the
    one executed member; the stand-in returns None, as the real one does for a request without
    structured outputs (``Sampling.structured_outputs`` is None).
14. ``vllm.v1.utils`` (uvloop, usage stats, multiprocessing helpers): ``ConstantList``, the read-only view
    ``Request`` wraps its token lists in, IS executed; the stand-in is a ``Sequence`` over the wrapped list,
    as the real one is (the real one adds only ``__setitem__`` / ``copy`` helpers the manager never calls);
    ``tensor_data`` (prompt-embeds hashing) is never called.
15. ``vllm.compilation.cuda_graph`` (``CUDAGraphStat``), ``vllm.v1.metrics.perf`` (``PerfStats``),
    ``vllm.v1.spec_decode.metrics`` (``SpecDecodingStats``): prometheus; annotations of ``metrics/stats.py``.
16. ``vllm.v1.hisparse.runtime`` (CUDA host pools): imported by ``hisparse/layout.py``; HiSparse is off.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

VLLM_VERSION = "0.33.0"
# Every sys.modules entry load_vllm() may stub (the docstring says why each is never executed).
STUBS = ("vllm", "vllm.distributed", "vllm.distributed.parallel_state", "vllm.config", "vllm.v1.attention.backend",
         "vllm.config.kv_events", "vllm.config.kv_transfer",
         "vllm.utils.network_utils", "zmq", "psutil", "vllm.multimodal", "vllm.multimodal.utils",
         "vllm.multimodal.inputs", "vllm.pooling_params", "vllm.sampling_params", "vllm.v1.engine",
         "vllm.v1.kv_hints", "vllm.v1.structured_output.request", "vllm.v1.utils", "vllm.compilation.cuda_graph",
         "vllm.v1.metrics.perf", "vllm.v1.spec_decode.metrics", "vllm.v1.hisparse.runtime")
STUB_DOC = "kvarena stub"


class VLLMUnavailable(ImportError):
    """vllm (or one of msgspec, cbor2, regex) is not installed: ``make vllm``."""


class _Placeholder(type):
    """A stand-in class: subclassable and nameable (``X.MEMBER`` is the string "X.MEMBER"), never built."""

    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"

    def __call__(cls, *_a: Any, **_k: Any) -> Any:
        raise NotImplementedError(f"{cls.__name__} is a kvarena stand-in: the vLLM adapter's paths never build it")


def _cls(name: str) -> type:
    return _Placeholder(name, (), {})


def _fn(name: str) -> Callable[..., Any]:
    def fail(*_a: Any, **_k: Any) -> Any:
        raise NotImplementedError(f"{name} is a kvarena stand-in: the vLLM adapter's paths never call it")
    fail.__name__ = name
    return fail


class ConstantList(Sequence):
    """Stand-in for ``vllm.v1.utils.ConstantList``: a live read-only view of the list it wraps."""

    def __init__(self, x: list) -> None:  # no copy: the view follows the request's list
        self._x = x

    def __getitem__(self, item: Any) -> Any:
        return self._x[item]

    def __len__(self) -> int:
        return len(self._x)

    def __repr__(self) -> str:
        return f"ConstantList({self._x!r})"


class _NoStructuredOutput:
    @staticmethod
    def from_sampling_params(sampling_params: Any) -> None:
        assert getattr(sampling_params, "structured_outputs", None) is None
        return None


def _install_stubs() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise VLLMUnavailable("vllm is not installed")
    root = next(iter(spec.submodule_search_locations))

    def package(name: str) -> types.ModuleType:
        m = types.ModuleType(name, STUB_DOC)
        m.__path__ = [root + "".join("/" + p for p in name.split(".")[1:])]
        sys.modules[name] = m
        return m

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name, STUB_DOC)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    package("vllm")
    package("vllm.distributed")
    module("vllm.distributed.parallel_state", is_local_first_rank=lambda: True, is_global_first_rank=lambda: True)
    module("vllm.config", VllmConfig=_cls("VllmConfig"), SpeculativeConfig=_cls("SpeculativeConfig"),
           get_current_vllm_config_or_none=lambda: None)
    module("vllm.v1.attention.backend", MultipleOf=_cls("MultipleOf"))
    module("vllm.config.kv_events", KVEventsConfig=_cls("KVEventsConfig"))
    module("vllm.config.kv_transfer", hisparse_host_pool_gib=_fn("hisparse_host_pool_gib"))
    module("vllm.utils.network_utils", **{n: _fn(n) for n in ("get_ip", "get_tcp_uri", "is_valid_ipv6_address",
                                                             "split_zmq_path")})
    for third_party in ("zmq", "psutil"):
        if importlib.util.find_spec(third_party) is None:
            m = module(third_party)
            m.__getattr__ = lambda a, p=third_party: (_cls(f"{p}.{a}") if not a.startswith("__")
                                                     else (_ for _ in ()).throw(AttributeError(a)))
    package("vllm.multimodal")
    module("vllm.multimodal.utils", get_mm_features_in_window=_fn("get_mm_features_in_window"))
    module("vllm.multimodal.inputs", MultiModalFeatureSpec=_cls("MultiModalFeatureSpec"))
    module("vllm.pooling_params", PoolingParams=_cls("PoolingParams"))
    module("vllm.sampling_params", SamplingParams=_cls("SamplingParams"))
    module("vllm.v1.engine", **{n: _cls(n) for n in ("EngineCoreEvent", "EngineCoreEventType", "EngineCoreRequest",
                                                     "FinishReason")})
    module("vllm.v1.kv_hints", KvHintsEnvelope=_cls("KvHintsEnvelope"))
    module("vllm.v1.structured_output.request", StructuredOutputRequest=_NoStructuredOutput)
    module("vllm.v1.utils", ConstantList=ConstantList, tensor_data=_fn("tensor_data"))
    module("vllm.compilation.cuda_graph", CUDAGraphStat=_cls("CUDAGraphStat"))
    module("vllm.v1.metrics.perf", PerfStats=_cls("PerfStats"))
    module("vllm.v1.spec_decode.metrics", SpecDecodingStats=_cls("SpecDecodingStats"))
    module("vllm.v1.hisparse.runtime", ResolvedHiSparseConfig=_cls("ResolvedHiSparseConfig"),
           get_hisparse_host_block_stride=_fn("get_hisparse_host_block_stride"),
           use_shared_hisparse_host_pool=_fn("use_shared_hisparse_host_pool"))


_LOADED: types.SimpleNamespace | None = None


def load_vllm() -> types.SimpleNamespace:
    """vLLM's modules the adapter drives (imported once per process); VLLMUnavailable if missing."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    for dep in ("vllm", "msgspec", "cbor2", "regex", "torch"):
        if importlib.util.find_spec(dep) is None:
            raise VLLMUnavailable(f"{dep} is not installed")
    from importlib.metadata import version
    if version("vllm") != VLLM_VERSION:
        raise VLLMUnavailable(f"vllm {version('vllm')} is installed; the adapter is written against {VLLM_VERSION}")
    if "vllm" in sys.modules and (sys.modules["vllm"].__doc__ or "") != STUB_DOC:
        raise VLLMUnavailable("the real vllm package is already imported in this process; run the adapter alone")
    _install_stubs()
    names = {"manager": "vllm.v1.core.kv_cache_manager", "coordinator": "vllm.v1.core.kv_cache_coordinator",
             "single": "vllm.v1.core.single_type_kv_cache_manager", "pool": "vllm.v1.core.block_pool",
             "utils": "vllm.v1.core.kv_cache_utils", "planning": "vllm.v1.core.kv_cache_planning",
             "iface": "vllm.v1.kv_cache_interface", "request": "vllm.v1.request",
             "layout": "vllm.v1.kv_cache_layout", "hashing": "vllm.utils.hashing",
             "registry": "vllm.v1.attention.backends.registry"}
    _LOADED = types.SimpleNamespace(**{k: importlib.import_module(v) for k, v in names.items()})
    return _LOADED
