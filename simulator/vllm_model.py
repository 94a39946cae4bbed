"""The vLLM-style peer: one block pool with a single page size (vLLM v1's hybrid KV cache manager).

How vLLM v1 lays out a hybrid model (peers-and-models.md §2.1), as modeled here:

- Layers are split into KV-cache groups of ``g`` layers each, ``g`` = the smallest layer count of any
  kind (Qwen3.5-4B: 8 attention + 24 GDN layers -> one attention group, three state groups). Every
  group has the same page size, so one page of the pool holds ``g`` layers of one group.
- Attention pages hold ``block`` tokens. With recurrent layers the block grows until one layer's state
  fits one layer's attention page (``_align_hybrid_block_size``):
  ``block = 16 * ceil(state_bytes_per_layer / (16 * attn_bytes_per_token_per_layer))``
  (Qwen3.5-4B: 2,146,304 / 4,096 = 524 -> 528 tokens). The state is padded to that page. Without
  recurrent layers the block is the arena's page size, so only the layout differs from the other two.
- A request holds ``ceil(tokens / block)`` pages per full-attention group, the pages of its window
  per window group (pages wholly outside the window return to the pool), and one page per state group.
- Pages never move: nothing to compact, no virtual ids; the waste is padding (state padded to a page,
  layer padding of the last group, whole 528-token blocks). Block 0 is vLLM's null block
  (``BlockPool.__init__``), never handed out.
- Prefix caching on (vLLM's default) puts the recurrent state in mamba cache mode "align"
  (``MambaModelConfig.verify_and_update_config``): each allocation that adds attention blocks also writes
  the state into a fresh block per state group (``MambaManager.allocate_new_blocks``); the superseded one is
  freed by the next step's ``remove_skipped_blocks``, i.e. once the forward after the allocation has run.
  A logical state page keeps its id; its physical pages change. ``prefix_caching=False`` is mode "none"
  (one state block per group for the request's life).

The class offers the page API subset the scheduler model uses (``admit / extend / slide / free /
acquire / release``), in units of *logical* pages per state class: a logical page of a class is one
page in each of its groups. A page a ledger user holds is withheld until released; a request freed while
one holds any of its pages is withheld whole (``Scheduler._free_request_blocks`` pops it with
``pop_blocks_for_free``). docs/vllm-findings.md §8 compares the model with vLLM's own manager (the same
decisions on every preset).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvarena.reference.arena import Stats
from kvarena.spec.errors import (
    AdmissionRejectedError,
    CapacityTooSmallError,
    DuplicateOwnerError,
    DuplicateUserError,
    InvalidArgumentError,
    InvariantViolation,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
    UnknownPageError,
)
from kvarena.spec.layout import Kind, entry_layout
from kvarena.spec.models import ArenaConfig, chain
from kvarena.spec.types import UserKind

KERNEL_BLOCK_ALIGN = 16  # tokens: vLLM's kernel_block_alignment_size for the attention block


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Geometry:
    """vLLM's page geometry for one model: block tokens, layers per group, groups per class."""

    block_tokens: int
    group_layers: int
    attn_bytes_per_token_layer: int
    page_bytes: int
    groups: dict[str, int]  # state class -> KV-cache groups it spans

    @staticmethod
    def of(config: ArenaConfig) -> Geometry:
        classes = config.model.classes
        layers = {c.name: len({r.layer for r in c.rows}) for c in classes}
        per_layer = {c.name: _ceil(entry_layout(c).entry_bytes, layers[c.name]) for c in classes}
        attn_unit = max(per_layer[c.name] for c in classes if c.kind is not Kind.RECURRENT)
        state = [c.name for c in classes if c.kind is Kind.RECURRENT]
        if state:
            block = KERNEL_BLOCK_ALIGN * _ceil(per_layer[state[0]], KERNEL_BLOCK_ALIGN * attn_unit)
        else:
            block = config.page_size
        g = min(layers.values())
        return Geometry(block, g, attn_unit, block * g * attn_unit, {c: _ceil(n, g) for c, n in layers.items()})


