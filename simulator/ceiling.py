"""What the scheduler tells kvarena's arena about a new window page: the placement limit (spec §Placement limit).

The arena places by what it sees; the scheduler knows more. Every running request's final length is known
(``ignore_eos``: its output is fixed; otherwise ``max_new_tokens`` bounds it), and so is when a new window page
slides out: after ``life`` more page crossings of its owner (the pager's own arithmetic: the window's pages
plus SGLang's eviction slack). In those crossings every decoding request crosses ``life`` page boundaries too,
so while the page lives the full-attention band holds at most

    planned = sum over running requests of min(final pages, pages now + life)

unless something new is admitted. So the limit is given only while admission is blocked (the last admission
pass refused the queue head for memory, or nothing waits); a request admitted later reuses the full pages its
predecessors freed first. The arena then reuses the window band's holes below ``top - planned`` nearest that
line first: the pages that die before the full band arrives sit where it will arrive, and the ones still live
then sit below it, so rung 2 has less to move (bench/results/rung1-ceiling-2026-12-02.md: gpt-oss-20b-max
moves 0.07x of the full flush's bytes instead of 0.58x, the same decisions). Engines other than kvarena's arena
never get a limit: SGLang's and vLLM's allocators take no such hint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def window_page_life(held: int, keep: int, slack: int) -> int:
    """Crossings of its owner until a window page allocated now slides out, for an owner holding ``held``
    window pages before the crossing (``Pager.grow_one`` with ``evict_first``: the pages beyond ``keep`` go
    first once more than ``slack`` of them piled up, then the new page is appended).

    >>> [window_page_life(h, 3, 2) for h in (3, 4, 5)]  # GPT-OSS at 64-token pages: 3-5 held in turn
    [5, 4, 3]
    """
    gone = held + 1 - keep
    pages = list(range(held + 1 - (gone if gone > slack else 0)))
    mine, crossings = pages[-1], 0
    while mine in pages:
        crossings += 1
        n = len(pages) + 1 - keep
        if n > slack:
            del pages[:n]
        pages.append(-crossings)
    return crossings


def planned_full_pages(running: Iterable[tuple[int, int]], life: int) -> int:
    """The most full-attention pages the running requests hold while a page of ``life`` crossings lives:
    ``running`` gives (pages now, final pages) per request.

    >>> planned_full_pages([(10, 12), (3, 30)], 4)
    19
    """
    return sum(min(final, now + life) for now, final in running)


class PlacementLimit:
    """Per scheduler step and page life, the window class's ``below`` for kvarena's arena (bytes)."""

    def __init__(self, top_bytes: int, full_page_bytes: int, window: str) -> None:
        self.top_bytes, self.full_page_bytes, self.window = top_bytes, full_page_bytes, window
        self._cache: dict[tuple[int, int], int] = {}
        self.given = 0  # limits handed to the arena

    def below(self, step: int, life: int, running: Iterable[tuple[int, int]]) -> Mapping[str, int]:
        key = (step, life)
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) > 16:  # older steps
                self._cache.clear()
            full = planned_full_pages(running, life)
            got = self._cache[key] = max(0, self.top_bytes - full * self.full_page_bytes)
        self.given += 1
        return {self.window: got}
