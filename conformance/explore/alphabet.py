"""The explorer's alphabet: every single step a state offers, in handle terms (conformance/vectors/FORMAT.md).

Unlike the lockstep machine's rules (conformance/machine/lockstep.py), which draw one step's arguments at
random, :func:`steps` lists them all, within small ranges: each admission's demand up to ``pages`` per class,
every owner's extend / drop / slide / free, every page's share, write, read and translate, an acquire of each
owner's pages by each user kind, every release, compaction with and without a budget, a relayout per class,
``flush_idle`` under budgets of one page and of everything, ``copy_state`` into a new owner and into every owner
with room. Then one malformed call per refusal the state allows (:func:`refusals`): each must be refused with
the reference's error class and change nothing.

Owners, users and tags get fresh names from the conductor's serial; the explorer's canonical form renames them
(canon.py), so a step's names never make two states differ.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from kvarena.conformance.machine.below import offers_below
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import CACHE
from kvarena.conformance.machine.lockstep import (
    BAD_IDS,
    KINDS,
    _offers_flush,
    _recurrent_contract,
    held_flat,
    is_state,
    live,
    requests,
    room,
    shareable,
    states,
)

Step = tuple[str, dict[str, Any]]
QUERIES = ("read", "translate")  # steps that change nothing even when they succeed


def _middle(c: Conductor, cls: str) -> int:
    """The byte at the middle slot of the class's band (its anchor when the band is empty)."""
    band = c.oracle.arena.bands[cls]
    return (band.lo + band.hi) // 2 * c.geo.page_bytes[cls]


def steps(c: Conductor, pages: int = 1) -> Iterator[Step]:
    """Every valid step of the bounded alphabet in this state (names are drawn as each step is yielded)."""
    order = c.order
    owners = c.oracle.owners()
    reqs = requests(c)
    token_pages = shareable(c)
    # admissions: every demand up to `pages` a class (the recurrent class within recurrent_slots), then a
    # prefix-shared admission of each shareable page
    ranges = [range(room(c, k, pages) + 1) for k in order]
    for counts in itertools.product(*ranges):
        yield "admit", {"owner": c.fresh("r"), "demand": dict(zip(order, counts)), "shared": []}
    for h in token_pages:
        yield "admit", {"owner": c.fresh("r"), "demand": {order[-1]: 1}, "shared": [h]}
    below = offers_below(c)  # the optional placement limit: one page of each end below the end band's middle slot
    ends = [k for k in dict.fromkeys((order[0], order[-1])) if room(c, k, 1)]
    for k in ends if below else ():
        yield "admit", {"owner": c.fresh("r"), "demand": {k: 1}, "shared": [], "below": {k: _middle(c, k)}}
    for o in reqs:
        for k in order:
            if room(c, k, 1, o):
                yield "extend", {"owner": o, "demand": {k: 1}}
        for k in ends if below else ():
            if room(c, k, 1, o):
                yield "extend", {"owner": o, "demand": {k: 1}, "below": {k: _middle(c, k)}}
    cached = set(held_flat(c, CACHE)) if CACHE in owners else set()
    for h in token_pages:
        if h not in cached:
            yield "share", {"owner": CACHE, "pages": [h]}
    for o in owners:
        held = c.oracle.held(o)
        for h in held_flat(c, o):
            yield "drop", {"owner": o, "pages": [h]}
        for k in order:
            if held[k]:
                yield "slide", {"owner": o, "cls": k, "n": 1}
        yield "free", {"owner": o}
    for h in states(c) if _recurrent_contract(c) else ():
        cls = c.oracle.cls_of(h)
        yield "copy_state", {"owner": c.fresh("node"), "page": h}
        for o in reqs:
            if room(c, cls, 1, o):
                yield "copy_state", {"owner": o, "page": h}
    for o in owners:
        mine = held_flat(c, o)
        if mine:
            for kind in KINDS:
                yield "acquire", {"user": c.fresh("u"), "kind": kind, "pages": mine}
    for u in list(c.users):
        yield "release", {"user": u}
    yield "compact", {"max_moves": None}
    yield "compact", {"max_moves": 1}
    for k in order:
        yield "relayout", {"demand": {k: 1}}
    if _offers_flush(c):  # optional in the adapter protocol (version 9)
        yield "flush_idle", {"budget_bytes": min(c.geo.page_bytes.values())}
        yield "flush_idle", {"budget_bytes": c.geo.capacity}
    for h in live(c):
        c.serial += 1
        yield "write", {"page": h, "entry": 0, "row": 0, "tag": c.serial}
    for h in live(c):
        yield "read", {"page": h, "entry": 0, "row": 0}
        yield "translate", {"page": h}


