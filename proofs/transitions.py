"""Every transition of the spec as a guarded update of the symbolic state, each with its planted bugs.

A transition is a function ``(config, pre-state, tag, mutant) -> [Step]``: one ``Step`` per *case* (a hole or a
frontier, the low or the high band, ...), each a guard over the pre-state and its arguments and the post-state
as terms of them. Cases keep each query small and name what was proven ("extend: the high band grows down").

Guards are what the reference guarantees at that step (by validation or by the planner's choices); they may be
*weaker* than the reference's exact choice (any free id, not the smallest; any held page, not the oldest), so
what is proven for the model holds for the reference. The ``mutant`` argument drops or bends one guard or
effect: the bug the invariant rules out. ``MUTANTS`` lists them with the IDs they must break.

Names follow spec/arena.md §Operations and §Admission ladder: ``admit`` / ``extend`` place one page (rung 1:
a hole, or a frontier slot in the adjacent gap); ``share``; ``slide`` drops one held page (``drop`` is a
sequence of these: owner order is not modelled); ``free`` lets go of every page of an owner; ``acquire`` /
``release`` (§Ledger); ``write``; ``move`` (``Arena._move`` under ledger rules 2-4); ``compact`` (one step
of ``plan_compaction``: the farthest movable page of an end band to its hole nearest the anchor);
``relayout_grow`` / ``relayout_move`` / ``relayout_trim`` (the three parts of ``Arena._retarget_float``);
``absorb`` (one step of ``Band.absorb_boundary_holes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import z3

from kvarena.proofs.model import (
    BANDS,
    FLOAT,
    HIGH,
    LOW,
    Config,
    State,
    bvar,
    float_present,
    floor_ok,
    has_writer,
    hi_byte,
    in_span,
    in_use,
    init,
    is_band,
    is_state,
    lo_byte,
    pick,
    qo,
    qv,
)

TRUE = z3.BoolVal(True)


@dataclass
class Step:
    transition: str
    case: str
    guard: z3.BoolRef
    post: State
    args: dict[str, z3.ExprRef] = field(default_factory=dict)
    # What makes a witness the step the reference's own operation takes (used only to find replayable
    # counterexamples, never in a proof): e.g. compaction does the low band's move first.
    replay_guard: z3.BoolRef = TRUE


@dataclass(frozen=True)
class Transition:
    name: str
    doc: str
    build: Callable[..., list[Step]]
    # transitions the reference runs only inside an operation that absorbs afterwards start from any state;
    # the others start from a state some operation just finished (no boundary holes, empty float parked)
    from_settled: bool = True


@dataclass(frozen=True)
class Mutant:
    name: str
    transition: str
    breaks: tuple[str, ...]  # invariant IDs the bug must violate (Z3 finds it, the reference confirms it)
    why: str
    reference: str = ""  # the planted bug of tests/quality/mutants.py it mirrors, if any


# ---------------------------------------------------------------------------------------------
# Shared pieces


def _args(tag: str, names: str) -> list[z3.ArithRef]:
    return [z3.Int(f"{tag}.{n}") for n in names.split()]


def _bools(tag: str, names: str) -> list[z3.BoolRef]:
    return [z3.Bool(f"{tag}.{n}") for n in names.split()]


def set_geom(st: State, b: int, lo=None, hi=None) -> dict:
    los, his = list(st.lo), list(st.hi)
    if lo is not None:
        los[b] = lo
    if hi is not None:
        his[b] = hi
    return {"lo": tuple(los), "hi": tuple(his)}


def clear_content(st: State, b, s, keep: z3.BoolRef | bool = False) -> z3.ArrayRef:
    """``content.pop((cls, slot))`` (a no-op under INV-PAGE-ATOMIC when the slot was not live)."""
    if keep is True:
        return st.content
    bb, ss, e, r = (bvar(k, "clear") for k in ("band", "slot", "entry", "row"))
    return z3.Lambda([bb, ss, e, r], z3.And(st.content[bb, ss, e, r], z3.Not(z3.And(bb == b, ss == s))))


def fresh_vid(st: State, v) -> z3.BoolRef:
    """The new page's id is a freed id or the next fresh one (the reference takes the smallest freed id)."""
    return z3.Or(st.free[v], v == st.next_vid)


def bind(st: State, b, s, v) -> dict:
    """``Arena._bind_new``: bind ``v`` at ``(b, s)`` with a new serial (span and holes are the caller's)."""
    return {"live": z3.Store(st.live, b, s, True), "p2v": z3.Store(st.p2v, b, s, v),
            "bound": z3.Store(st.bound, v, True), "vband": z3.Store(st.vband, v, b),
            "vslot": z3.Store(st.vslot, v, s), "gen": z3.Store(st.gen, v, st.next_gen),
            "next_gen": st.next_gen + 1, "free": z3.Store(st.free, v, False),
            "next_vid": z3.If(v == st.next_vid, st.next_vid + 1, st.next_vid), "content": clear_content(st, b, s)}


def _above(c: Config, st: State, b: int) -> z3.ArithRef:
    """The byte where the present band above ``b`` starts (its gap's top)."""
    if b == LOW:
        return z3.If(float_present(st), lo_byte(c, st, FLOAT), lo_byte(c, st, HIGH))
    return lo_byte(c, st, HIGH)