@dataclass(frozen=True)
class _Admission:
    pages: dict[str, tuple[int, ...]]


class VllmPool:
    """One pool of equal pages; the scheduler's allocator API; nothing ever moves."""

    ANCHORED_ENDS = False

    def __init__(self, config: ArenaConfig, prefix_caching: bool = True) -> None:
        config.validate()
        self.config = config
        self.capacity = config.capacity
        self.geometry = geo = Geometry.of(config)
        self.page_tokens = geo.block_tokens
        self.page_bytes = geo.page_bytes
        self.order = [c.name for c in chain(config.model)]
        self.kinds = {c.name: c.kind for c in config.model.classes}
        self.total_pages = config.capacity // geo.page_bytes - 1  # less vLLM's null block
        self._free: list[int] = list(range(self.total_pages - 1, -1, -1))  # a stack: lowest id on top
        self.state = [c.name for c in config.model.classes if c.kind is Kind.RECURRENT]
        self.align = prefix_caching and bool(self.state)
        self.state_groups = sum(geo.groups[c] for c in self.state)
        self._superseded: dict[str, list[int]] = {}  # owner -> align mode's old state pages, freed after a forward
        self._since_forward: set[str] = set()  # owners that superseded state since the last forward began
        self._after_forward: dict[str, set[str]] = {}  # ledger user -> owners whose old state its end frees
        self._live: dict[int, str] = {}  # physical page -> class
        self._withheld: set[int] = set()
        self._holds: Counter[int] = Counter()
        self.users: dict[str, tuple[int, ...]] = {}
        self.v2p: dict[int, tuple[int, ...]] = {}  # logical page -> its physical pages (one per group)
        self.owners: dict[str, dict[str, list[int]]] = {}
        self._next_vid = 0
        self._live_logical: Counter[str] = Counter()
        self.stats = Stats()
        worst = self.request_pages(config.context_len)
        if self.physical(worst) > self.total_pages:
            raise CapacityTooSmallError(
                f"the vLLM-style pool of {self.total_pages} pages of {geo.page_bytes} B cannot hold one "
                f"worst-case request of {config.context_len} tokens ({self.physical(worst)} pages); "
                "raise capacity or lower max_context_len")

    def request_pages(self, tokens: int) -> dict[str, int]:
        """Logical pages per class one request of ``tokens`` holds at most (worst_case_demand, in blocks)."""
        full = _ceil(tokens, self.page_tokens)
        out = {}
        for c in self.config.model.classes:
            if c.kind is Kind.FULL:
                out[c.name] = full
            elif c.kind is Kind.WINDOW:
                out[c.name] = min(full, _ceil(c.window, self.page_tokens) + 1)
            else:
                out[c.name] = 1
        return out

    # ---- sizes ---------------------------------------------------------------------------------

    def physical(self, demand: Mapping[str, int]) -> int:
        """Pool pages a demand of logical pages per class takes."""
        return sum(n * self.geometry.groups[c] for c, n in demand.items())

    def page_bytes_of(self, cls: str) -> int:
        return self.geometry.groups[cls] * self.page_bytes

    def padding_bytes(self, cls: str) -> int:
        """Bytes of one logical page of ``cls`` that hold nothing (state padding, layer padding)."""
        c = self.config.model.cls(cls)
        per = 1 if c.kind is Kind.RECURRENT else self.page_tokens
        return self.page_bytes_of(cls) - per * entry_layout(c).entry_bytes

    def fits(self, demand: Mapping[str, int], reserve_full_pages: int) -> bool:
        """A demand without state pages is a decode step's block crossings: in align mode each also takes a
        fresh state block per state group."""
        full = next(c for c, k in self.kinds.items() if k is Kind.FULL)
        need = self.physical(demand) + reserve_full_pages * self.geometry.groups[full]
        if self.align and not any(c in self.state for c in demand):
            need += demand.get(full, 0) * self.state_groups
        return need <= len(self._free)

    def used_bytes(self) -> int:
        return (self.total_pages - len(self._free)) * self.page_bytes

    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes()

    def occupancy(self) -> dict[str, int]:
        return {c: self._live_logical[c] * self.page_bytes_of(c) for c in self.order}

    # ---- allocation ----------------------------------------------------------------------------

    def _check_demand(self, demand: Mapping[str, int], extra: int = 0) -> dict[str, int]:
        out = {}
        for c, n in demand.items():
            if c not in self.kinds:
                raise InvalidArgumentError(f"demand names class {c!r}; use one of {self.order}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise InvalidArgumentError(f"demand for {c!r} must be an int >= 0 pages, got {n!r}")
            if n:
                out[c] = n
        need = self.physical(out) + extra
        if need > len(self._free):
            short = need - len(self._free)
            raise AdmissionRejectedError(
                f"the vLLM-style pool has {len(self._free)} free pages, {dict(out)} needs {need}; "
                "retract a request, then retry", {"pool": short}, short * self.page_bytes)
        return out

    def _take(self, demand: dict[str, int]) -> dict[str, tuple[int, ...]]:
        got: dict[str, tuple[int, ...]] = {}
        for c in self.order:
            vids = []
            for _ in range(demand.get(c, 0)):
                phys = tuple(self._free.pop() for _ in range(self.geometry.groups[c]))
                for p in phys:
                    self._live[p] = c
                vid, self._next_vid = self._next_vid, self._next_vid + 1
                self.v2p[vid] = phys
                vids.append(vid)
            if vids:
                got[c] = tuple(vids)
                self._live_logical[c] += len(vids)
        self.stats.rung_used[1] += 1
        self.stats.pages_placed += sum(len(v) for v in got.values())
        return got

    def admit(self, owner: str, demand: Mapping[str, int], shared: Sequence[int] = ()) -> _Admission:
        if owner in self.owners:
            raise DuplicateOwnerError(f"owner {owner!r} is already admitted; use extend() to grow it")
        if shared:
            raise InvalidArgumentError("the vLLM-style pool model has no prefix sharing; pass shared=()")
        got = self._take(self._check_demand(demand))
        self.owners[owner] = {c: list(got.get(c, ())) for c in self.order}
        self.stats.admitted += 1
        return _Admission(got)

    def _owner(self, owner: str) -> dict[str, list[int]]:
        try:
            return self.owners[owner]
        except KeyError:
            raise UnknownOwnerError(f"owner {owner!r} holds no pages; admit it first") from None

    def extend(self, owner: str, demand: Mapping[str, int]) -> _Admission:
        held = self._owner(owner)
        full = next(c for c, k in self.kinds.items() if k is Kind.FULL)
        moves = self.align and demand.get(full, 0) > 0 and not any(demand.get(c, 0) for c in self.state)
        states = [v for c in self.state for v in held[c]] if moves else []
        # allocate_slots first frees the state an earlier allocation superseded (remove_skipped_blocks)
        stale = [p for p in self._superseded.get(owner, ()) if not self._holds[p]] if moves else []
        got = self._take(self._check_demand(demand, sum(len(self.v2p[v]) for v in states) - len(stale)))
        if stale:
            self._drop_superseded(owner)
        for c, vs in got.items():
            held[c].extend(vs)
        for v in states:  # align mode: the state is written into fresh blocks; the old ones go after a forward
            old, cls = self.v2p[v], self._live[self.v2p[v][0]]
            new = tuple(self._free.pop() for _ in old)
            for p in new:
                self._live[p] = cls
            self.v2p[v] = new
            self._superseded.setdefault(owner, []).extend(old)
            self._since_forward.add(owner)
        return _Admission(got)

    def _drop_superseded(self, owner: str) -> None:
        for p in self._superseded.pop(owner, ()):
            del self._live[p]
            if self._holds[p]:
                self._withheld.add(p)
            else:
                self._free.append(p)

    def _release_logical(self, vids: Sequence[int]) -> None:
        for v in vids:
            phys = self.v2p.pop(v)
            self._live_logical[self._live[phys[0]]] -= 1
            for p in phys:
                del self._live[p]
                if self._holds[p]:
                    self._withheld.add(p)
                else:
                    self._free.append(p)

    def slide(self, owner: str, cls: str, n: int) -> list[int]:
        held = self._owner(owner)
        if cls not in held or not isinstance(n, int) or not 0 <= n <= len(held[cls]):
            raise InvalidArgumentError(f"slide({owner!r}, {cls!r}, {n!r}): owner holds "
                                       f"{len(held.get(cls, ()))} pages of that class")
        out = held[cls][:n]
        del held[cls][:n]
        self._release_logical(out)
        return out

    def free(self, owner: str) -> list[int]:
        held = self._owner(owner)
        del self.owners[owner]
        vids = [v for c in self.order for v in held[c]]
        # _free_request_blocks with defer_block_free: a request an in-flight forward reads is popped whole
        # (pop_blocks_for_free) and its blocks freed when that forward ends, not only the pages it reads
        mine = [p for v in vids for p in self.v2p[v]] + self._superseded.get(owner, [])
        ours = set(mine)
        for u, ps in self.users.items():
            if ours.intersection(ps):
                extra = [p for p in mine if p not in set(ps)]
                self.users[u] = (*ps, *extra)
                for p in extra:
                    self._holds[p] += 1
        self._release_logical(vids)
        self._drop_superseded(owner)
        self._since_forward.discard(owner)
        return vids

    # ---- ledger --------------------------------------------------------------------------------

    def acquire(self, user: str, kind: UserKind, vids: Sequence[int]) -> None:
        if user in self.users:
            raise DuplicateUserError(f"ledger user {user!r} is live; release it first")
        missing = [v for v in vids if v not in self.v2p]
        if missing:
            raise UnknownPageError(f"acquire({user!r}): pages {missing[:8]} are not bound")
        phys = tuple(p for v in vids for p in self.v2p[v])
        self.users[user] = phys
        for p in phys:
            self._holds[p] += 1
        if self._since_forward:
            self._after_forward[user], self._since_forward = self._since_forward, set()

    def release(self, user: str) -> None:
        phys = self.users.pop(user, None)
        if phys is None:
            raise ReleaseWithoutAcquireError(f"release({user!r}): no such live ledger user")
        for p in phys:
            self._holds[p] -= 1
            if not self._holds[p]:
                del self._holds[p]
                if p in self._withheld:
                    self._withheld.discard(p)
                    self._free.append(p)
        for o in self._after_forward.pop(user, ()):
            if o not in self._since_forward:  # superseded again since: its newer old pages wait for a later forward
                self._drop_superseded(o)

    # ---- invariants ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Page conservation and a bijective logical -> physical map (O(pool))."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise InvariantViolation("INV-VMAP-BIJECTIVE", "a page is on the free list twice")
        live = set(self._live)
        for a, b, what in ((free, live, "free and live"), (free, self._withheld, "free and withheld"),
                           (live, self._withheld, "live and withheld")):
            if a & b:
                raise InvariantViolation("INV-NO-OVERLAP", f"pages {sorted(a & b)[:8]} are {what}")
        if len(free) + len(live) + len(self._withheld) != self.total_pages:
            raise InvariantViolation("INV-BYTE-CONSERVATION",
                                     f"{len(free)} free + {len(live)} live + {len(self._withheld)} withheld "
                                     f"!= {self.total_pages} pages")
        mapped = [p for phys in self.v2p.values() for p in phys] + [p for ps in self._superseded.values() for p in ps]
        if sorted(mapped) != sorted(live):
            raise InvariantViolation("INV-VMAP-BIJECTIVE", "live pages and the logical map disagree")
        owned = sorted(v for h in self.owners.values() for vs in h.values() for v in vs)
        if owned != sorted(self.v2p):
            raise InvariantViolation("INV-VMAP-BIJECTIVE", "owned logical pages and the map disagree")
        if any(p not in live and p not in self._withheld for p in self._holds):
            raise InvariantViolation("INV-LEDGER-SAFETY", "a held page is free")
