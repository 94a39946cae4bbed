"""SGLang 0.5.23's real allocators as simulator engines, on CPU torch at H200 sizes.

Two engines, both SGLang's own code from the installed wheel, loaded by the conformance adapter's
``load_sglang`` (its docstring lists every ``sys.modules`` stand-in and why it never runs):

- :class:`SGLangUnified` (``--enable-unified-memory``): ``UnifiedKVPool`` with its ``MultiEndedAllocator``
  ENDs and ``FloatMultiEndedAllocator`` middles, their shortfall ladder (``_relieve_for_alloc``), lazy
  compaction and ``_float_open_short_side``, through :class:`~kvarena.engines.sglang.adapter.SGLangArena`.
  The byte buffer is on torch's **meta** device: its views and page copies (``copy_pages``) run on shapes
  only, and zeroing a page on hand-out, with no bytes to write, is skipped (:class:`_NoBytes`), so an 80 GiB
  arena costs no memory; only the allocators' index tensors (a few int64 per page) are real. The adapter's
  per-refusal audit reads page bytes, which meta has none of, so it is off here (the conformance suite runs
  it); the end-of-run check is SGLang's own ``_chain_byte_accounting_violations`` plus kvarena's observation
  checks.
- :class:`SGLangSplit` (the default, ``--swa-full-tokens-ratio`` / ``--mamba-full-memory-ratio``): one
  ``TokenToKVPoolAllocator`` per token class (allocator/token.py: what ``SWATokenToKVPoolAllocator`` builds
  for its full and SWA sides at page size 1) and a ``MambaSlotAllocator`` (allocator/mamba.py) per state
  class, sized from the split regions the ratio flags give (``reference/split.py`` ``split_regions``, which
  follows SGLang's pool sizing). ``SWATokenToKVPoolAllocator.alloc`` checks both sides' ``available_size``
  before allocating either; :meth:`SGLangSplit.admit` does the same over every class, so a refusal changes
  nothing. The pools hold token ids only (no KV buffer is built: the allocators never touch it on these paths).

Speed (our side of the calls only: every decision is SGLang's, and the ``--json`` of every preset is the
same field by field before and after): SGLang's ``with record_function(...)`` trace labels are a no-op
context here (:func:`_unlabelled`: no profiler runs; each label costs ~20 us of CPU torch); the split
pools' frees go to SGLang as one ``free`` per class with the ids in order, which its free group
concatenates exactly as it would one ``free`` per page; the adapter gathers slots and token ids with
one tensor op per call, not per page.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from kvarena.engines.sglang.adapter import SGLangArena, WouldBlock, load_sglang
from kvarena.reference.arena import Stats
from kvarena.spec.errors import (
    AdmissionRejectedError,
    CapacityTooSmallError,
    DuplicateOwnerError,
    InvalidArgumentError,
    InvariantViolation,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
)
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig, chain, worst_case_demand
from kvarena.spec.pools import split_regions
from kvarena.spec.types import UserKind


def _unlabelled(sg: Any) -> None:
    """SGLang's allocator modules label their calls with ``torch.profiler.record_function`` for a profiler
    trace; with no profiler running a label does nothing but costs ~20 us on CPU torch, several per page
    operation. The simulator swaps the name for ``contextlib.nullcontext`` in those modules (process-wide:
    with no profiler, either behaves the same)."""
    for m in (sg.pool, sg.alloc):
        if getattr(m, "record_function", None) is not contextlib.nullcontext:
            m.record_function = contextlib.nullcontext


def missing() -> str | None:
    """None when SGLang's allocators load; else the one line saying how to add them."""
    from kvarena.engines.sglang.adapter import SGLangUnavailable

    try:
        load_sglang()
    except SGLangUnavailable as e:
        return f"{e} (then the sglang-0.5.23 columns run)"
    return None


