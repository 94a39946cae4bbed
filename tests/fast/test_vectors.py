"""The committed conformance vectors (conformance/vectors/): they match the reference, they cover the
contract, they replay, they catch the planted bugs, and a malformed file is named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvarena.conformance.machine.harness import OPS
from kvarena.conformance.vectors import replay as vectors
from kvarena.conformance.vectors.scenarios import VECTORS
from kvarena.reference.arena import Arena
from kvarena.spec.models import TOY_MODELS
from tests.quality.below_arenas import IgnoresBelow, NoBelow
from tests.quality.mutants import MUTANTS, Mutant, isolated

FILES = sorted(vectors.VECTOR_DIR.glob("*.jsonl"))

# every error code each operation can raise (spec/arena.md §Operations, §Configuration and refusals)
REQUIRED_ERRORS = {
    "admit": {"DuplicateOwner", "InvalidArgument", "UnknownPage", "AdmissionRejected"},
    "extend": {"UnknownOwner", "InvalidArgument", "AdmissionRejected"},
    "share": {"InvalidArgument", "UnknownPage"},
    "drop": {"UnknownOwner", "InvalidArgument", "DoubleFree"},
    "slide": {"UnknownOwner", "InvalidArgument"},
    "free": {"UnknownOwner"},
    "acquire": {"DuplicateUser", "InvalidArgument", "UnknownPage"},
    "release": {"ReleaseWithoutAcquire"},
    "compact": {"InvalidArgument"},
    "relayout": {"InvalidArgument", "AdmissionRejected"},
    "write": {"UnknownPage", "InvalidArgument"},
    "read": {"UnknownPage", "InvalidArgument"},
    "translate": {"UnknownPage"},
    "construct": {"ConfigError", "CapacityTooSmall"},
}


def test_committed_vectors_match_the_reference() -> None:
    """`kvarena vectors --check`: a difference means the reference's behaviour changed; regenerate with
    `kvarena vectors --write` and review the diff."""
    assert vectors.check_all() == []


def test_the_set_is_modest_and_complete() -> None:
    assert {f.name for f in FILES} == {f"{v.name}.jsonl" for v in VECTORS}
    assert 12 <= len(FILES) <= 40
    assert sum(f.stat().st_size for f in FILES) < 2_000_000
    ops: set[str] = set()
    errors: dict[str, set[str]] = {}
    rungs: set[int] = set()
    models = set()
    for f in FILES:
        head = json.loads(f.read_text().splitlines()[0])
        assert 50 <= head["steps"] <= 300, f.name
        models.add(head["config"]["model"])
        ops |= set(head["covers"]["ops"])
        rungs |= set(head["covers"]["rungs"])
        for op, codes in head["covers"]["errors"].items():
            errors.setdefault(op, set()).update(codes)
    assert ops == set(OPS)
    missing = {op: sorted(codes - errors.get(op, set())) for op, codes in REQUIRED_ERRORS.items()
               if codes - errors.get(op, set())}
    assert not missing, f"error paths no vector covers: {missing}"
    assert {1, 2, 3} <= rungs
    assert set(TOY_MODELS) <= models
    assert sum(f.name.startswith("sglang-") for f in FILES) >= 3


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_vector_replays_on_the_reference(path: Path) -> None:
    r = vectors.replay(path, Arena, "exact")
    assert r.status == "passed", r.message


LOADED = [vectors.load(f) for f in FILES]


class HighHints(Arena):
    """A valid arena with another placement policy: empty floats start at the top."""

    def _float_hints(self) -> dict[str, int]:
        return dict.fromkeys(super()._float_hints(), self.capacity)


def test_another_placement_policy_replays_at_safety() -> None:
    """At safety a vector may stop early (the implementation refused what the reference admitted), never fail."""
    results = [vectors.replay(v, HighHints, "safety") for v in LOADED]
    assert not [r.message for r in results if r.status == "failed"]
    assert any(r.status == "stopped" and "which the reference admitted" in r.message for r in results)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_vectors_alone_catch_mutant(mutant: Mutant) -> None:
    """Replayed at safety with only the observation checks, the vectors catch every planted bug."""
    factory = isolated(mutant)
    for vec in LOADED:
        if vectors.replay(vec, factory, "safety", deep=False).status == "failed":
            return
    pytest.fail(f"no vector catches {mutant.name}")


# -- malformed files: a clear error naming the file and line ------------------------------------

def _copy(tmp_path: Path, edit) -> Path:
    lines = (vectors.VECTOR_DIR / "errors-every-code.jsonl").read_text().splitlines()
    lines = edit(lines)
    out = tmp_path / "bad.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def _set(lines: list[str], i: int, **changes) -> list[str]:
    d = json.loads(lines[i])
    d.update(changes)
    lines[i] = json.dumps(d)
    return lines


@pytest.mark.parametrize(("edit", "line", "words"), [
    (lambda ls: [*ls[:2], "{not json", *ls[3:]], 3, "not JSON"),
    (lambda ls: _set(ls, 0, version=9), 1, "version 9 is not supported"),
    (lambda ls: _set(ls, 0, format="other"), 1, "header"),
    (lambda ls: _set(ls, 4, op="teleport"), 5, "unknown op 'teleport'"),
    (lambda ls: _set(ls, 4, args={"owner": "x"}), 5, "takes exactly the args"),
    (lambda ls: _set(ls, 4, expect={"rejects": "Oops"}), 5, "unknown error code 'Oops'"),
    (lambda ls: _set(ls, 4, expect={}), 5, "exactly one of"),
    (lambda ls: _set(ls, 4, step=40), 5, "step number 40"),
    (lambda ls: [*ls[:3], "", *ls[3:]], 4, "blank line"),
    (lambda ls: _set(ls, 0, steps=1), 1, "header says 1 steps"),
    (lambda ls: _set(ls, 0, float_hints={"window": 1}), 1, "exact-rational sizing"),
])
def test_malformed_vector_names_file_and_line(tmp_path: Path, edit, line, words) -> None:
    path = _copy(tmp_path, edit)
    with pytest.raises(vectors.VectorFormatError) as info:
        vectors.load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert words in msg, msg


def _tiny(tmp_path: Path, steps: list[dict]) -> Path:
    """A hand-written vector on the empty toy-tri arena of errors-every-code (steps without snapshots)."""
    head = json.loads((vectors.VECTOR_DIR / "errors-every-code.jsonl").read_text().splitlines()[0])
    head["steps"] = len(steps)
    for i, st in enumerate(steps, start=1):
        st["step"] = i
    path = tmp_path / "tiny.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [head, *steps]) + "\n")
    return path


def _admit(owner: str, handle: int, vid: int) -> dict:
    return {"op": "admit", "args": {"owner": owner, "demand": {"full": 1}, "shared": []},
            "expect": {"returns": {"pages": {"full": [handle]}, "vids": {"full": [vid]}, "plan": None}}}


def test_hand_written_vector_and_dead_handles(tmp_path: Path) -> None:
    """{"dead": n} is valid only before the next allocation (ids are reused after it)."""
    drop = {"op": "drop", "args": {"owner": "r1", "pages": [0]}, "expect": {"returns": [0]}}
    dead = {"op": "translate", "args": {"page": {"dead": 0}}, "expect": {"rejects": "UnknownPage"}}
    ok = _tiny(tmp_path, [_admit("r1", 0, 0), drop, dead, _admit("r2", 1, 0)])
    vec = vectors.load(ok)
    assert [s.op for s in vec.steps] == ["admit", "drop", "translate", "admit"]
    assert vectors.replay(vec, Arena, "decisions").status == "passed"
    late = _tiny(tmp_path, [_admit("r1", 0, 0), drop, _admit("r2", 1, 0), dead])
    with pytest.raises(vectors.VectorFormatError, match=r"tiny.jsonl:5: .*dead handle may be named only"):
        vectors.load(late)
    skipped = _tiny(tmp_path, [_admit("r1", 0, 0), _admit("r2", 2, 1)])
    with pytest.raises(vectors.VectorFormatError, match=r"tiny.jsonl:3: new page handle 2; .*expected 1"):
        vectors.load(skipped)


def test_hand_written_vector_divergence_names_the_line(tmp_path: Path) -> None:
    """Snapshots are optional below exact; a wrong answer is reported with the file and line."""
    wrong = {"op": "translate", "args": {"page": 0}, "expect": {"returns": ["window", 13]}}
    path = _tiny(tmp_path, [_admit("r1", 0, 0), wrong])
    r = vectors.replay(path, Arena, "decisions")
    assert r.status == "failed", r
    assert r.message.startswith("tiny.jsonl:3: step 2 at level decisions: translate {\"page\": 0}: got"), r.message


def test_live_handle_check(tmp_path: Path) -> None:
    lines = (vectors.VECTOR_DIR / "errors-every-code.jsonl").read_text().splitlines()
    i = next(i for i, raw in enumerate(lines) if json.loads(raw).get("op") == "translate")
    lines = _set(lines, i, args={"page": 12345})
    path = tmp_path / "handle.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(vectors.VectorFormatError, match=rf"{path.name}:{i + 1}: page handle 12345 is not live"):
        vectors.load(path)


def test_empty_and_missing(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(vectors.VectorFormatError, match=r"empty\.jsonl:1: empty file"):
        vectors.load(tmp_path / "empty.jsonl")
    with pytest.raises(vectors.VectorFormatError, match="no such vector file or directory"):
        vectors.discover(tmp_path / "nowhere")
    (tmp_path / "sub").mkdir()
    with pytest.raises(vectors.VectorFormatError, match=r"no \*\.jsonl vector files"):
        vectors.discover(tmp_path / "sub")


# -- the optional feature `below` (FORMAT.md §Features) -------------------------------------------

BELOW = [f for f in FILES if "below" in json.loads(f.read_text().splitlines()[0]).get("requires", [])]


def _unbool(below):  # type: ignore[no-untyped-def]
    return {k: int(v) if isinstance(v, bool) else v for k, v in below.items()} if isinstance(below, dict) else below


class BoolBelow(Arena):
    """Validates `below` but lets a bool through as a byte (True is 1)."""

    def admit(self, owner, demand, shared=(), below=None):  # type: ignore[no-untyped-def, override]
        return super().admit(owner, demand, shared, _unbool(below))

    def extend(self, owner, demand, below=None):  # type: ignore[no-untyped-def, override]
        return super().extend(owner, demand, _unbool(below))


def test_every_vector_that_uses_below_requires_it() -> None:
    assert {f.name for f in BELOW} == {"rung1-below.jsonl", "rung1-below-tri.jsonl"}
    for f in FILES:
        used = any("below" in s.args for s in vectors.load(f).steps)
        assert used == (f in BELOW), f.name


@pytest.mark.parametrize("path", BELOW, ids=[f.stem for f in BELOW])
def test_a_below_vector_is_refused_without_the_feature(path: Path) -> None:
    """Not replayed with the argument dropped: stopped before the first step, one line saying why."""
    from kvarena.conformance.adapter.protocol import features

    assert features(NoBelow(vectors.load(path).config)) == frozenset()
    for level in ("safety", "exact"):
        r = vectors.replay(path, NoBelow, level)
        assert (r.status, r.steps_run) == ("stopped", 0), r
        assert r.message.startswith("not replayed: the vector requires below") and "\n" not in r.message, r.message


@pytest.mark.parametrize("path", BELOW, ids=[f.stem for f in BELOW])
def test_below_vectors_replay_and_catch_a_dropped_or_loose_limit(path: Path) -> None:
    assert vectors.replay(path, Arena, "exact").status == "passed"
    ignored = vectors.replay(path, IgnoresBelow, "exact")
    assert ignored.status == "failed" and '"below": {' in ignored.summary, ignored.message  # a limited admission
    loose = vectors.replay(path, BoolBelow, "safety")
    assert loose.status == "failed" and "the reference raises InvalidArgument" in loose.message, loose.message


def test_below_needs_the_header_to_require_it(tmp_path: Path) -> None:
    lines = BELOW[0].read_text().splitlines()
    head = json.loads(lines[0])
    i = next(i for i, raw in enumerate(lines) if "below" in json.loads(raw).get("args", {}))
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join([json.dumps({k: v for k, v in head.items() if k != "requires"}), *lines[1:]]) + "\n")
    with pytest.raises(vectors.VectorFormatError, match=rf"b.jsonl:{i + 1}: args.below is an optional feature"):
        vectors.load(path)
    path.write_text("\n".join([json.dumps({**head, "requires": ["below", "teleport"]}), *lines[1:]]) + "\n")
    with pytest.raises(vectors.VectorFormatError, match=r"b.jsonl:1: header.requires \['below', 'teleport'\]"):
        vectors.load(path)