def refusals(c: Conductor) -> Iterator[Step]:
    """One malformed call per refusal this state allows; each must raise the reference's error and change nothing."""
    order, geo = c.order, c.geo
    low, high = order[0], order[-1]
    owners = c.oracle.owners()
    reqs = requests(c)
    pages = live(c)
    token_pages = shareable(c)
    bad = BAD_IDS[0]
    yield "admit", {"owner": c.fresh("r"), "demand": {low: -1}, "shared": []}
    yield "admit", {"owner": c.fresh("r"), "demand": {"nope": 1}, "shared": []}
    yield "admit", {"owner": c.fresh("r"), "demand": {high: geo.top[high] + 1}, "shared": []}
    yield "admit", {"owner": c.fresh("r"), "demand": {low: geo.top[low], high: geo.top[high]}, "shared": []}
    yield "admit", {"owner": c.fresh("r"), "demand": {high: 1}, "shared": [bad]}
    if owners:
        yield "admit", {"owner": owners[0], "demand": {high: 1}, "shared": []}
    for op, args in (("extend", {"demand": {high: 1}}), ("drop", {"pages": []}), ("slide", {"cls": low, "n": 0}),
                     ("free", {})):
        yield op, {"owner": "ghost", **args}
    for o in reqs[:1]:
        mine = set(held_flat(c, o))
        others = [h for h in pages if h not in mine]
        yield "drop", {"owner": o, "pages": [others[0] if others else bad]}
        if mine:
            h = min(mine)
            yield "drop", {"owner": o, "pages": [h, h]}
        yield "slide", {"owner": o, "cls": low, "n": len(c.oracle.held(o)[low]) + 1}
        yield "slide", {"owner": o, "cls": "nope", "n": 0}
        yield "extend", {"owner": o, "demand": {low: -1}}
    if offers_below(c):  # a malformed placement limit: a bool is not a byte offset, a float class has none
        yield "admit", {"owner": c.fresh("r"), "demand": {high: 1}, "shared": [], "below": {high: True}}
        yield "admit", {"owner": c.fresh("r"), "demand": {high: 1}, "shared": [], "below": {high: geo.capacity + 1}}
        for k in geo.floats()[:1]:
            yield "admit", {"owner": c.fresh("r"), "demand": {high: 1}, "shared": [], "below": {k: 0}}
    yield "share", {"owner": CACHE, "pages": [bad]}
    if token_pages:
        h = token_pages[0]
        yield "share", {"owner": c.fresh("s"), "pages": [h, h]}
    if CACHE in owners and held_flat(c, CACHE):
        yield "share", {"owner": CACHE, "pages": [held_flat(c, CACHE)[0]]}
    recurrent = _recurrent_contract(c)  # copy_state and the rules that came with it are optional (protocol)
    for h in states(c)[:1] if recurrent else ():
        cls = c.oracle.cls_of(h)
        cap = c.oracle.arena.config.recurrent_slots
        yield "share", {"owner": CACHE, "pages": [h]}
        yield "admit", {"owner": c.fresh("r"), "demand": {}, "shared": [h]}
        yield "admit", {"owner": c.fresh("r"), "demand": {cls: cap + 1}, "shared": []}
        for o in [o for o in reqs if not room(c, cls, 1, o)][:1]:
            yield "extend", {"owner": o, "demand": {cls: 1}}
            yield "copy_state", {"owner": o, "page": h}
        if token_pages:
            yield "copy_state", {"owner": c.fresh("node"), "page": token_pages[0]}
    if recurrent:
        yield "acquire", {"user": c.fresh("u"), "kind": KINDS[0], "pages": []}
    yield "acquire", {"user": c.fresh("u"), "kind": "bogus", "pages": pages[:1]}
    yield "acquire", {"user": c.fresh("u"), "kind": KINDS[0], "pages": [bad]}
    if pages:
        h = pages[0]
        yield "acquire", {"user": c.fresh("u"), "kind": KINDS[0], "pages": [h, h]}
        cls = c.oracle.cls_of(h)
        yield "write", {"page": h, "entry": 0, "row": geo.rows[cls], "tag": 1}
        yield "write", {"page": h, "entry": -1, "row": 0, "tag": 1}
        yield "read", {"page": h, "entry": geo.entries[cls], "row": 0}
    for u in list(c.users)[:1]:
        yield "acquire", {"user": u, "kind": KINDS[0], "pages": pages[:1]}
    yield "release", {"user": "never-acquired"}
    yield "write", {"page": bad, "entry": 0, "row": 0, "tag": 1}
    yield "read", {"page": bad, "entry": 0, "row": 0}
    yield "translate", {"page": bad}
    yield "compact", {"max_moves": -1}
    if _offers_flush(c):
        yield "flush_idle", {"budget_bytes": -1}
    yield "relayout", {"demand": {"nope": 1}}
    yield "relayout", {"demand": {high: geo.top[high] + 1}}


