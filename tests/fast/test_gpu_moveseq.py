"""gpu/moveseq.py: a plan's moves as arrays behave as the tuple of Move objects the reference returns."""

import numpy as np
import pytest

from kvarena.gpu.moveseq import MoveSeq
from kvarena.spec.types import Move, Plan, Rung

MOVES = (Move("a", 5, 1), Move("a", 6, 2), Move("b", 9, 3), Move("a", 7, 4))


def _seq() -> MoveSeq:
    return MoveSeq([("a", np.array([5]), np.array([1])), ("a", np.array([6]), np.array([2])),
                    ("b", np.array([9]), np.array([3])), ("a", np.array([7]), np.array([4])), ("c", [], [])])


def test_it_is_the_tuple_of_moves() -> None:
    s = _seq()
    assert len(s) == 4 and bool(s) and not MoveSeq()
    assert tuple(s) == MOVES and list(s) == list(MOVES)
    assert s == MOVES and MOVES == s and s == list(MOVES) and s == MoveSeq.of(MOVES)  # noqa: SIM300 (both ways)
    assert s != MOVES[:3] and s != (*MOVES[:3], Move("a", 7, 5)) and MOVES[::-1] != s
    assert [s[i] for i in range(4)] == list(MOVES) and s[-1] == MOVES[-1] and s[1:3] == MOVES[1:3]
    with pytest.raises(IndexError):
        s[4]
    assert hash(s) == hash(MOVES) and repr(s) == repr(MOVES)
    assert all(isinstance(m.src, int) and isinstance(m.dst, int) for m in s)  # plain ints, as JSON wants


def test_runs_merge_consecutive_classes_and_keep_order() -> None:
    runs = _seq().runs()
    assert [(c, src.tolist(), dst.tolist()) for c, src, dst in runs] == [("a", [5, 6], [1, 2]), ("b", [9], [3]),
                                                                        ("a", [7], [4])]
    assert tuple(MoveSeq.concat(MOVES[:2], _seq().without(["a"]), MOVES[3:])) == (*MOVES[:3], MOVES[3])
    assert tuple(_seq().of_class("a")) == (MOVES[0], MOVES[1], MOVES[3])
    assert _seq().bytes({"a": 10, "b": 100}) == 130


def test_plans_compare_equal_to_the_references() -> None:
    ref = Plan(Rung.COMPACT, MOVES, {}, {2: 40}, {})
    gpu = Plan(Rung.COMPACT, _seq(), {}, {2: 40}, {})  # type: ignore[arg-type]
    assert gpu == ref and ref == gpu
    assert Plan(Rung.COMPACT, MoveSeq.of(MOVES[:3]), {}, {2: 40}, {}) != ref  # type: ignore[arg-type]
