"""The placement limit ``below`` of admit / extend (spec/arena.md §Placement limit) in the vectors.

``rung1-below``: toy-swa (window low | full high, GPT-OSS's two bands), with holes on both sides of each limit:
admissions and extensions with and without a limit, a limit on a class the demand does not name, the extreme
limits 0 and capacity, on and off each band's page grid, a demand that spills past the anchor-side holes and
one that reaches the frontier, a limit on admissions that need compaction (rung 2 ignores it) and one that does
not fit; then every malformed ``below`` (InvalidArgument, state unchanged) and the refusals checked before it.
``rung1-below-tri``: toy-tri (state low | window float | full high): the float class is refused, the state band
takes a limit like any low band. Both end in a random walk that uses the limit.

Each scripted limit is checked against the rule it shows (``toward``, written from the spec, not from the
reference's code), so a change to the reference that retires it fails generation. Helpers come from
scenarios.py, imported when a script runs (scenarios.py imports this module for VECTORS).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from kvarena.conformance.machine.below import toward

if TYPE_CHECKING:
    from kvarena.conformance.machine.conductor import Conductor
    from kvarena.conformance.machine.harness import Expect
    from kvarena.conformance.vectors.steps import VectorSpec

WALK = {"admit_below": 8, "extend_below": 6, "admit": 3, "extend": 2, "free": 5, "drop_some": 3, "slide": 3}


def limited(c: Conductor, what: str, op: str, below: Any, **args: Any) -> Expect:
    """Run an admission with ``below`` and check that each limited class took its holes in ``toward`` order
    (unlimited classes: nearest the anchor), rung 1."""
    from kvarena.conformance.vectors.steps import ScenarioError, must

    snap = c.oracle.snapshot()
    exp = must(c.run(op, **args, below=below), what, rung=1)
    after = c.oracle.snapshot().pages
    for cls, n in args["demand"].items():
        holes = list(snap.holes[cls])
        low = cls == c.geo.low
        limit = (below or {}).get(cls)
        if limit is None:
            want = sorted(holes)[:n] if low else sorted(holes, reverse=True)[:n]
        else:
            pb = c.geo.page_bytes[cls]
            want = toward(holes, limit // pb if low else -(-limit // pb), low, n)
        got = [after[h][1] for h in (exp.pages or {}).get(cls, [])][:len(want)]
        if got != want:
            raise ScenarioError(f"{what}: {cls} pages at slots {got}, the limit {limit} takes {want} of holes {holes}")
    return exp


def refusals(c: Conductor, owner: str, cls_low: str, cls_high: str, floats: list[str]) -> None:
    """Every malformed ``below`` on admit and extend, then the refusals that come before it."""
    from kvarena.conformance.vectors.steps import must

    cap = c.geo.capacity
    bad: list[Any] = [{"nope": 0}, {cls_low: True}, {cls_high: False}, {cls_low: -1}, {cls_high: cap + 1},
                      {cls_low: 1.5}, {cls_high: 2.0}, [[cls_low, 0]], cls_low, 7]
    bad += [{f: 0} for f in floats] + [{cls_low: 0, "nope": 1}, {cls_low: "0"}]
    for i, b in enumerate(bad):
        must(c.run("admit", owner=c.fresh("bad"), demand={cls_low: 1}, shared=[], below=b), f"admit below {b}",
             "InvalidArgument")
        if i % 2 == 0:
            must(c.run("extend", owner=owner, demand={cls_high: 1}, below=b), f"extend below {b}", "InvalidArgument")
    must(c.run("admit", owner=owner, demand={cls_low: 1}, shared=[], below={"nope": 0}), "owner first",
         "DuplicateOwner")
    must(c.run("extend", owner="ghost", demand={cls_low: 1}, below={"nope": 0}), "owner first", "UnknownOwner")
    must(c.run("admit", owner=c.fresh("bad"), demand={cls_low: -1}, shared=[], below={cls_low: 0}), "demand",
         "InvalidArgument")


def rung1_below(c: Conductor, rng: random.Random) -> None:
    from kvarena.conformance.vectors.steps import ScenarioError, flat, must, readback, walk, write_page

    w, f = c.geo.page_bytes["window"], c.geo.page_bytes["full"]
    made = [must(c.run("admit", owner=f"r{i}", demand={"window": 1, "full": 2}, shared=[]), f"r{i}", rung=1)
            for i in range(1, 11)]
    for e in made[::3]:
        write_page(c, flat(e)[0])
    for i in (2, 4, 6, 8):
        must(c.run("free", owner=f"r{i}"), f"free r{i}")  # holes in both bands, r10 keeps the frontiers
    hi = c.oracle.snapshot().holes
    mid_w, mid_f = sorted(hi["window"])[1], sorted(hi["full"])[len(hi["full"]) // 2]
    limited(c, "a1: both bands, on the grid", "admit", {"window": (mid_w + 1) * w, "full": mid_f * f},
            owner="a1", demand={"window": 2, "full": 3}, shared=[])
    limited(c, "a2: the limit names a class the demand does not", "admit", {"window": 0},
            owner="a2", demand={"full": 2}, shared=[])
    limited(c, "a3: no limit (null)", "admit", None, owner="a3", demand={"window": 1, "full": 1}, shared=[])
    for i in (3, 5, 7):
        must(c.run("free", owner=f"r{i}"), f"free r{i}")
    hi = c.oracle.snapshot().holes
    mid_w, mid_f = sorted(hi["window"])[len(hi["window"]) // 2], sorted(hi["full"])[len(hi["full"]) // 2]
    limited(c, "extend a1: off the grid (floor / ceiling)", "extend", {"window": mid_w * w + w // 2,
                                                                      "full": mid_f * f - f // 2},
            owner="a1", demand={"window": 1, "full": 2})
    must(c.run("extend", owner="a1", demand={"window": 1, "full": 1}), "extend a1 without a limit", rung=1)
    limited(c, "extend a2: the extremes (window capacity, full 0)", "extend", {"window": c.geo.capacity, "full": 0},
            owner="a2", demand={"window": 1, "full": 1})
    hi = c.oracle.snapshot().holes
    limited(c, "b1: spills past the anchor-side holes", "admit", {"window": (min(hi["window"]) + 1) * w,
                                                                 "full": max(hi["full"]) * f},
            owner="b1", demand={"window": 2, "full": 3}, shared=[])
    for o in ("r1", "r9"):
        must(c.run("free", owner=o), f"free {o}")
    hi = c.oracle.snapshot().holes
    limited(c, "b2: more than the holes, then the frontiers", "admit", {"window": 5 * w, "full": c.geo.capacity},
            owner="b2", demand={"window": len(hi["window"]) + 1, "full": len(hi["full"]) + 1}, shared=[])
    for o in ("a3", "b1"):
        must(c.run("free", owner=o), f"free {o}")  # window holes only compaction gives the full band
    rungs = []
    for _ in range(40):  # the full band grows under a limit until compaction is needed, then until nothing fits
        e = c.run("admit", owner=c.fresh("g"), demand={"full": 3}, shared=[],
                  below={"window": 2 * w, "full": c.geo.capacity - 2 * f})
        if not e.ok:
            break
        rungs.append((e.plan or {}).get("rung"))
    if 2 not in rungs or e.ok:
        raise ScenarioError(f"rung1-below: the limited admissions took rungs {rungs} and {'fit' if e.ok else 'stop'}; "
                            "expected a rung 2 and a final AdmissionRejected")
    refusals(c, "a1", "window", "full", [])
    for o in [o for o in c.oracle.owners() if o.startswith(("g", "b"))]:
        c.run("free", owner=o)
    walk(c, rng, 40, WALK)
    readback(c)


def rung1_below_tri(c: Conductor, rng: random.Random) -> None:
    from kvarena.conformance.vectors.steps import must, readback, walk

    s, f = c.geo.page_bytes["state"], c.geo.page_bytes["full"]
    for i in range(1, 11):
        must(c.run("admit", owner=f"t{i}", demand={"state": 1, "full": 2}, shared=[]), f"t{i}", rung=1)
    for i in (2, 3, 5, 7, 8):
        must(c.run("free", owner=f"t{i}"), f"free t{i}")
    hi = c.oracle.snapshot().holes
    limited(c, "u1: the state band under a limit", "admit", {"state": (sorted(hi["state"])[2] + 1) * s},
            owner="u1", demand={"state": 1, "full": 1}, shared=[])
    limited(c, "u2: both end bands", "admit", {"state": (max(hi["state"]) + 1) * s, "full": min(hi["full"]) * f},
            owner="u2", demand={"state": 1, "full": 2}, shared=[])
    limited(c, "extend u2: the full band from below", "extend", {"full": 0}, owner="u2", demand={"full": 1})
    refusals(c, "u1", "state", "full", ["window"])
    walk(c, rng, 40, WALK)
    readback(c)


def below_vectors() -> tuple[VectorSpec, ...]:
    from kvarena.conformance.vectors.steps import VectorSpec

    swa: Any = VectorSpec("rung1-below", "the placement limit below (rung 1's hole order toward a byte) on window | "
                          "full: holes on both sides, with and without a limit, every malformed below refused",
                          "toy-swa", 6144, 2, rung1_below, seed=20)
    tri: Any = VectorSpec("rung1-below-tri", "the placement limit on state | window | full: the float class is "
                          "refused, the state band takes a limit", "toy-tri", 6144, 4, rung1_below_tri, seed=21)
    return (swa, tri)
