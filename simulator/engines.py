"""The engines under test, behind one small interface.

An engine is a KV allocator the scheduler drives through the reference arena's page API. To add one,
write a builder here (``ArenaConfig -> allocator``) and register it in :data:`ENGINES`; nothing else
changes. The interface, as :class:`Engine` states it:

- ``admit(owner, demand) -> .pages``, ``extend(owner, demand) -> .pages``, ``slide(owner, cls, n)``,
  ``free(owner)``: pages per state class, by virtual id;
- ``acquire(user, kind, vids)`` / ``release(user)``: the page-use ledger (an in-flight forward pass);
- ``config``, ``capacity``, ``order`` (class names), ``stats`` (``admitted``, ``moves``,
  ``bytes_moved``, ``rung_used``), ``used_bytes()``, and either ``bands`` (the arena's) or
  ``page_bytes_of(cls)`` / ``fits(demand, reserve_pages)`` / ``occupancy()`` (a pool of its own).

Each engine also names the scheduler rules it runs under (``scheduler_overrides``): the vLLM model
frees window pages at once and keeps no mamba tracking slots.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvarena.reference.arena import Arena
from kvarena.reference.policy import POLICIES
from kvarena.reference.split import SplitPools
from kvarena.simulator.vllm_model import VllmPool
from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import UserKind


class Engine(Protocol):
    """What the scheduler model needs from an allocator."""

    config: ArenaConfig
    capacity: int
    order: list[str]
    stats: Any

    def admit(self, owner: str, demand: Mapping[str, int]) -> Any: ...
    def extend(self, owner: str, demand: Mapping[str, int]) -> Any: ...
    def slide(self, owner: str, cls: str, n: int) -> Any: ...
    def free(self, owner: str) -> Any: ...
    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None: ...
    def release(self, user: str) -> None: ...
    def used_bytes(self) -> int: ...


@dataclass(frozen=True)
class EngineKind:
    """One kind of configuration column: how to build it and what it is."""

    name: str  # "split" | "unified" | "vllm"
    implementation: str  # what the numbers come from
    build: Callable[[ArenaConfig, str], Engine]  # (config, policy) -> allocator
    scheduler_overrides: dict[str, object] = field(default_factory=dict)
    missing: Callable[[], str | None] = lambda: None  # None: can run; else the one line saying how to add it
    real: bool = False  # another engine's own code (an optional extra), not kvarena's
    unified: bool = False  # one byte arena (SGLang sizes the running cap over every byte)
    column: bool = True  # a column of `kvarena simulate --workload` (else only a row of --matrix)


def _unified(cfg: ArenaConfig, policy: str) -> Engine:
    return Arena(cfg) if policy == "default" else Arena(cfg, POLICIES[policy]())


# Unified-arena admission policies: the default is the spec's ladder; every shipped plug-in policy
# (reference/policy.py) runs as one more configuration.
UNIFIED_POLICIES: tuple[str, ...] = ("default", *(n for n in POLICIES if n != "ladder"))

def _sglang_split(cfg: ArenaConfig, _policy: str) -> Engine:
    from kvarena.simulator.sglang_real import SGLangSplit

    return SGLangSplit(cfg)


def _sglang_unified(cfg: ArenaConfig, _policy: str) -> Engine:
    from kvarena.simulator.sglang_real import SGLangUnified

    return SGLangUnified(cfg)


def _sglang_missing() -> str | None:
    from kvarena.simulator.sglang_real import missing

    return missing()


def _vllm_real(cfg: ArenaConfig, _policy: str) -> Engine:
    from kvarena.simulator.vllm_real import VllmReal

    return VllmReal(cfg)


def _vllm_missing() -> str | None:
    from kvarena.simulator.vllm_real import missing

    return missing()


# vLLM frees skipped blocks every step (remove_skipped_blocks) and has no mamba tracking slots (nor SGLang's
# radix-tree state checkpoint, nor its batch_is_full latch: vLLM's scheduler tries its waiting queue every step)
_VLLM_RULES: dict[str, object] = {"swa_eviction_interval": None, "state_slots": 1, "max_running": None,
                                  "swa_admission": False, "radix_state_slots": 0, "batch_is_full": False}

def _transformers(cfg: ArenaConfig, _policy: str) -> Engine:
    from kvarena.simulator.transformers_real import TransformersPool

    return TransformersPool(cfg)


def _transformers_missing() -> str | None:
    from kvarena.simulator.transformers_real import missing

    return missing()


ENGINES: dict[str, EngineKind] = {
    "split": EngineKind("split", "kvarena-reference (split pools)", lambda cfg, _p: SplitPools(cfg)),
    "unified": EngineKind("unified", "kvarena-reference", _unified, unified=True),
    "vllm": EngineKind("vllm", "kvarena vLLM-style model", lambda cfg, _p: VllmPool(cfg), _VLLM_RULES),
    # the real engines (optional extras): SGLang's own allocators, at SGLang's rules
    "sglang-split": EngineKind("sglang-split", "sglang-0.5.23 (split pools)", _sglang_split,
                               missing=_sglang_missing, real=True),
    "vllm-real": EngineKind("vllm-real", "vllm-0.33.0", _vllm_real, _VLLM_RULES, missing=_vllm_missing, real=True),
    "sglang-unified": EngineKind("sglang-unified", "sglang-0.5.23", _sglang_unified, missing=_sglang_missing,
                                 real=True, unified=True),
    # transformers' continuous-batching sector pool: a row of --matrix (make test installs transformers)
    "transformers": EngineKind("transformers", "transformers-5.23.0 (sector pool)", _transformers,
                               missing=_transformers_missing, real=True, column=False),
}


def smallest_capacity(build: Callable[[int], object], hint: int, precision: float = 0.01) -> int:
    """The fewest bytes (within ``precision``) for which ``build(capacity)`` constructs: every engine
    refuses a capacity that cannot hold one worst-case request (CapacityTooSmallError)."""
    from kvarena.spec.errors import CapacityTooSmallError

    def ok(n: int) -> bool:
        try:
            build(n)
        except CapacityTooSmallError:
            return False
        return True

    hi = max(hint, 1 << 20)
    while not ok(hi):
        hi *= 2
    lo = hi // 2
    while lo > (1 << 20) and ok(lo):
        hi, lo = lo, lo // 2
    while hi - lo > precision * hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
