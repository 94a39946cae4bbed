"""A real model on the arena: ``model.generate`` with ``ArenaCache`` gives the default cache's greedy tokens.

Seven hybrid families (tiny random-weight configs built in code), a batch of 3 with left padding and different
prompt lengths, page size 4 so windows slide and holes form; between decode steps a ``LogitsProcessor`` plays the
rest of an engine: it frees the request it admitted one step before and compacts the arena (rung 2 moves the
rows' live pages into the holes), then admits another. Equal tokens after those moves are
INV-CONTENT-FOLLOWS-VID checked through a real forward pass; the planted bugs at the end show the check can fail.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytestmark = [pytest.mark.transformers]

import torch  # noqa: E402
from transformers import LogitsProcessor, LogitsProcessorList  # noqa: E402

from kvarena.engines.transformers.cache import ArenaCache, CacheFullError  # noqa: E402
from kvarena.engines.transformers.tiny import FAMILIES, tiny_model  # noqa: E402
from kvarena.spec.errors import InvalidArgumentError  # noqa: E402

CAPACITY = 1 << 20
NEW_TOKENS = 14


class Churn(LogitsProcessor):
    """Between steps: free last step's other request, compact, admit a new one (pages interleave with the rows')."""

    def __init__(self, cache: ArenaCache) -> None:
        self.cache, self.step, self.moves, self.other = cache, 0, 0, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        arena = self.cache.arena
        if self.other is not None:
            arena.free(self.other)
        self.moves += len(arena.compact().moves)
        self.step += 1
        self.other = f"other{self.step}"
        arena.admit(self.other, {c: (1 if c == "state" else 2) for c in arena.order})
        return scores


def prompts(batch: int = 3, length: int = 11, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 120, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for b in range(1, batch):  # left padding: rows of different prompt lengths
        mask[b, : 3 * b] = 0
    return ids, mask


def generate(model: object, cache: object = None, processors: list | None = None, **kw: object) -> torch.Tensor:
    ids, mask = prompts()
    extra = {"past_key_values": cache} if cache is not None else {}
    return model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                          logits_processor=LogitsProcessorList(processors or []), **extra, **kw)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[str, object, torch.Tensor]:
    model = tiny_model(request.param)
    return request.param, model, generate(model)


def test_tokens_identical_with_moves_between_steps(family: tuple[str, object, torch.Tensor]) -> None:
    name, model, expected = family
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    churn = Churn(cache)
    out = generate(model, cache, [churn])
    assert torch.equal(out, expected), f"{name}: tokens differ from the default cache's"
    assert churn.moves > 0, f"{name}: no live page moved between steps; the check would prove nothing"
    arena = cache.arena
    arena.free(churn.other)
    cache.release()
    assert arena.used_bytes() == 0 and not arena.owners.rows, f"{name}: pages left after release()"


def test_tokens_identical_without_moves(family: tuple[str, object, torch.Tensor]) -> None:
    name, model, expected = family
    with ArenaCache(model.config, capacity=CAPACITY, page_size=8, max_context_len=64) as cache:
        assert torch.equal(generate(model, cache), expected), name
        arena = cache.arena
    assert arena.used_bytes() == 0


class Look(LogitsProcessor):
    """Records the pages row 0 holds per class at every step."""

    def __init__(self, cache: ArenaCache) -> None:
        self.cache, self.seen = cache, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.seen.append({c: len(p) for c, p in self.cache.arena.held("row0").items()})
        return scores


@pytest.mark.parametrize(("fam", "classes"), [("gpt_oss", {"full", "window"}), ("qwen3_5", {"full", "state"})])
def test_every_class_holds_pages_while_generating(fam: str, classes: set[str]) -> None:
    """The layout is used, not bypassed: full, window and state pages are held by each row mid-generation."""
    model = tiny_model(fam)
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    look = Look(cache)
    generate(model, cache, [look])
    assert all(set(s) == classes for s in look.seen), (fam, look.seen)
    if "window" in classes:  # window pages slide: a row never holds more than the window needs
        assert max(s["window"] for s in look.seen) <= 8 // 4 + 1
        assert max(s["full"] for s in look.seen) > 8 // 4 + 1
    else:
        assert all(s["state"] == 1 for s in look.seen)
    cache.release()


def test_beam_search_identical() -> None:
    model = tiny_model("gpt_oss")
    expected = generate(model, num_beams=2)
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    assert torch.equal(generate(model, cache, [Churn(cache)], num_beams=2), expected)


def test_too_small_a_capacity_is_a_typed_error_that_leaves_nothing() -> None:
    model = tiny_model("qwen3_5")
    cache = ArenaCache(model.config, capacity=40_000, page_size=4, max_context_len=16)
    with pytest.raises(CacheFullError, match="raise capacity="):
        generate(model, cache)
    before = cache.arena.used_bytes()
    cache.release()
    assert cache.arena.used_bytes() == 0 and before >= 0


def test_crop_and_repeat_are_refused_with_the_fix() -> None:
    model = tiny_model("gemma3")
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    generate(model, cache)
    with pytest.raises(InvalidArgumentError, match="default cache for assisted decoding"):
        cache.crop(-2)
    with pytest.raises(InvalidArgumentError, match="expand the inputs"):
        cache.batch_repeat_interleave(2)
    cache.crop(0)
    cache.release()


def test_a_second_batch_needs_release() -> None:
    model = tiny_model("gpt_oss")
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    first = generate(model, cache)
    with pytest.raises(InvalidArgumentError, match="release"):
        model(torch.ones(2, 1, dtype=torch.long), past_key_values=cache)  # 2 rows where the cache holds 3
    cache.release()
    assert torch.equal(generate(model, cache), first)  # reused from empty: the same tokens


# ---- the check can fail: planted bugs in the cache, each caught by token identity ------------------------------

def _stale_translation(self: ArenaCache, tc: object, lo: int, hi: int) -> torch.Tensor:
    """Bug: each token's physical entry is translated once, when first seen, and kept (as if pages never moved)."""
    known = self.__dict__.setdefault("_stale", {})
    start, phys = known.get(tc.name, (lo, None))
    end = start + (0 if phys is None else phys.shape[1])
    if lo < start or phys is None:
        start, phys, end = lo, ORIGINAL_ENTRIES(self, tc, lo, hi), hi
    elif hi > end:
        phys = torch.cat([phys, ORIGINAL_ENTRIES(self, tc, end, hi)], dim=1)
    known[tc.name] = (start, phys)
    return phys[:, lo - start:hi - start]


