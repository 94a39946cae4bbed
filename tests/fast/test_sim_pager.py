"""The pager's window retention (simulator/pager.py docstring): at 64-token pages, W = 128 and
SGLANG_SWA_EVICTION_INTERVAL 128 a decoding request holds 3, 4, 5 window pages in turn, always covering its
window, a page more at each end than SGLang's page-size-1 rule keeps (rules.swa_eviction_due). Each check is
shown to fail on a planted bug (the keep or the slack off by one)."""

from __future__ import annotations

from kvarena.reference.split import SplitPools
from kvarena.simulator import rules
from kvarena.simulator.budget import GiB
from kvarena.simulator.pager import Pager
from kvarena.spec.models import ArenaConfig, preset

CFG = ArenaConfig(preset("gpt-oss-20b"), 4 * GiB, max_context_len=4096)
PROMPT, W, PT = 1024, 128, 64


def _window_pages(keep: int | None = None, slack: int | None = None, crossings: int = 26) -> list[tuple[int, int]]:
    """(tokens held, window pages) after each page crossing of one decoding request."""
    pg = Pager(SplitPools(CFG), swa_eviction_interval=rules.SWA_EVICTION_INTERVAL, evict_first=True)
    assert pg.pt == PT and pg.windows == {"window": W}
    if keep is not None:
        pg.keep["window"] = keep
    if slack is not None:
        pg.slack["window"] = slack
    pg.admit(0, PROMPT)
    out = []
    for k in range(crossings):
        pg.grow_one(0)
        out.append((PROMPT + k * PT + 1, len(pg.vids[0]["window"])))  # the token that crossed into a new page
    pg.free(0)
    return out


def _sglang_page1_held(seqlen: int) -> int:
    """Window tokens SGLang holds at ``seqlen`` at page size 1 without a radix tree (evicted from 0)."""
    evicted = 0
    for s in range(PROMPT + 1, seqlen + 1):
        if rules.swa_eviction_due(s, W, evicted):
            evicted = s - 1 - W
    return seqlen - evicted


def _covers_the_window(run: list[tuple[int, int]]) -> bool:
    """The newest pages hold every token of the window: [seqlen - W, seqlen)."""
    return all((-(-s // PT) - n) * PT <= s - W for s, n in run)


def test_window_pages_cycle_three_four_five() -> None:
    run = _window_pages()
    assert [n for _, n in run[:6]] == [4, 5, 3, 4, 5, 3]
    assert {n for _, n in run} == {3, 4, 5}
    assert _covers_the_window(run)
    held = [n * PT for _, n in run[2:]]  # past the first eviction: 192, 256, 320 tokens in turn
    assert sum(held) / len(held) == 256
    # SGLang at page size 1 keeps W + 1 .. W + interval tokens (mean ~W + 64) over the decode: the pager's
    # page grid holds about one page (64 tokens) more on average, the over-holding the docstring states
    page1 = [_sglang_page1_held(s) for s in range(PROMPT + 1, run[-1][0] + 1)]
    assert (min(page1), max(page1)) == (W + 1, W + rules.SWA_EVICTION_INTERVAL)
    assert (min(held), max(held)) == (192, 320)
    assert 60 <= sum(held) / len(held) - sum(page1) / len(page1) <= 68


def test_planted_retention_bugs_are_caught() -> None:
    short = _window_pages(keep=2)  # a window of W tokens touches ceil(W / pt) + 1 pages, not ceil(W / pt)
    assert not _covers_the_window(short)
    lazy = _window_pages(slack=3)  # one page more slack than the interval: 3..6 pages
    assert {n for _, n in lazy} != {3, 4, 5}