class _WaitingStream:
    """``torch.cuda.current_stream()`` inside the engine's calls into SGLang: where SGLang waits on the
    in-flight forward's event (an urgent flush, ``make_room``, an urgent pending-reuse drain), the schedule
    stream stalls until that forward finishes. The engine models exactly that: the forward completes there
    (its ledger users are released: the event fires) and SGLang goes on, as on a GPU."""

    def __init__(self, engine: SGLangUnified) -> None:
        self.engine = engine

    def wait_event(self, event: Any) -> None:
        if event is not None and not event.query():
            self.engine._forward_finishes()

    def wait_stream(self, _stream: Any) -> None:
        self.engine._forward_finishes()


class _NoBytes:
    """The KV pool side of a sub-pool whose byte buffer is on ``meta`` (what SGLang's allocator calls as
    ``_kvcache``): page copies still go through SGLang's ``copy_pages`` (shapes only), and zeroing a page
    envelope on hand-out, which has no bytes to write here, is skipped (SGLang's ``zero_pages`` on meta
    would only build index tensors, ~30 us a call on every allocation)."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv

    def move_physical_pages(self, tgt_pages: Any, src_pages: Any, page_size: int) -> None:
        self.kv.move_physical_pages(tgt_pages, src_pages, page_size)

    def zero_physical_pages(self, _phys_pages: Any) -> None:
        pass


class SGLangUnified(SGLangArena):
    """SGLang's unified allocator behind the simulator's engine interface (byte buffer on ``meta``)."""

    ALIGN = 256  # SGLang views its byte buffer as bf16 / fp32 rows: the buffer length must divide evenly

    def __init__(self, config: ArenaConfig) -> None:
        # at most 255 B fewer than the other columns get (at most one page less per class)
        config = replace(config, capacity=config.capacity // self.ALIGN * self.ALIGN)
        super().__init__(config, device="meta", own_grid=True)
        _unlabelled(self.sg)
        for a in self.allocs.values():
            a._kvcache = _NoBytes(a._kvcache)
        self.capacity = config.capacity
        self.stats = Stats()
        self._role = {c: (2 if i in (0, self.K - 1) else 3) for i, c in enumerate(self.order)}
        self._used: Counter[str] = Counter()  # pages bound or freed-but-deferred, per class
        self._finished: set[str] = set()  # ledger users whose forward finished inside an SGLang wait
        self.forward_waits = 0
        self._stream = _WaitingStream(self)
        for a in self.allocs.values():  # frees batched per step, as SGLang's scheduler groups them
            a.free_group_begin()

    def _flush_frees(self) -> None:
        """Apply the frees queued since the last allocation (SGLang's ``_flush_deferred_free_group``:
        ``free_group_end`` then ``free_group_begin``); each free's order in the free list is unchanged."""
        with self._streams():
            for a in self.allocs.values():
                if a.free_group:
                    a.free_group_end()
                    a.free_group_begin()

    # -- the engine interface -------------------------------------------------------------------
    def page_bytes_of(self, cls: str) -> int:
        return self.page_bytes[cls]

    def used_bytes(self) -> int:
        return sum(n * self.page_bytes[c] for c, n in self._used.items())

    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes()

    def occupancy(self) -> dict[str, int]:
        n = Counter(self._decode(v)[0] for v in self.bound)
        return {c: n[c] * self.page_bytes[c] for c in self.order}

    @contextlib.contextmanager
    def _streams(self) -> Iterator[None]:
        import torch

        saved = torch.cuda.current_stream
        torch.cuda.current_stream = lambda *_a, **_k: self._stream  # type: ignore[assignment]
        try:
            yield
        finally:
            torch.cuda.current_stream = saved  # type: ignore[assignment]

    def _forward_finishes(self) -> None:
        """SGLang waited on the forward: every live ledger user is done (its event fires). The scheduler's
        later ``release`` of such a user is a no-op; deferred frees go out once SGLang's call returns."""
        self.forward_waits += 1
        for u in list(self.users):
            del self.users[u]
            del self.ledger.live[u]
            self._finished.add(u)

    def release(self, user: str) -> None:
        if user in self._finished:
            self._finished.discard(user)
            return
        super().release(user)

    def _place(self, d: Mapping[str, int]) -> dict[str, list[int]]:
        """The adapter's placement (state slot, then full, then window pages, each class through its
        sub-pool's ``alloc`` and the composite's flush-and-make-room retry) without its snapshot: a refusal
        frees what this call had allocated, as SGLang's own callers do; moves it made stay made."""
        if not d:
            return {}
        self._flush_frees()
        marks = self._history_marks()
        got: dict[str, list[int]] = {}
        rest = dict(d)
        short = None
        with self._streams():
            for c in self.alloc_order:
                if not rest.get(c):
                    continue
                ids = self._alloc_one(c, rest[c], rest)
                if ids is None:
                    short = c
                    break
                ps = self.page_size[c]
                got[c] = [int(t) // ps for t in ids.tolist()[::ps]]
                del rest[c]
            if short is not None:
                for c, vps in got.items():
                    self.allocs[c].free(self._tokens(c, vps))
            if self._finished:
                self._sync_events()
        self._free_moved_zombies()
        for m in self._moves_since(marks):  # END pages: lazy compaction (rung 2); float pages: make_room (rung 3)
            r = self._role[m.cls]
            self.stats.moves[r] += 1
            self.stats.bytes_moved[r] += self.page_bytes[m.cls]
        if short is not None:
            need = {c: n for c, n in d.items() if c not in got}
            raise AdmissionRejectedError(f"SGLang's {short} sub-pool returned None for {dict(d)}", need,
                                         sum(n * self.page_bytes[c] for c, n in need.items()))
        self.stats.pages_placed += sum(d.values())
        self.stats.rung_used[1] += 1
        out: dict[str, list[int]] = {}
        for c in self.order:
            if c in got:
                out[c] = [self._vid(c, vp) for vp in got[c]]
                self.bound.update(dict.fromkeys(out[c]))
                self._used[c] += len(out[c])
                if self.kind[c] is Kind.RECURRENT:  # the caller's UnifiedMambaPool.clear_slots (page = slot)
                    import torch

                    a = self.allocs[c]
                    a._kvcache.zero_physical_pages(a.virtual_to_physical[torch.tensor(got[c], dtype=torch.int64)])
        return out

    def _free_unheld_zombies(self) -> None:
        before = list(self.zombies)
        super()._free_unheld_zombies()
        for v in before:
            if v not in self.zombies:
                self._used[self._decode(v)[0]] -= 1

    _free_moved_zombies = _free_unheld_zombies

    def flush_idle(self, budget_bytes: int) -> None:
        """SGLang's own idle-time flush (the scheduler's ``on_idle`` -> ``flush_opportunistic`` on every member,
        under SGLang's own move cap ``SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL``; ``budget_bytes`` is kvarena's
        knob and is not SGLang's, so it is not applied)."""
        self._flush_frees()
        marks = self._history_marks()
        try:
            self.compact(None)
        except WouldBlock:
            return
        for m in self._moves_since(marks):
            r = self._role[m.cls]
            self.stats.moves[r] += 1
            self.stats.bytes_moved[r] += self.page_bytes[m.cls]

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> Any:
        got = super().admit(owner, demand, shared)
        self.stats.admitted += 1
        return got

    def check_invariants(self) -> None:
        """SGLang's own byte accounting (``_chain_byte_accounting_violations``: per-pool conservation,
        capacity memos, frontier order), then that every page it handed out is counted here. kvarena's
        observation checks need kvarena's page grids, which ``own_grid`` gives up (the conformance suite
        runs them on the adapter's shifted grids)."""
        self._flush_frees()
        bad = self.sg.alloc._chain_byte_accounting_violations([self.allocs[c] for c in self.order])
        if bad:
            raise InvariantViolation("INV-BYTE-CONSERVATION", f"SGLang's own byte accounting reports: {bad}")
        used = Counter(self._decode(v)[0] for v in [*self.bound, *self.zombies])
        if +used != +self._used:
            raise InvariantViolation("INV-BYTE-CONSERVATION", f"pages in use {dict(used)} != counted {self._used}")


class SGLangSplit:
    """SGLang's split pools: a real free-list allocator per class, over the split regions' sizes."""

    ANCHORED_ENDS = False

    def __init__(self, config: ArenaConfig) -> None:
        config.validate()
        load_sglang()  # installs the stand-ins allocator/token.py's package needs
        import importlib

        import torch

        token = importlib.import_module("sglang.srt.mem_cache.allocator.token")
        mamba = importlib.import_module("sglang.srt.mem_cache.allocator.mamba")
        self.torch = torch
        self.config = config
        self.capacity = config.capacity
        self.order = [c.name for c in chain(config.model)]
        self.kind = {c.name: c.kind for c in config.model.classes}
        self.stats = Stats()
        # one id per kvarena page: PagedTokenToKVPoolAllocator keeps this same free list of page ids (its
        # module's triton kernels are stand-ins here, so its token-granular base class holds the page ids)
        self._full = next(c for c, k in self.kind.items() if k is Kind.FULL)
        regions = split_regions(config)
        self.slots = {c: (hi - lo) // config.page_bytes(c) for c, (lo, hi) in regions.items()}
        self._pb = {c: config.page_bytes(c) for c in self.order}
        worst = worst_case_demand(config)
        short = {c: n for c, n in worst.items() if n > self.slots[c]}
        if short:
            raise CapacityTooSmallError(f"SGLang's split pools ({self.slots} pages) cannot hold one worst-case "
                                        f"request ({dict(worst)}); raise capacity or change the ratio flags")
        self.allocs: dict[str, Any] = {}
        for c in self.order:
            if self.kind[c] is Kind.RECURRENT:
                self.allocs[c] = mamba.MambaSlotAllocator(self.slots[c], "cpu")
            else:
                self.allocs[c] = token.TokenToKVPoolAllocator(self.slots[c], torch.int64, "cpu",
                                                              None, need_sort=False)
                self.allocs[c].free_group_begin()  # frees batched per step, as SGLang's scheduler groups them
        self.owners: dict[str, dict[str, list[int]]] = {}
        self.pages: dict[int, int] = {}  # vid -> the token id (or slot) SGLang handed out (one per page)
        self.cls_of: dict[int, str] = {}
        self.holds: Counter[int] = Counter()
        self.users: dict[str, tuple[int, ...]] = {}
        self.withheld: dict[int, None] = {}
        self._next = 0
        self._live = Counter()

    # -- sizes ----------------------------------------------------------------------------------
    def page_bytes_of(self, cls: str) -> int:
        return self._pb[cls]

    def _flush_frees(self) -> None:
        for c in self.order:
            a = self.allocs[c]
            if self.kind[c] is not Kind.RECURRENT and a.free_group:
                a.free_group_end()
                a.free_group_begin()

    def _free_pages(self, c: str) -> int:
        """Free pages of ``c`` once the queued frees are applied (call :meth:`_flush_frees` first)."""
        return self.allocs[c].available_size()

    def fits(self, demand: Mapping[str, int], reserve_full_pages: int) -> bool:
        self._flush_frees()
        return all(demand.get(c, 0) + (reserve_full_pages if c == self._full else 0) <= self._free_pages(c)
                   for c in self.order)

    def used_bytes(self) -> int:
        return sum((self._live[c]) * self._pb[c] for c in self.order) + \
            sum(self._pb[self.cls_of[v]] for v in self.withheld)

    def occupancy(self) -> dict[str, int]:
        return {c: self._live[c] * self._pb[c] for c in self.order}

    # -- allocation -----------------------------------------------------------------------------
    def _take(self, demand: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        d = {}
        for c, n in demand.items():
            if c not in self.allocs:
                raise InvalidArgumentError(f"demand names class {c!r}; use one of {self.order}")
            if n:
                d[c] = n
        self._flush_frees()
        short = {c: n - free for c, n in d.items() if n > (free := self._free_pages(c))}
        if short:  # SWATokenToKVPoolAllocator.alloc: every side's available_size first, then allocate
            raise AdmissionRejectedError(f"SGLang's split pools cannot place {d}: short {short}", short,
                                         sum(n * self._pb[c] for c, n in short.items()))
        got: dict[str, tuple[int, ...]] = {}
        for c in self.order:
            if c not in d:
                continue
            ids = self.allocs[c].alloc(d[c])
            assert ids is not None, (c, d)
            vids = range(self._next, self._next + d[c])
            self._next += d[c]
            self.pages.update(zip(vids, ids.tolist()))
            self.cls_of.update(dict.fromkeys(vids, c))
            self._live[c] += d[c]
            got[c] = tuple(vids)
        self.stats.rung_used[1] += 1
        self.stats.pages_placed += sum(d.values())
        return got

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> SimpleNamespace:
        if owner in self.owners:
            raise DuplicateOwnerError(f"owner {owner!r} is already admitted")
        if shared:
            raise InvalidArgumentError("SGLang's split pools engine has no prefix sharing here; pass shared=()")
        got = self._take(demand)
        self.owners[owner] = {c: list(got.get(c, ())) for c in self.order}
        self.stats.admitted += 1
        return SimpleNamespace(pages=got)

    def _owner(self, owner: str) -> dict[str, list[int]]:
        try:
            return self.owners[owner]
        except KeyError:
            raise UnknownOwnerError(f"owner {owner!r} holds no pages; admit it first") from None

    def extend(self, owner: str, demand: Mapping[str, int]) -> SimpleNamespace:
        held = self._owner(owner)
        got = self._take(demand)
        for c, vs in got.items():
            held[c].extend(vs)
        return SimpleNamespace(pages=got)

    def _release(self, vids: Sequence[int]) -> None:
        back = []
        for v in vids:
            c = self.cls_of[v]
            self._live[c] -= 1
            if self.holds[v]:
                self.withheld[v] = None  # an in-flight forward still reads it: freed at its release
            else:
                back.append(v)
        self._give_back(back)

    def _give_back(self, vids: Sequence[int]) -> None:
        """Free ``vids`` in SGLang: one ``free`` per class with their ids in this order, which appends to the
        free list exactly what one ``free`` per page would (a free group concatenates its frees in order)."""
        by_cls: dict[str, list[int]] = {}
        for v in vids:
            by_cls.setdefault(self.cls_of.pop(v), []).append(self.pages.pop(v))
        for c, ids in by_cls.items():
            self.allocs[c].free(self.torch.tensor(ids, dtype=self.torch.int64))

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        held = self._owner(owner)
        if cls not in held or not 0 <= n <= len(held[cls]):
            raise InvalidArgumentError(f"slide({owner!r}, {cls!r}, {n!r}): owner holds {len(held.get(cls, ()))}")
        out = held[cls][:n]
        del held[cls][:n]
        self._release(out)
        return out

    def free(self, owner: str) -> list[int]:
        held = self._owner(owner)
        del self.owners[owner]
        vids = [v for c in self.order for v in held[c]]
        self._release(vids)
        return vids

    # -- ledger ---------------------------------------------------------------------------------
    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None:
        self.users[user] = tuple(vids)
        for v in vids:
            self.holds[v] += 1

    def release(self, user: str) -> None:
        vids = self.users.pop(user, None)
        if vids is None:
            raise ReleaseWithoutAcquireError(f"release({user!r}): no such live ledger user")
        back = []
        for v in vids:
            self.holds[v] -= 1
            if not self.holds[v]:
                del self.holds[v]
                if v in self.withheld:
                    del self.withheld[v]
                    back.append(v)
        self._give_back(back)

    def check_invariants(self) -> None:
        """Every slot is free in SGLang's allocator or held by exactly one page, never both."""
        self._flush_frees()
        for c in self.order:
            a = self.allocs[c]
            free = (a.free_slots if self.kind[c] is Kind.RECURRENT
                    else self.torch.cat([a.free_pages, a.release_pages])).tolist()
            held = [self.pages[v] for v, cc in self.cls_of.items() if cc == c]
            every = free + held
            if len(set(every)) != len(every):
                raise InvariantViolation("INV-VMAP-BIJECTIVE", f"{c}: a slot is both free and held, or held twice")
            if len(every) != self.slots[c]:
                raise InvariantViolation("INV-BYTE-CONSERVATION",
                                         f"{c}: {len(free)} free + {len(held)} held != {self.slots[c]}")
