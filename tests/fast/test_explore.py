"""`kvarena explore` (conformance/explore/): canonical states, the alphabet's refusals, the checks it runs in every
state, and the planted bugs it must find, through `--impl` and in the reference itself."""

from __future__ import annotations

import json

import pytest

from kvarena.cli import main
from kvarena.conformance.example.adapter import make, make_buggy
from kvarena.conformance.explore.alphabet import alphabet, refusals, run_step, steps
from kvarena.conformance.explore.canon import digest, state_key
from kvarena.conformance.explore.search import Bounds, explore, root
from kvarena.conformance.machine.harness import LiveReference, config_from_json
from kvarena.conformance.runner.conform import conform
from kvarena.conformance.vectors.replay import load
from kvarena.spec.types import UserKind
from tests.quality.mutants import CHAIN_MUTANTS, MUTANTS, REFUSAL_MUTANTS, isolated

TOY = Bounds(depth=2)
# every operation of the alphabet (spec/arena.md §Operations); the batched ones need an implementation that has them
OPS = {"admit", "extend", "share", "drop", "slide", "free", "copy_state", "acquire", "release", "compact", "relayout",
       "flush_idle", "write", "read", "translate"}


def _two_pages(names: tuple[str, str], tags: tuple[int, int]):  # type: ignore[no-untyped-def]
    c = root(TOY)
    c.run("admit", owner=names[0], demand={"full": 1}, shared=[])
    c.run("admit", owner=names[1], demand={"window": 1, "state": 1}, shared=[])
    c.run("write", page=0, entry=0, row=0, tag=tags[0])
    c.run("write", page=1, entry=0, row=1, tag=tags[1])
    c.run("acquire", user=names[0] + "-u", kind="host_save", pages=[0])
    return c


def test_names_drop_out_of_the_canonical_state() -> None:
    a, b = _two_pages(("a", "b"), (5, 9)), _two_pages(("q", "z"), (70, 3))
    assert digest(state_key(a)) == digest(state_key(b))
    c = _two_pages(("a", "b"), (5, 5))  # equal tags on two rows is another state: a move that mixed rows shows
    assert digest(state_key(a)) != digest(state_key(c))
    a.run("release", user="a-u")
    assert digest(state_key(a)) != digest(state_key(b))


def test_symmetric_orders_reach_one_state_and_layouts_stay_apart() -> None:
    one, two = root(TOY), root(TOY)
    one.run("admit", owner="x", demand={"full": 1}, shared=[])
    one.run("admit", owner="y", demand={"window": 1}, shared=[])
    two.run("admit", owner="y", demand={"window": 1}, shared=[])
    two.run("admit", owner="x", demand={"full": 1}, shared=[])
    assert digest(state_key(one)) == digest(state_key(two))
    three = root(TOY)
    three.run("admit", owner="x", demand={"full": 2}, shared=[])
    three.run("drop", owner="x", pages=[0])  # one full page, one slot further from the anchor: another layout
    assert digest(state_key(one)) != digest(state_key(three))


@pytest.mark.parametrize("model", ["toy-tri", "toy-two-float", "toy-win-float", "toy-swa", "toy-state"])
def test_every_refusal_of_the_alphabet_is_refused(model: str) -> None:
    c = root(Bounds(model=model))
    for _ in range(2):  # the empty arena, then one with an owner of every class, users and a cached page
        for op, args in list(refusals(c)):
            before = c.oracle.arena.snapshot()
            ok, code = run_step(c, op, args)
            assert not ok and code, f"{op} {args} was not refused"
            assert c.oracle.arena.snapshot() == before
        c.run("admit", owner="o", demand={k: 1 for k in c.order}, shared=[])
        c.run("share", owner="cache", pages=[h for h in c.oracle.live() if c.oracle.cls_of(h) == c.order[-1]][:1])
        c.run("acquire", user="u", kind=UserKind.NET_SEND.value, pages=c.oracle.live())


def test_the_alphabet_offers_every_kind_of_user_and_its_valid_steps_take_effect() -> None:
    c = root(TOY)
    c.run("admit", owner="o", demand={k: 1 for k in c.order}, shared=[])
    c.run("acquire", user="u", kind="forward_read", pages=c.oracle.live())
    menu = list(steps(c))
    assert {a["kind"] for op, a in menu if op == "acquire"} == {k.value for k in UserKind}
    assert {op for op, _ in menu} == OPS
    assert len(list(alphabet(c))) > len(menu)


def test_toy_tri_to_depth_two_is_clean_and_exercises_every_operation() -> None:
    r = explore(TOY)
    assert not r.violations and r.depth_reached == 2
    assert r.states > 100 and r.refused > 0 and r.transitions > r.states
    assert set(r.ops) == OPS
    assert [d["states"] for d in r.per_depth] == sorted(d["states"] for d in r.per_depth)


@pytest.mark.parametrize("model", ["toy-two-float", "toy-win-float"])
def test_the_float_chain_toys_are_clean(model: str) -> None:
    r = explore(Bounds(model=model, depth=2))
    assert not r.violations and r.states > 100


