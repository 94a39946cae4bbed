"""A prefix (radix) cache model: shared system prompts and multi-turn sessions, as SGLang's radix cache
serves them, over any engine with ``share`` (and ``copy_state`` for recurrent state).

What a request declares (``arrivals.Arrival``): ``prefix`` / ``prefix_tokens`` (its prompt starts with
that cached context) and ``cache_as`` (cache its whole context under that key when it completes: the
next turn of its session starts with it).

- **Entries** are owners of the engine, ``cache:<key>``, holding the prefix's whole full-attention pages
  (``share``: the pages have two owners while the request runs) and, for a model with recurrent state,
  one state page copied from the request's (``copy_state``: SGLang's mamba radix cache forks the slot;
  a state page is never shared). Window-attention pages are not cached: a hit allocates its window pages
  afresh (SGLang's SWA radix cache keeps the window of a cached prefix too; not modeled).
- **A hit** (``lookup``) admits the request with the entry's full pages as ``shared`` and its state
  copied, and prefills only the rest of the prompt. The entry is locked while a request uses it.
- **Eviction**: an unlocked entry's pages are cache-only. SGLang counts evictable cache as free
  (``available_and_evictable_str``, ``evict_for_alloc``): admission and decode allocations evict least
  recently used unlocked entries until they fit, before any request is refused or retracted.
- Engines without ``share`` (the vLLM models, SGLang's split free lists) run the workload without a
  cache; their column says so (``Outcome.prefix_cache``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kvarena.spec.errors import AdmissionRejectedError, InvalidArgumentError


@dataclass
class Entry:
    owner: str
    tokens: int  # cached context, a whole number of pages
    full: list[int]  # full-attention pages (shared with the requests that hit)
    state: int | None = None  # its recurrent state page (copied into each hit)
    locks: int = 0


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    tokens_hit: int = 0
    tokens_asked: int = 0  # prefix tokens of the lookups
    inserted: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def supported(alloc) -> bool:
    """The engine can hold a prefix cache: ``share`` for token pages, ``copy_state`` if it has state."""
    from kvarena.spec.layout import Kind

    has_state = any(c.kind is Kind.RECURRENT for c in alloc.config.model.classes)
    return hasattr(alloc, "share") and (not has_state or hasattr(alloc, "copy_state"))


class PrefixCache:
    """Entries of one run, in LRU order (the first is the least recently used)."""

    def __init__(self, alloc, pager) -> None:
        self.alloc, self.pg = alloc, pager
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.stats = CacheStats()

    def peek(self, key: str, prefix_tokens: int, prompt: int) -> Entry | None:
        """The entry a prompt of ``prompt`` tokens starting with ``key``'s ``prefix_tokens`` hits (whole pages,
        at least one prompt token left to prefill), or None. Counted by :meth:`record` once admitted."""
        if not key:
            return None
        e = self.entries.get(key)
        if e is None or e.tokens > min(prefix_tokens, prompt - 1) or not e.full:
            return None
        self.entries.move_to_end(key)
        return e

    def record(self, e: Entry | None, prefix_tokens: int) -> None:
        """An admitted request's lookup: a hit on ``e`` or a miss."""
        self.stats.lookups += 1
        self.stats.tokens_asked += prefix_tokens
        if e is not None:
            self.stats.hits += 1
            self.stats.tokens_hit += e.tokens

    def lock(self, e: Entry) -> None:
        e.locks += 1

    def unlock(self, e: Entry) -> None:
        e.locks -= 1

    def insert(self, key: str, rid: int, tokens: int) -> None:
        """Cache ``rid``'s first ``tokens`` (rounded down to whole pages) under ``key`` (no-op if cached)."""
        if not key or key in self.entries:
            return
        v = self.pg.vids[rid]
        n = min(tokens // self.pg.pt, len(v[self.pg.full]))
        if n == 0:
            return
        owner = f"cache:{key}"
        pages = list(v[self.pg.full][:n])
        state = None
        if self.pg.state:
            src = v[self.pg.state[0]]
            if not src:
                return
            try:
                state = self.alloc.copy_state(owner, src[0])
            except (AdmissionRejectedError, InvalidArgumentError):
                return  # no room for the copy: not cached
        self.alloc.share(owner, pages)
        self.entries[key] = Entry(owner, n * self.pg.pt, pages, state)
        self.stats.inserted += 1

    def evict_one(self) -> bool:
        """Free the least recently used unlocked entry. False: every entry is in use (or none is left)."""
        for key, e in self.entries.items():
            if e.locks == 0:
                before = self.alloc.used_bytes()
                self.alloc.free(e.owner)
                del self.entries[key]
                self.stats.evicted += 1
                self.stats.evicted_bytes += before - self.alloc.used_bytes()
                return True
        return False

    def evict_until(self, ok: Callable[[], bool]) -> bool:
        """Evict until ``ok()`` holds (SGLang: evictable cache is free memory). Returns ``ok()``."""
        while not ok():
            if not self.evict_one():
                return False
        return True

    def drop_all(self) -> None:
        """At the end of a run: every entry freed (the engine ends empty)."""
        for e in self.entries.values():
            self.alloc.free(e.owner)
        self.entries.clear()