def _below(c: Config, st: State, b: int) -> z3.ArithRef:
    """The byte where the present band below ``b`` ends (its gap's bottom)."""
    if b == HIGH:
        return z3.If(float_present(st), hi_byte(c, st, FLOAT), hi_byte(c, st, LOW))
    return hi_byte(c, st, LOW)


def frontier_cases(c: Config, st: State, s, slack: bool) -> list[tuple[str, int, z3.BoolRef, dict]]:
    """Rung 1 without holes: a band grows by the one slot adjacent to its growing edge(s), inside the gap.

    ``slack`` is the planted off-by-one: the slot may reach one page past the gap (``fit + 1``).
    """
    P = c.P
    lo, hi = st.lo, st.hi
    k = {b: (P[b] if slack else 0) for b in BANDS}
    return [
        ("low grows up", LOW, z3.And(s == hi[LOW], (s + 1) * P[LOW] <= _above(c, st, LOW) + k[LOW]),
         set_geom(st, LOW, hi=s + 1)),
        ("high grows down", HIGH, z3.And(s == lo[HIGH] - 1, s * P[HIGH] >= _below(c, st, HIGH) - k[HIGH]),
         set_geom(st, HIGH, lo=s)),
        ("float grows up", FLOAT,
         z3.And(float_present(st), s == hi[FLOAT], (s + 1) * P[FLOAT] <= _above(c, st, FLOAT) + k[FLOAT]),
         set_geom(st, FLOAT, hi=s + 1)),
        ("float grows down", FLOAT,
         z3.And(float_present(st), s == lo[FLOAT] - 1, s >= 0,
                s * P[FLOAT] >= _below(c, st, FLOAT) - k[FLOAT]),
         set_geom(st, FLOAT, lo=s)),
        ("float starts", FLOAT,
         z3.And(z3.Not(float_present(st)), s >= 0, s * P[FLOAT] >= _below(c, st, FLOAT) - k[FLOAT],
                (s + 1) * P[FLOAT] <= _above(c, st, FLOAT) + k[FLOAT]),
         set_geom(st, FLOAT, lo=s, hi=s + 1)),
    ]


def use_decided(st: State, b, s, iu: z3.BoolRef, uw: z3.ArithRef) -> z3.BoolRef:
    """``iu`` is ``_in_use((b, s))``, and when true ``uw`` is a live user holding the page (the existential
    "some user holds it" as a chosen witness, so every quantifier of a query stays universal)."""
    u = bvar("user", "nobody")
    return z3.If(iu, z3.And(st.user[uw], st.holds[uw, b, s]),
                 z3.ForAll([u], z3.Not(z3.And(st.user[u], st.holds[u, b, s]))))


def vacate(st: State, b, s, iu: z3.BoolRef, uw: z3.ArithRef, mutant: str | None) -> dict:
    """``Arena._vacate``: a slot whose page left is withheld while a user holds it, else a hole."""
    holder = z3.If(iu, z3.Store(st.holder, b, s, uw), st.holder)
    if mutant in ("vacate-ignores-users",):
        return {"holes": z3.Store(st.holes, b, s, True)}
    if mutant in ("free-loses-slot", "compact-loses-source", "relayout-loses-source"):
        return {"withheld": z3.Store(st.withheld, b, s, iu), "holder": holder}
    return {"withheld": z3.Store(st.withheld, b, s, iu), "holes": z3.Store(st.holes, b, s, z3.Not(iu)),
            "holder": holder}


# ---------------------------------------------------------------------------------------------
# Rung 1: admit / extend place one page


def slot_free(c: Config, st: State, o, b, k, unchecked: bool = False) -> z3.BoolRef:
    """A new page of band ``b`` for owner ``o`` may take recurrent index ``k``: outside the recurrent band any
    ``k``; in it, an index below R that none of the owner's recurrent pages takes (``_check_state_slots``: the
    owner holds fewer than recurrent_slots). ``unchecked`` is the planted bug: any index below R, taken or not."""
    x = bvar("vid", "slotfree")
    taken = z3.ForAll([x], z3.Implies(z3.And(st.held[o, x], is_state(c, st, x)), st.sidx[x] != k))
    free = z3.And(k >= 0, k < c.R, *([] if unchecked else [taken]))
    return z3.Implies(z3.And(c.REC, b == LOW), free)


def copy_rows(st: State, post: State, s, sv) -> z3.ArrayRef:
    """``copy_state``: the new page at ``(LOW, s)`` gets every row of page ``sv`` (the rest as ``post`` has it)."""
    bb, ss, e, r = (bvar(k, "copy") for k in ("band", "slot", "entry", "row"))
    return z3.Lambda([bb, ss, e, r], z3.If(z3.And(bb == LOW, ss == s), st.content[LOW, st.vslot[sv], e, r],
                                           post.content[bb, ss, e, r]))