BATCHED = ("admit_batch", "extend_batch", "free_batch")  # the engine's calls (spec/arena.md §Batched operations)


def batched(c: Conductor) -> Iterator[Step]:
    """With an implementation that has them, the batched calls: two fresh owners admitted in one call (one
    page of every class each, and nothing), a decode step growing every request's high end by a page (a
    ghost lane included, refused in place), and every request freed in one call."""
    from kvarena.conformance.machine.batched import _has

    order, reqs = c.order, requests(c)
    if _has(c, "admit_batch"):
        yield "admit_batch", {"items": [{"owner": c.fresh("r"), "demand": {k: 1 for k in order}, "shared": []},
                                        {"owner": c.fresh("r"), "demand": {}, "shared": []}]}
    if reqs and _has(c, "extend_batch"):
        yield "extend_batch", {"items": [{"owner": o, "demand": {order[-1]: 1}} for o in [*reqs, "ghost"]]}
    if reqs and _has(c, "free_batch"):
        yield "free_batch", {"items": [{"owner": o} for o in reqs]}


def _fill(c: Conductor, pages: dict[str, list[int]] | None) -> None:
    """Every page an admission hands out gets its first and last row written (fresh tags), in the same transition:
    every live page then carries content, so a move, free or hand-out that loses or leaks rows shows within the
    fewest steps, and a written page is no other state than an unwritten one would be (tags are renamed away)."""
    for cls, hs in (pages or {}).items():
        last = (c.geo.entries[cls] - 1, c.geo.rows[cls] - 1)
        for h in hs:
            for entry, row in dict.fromkeys([(0, 0), last]):
                c.serial += 1
                c.run("write", page=h, entry=entry, row=row, tag=c.serial)


def run_step(c: Conductor, op: str, args: dict[str, Any]) -> tuple[bool, str | None]:
    """One step of the alphabet on the conductor: (took effect, the refusal's code). A batched step is one
    batched call on the implementation and the same calls in order on the reference (machine/batched.py). An
    admission's new pages are written at once (:func:`_fill`)."""
    if op not in BATCHED:
        exp = c.run(op, **args)
        if exp.ok and op in ("admit", "extend"):  # a copy_state page carries its source's rows
            _fill(c, exp.pages)
        return exp.ok, exp.code
    from kvarena.conformance.machine.batched import batch

    base, items = op.removesuffix("_batch"), args["items"]
    owners = [x["owner"] for x in items]
    if base == "admit":
        call = lambda a, _r: a.admit_batch(owners, [x["demand"] for x in items])  # noqa: E731
    elif base == "extend":
        call = lambda a, _r: a.extend_batch(owners, [x["demand"] for x in items])  # noqa: E731
    else:
        call = lambda a, _r: a.free_batch(owners)  # noqa: E731
    exps = batch(c, base, items, call)
    for e in exps:
        if e.ok and base in ("admit", "extend"):
            _fill(c, e.pages)
    ok = [e for e in exps if e.ok]
    return bool(ok), None if ok else exps[0].code


def alphabet(c: Conductor, pages: int = 1) -> Iterator[Step]:
    """The valid steps, the batched calls (an implementation's), then the refusals."""
    yield from steps(c, pages)
    if c.impl is not None:
        yield from batched(c)
    yield from refusals(c)


__all__ = ["BATCHED", "QUERIES", "Step", "alphabet", "batched", "is_state", "refusals", "run_step", "steps"]