def _no_write_back(self: ArenaCache) -> None:
    """Bug: state handed out to the model is never written back (in-place decode updates are lost)."""


ORIGINAL_ENTRIES = ArenaCache.entries
MUTANTS = {"stale-translation": ("entries", _stale_translation, "gpt_oss"),
           "no-state-write-back": ("flush", _no_write_back, "qwen3_5")}


@pytest.mark.quality
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_planted_bug_changes_the_tokens(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    attr, bug, fam = MUTANTS[mutant]
    model = tiny_model(fam)
    expected = generate(model)
    monkeypatch.setattr(ArenaCache, attr, bug)
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    try:
        out = generate(model, cache, [Churn(cache)])
    except Exception:  # a crash is a kill too
        return
    assert not torch.equal(out, expected), f"{mutant} survived: token identity does not see it"


def test_readme_example_runs_as_pasted() -> None:
    """README.md §Run a model on the arena: its Python block, verbatim (it asserts the tokens itself)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = text.split("## Run a model on the arena", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


@pytest.mark.parametrize("fam", ["gpt_oss", "gemma3"])
def test_batch_select_indices_keeps_the_selected_rows_content(fam: str) -> None:
    """Rows 2 and 0 kept (in that order), row 1's pages freed; the next forward equals the default cache's."""
    from transformers import DynamicCache

    model = tiny_model(fam)
    ids, mask = prompts()
    ref, cache = DynamicCache(config=model.config), ArenaCache(model.config, capacity=CAPACITY, page_size=4,
                                                               max_context_len=64)
    for c in (ref, cache):
        model(ids, attention_mask=mask, past_key_values=c)
    before = cache.arena.used_bytes()
    keep = torch.tensor([2, 0])
    for c in (ref, cache):
        c.batch_select_indices(keep)
    assert cache.arena.used_bytes() < before and "row1" not in cache.arena.owners.rows
    nxt = torch.tensor([[5], [7]])
    m2 = torch.cat([mask[keep], torch.ones(2, 1, dtype=mask.dtype)], dim=1)
    want = model(nxt, attention_mask=m2, past_key_values=ref).logits
    got = model(nxt, attention_mask=m2, past_key_values=cache).logits
    assert torch.equal(got, want)
    cache.release()
    assert cache.arena.used_bytes() == 0


def test_batch_select_indices_keeps_the_selected_rows_state() -> None:
    """Recurrent state follows the selected rows (transformers' own LinearAttentionLayer has no
    batch_select_indices, so the default cache cannot be the oracle here)."""
    model = tiny_model("qwen3_5")
    ids, mask = prompts()
    cache = ArenaCache(model.config, capacity=CAPACITY, page_size=4, max_context_len=64)
    model(ids, attention_mask=mask, past_key_values=cache)
    keep = torch.tensor([2, 0])
    before = {(i, p): getattr(cache, f"get_{p}_state")(i).clone() for i in range(3) for p in ("conv", "recurrent")}
    cache.batch_select_indices(keep)
    for (i, p), value in before.items():
        assert torch.equal(getattr(cache, f"get_{p}_state")(i), value[keep]), (i, p)
    cache.release()
