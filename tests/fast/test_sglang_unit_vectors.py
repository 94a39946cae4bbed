"""The ports of SGLang's own allocator unit tests (conformance/vectors/sglang-unit-*.jsonl): each names the SGLang
test it comes from, passes the reference and gpu/ at exact, is listed in docs/sglang-unit-ports.md, and fails on
an arena that does what SGLang's tests (or SGLang's known findings) allow but the contract does not."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from kvarena.conformance.runner.conform import conform
from kvarena.conformance.vectors import replay as vectors
from kvarena.conformance.vectors.scenarios import VECTORS
from kvarena.reference.arena import Arena
from kvarena.spec.errors import DoubleFreeError

FILES = sorted(vectors.VECTOR_DIR.glob("sglang-unit-*.jsonl"))
DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang-unit-ports.md"
SGLANG_TEST = re.compile(r"test/registered/unit/mem_cache/test_\w+\.py")


def _head(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[0])


def test_the_ports_are_registered_and_modest() -> None:
    assert len(FILES) == 7
    assert {f.stem for f in FILES} <= {v.name for v in VECTORS}
    for f in FILES:
        assert f.stat().st_size <= 100_000, f.name
        assert 50 <= _head(f)["steps"] <= 300, f.name


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_description_names_the_sglang_test(path: Path) -> None:
    desc = _head(path)["description"]
    assert SGLANG_TEST.search(desc), desc
    assert re.search(r"\bTest\w+|\btest_\w+", desc.split(".py", 1)[1]), f"{path.name}: no test class or function"


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_reference_passes_at_exact(path: Path) -> None:
    report = conform(Arena, level="exact", vectors=path, examples=0)
    assert [v.status for v in report.vectors] == ["passed"], report.vectors[0].message
    assert report.vectors[0].steps_run == _head(path)["steps"]


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_gpu_passes_at_exact(path: Path) -> None:
    pytest.importorskip("torch")
    from kvarena.gpu.allocator import make

    report = conform(make, level="exact", vectors=path, examples=0, impl="kvarena.gpu.allocator:make")
    assert [v.status for v in report.vectors] == ["passed"], report.vectors[0].message


def test_the_differences_doc_names_every_port() -> None:
    text = DOC.read_text()
    for f in FILES:
        assert f.name in text, f"docs/sglang-unit-ports.md does not name {f.name}"
    cited = set(re.findall(r"sglang-unit-[\w-]+\.jsonl", text))
    assert cited <= {f.name for f in FILES}, cited - {f.name for f in FILES}


# -- planted bugs: what SGLang's tests (or its findings) allow, and the ports must refuse ---------------------


class MoveCapZeroMovesOne(Arena):
    """SGLang finding 5: a move cap of 0 still moves one page."""

    def compact(self, max_moves: int | None = None):  # type: ignore[override]
        return super().compact(1 if max_moves == 0 else max_moves)


class AcceptsDoubleFree(Arena):
    """SGLang findings 1 and 2 (lazy END, float): a page the owner no longer holds is freed silently."""

    def drop(self, owner: str, vids):  # type: ignore[override]
        try:
            return super().drop(owner, vids)
        except DoubleFreeError:
            return []


class CompactsUnderWriter(Arena):
    """Compaction that ignores an in-flight forward pass's write set (SGLang's non-urgent flush stops there)."""

    def compact(self, max_moves: int | None = None):  # type: ignore[override]
        kept, self.writers = self.writers, Counter()
        try:
            return super().compact(max_moves)
        finally:
            self.writers = kept


@pytest.mark.parametrize(("bug", "caught_by"), [
    (MoveCapZeroMovesOne, "sglang-unit-lazy-compaction.jsonl"),
    (AcceptsDoubleFree, "sglang-unit-token-allocators.jsonl"),
    (AcceptsDoubleFree, "sglang-unit-float.jsonl"),
    (CompactsUnderWriter, "sglang-unit-lazy-compaction.jsonl"),
], ids=["move-cap-zero", "double-free-token", "double-free-float", "compact-under-writer"])
def test_a_planted_sglang_behaviour_fails_its_port(bug: type[Arena], caught_by: str) -> None:
    r = vectors.replay(vectors.VECTOR_DIR / caught_by, bug, "safety", deep=False)
    assert r.status == "failed", r