def _place(c: Config, st: State, tag: str, mutant: str | None, new_owner: bool | None, name: str) -> list[Step]:
    """One page placed by rung 1 for owner ``o``: a new owner (``new_owner``), an existing one (False), or
    either (None: ``copy_state``, whose page copies the rows of recurrent page ``sv``)."""
    o, v, b, s, k = _args(tag, "o v b s k")
    copy = new_owner is None
    vid_ok = fresh_vid(st, v)
    if mutant == "reuse-bound-id":
        vid_ok = z3.Or(vid_ok, st.bound[v])  # the free list holds an id that is still bound
    own = TRUE if copy else st.owner[o] if not new_owner else z3.Not(st.owner[o])
    own = z3.And(own, slot_free(c, st, o, b, k, unchecked=mutant in ("over-slots", "copy-over-slots")))
    held = ({"held": z3.Store(st.held, o, v, True), "owner_of": z3.Store(st.owner_of, v, o)}
            if mutant != "leak" else {})
    owner = {"owner": z3.Store(st.owner, o, True)} if new_owner is not False else {}
    held["sidx"] = z3.Store(st.sidx, v, k)
    args = {"o": o, "v": v, "b": b, "s": s, "k": k}
    if copy:
        (sv,) = _args(tag, "sv")
        own = z3.And(own, is_state(c, st, sv), b == LOW)
        args["sv"] = sv
    steps = []
    # a hole of any band (first_holes); the planted bugs hand out a withheld slot or keep the hole
    if mutant == "reuse-withheld":
        hole_guard, slot_upd = st.withheld[b, s], {"withheld": z3.Store(st.withheld, b, s, False)}
    elif mutant == "keep-hole":
        hole_guard, slot_upd = st.holes[b, s], {}
    else:
        hole_guard, slot_upd = st.holes[b, s], {"holes": z3.Store(st.holes, b, s, False)}
    steps.append(Step(name, "at a hole", z3.And(own, vid_ok, is_band(b), hole_guard),
                      st.update(**bind(st, b, s, v), **slot_upd, **held, **owner), args))
    if mutant not in ("reuse-withheld", "keep-hole"):
        for case, band, g, geom in frontier_cases(c, st, s, slack=mutant == "cross-band"):
            if copy and band != LOW:
                continue
            steps.append(Step(name, case, z3.And(own, vid_ok, b == band, g),
                              st.update(**bind(st, band, s, v), **geom, **held, **owner), args))
    if copy:
        to = s + 1 if mutant == "copy-off-by-one" else s  # the planted bug writes the rows one slot up
        steps = [Step(x.transition, x.case, x.guard, x.post.update(content=copy_rows(st, x.post, to, args["sv"])),
                      x.args) for x in steps]
    return steps