def test_the_planted_boundary_bug_is_caught_through_impl_and_its_trace_is_a_vector(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = Bounds(depth=3, impl="kvarena.conformance.example.adapter:make_buggy", level="safety")
    r = explore(b, factory=make_buggy)
    assert r.violations and r.violations[0].inv == "INV-NO-OVERLAP"
    depth = r.violations[0].depth
    assert depth <= 3 and all(v.depth == depth for v in r.violations)
    path = tmp_path / "found.jsonl"
    path.write_text(r.vector(0))
    vec = load(path)
    assert sum(s.op != "write" for s in vec.steps) == depth  # an admission's pages are written in its transition
    assert [s.args["owner"] for s in vec.steps if "owner" in s.args][:1] == ["r1"]
    report = conform(make_buggy, level="safety", vectors=path, examples=0)
    assert report.exit_code == 1 and "INV-NO-OVERLAP" in report.format()
    honest = explore(Bounds(depth=3, impl="example", level="safety"), factory=make)
    assert not honest.violations and honest.states > 1000


@pytest.mark.parametrize("name", ["overlap-off-by-one-frontier", "reuse-withheld-page", "stale-v2p-after-move"])
def test_reference_mutants_in_lockstep_are_found_at_small_depth(name: str) -> None:
    """Planted in a copy of the reference, plan validator off, no invariant predicates on it: the lockstep's
    observation checks must find them (bench/results/explore-*.md has the whole kill table)."""
    (m,) = [m for m in MUTANTS if m.name == name]
    r = explore(Bounds(depth=3, impl=name, deep=False), factory=isolated(m, validator=False))
    assert r.violations, f"{name} survived {r.states} states"


@pytest.mark.parametrize("name", ["share-registers-before-checking"])
def test_a_refusal_that_changes_the_reference_is_found_by_the_step_check(name: str) -> None:
    """The reference itself mutated, its INV-REFUSAL-IS-NOOP predicate taken out of the state check: the explorer's
    own comparison of the state before and after each refused step must find it."""
    from kvarena.conformance.explore import search

    (m,) = [m for m in REFUSAL_MUTANTS if m.name == name]
    mutated = isolated(m, validator=True)
    real = LiveReference.__init__

    def with_mutant(self, config, arena=None):  # type: ignore[no-untyped-def]
        real(self, config, arena if arena is not None else mutated(config))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LiveReference, "__init__", with_mutant)
        mp.setattr(search, "INVARIANTS", {k: v for k, v in search.INVARIANTS.items() if k != "INV-REFUSAL-IS-NOOP"})
        r = search.explore(Bounds(depth=3))
    assert r.violations, f"{name} survived {r.states} states"
    v = r.violations[0]
    assert v.inv == "INV-REFUSAL-IS-NOOP" and "changed the reference's state" in v.message


def test_gpu_at_exact_to_depth_two() -> None:
    pytest.importorskip("torch")
    from kvarena.gpu.allocator import make as gpu

    r = explore(Bounds(depth=2, impl="kvarena.gpu.allocator:make"), factory=gpu)
    assert not r.violations and r.states > 5
    assert {"admit_batch", "extend_batch", "free_batch"} <= set(r.ops)


def test_cli_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--depth", "1", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["violations"] == [] and out["depth_reached"] == 1 and out["states"] > 1
    assert out["transitions"] >= out["states"] and out["bounds"]["model"] == "toy-tri"
    assert config_from_json(out["config"]).capacity == out["config"]["capacity"]
    argv = ["explore", "--depth", "3", "--impl", "kvarena.conformance.example.adapter:make_buggy"]
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert "VIOLATION INV-NO-OVERLAP" in text and "shortest trace" in text
    assert main(["explore", "--depth", "-1"]) == 2


def test_the_two_float_mutant_is_found_on_two_floats_only() -> None:
    """The planted bug only two present floats expose (tests/quality/mutants.py CHAIN_MUTANTS; refuted for chains of
    any length by proofs/chain.py): found on toy-two-float within two steps, absent from toy-tri's states."""
    (m,) = CHAIN_MUTANTS
    two = explore(Bounds(model="toy-two-float", depth=2, impl=m.name, deep=False), factory=isolated(m))
    assert two.violations and two.violations[0].depth <= 2
    one = explore(Bounds(model="toy-tri", depth=3, impl=m.name, deep=False), factory=isolated(m))
    assert not one.violations and one.states > 1000


@pytest.mark.parametrize("name", ["make_buggy_twice", "make_buggy_leak"])
def test_a_block_pool_at_level_pool_and_its_planted_bugs(name: str) -> None:
    """`--level pool`: the vLLM-style block pool explores clean; its planted bugs are found (the three others need
    depth 3 or 4)."""
    from kvarena.conformance.example import block_pool

    honest = explore(Bounds(depth=2, impl="block_pool:make", level="pool"), factory=block_pool.make)
    assert not honest.violations and honest.states > 100
    r = explore(Bounds(depth=2, impl=name, level="pool"), factory=getattr(block_pool, name))
    assert r.violations and r.violations[0].inv


def test_an_uncopyable_allocator_is_refused_in_one_line() -> None:
    import types

    from kvarena.text import UsageError

    def uncopyable(config):  # type: ignore[no-untyped-def]
        alloc = make(config)
        alloc.handle = types  # a module: neither pickle nor deepcopy copies it (SGLang's adapter holds one)
        return alloc

    with pytest.raises(UsageError, match=r"copies the allocator at every state.*cannot pickle 'module'"):
        explore(Bounds(depth=1, impl="uncopyable", level="safety"), factory=uncopyable)