def admit(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``admit(owner, demand)``: a new owner and one new page of its demand, placed by rung 1."""
    return _place(c, st, tag, mutant, True, "admit")


def copy_state(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``copy_state(owner, sv)``: the owner (new or existing, with a free recurrent slot) gets a new page of the
    recurrent band holding every row of bound recurrent page ``sv``, placed by rung 1 (rungs 2-3 are the move
    steps before it, as for admit)."""
    return _place(c, st, tag, mutant, None, "copy_state")


def extend(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``extend(owner, demand)``: one more page for an existing owner, placed by rung 1."""
    return _place(c, st, tag, mutant, False, "extend")


# ---------------------------------------------------------------------------------------------
# Owners: share / slide / free


def share(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``share(owner, [v])``: the owner (created if new) also holds bound page ``v`` it did not hold; a page of
    the recurrent class is never shared (``_check_not_state``)."""
    o, v = _args(tag, "o v")
    ok = z3.And(z3.Not(st.held[o, v]), st.bound[v] if mutant != "share-unbound" else TRUE)
    if mutant != "share-state":
        ok = z3.And(ok, z3.Not(is_state(c, st, v)))
    post = st.update(owner=z3.Store(st.owner, o, True), held=z3.Store(st.held, o, v, True))
    return [Step("share", "one page", ok, post, {"o": o, "v": v})]


def slide(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``slide(owner, cls, 1)`` (and each page of ``drop``): the owner lets go of one page it holds; the page
    is freed if no other owner holds it (``_unref`` / ``_free_page`` / ``_vacate``)."""
    o, v, o2, uw = _args(tag, "o v other user")
    last, iu = _bools(tag, "last iu")
    b, s = st.vband[v], st.vslot[v]
    x = bvar("owner", tag)
    if mutant == "free-while-shared":  # the count reached 0 although another owner holds the page
        decided = last
    else:  # last: no other owner holds v; else o2 is one that does
        decided = z3.If(last, z3.ForAll([x], z3.Implies(x != o, z3.Not(z3.And(st.owner[x], st.held[x, v])))),
                        z3.And(o2 != o, st.owner[o2], st.held[o2, v]))
    guard = z3.And(st.owner[o], st.held[o, v], decided, use_decided(st, b, s, iu, uw))
    freed = {"bound": z3.Store(st.bound, v, False), "free": z3.Store(st.free, v, True),
             "live": z3.Store(st.live, b, s, False),
             "content": clear_content(st, b, s, keep=mutant == "free-keeps-rows"), **vacate(st, b, s, iu, uw, mutant)}
    upd = {k: z3.If(last, term, getattr(st, k)) for k, term in freed.items()}
    owner_of = z3.If(z3.And(z3.Not(last), st.owner_of[v] == o), z3.Store(st.owner_of, v, o2), st.owner_of)
    post = st.update(held=z3.Store(st.held, o, v, False), owner_of=owner_of, **upd)
    return [Step("slide", "one page", guard, post, {"o": o, "v": v, "last": last, "iu": iu})]


def free(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``free(owner)``: the owner lets go of every page (all classes) and is forgotten; each page no other
    owner holds is freed: unbound, its rows dropped, its slot withheld if a user holds it, else a hole."""
    (o,) = _args(tag, "o")
    FR = z3.Array(f"{tag}.freed", z3.IntSort(), z3.BoolSort())  # the pages whose last owner this is
    NW = z3.Array(f"{tag}.next_owner", z3.IntSort(), z3.IntSort())  # another owner of each page that stays
    IU = z3.Array(f"{tag}.in_use", z3.IntSort(), z3.IntSort(), z3.BoolSort())
    UW = z3.Array(f"{tag}.user", z3.IntSort(), z3.IntSort(), z3.IntSort())
    x, o2, bb, ss, u, e, r = (bvar(k, tag) for k in ("vid", "owner", "band", "slot", "user", "entry", "row"))
    if mutant == "free-leaks":  # the owner is deleted, its pages are never unreferenced
        owners_decided = z3.ForAll([x], z3.Not(FR[x]))
    else:
        owners_decided = z3.And(
            z3.ForAll([x, o2], z3.Implies(z3.And(FR[x], o2 != o), z3.Not(z3.And(st.owner[o2], st.held[o2, x])))),
            z3.ForAll([x], z3.Implies(FR[x], st.held[o, x])),
            z3.ForAll([x], z3.Implies(z3.And(st.held[o, x], z3.Not(FR[x])),
                                      z3.And(NW[x] != o, st.owner[NW[x]], st.held[NW[x], x]))))
    users_decided = z3.And(
        z3.ForAll([bb, ss], z3.Implies(IU[bb, ss], z3.And(st.user[UW[bb, ss]], st.holds[UW[bb, ss], bb, ss]))),
        z3.ForAll([bb, ss, u], z3.Implies(z3.Not(IU[bb, ss]), z3.Not(z3.And(st.user[u], st.holds[u, bb, ss])))))
    guard = z3.And(st.owner[o], owners_decided, users_decided)
    goes = z3.And(st.live[bb, ss], FR[st.p2v[bb, ss]])
    holes = (z3.Lambda([bb, ss], z3.Or(st.holes[bb, ss], goes)) if mutant == "vacate-ignores-users" else
             st.holes if mutant == "free-loses-slot" else
             z3.Lambda([bb, ss], z3.Or(st.holes[bb, ss], z3.And(goes, z3.Not(IU[bb, ss])))))
    withheld = (st.withheld if mutant == "vacate-ignores-users" else
                z3.Lambda([bb, ss], z3.Or(st.withheld[bb, ss], z3.And(goes, IU[bb, ss]))))
    content = (st.content if mutant == "free-keeps-rows" else
               z3.Lambda([bb, ss, e, r], z3.And(st.content[bb, ss, e, r],
                                                z3.Not(z3.And(st.live[bb, ss], FR[st.p2v[bb, ss]])))))
    owner_of = (st.owner_of if mutant == "free-leaks" else
                z3.Lambda([x], z3.If(st.owner_of[x] == o, NW[x], st.owner_of[x])))
    post = st.update(
        owner=z3.Store(st.owner, o, False),
        held=z3.Lambda([qo, qv], z3.And(st.held[qo, qv], qo != o)),
        bound=z3.Lambda([x], z3.And(st.bound[x], z3.Not(FR[x]))),
        free=z3.Lambda([x], z3.Or(st.free[x], FR[x])),
        live=z3.Lambda([bb, ss], z3.And(st.live[bb, ss], z3.Not(FR[st.p2v[bb, ss]]))),
        holes=holes, withheld=withheld, content=content, owner_of=owner_of,
        holder=z3.Lambda([bb, ss], z3.If(z3.And(goes, IU[bb, ss]), UW[bb, ss], st.holder[bb, ss])))
    return [Step("free", "every page", guard, post, {"o": o, "freed": FR})]


# ---------------------------------------------------------------------------------------------
# Ledger: acquire / release


def acquire(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``acquire(user, kind, vids)``: a new user holds the physical pages its (bound, distinct) vids are at,
    recording vid and serial; ``writes`` is the kind's mode. At least one page (an acquire of none is refused):
    ``(ab, aslot)`` names one."""
    u, ab, aslot = _args(tag, "u ab aslot")
    (wr,) = _bools(tag, "writes")
    ACQ = z3.Array(f"{tag}.pages", z3.IntSort(), z3.IntSort(), z3.BoolSort())
    x, bb, ss = (bvar(k, tag) for k in ("user", "band", "slot"))
    ok = st.live[bb, ss] if mutant != "acquire-hole" else z3.Or(st.live[bb, ss], st.holes[bb, ss])
    guard = z3.And(z3.Not(st.user[u]), ACQ[ab, aslot], z3.ForAll([bb, ss], z3.Implies(ACQ[bb, ss], ok)))
    row = z3.And(x == u)
    post = st.update(
        user=z3.Store(st.user, u, True), writes=z3.Store(st.writes, u, wr),
        holds=z3.Lambda([x, bb, ss], z3.If(row, ACQ[bb, ss], st.holds[x, bb, ss])),
        hold_vid=z3.Lambda([x, bb, ss], z3.If(row, st.p2v[bb, ss], st.hold_vid[x, bb, ss])),
        hold_gen=z3.Lambda([x, bb, ss], z3.If(row, st.gen[st.p2v[bb, ss]], st.hold_gen[x, bb, ss])))
    return [Step("acquire", "a set of pages", guard, post,
                 {"u": u, "writes": wr, "pages": ACQ, "ab": ab, "aslot": aslot})]


def release(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``release(user)``: the user ends; each withheld slot it held that no other live user holds becomes a
    hole."""
    (u,) = _args(tag, "u")
    OTHER = z3.Array(f"{tag}.other", z3.IntSort(), z3.IntSort(), z3.BoolSort())  # another user holds the slot
    OW = z3.Array(f"{tag}.other_user", z3.IntSort(), z3.IntSort(), z3.IntSort())  # ... namely this one
    u2, bb, ss = (bvar(k, tag) for k in ("user", "band", "slot"))
    others_decided = z3.And(
        z3.ForAll([bb, ss], z3.Implies(OTHER[bb, ss], z3.And(OW[bb, ss] != u, st.user[OW[bb, ss]],
                                                             st.holds[OW[bb, ss], bb, ss]))),
        z3.ForAll([bb, ss, u2], z3.Implies(z3.And(z3.Not(OTHER[bb, ss]), u2 != u),
                                           z3.Not(z3.And(st.user[u2], st.holds[u2, bb, ss])))))
    guard = z3.And(st.user[u], others_decided)
    conv = z3.And(st.holds[u, bb, ss], st.withheld[bb, ss], z3.Not(OTHER[bb, ss]))
    if mutant == "release-keeps-withheld":
        conv = z3.BoolVal(False)
    withheld = z3.Lambda([bb, ss], z3.And(st.withheld[bb, ss], z3.Not(conv)))
    holes = (st.holes if mutant == "release-loses-slot" else
             z3.Lambda([bb, ss], z3.Or(st.holes[bb, ss], conv)))
    holder = z3.Lambda([bb, ss], z3.If(z3.And(st.holder[bb, ss] == u, OTHER[bb, ss]), OW[bb, ss],
                                      st.holder[bb, ss]))
    post = st.update(user=z3.Store(st.user, u, False), withheld=withheld, holes=holes, holder=holder)
    return [Step("release", "one user", guard, post, {"u": u})]


# ---------------------------------------------------------------------------------------------
# Data


def write(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``write(vid, entry, row, tag)``: a row of an entry of a bound page gets content."""
    v, e, r = _args(tag, "v e r")
    b, s = st.vband[v], st.vslot[v]
    rng = z3.And(e >= 0, e < pick(b, c.NE), r >= 0, r < pick(b, c.NR))
    guard = z3.And(st.bound[v], rng if mutant != "write-unchecked-row" else TRUE)
    return [Step("write", "one row", guard, st.update(content=z3.Store(st.content, b, s, e, r, True)),
                 {"v": v, "e": e, "r": r})]


# ---------------------------------------------------------------------------------------------
# Moves: move / compact / relayout


def _move_post(st: State, b, src, dst, iu: z3.BoolRef, uw, mutant: str | None, tag: str) -> tuple[State, dict]:
    """``Arena._move``: the page at ``src`` goes to hole ``dst`` of the same band with all its rows; the vid
    is remapped; ``src`` is vacated."""
    v = st.p2v[b, src]
    bb, ss, e, r = (bvar(k, tag + ".move") for k in ("band", "slot", "entry", "row"))
    extra: dict = {}
    if mutant == "partial-layer-move":  # dst gets one written row; src keeps them all
        e0, r0 = _args(tag, "e0 r0")
        extra = {"e0": e0, "r0": r0}
        content = z3.Lambda([bb, ss, e, r], z3.If(
            z3.And(bb == b, ss == dst), z3.And(st.content[b, src, e, r], e == e0, r == r0), st.content[bb, ss, e, r]))
    else:
        content = z3.Lambda([bb, ss, e, r], z3.If(
            z3.And(bb == b, ss == dst), st.content[b, src, e, r],
            z3.If(z3.And(bb == b, ss == src), False, st.content[bb, ss, e, r])))
    holes = z3.Store(st.holes, b, dst, False)
    upd = vacate(st.update(holes=holes), b, src, iu, uw, mutant)
    upd.setdefault("holes", holes)
    post = st.update(live=z3.Store(z3.Store(st.live, b, src, False), b, dst, True),
                     p2v=z3.Store(st.p2v, b, dst, v),
                     vslot=st.vslot if mutant == "stale-v2p" else z3.Store(st.vslot, v, dst),
                     content=content, **upd)
    return post, extra


def move(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``Arena._move`` as ledger rules 2-4 allow it: a live page without a writer to a hole of its band."""
    b, src, dst, uw = _args(tag, "b src dst user")
    (iu,) = _bools(tag, "iu")
    dst_ok = (z3.Not(in_span(st, b, dst)) if mutant == "move-to-gap" else
              st.withheld[b, dst] if mutant == "move-onto-withheld" else st.holes[b, dst])
    movable = z3.Not(has_writer(st, b, src)) if mutant != "move-written-page" else TRUE
    guard = z3.And(is_band(b), st.live[b, src], dst_ok, movable, use_decided(st, b, src, iu, uw))
    post, extra = _move_post(st, b, src, dst, iu, uw, mutant, tag)
    return [Step("move", "one page", guard, post, {"b": b, "src": src, "dst": dst, **extra})]


def pinned(st: State, b, x, mutant: str | None = None) -> z3.BoolRef:
    """``Arena._barrier``'s slots: withheld, or held by a writer (the planted bug forgets the writers)."""
    if mutant == "move-page-with-writer":
        return st.withheld[b, x]
    return z3.Or(st.withheld[b, x], has_writer(st, b, x))


def compact(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """One step of ``plan_compaction``: in an end band, the farthest live page goes to the hole nearest the
    anchor, while that hole is nearer the anchor than the page and the page is beyond the band's barrier (the
    farthest slot that cannot move: withheld, or held by a writer)."""
    src, dst, uw = _args(tag, "src dst user")
    x = bvar("slot", tag)
    (iu,) = _bools(tag, "iu")
    steps = []
    for band, up in ((LOW, True), (HIGH, False)):
        def nearer(a, z, up=up):
            return a < z if up else a > z

        nearest_hole = z3.ForAll([x], z3.Implies(st.holes[band, x], z3.Not(nearer(x, dst))))
        farthest_live = z3.ForAll([x], z3.Implies(z3.And(st.live[band, x], nearer(src, x)), False))
        beyond_barrier = z3.ForAll([x], z3.Implies(pinned(st, band, x, mutant), nearer(x, src)))
        guard = z3.And(st.holes[band, dst], nearest_hole, st.live[band, src], farthest_live, nearer(dst, src),
                       beyond_barrier, use_decided(st, band, src, iu, uw))
        post, extra = _move_post(st, band, src, dst, iu, uw, mutant, tag)
        replay = TRUE
        if band == HIGH:  # compact(max_moves=1) makes the low band's move first, if it has one
            h, s2, y = bvar("slot", tag + ".h"), bvar("slot", tag + ".s"), bvar("slot", tag + ".y")
            blocked = z3.Exists([y], z3.And(pinned(st, LOW, y, mutant), y >= s2))
            replay = z3.ForAll([h, s2], z3.Implies(z3.And(st.holes[LOW, h], st.live[LOW, s2], h < s2), blocked))
        steps.append(Step("compact", f"{'low' if up else 'high'} band", guard, post,
                          {"b": z3.IntVal(band), "src": src, "dst": dst, **extra}, replay))
    return steps


def relayout_grow(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``_retarget_float``, first part: the float's span grows by one slot of the gap (a new hole), or an
    empty float starts at one; rung 3 keeps the target inside the room the ends leave."""
    (s,) = _args(tag, "s")
    out = []
    for case, band, g, geom in frontier_cases(c, st, s, slack=mutant == "grow-crosses"):
        if band != FLOAT:
            continue
        out.append(Step("relayout_grow", case, g, st.update(holes=z3.Store(st.holes, FLOAT, s, True), **geom),
                        {"s": s}))
    return out


def relayout_move(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``_retarget_float``, second part: a float page with no ledger user moves to a hole of the grown span."""
    src, dst, uw = _args(tag, "src dst user")
    (iu,) = _bools(tag, "iu")
    free_of_users = z3.Not(in_use(st, FLOAT, src)) if mutant != "relayout-ignores-users" else TRUE
    guard = z3.And(st.live[FLOAT, src], st.holes[FLOAT, dst], free_of_users,
                   use_decided(st, FLOAT, src, iu, uw))
    post, extra = _move_post(st, z3.IntVal(FLOAT), src, dst, iu, uw, mutant, tag)
    return [Step("relayout_move", "one page", guard, post, {"b": z3.IntVal(FLOAT), "src": src, "dst": dst,
                                                            **extra})]


def relayout_trim(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """``_retarget_float``, last part: the span becomes the target ``[t, t_end)``; every slot left outside is
    a hole (sources moved in, obstacles inside the target), and goes back to the gap."""
    t, t_end = _args(tag, "t t_end")
    x, bb, ss = bvar("slot", tag), bvar("band", tag + ".l"), bvar("slot", tag + ".l")
    outside = z3.And(in_span(st, FLOAT, x), z3.Not(z3.And(t <= x, x < t_end)))
    ok = st.holes[FLOAT, x] if mutant != "trim-drops-withheld" else z3.Or(st.holes[FLOAT, x],
                                                                          st.withheld[FLOAT, x])
    guard = z3.And(st.lo[FLOAT] <= t, t < t_end, t_end <= st.hi[FLOAT], z3.ForAll([x], z3.Implies(outside, ok)))
    gone = z3.And(bb == FLOAT, in_span(st, FLOAT, ss), z3.Not(z3.And(t <= ss, ss < t_end)))
    post = st.update(holes=z3.Lambda([bb, ss], z3.And(st.holes[bb, ss], z3.Not(gone))),
                     **set_geom(st, FLOAT, lo=t, hi=t_end))
    return [Step("relayout_trim", "to the target", guard, post, {"t": t, "t_end": t_end})]


def absorb(c: Config, st: State, tag: str, mutant: str | None = None) -> list[Step]:
    """One step of ``Band.absorb_boundary_holes``: a hole on an edge a band grows from goes back to the gap
    (the low band's top, the high band's bottom, either edge of a float); an emptied float is parked."""
    lo, hi = st.lo, st.hi
    edge = st.withheld if mutant == "absorb-withheld" else st.holes
    cases = [("low top", LOW, hi[LOW] - 1, set_geom(st, LOW, hi=hi[LOW] - 1)),
             ("high bottom", HIGH, lo[HIGH], set_geom(st, HIGH, lo=lo[HIGH] + 1))]
    for case, s, new_lo, new_hi in (("float top", hi[FLOAT] - 1, lo[FLOAT], hi[FLOAT] - 1),
                                    ("float bottom", lo[FLOAT], lo[FLOAT] + 1, hi[FLOAT])):
        emptied = new_lo == new_hi
        cases.append((case, FLOAT, s, set_geom(st, FLOAT, lo=z3.If(emptied, 0, new_lo), hi=z3.If(emptied, 0, new_hi))))
    if mutant == "absorb-low-bottom":  # the low band gives back a hole at its anchor edge
        cases.append(("low bottom", LOW, lo[LOW], set_geom(st, LOW, lo=lo[LOW] + 1)))
    out = []
    for case, band, s, geom in cases:
        guard = z3.And(lo[band] < hi[band], edge[band, s])
        post = st.update(holes=z3.Store(st.holes, band, s, False), **geom)
        # Band.absorb_boundary_holes works the top edge first: a bottom step is its first only if the top is not
        # a hole
        replay = z3.Not(st.holes[band, hi[band] - 1]) if case in ("float bottom", "low bottom") else TRUE
        out.append(Step("absorb", case, guard, post, {"b": z3.IntVal(band), "s": s}, replay))
    return out


TRANSITIONS: tuple[Transition, ...] = (
    Transition("admit", admit.__doc__ or "", admit),
    Transition("extend", extend.__doc__ or "", extend),
    Transition("share", share.__doc__ or "", share),
    Transition("copy_state", copy_state.__doc__ or "", copy_state),
    Transition("slide", slide.__doc__ or "", slide),
    Transition("free", free.__doc__ or "", free),
    Transition("acquire", acquire.__doc__ or "", acquire),
    Transition("release", release.__doc__ or "", release),
    Transition("write", write.__doc__ or "", write),
    Transition("move", move.__doc__ or "", move),
    Transition("compact", compact.__doc__ or "", compact),
    Transition("relayout_grow", relayout_grow.__doc__ or "", relayout_grow, from_settled=False),
    Transition("relayout_move", relayout_move.__doc__ or "", relayout_move, from_settled=False),
    Transition("relayout_trim", relayout_trim.__doc__ or "", relayout_trim, from_settled=False),
    Transition("absorb", absorb.__doc__ or "", absorb, from_settled=False),
)
BY_NAME = {t.name: t for t in TRANSITIONS}

NO, BO, LS, PA, VM, BC, FF = ("INV-NO-OVERLAP", "INV-BAND-ORDER", "INV-LEDGER-SAFETY", "INV-PAGE-ATOMIC",
                              "INV-VMAP-BIJECTIVE", "INV-BYTE-CONSERVATION", "INV-FEASIBILITY-FLOOR")
SP = "INV-STATE-PRIVATE"

MUTANTS = (  # the planted bugs, by transition: each must break the IDs it names
    Mutant("reuse-withheld", "admit", (LS,), "rung 1 hands out a withheld slot a user still reads"),
    Mutant("keep-hole", "admit", (NO, BC), "the new page's slot stays a hole too (counted twice)"),
    Mutant("cross-band", "admit", (BO,), "a frontier grows one page past its gap into the neighbour",
           "overlap-off-by-one-frontier"),
    Mutant("reuse-bound-id", "admit", (VM,), "the free-id heap holds an id that is still bound"),
    Mutant("reuse-withheld", "extend", (LS,), "rung 1 hands out a withheld slot a user still reads"),
    Mutant("cross-band", "extend", (NO, BO, BC), "a frontier grows one page past its gap into the neighbour",
           "overlap-off-by-one-frontier"),
    Mutant("leak", "extend", (VM,), "the page is bound but the owner does not record it"),
    Mutant("share-unbound", "share", (VM,), "share does not check that the id is bound"),
    Mutant("share-state", "share", (SP,), "share does not refuse a recurrent page: two owners hold one state"),
    Mutant("over-slots", "extend", (SP,), "extend does not check recurrent_slots: an owner's second state"),
    Mutant("reuse-withheld", "copy_state", (LS,), "the copy is placed on a withheld slot a user still reads"),
    Mutant("keep-hole", "copy_state", (NO, BC), "the copy's slot stays a hole too (counted twice)"),
    Mutant("cross-band", "copy_state", (BO,), "the low frontier grows one page past its gap for the copy",
           "overlap-off-by-one-frontier"),
    Mutant("reuse-bound-id", "copy_state", (VM,), "the copy takes an id that is still bound"),
    Mutant("copy-off-by-one", "copy_state", (PA,), "the rows are copied one slot past the new page"),
    Mutant("copy-over-slots", "copy_state", (SP,), "copy_state does not check recurrent_slots of the owner"),
    Mutant("vacate-ignores-users", "slide", (LS,), "a freed page still used by a transfer becomes a hole",
           "reuse-withheld-page"),
    Mutant("free-while-shared", "slide", (VM,), "the page is freed although another owner holds it",
           "double-free-accepted"),
    Mutant("free-keeps-rows", "slide", (PA,), "a freed page's rows stay behind for the next owner"),
    Mutant("free-loses-slot", "slide", (NO, BC), "the freed slot becomes neither a hole nor withheld"),
    Mutant("vacate-ignores-users", "free", (LS,), "a freed page still used by a transfer becomes a hole",
           "reuse-withheld-page"),
    Mutant("free-leaks", "free", (VM,), "the owner is forgotten but its pages are never unreferenced"),
    Mutant("free-keeps-rows", "free", (PA,), "a freed page's rows stay behind for the next owner"),
    Mutant("free-loses-slot", "free", (NO, BC), "the freed slot becomes neither a hole nor withheld"),
    Mutant("acquire-hole", "acquire", (LS,), "acquire records a slot that is not live (a stale translation)"),
    Mutant("release-keeps-withheld", "release", (LS,), "the last user leaves but the slot stays withheld"),
    Mutant("release-loses-slot", "release", (NO, BC), "the last user leaves and the slot vanishes from the band"),
    Mutant("write-unchecked-row", "write", (PA,), "write does not check the entry / row range"),
    Mutant("move-written-page", "move", (LS,), "a page a writer holds is moved", "move-page-with-writer"),
    Mutant("stale-v2p", "move", (VM,), "the move does not remap the virtual page", "stale-v2p-after-move"),
    Mutant("partial-layer-move", "move", (PA,), "the move copies one row; the others stay at the old slot",
           "partial-layer-move"),
    Mutant("move-to-gap", "move", (NO, BC), "the destination is a gap slot outside the band's span"),
    Mutant("move-onto-withheld", "move", (NO,), "the destination is a withheld slot a ledger user still holds"),
    Mutant("move-page-with-writer", "compact", (LS,), "compaction moves a page a writer holds",
           "move-page-with-writer"),
    Mutant("stale-v2p", "compact", (VM,), "the move does not remap the virtual page", "stale-v2p-after-move"),
    Mutant("partial-layer-move", "compact", (PA,), "the move copies one row; the others stay at the old slot",
           "partial-layer-move"),
    Mutant("compact-loses-source", "compact", (NO, BC), "the moved page's old slot becomes nothing"),
    Mutant("grow-crosses", "relayout_grow", (NO, BO, BC), "the float's target reaches one page into a neighbour"),
    Mutant("relayout-ignores-users", "relayout_move", (LS,), "rung 3 moves a float page a user holds",
           "relayout-ignores-users"),
    Mutant("stale-v2p", "relayout_move", (VM,), "the move does not remap the virtual page",
           "stale-v2p-after-move"),
    Mutant("partial-layer-move", "relayout_move", (PA,), "the move copies one row; the others stay behind",
           "partial-layer-move"),
    Mutant("relayout-loses-source", "relayout_move", (NO, BC), "the moved page's old slot becomes nothing"),
    Mutant("trim-drops-withheld", "relayout_trim", (NO, BC), "the target span leaves a withheld slot outside",
           "relayout-ignores-users"),
    Mutant("absorb-withheld", "absorb", (NO, BC), "absorption gives a withheld boundary slot to the gap"),
    Mutant("absorb-low-bottom", "absorb", (BO,), "the low band gives back a hole at its anchor (byte 0)"),
)

# Obligations with no planted bug, and why none is meaningful. Pairs where the transition writes no field
# the invariant reads are "frame" obligations, found and checked mechanically by the harness.
NO_MUTANT: dict[tuple[str, str], str] = {
    ("admit", PA): "binding only makes a slot live and clears its rows: both can only strengthen PAGE-ATOMIC; "
                   "rows come from write (write-unchecked-row) and leave with moves and frees",
    ("extend", PA): "binding only makes a slot live and clears its rows: both can only strengthen PAGE-ATOMIC",
    ("admit", SP): "a new owner holds no page, so any index below recurrent_slots is free: one new page cannot "
                   "exceed the cap (R >= 1) nor be held twice; the cap of more pages is extend's (over-slots)",
    ("slide", SP): "letting go of a page only removes a holding (and may unbind it): both only weaken the "
                   "antecedents of one-owner and slots",
    ("free", SP): "an owner letting go of everything only removes holdings and unbinds: both only weaken the "
                  "antecedents of one-owner and slots",
    ("relayout_grow", LS): "the new hole is a gap slot, and no user holds a gap slot (a held slot is live or "
                           "withheld, hence inside its span): no slot choice can break the ledger",
    ("relayout_trim", LS): "the trim removes only holes from the span; a trim that leaves a withheld slot "
                           "outside breaks NO-OVERLAP (trim-drops-withheld) while the hold still finds its slot "
                           "withheld",
    ("relayout_trim", BO): "a trim only shrinks the float's span inside its old span, which keeps the chain "
                           "order; a span that reaches a neighbour is relayout_grow's bug (grow-crosses)",
    ("absorb", LS): "absorption removes a hole, and a hole has no user; absorbing a withheld slot breaks "
                    "NO-OVERLAP (absorb-withheld) while the hold still finds its slot withheld",
}

INIT_MUTANTS: tuple[Mutant, ...] = (
    Mutant("init-skips-floor", "init", (FF,), "construction does not check the feasibility floor"),
    Mutant("init-high-unanchored", "init", (BO,), "the high band starts at slot 0 instead of its top"),
)


def init_mutant(c: Config, st: State, name: str) -> z3.BoolRef:
    """``Init`` with one planted bug of the constructor."""
    body = init(c, st).children()
    if name == "init-skips-floor":
        floor = floor_ok(c)
        return z3.And(*[a for a in body if not a.eq(floor)])
    if name == "init-high-unanchored":
        anchors = (st.lo[HIGH] == c.TOP, st.hi[HIGH] == c.TOP)
        kept = [a for a in body if not any(a.eq(x) for x in anchors)]
        return z3.And(*kept, st.lo[HIGH] == 0, st.hi[HIGH] == 0)
    raise KeyError(name)
