"""The symbolic arena (spec/arena.md §State, §Invariants; proofs/README.md): state, Init, invariant conjuncts by ID.

One Z3 term per field of the reference's state, named after it, so the model and ``reference/arena.py`` can
be read side by side:

- ``lo[b]``, ``hi[b]``: ``Band.lo``, ``Band.hi``, one Int per band (``LOW``, ``FLOAT``, ``HIGH``);
- ``live[b, s]``, ``p2v[b, s]``: ``slot in Band.live``, ``Band.live[slot]`` (the p->v map);
- ``holes[b, s]``, ``withheld[b, s]``: ``Band.holes``, ``Band.withheld``;
- ``bound[v]``, ``vband[v]``, ``vslot[v]``: ``vid in Arena.v2p``, ``Arena.v2p[vid]``;
- ``gen[v]``, ``next_gen``: ``Arena.gen``, ``Arena._next_gen``;
- ``free[v]``, ``next_vid``: ``vid in Arena._free_vids``, ``Arena._next_vid``;
- ``owner[o]``, ``held[o, v]``: ``o in Arena.owners``, ``v in Arena.owners[o][cls]``;
- ``user[u]``, ``writes[u]``: ``u in Arena.users``, ``Arena.users[u].mode is Mode.WRITE``;
- ``holds[u, b, s]``, ``hold_vid[u, b, s]``, ``hold_gen[u, b, s]``: a ``Hold(cls, slot, vid, gen)`` of user ``u``;
- ``content[b, s, e, r]``: ``(e, r) in Arena.content[(cls, slot)]``.

Slots, virtual ids, owners and users are unbounded integers. The model fixes the chain to three bands
(``LOW | FLOAT | HIGH``, the tri-pool shape; a two-band chain is the case where the float is never used);
that is the one structural bound, stated in proofs/README.md (Bounds).

The reference's counters are *derived* in the model: ``refs[v]`` is the number of owners holding ``v`` and
``readers`` / ``writers`` count users, so the model keeps the owners and users themselves and reads "has a
user" and "has a writer" as quantified formulas over them. The reference's conjuncts that compare a counter
with its recount ("reference counts equal the number of owners", "use counts drifted") are therefore
definitional here; see ``DEFINITIONAL``.

Every conjunct is universally quantified. The two that say "there is one" (no bound page is ownerless; every
withheld slot has a user) are Skolemized: the ghost fields ``owner_of[v]`` and ``holder[b, s]`` name that owner
and that user, and each transition that could take the witness away names a new one (a transition argument
constrained by its guard). With an existential left in, Z3 answered ``unknown`` on some obligations; without,
each query takes milliseconds. The ghosts have no counterpart in the reference and the replay ignores them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import z3

LOW, FLOAT, HIGH = 0, 1, 2
BANDS = (LOW, FLOAT, HIGH)
BAND_NAMES = {LOW: "low", FLOAT: "float", HIGH: "high"}

INT = z3.IntSort()
BOOL = z3.BoolSort()

# Bound variables are named ``role#tag``: the role (what the integer indexes) lets the witness search of the
# harness instantiate a quantifier over a finite domain of that role (proofs/README.md, Bounds, "Witnesses").
ROLES = ("band", "slot", "vid", "owner", "user", "entry", "row")


def bvar(role: str, tag: str) -> z3.ArithRef:
    assert role in ROLES, role
    return z3.Int(f"{role}#{tag}")


qb, qs, qv, qo, qu, qe, qr = (bvar(r, "q") for r in ROLES)


# ---------------------------------------------------------------------------------------------
# The configuration: constants, never written by a transition (ArenaConfig is frozen).


@dataclass(frozen=True)
class Config:
    C: z3.ArithRef  # capacity, bytes
    P: tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]  # page bytes per band
    TOP: z3.ArithRef  # capacity // P[HIGH]: the high band's anchor slot
    NE: tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]  # entries per page
    NR: tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]  # rows per entry
    D: tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]  # worst-case demand (pages) per band
    Q: z3.ArithRef  # ghost: ceil(D[LOW] * P[LOW] / P[FLOAT]) (the first float slot above the worst low band)
    REC: z3.BoolRef  # the low band is the recurrent class (chain() puts the one recurrent class first)
    R: z3.ArithRef  # ArenaConfig.recurrent_slots: recurrent pages one owner may hold


def config(tag: str = "cfg") -> Config:
    def three(n: str) -> tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]:
        return tuple(z3.Int(f"{tag}.{n}{b}") for b in BANDS)  # type: ignore[return-value]

    return Config(z3.Int(f"{tag}.C"), three("P"), z3.Int(f"{tag}.TOP"), three("NE"), three("NR"), three("D"),
                  z3.Int(f"{tag}.Q"), z3.Bool(f"{tag}.REC"), z3.Int(f"{tag}.R"))


def config_ok(c: Config) -> z3.BoolRef:
    """What ArenaConfig.validate and the layouts guarantee (page bytes > 0, top = capacity // P_high)."""
    return z3.And(c.C > 0, *[p > 0 for p in c.P], *[n >= 1 for n in c.NE], *[n >= 1 for n in c.NR],
                  *[d >= 0 for d in c.D], c.R >= 1,
                  c.TOP * c.P[HIGH] <= c.C, (c.TOP + 1) * c.P[HIGH] > c.C,
                  (c.Q - 1) * c.P[FLOAT] < c.D[LOW] * c.P[LOW], c.D[LOW] * c.P[LOW] <= c.Q * c.P[FLOAT])


def floor_ok(c: Config) -> z3.BoolRef:
    """INV-FEASIBILITY-FLOOR: rung 1 (``place``) fits the worst case ``D`` on the empty three-band chain.

    ``place`` on empty bands: the low band grows up from byte 0, the high band down from ``TOP * P_high``,
    and the empty float takes the first aligned run above the low band (``s_min = ceil(D_low P_low / P_float)``)
    that ends below the high band. Each ``min(pages, room // P)`` is exact iff ``pages * P <= room``.
    """
    low, flt, high = c.D[LOW] * c.P[LOW], c.D[FLOAT] * c.P[FLOAT], c.D[HIGH] * c.P[HIGH]
    anchor = c.TOP * c.P[HIGH]
    return z3.And(low <= anchor, low + high <= anchor,
                  z3.Or(c.D[FLOAT] == 0, c.Q * c.P[FLOAT] + flt <= anchor - high))


def pick(b: z3.ArithRef | int, three: tuple) -> z3.ExprRef:
    """``three[b]`` for a symbolic band index."""
    if isinstance(b, int):
        return three[b]
    return z3.If(b == LOW, three[LOW], z3.If(b == FLOAT, three[FLOAT], three[HIGH]))


def is_band(b: z3.ArithRef) -> z3.BoolRef:
    return z3.And(b >= LOW, b <= HIGH)


# ---------------------------------------------------------------------------------------------
# The state


@dataclass(frozen=True)
class State:
    lo: tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]
    hi: tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]
    live: z3.ArrayRef  # (band, slot) -> Bool
    p2v: z3.ArrayRef  # (band, slot) -> vid
    holes: z3.ArrayRef  # (band, slot) -> Bool
    withheld: z3.ArrayRef  # (band, slot) -> Bool
    bound: z3.ArrayRef  # vid -> Bool
    vband: z3.ArrayRef  # vid -> band
    vslot: z3.ArrayRef  # vid -> slot
    gen: z3.ArrayRef  # vid -> allocation serial
    next_gen: z3.ArithRef
    free: z3.ArrayRef  # vid -> Bool (in the free-id heap)
    next_vid: z3.ArithRef
    owner: z3.ArrayRef  # owner -> Bool
    held: z3.ArrayRef  # (owner, vid) -> Bool
    user: z3.ArrayRef  # user -> Bool
    writes: z3.ArrayRef  # user -> Bool (mode WRITE)
    holds: z3.ArrayRef  # (user, band, slot) -> Bool
    hold_vid: z3.ArrayRef  # (user, band, slot) -> vid recorded at acquire
    hold_gen: z3.ArrayRef  # (user, band, slot) -> serial recorded at acquire
    content: z3.ArrayRef  # (band, slot, entry, row) -> Bool (a tag was written there)
    # ghosts (no reference field): the Skolem functions of the two existential conjuncts
    owner_of: z3.ArrayRef  # vid -> an owner that holds it ("no bound page is ownerless")
    holder: z3.ArrayRef  # (band, slot) -> a user that holds it ("every withheld slot has a user")
    sidx: z3.ArrayRef  # vid -> which of its owner's recurrent_slots a recurrent page takes (the cap, as pigeonholes)

    def update(self, **changes) -> State:
        return replace(self, **changes)


FIELDS = tuple(f.name for f in fields(State))

_SORTS = {
    "live": (INT, INT, BOOL), "p2v": (INT, INT, INT), "holes": (INT, INT, BOOL), "withheld": (INT, INT, BOOL),
    "bound": (INT, BOOL), "vband": (INT, INT), "vslot": (INT, INT), "gen": (INT, INT), "free": (INT, BOOL),
    "owner": (INT, BOOL), "held": (INT, INT, BOOL), "user": (INT, BOOL), "writes": (INT, BOOL),
    "holds": (INT, INT, INT, BOOL), "hold_vid": (INT, INT, INT, INT), "hold_gen": (INT, INT, INT, INT),
    "content": (INT, INT, INT, INT, BOOL),
    "owner_of": (INT, INT), "holder": (INT, INT, INT), "sidx": (INT, INT),
}


def state(tag: str) -> State:
    """A fresh symbolic state whose constants are named ``tag.field``."""
    kw: dict = {"lo": tuple(z3.Int(f"{tag}.lo{b}") for b in BANDS),
                "hi": tuple(z3.Int(f"{tag}.hi{b}") for b in BANDS),
                "next_gen": z3.Int(f"{tag}.next_gen"), "next_vid": z3.Int(f"{tag}.next_vid")}
    for name, sorts in _SORTS.items():
        kw[name] = z3.Array(f"{tag}.{name}", *sorts)
    return State(**kw)


def init(c: Config, st: State) -> z3.BoolRef:
    """``Arena(config)``: every band empty on its anchor (the float parked at (0, 0)), nothing bound, owned,
    held or written; construction succeeded, so the configuration passed the floor check."""
    return z3.And(
        st.lo[LOW] == 0, st.hi[LOW] == 0, st.lo[FLOAT] == 0, st.hi[FLOAT] == 0,
        st.lo[HIGH] == c.TOP, st.hi[HIGH] == c.TOP,
        _all_false(st.live, 2),
        _all_false(st.holes, 2), _all_false(st.withheld, 2), _all_false(st.bound, 1), _all_false(st.free, 1),
        _all_false(st.owner, 1), _all_false(st.held, 2), _all_false(st.user, 1), _all_false(st.holds, 3),
        _all_false(st.content, 4), st.next_gen == 0, st.next_vid == 0, floor_ok(c))


def _all_false(arr: z3.ArrayRef, arity: int) -> z3.BoolRef:
    xs = [qb, qs, qe, qr][:arity]
    return z3.ForAll(xs, z3.Not(arr[tuple(xs)] if arity > 1 else arr[xs[0]]))


# ---------------------------------------------------------------------------------------------
# Derived notions (the reference's counters, read as existentials)


def lo_of(st: State, b) -> z3.ArithRef:
    return pick(b, st.lo)


def hi_of(st: State, b) -> z3.ArithRef:
    return pick(b, st.hi)


def in_span(st: State, b, s) -> z3.BoolRef:
    return z3.And(lo_of(st, b) <= s, s < hi_of(st, b))


def float_present(st: State) -> z3.BoolRef:
    return st.lo[FLOAT] < st.hi[FLOAT]


def lo_byte(c: Config, st: State, b: int) -> z3.ArithRef:
    return st.lo[b] * c.P[b]


def hi_byte(c: Config, st: State, b: int) -> z3.ArithRef:
    return st.hi[b] * c.P[b]


def in_use(st: State, b, s) -> z3.BoolRef:
    """``readers[(b, s)] + writers[(b, s)] > 0``: some live user holds the physical page."""
    u = bvar("user", "in_use")
    return z3.Exists([u], z3.And(st.user[u], st.holds[u, b, s]))


def has_writer(st: State, b, s) -> z3.BoolRef:
    """``writers[(b, s)] > 0``."""
    u = bvar("user", "has_writer")
    return z3.Exists([u], z3.And(st.user[u], st.writes[u], st.holds[u, b, s]))


# ---------------------------------------------------------------------------------------------
# Invariant conjuncts


@dataclass(frozen=True)
class Conjunct:
    inv: str  # the invariant ID (kvarena.reference.invariants.INVARIANTS)
    name: str
    reads: frozenset[str]  # state fields the conjunct reads (frame reasoning, see harness)
    formula: Callable[[Config, State], z3.BoolRef]
    aux: bool = False  # a strengthening the induction needs; the reference's predicate does not check it
    mirrors: str = ""  # what the reference's predicate says

    @property
    def key(self) -> str:
        return f"{self.inv}/{self.name}"


def partition(c: Config, st: State) -> z3.BoolRef:
    lv, hl, wh = st.live[qb, qs], st.holes[qb, qs], st.withheld[qb, qs]
    return z3.ForAll([qb, qs], z3.And(z3.Not(z3.And(lv, hl)), z3.Not(z3.And(lv, wh)), z3.Not(z3.And(hl, wh))))


def span_covers(c: Config, st: State) -> z3.BoolRef:
    state_ = z3.Or(st.live[qb, qs], st.holes[qb, qs], st.withheld[qb, qs])
    return z3.ForAll([qb, qs], z3.And(z3.Implies(is_band(qb), in_span(st, qb, qs) == state_),
                                      z3.Implies(z3.Not(is_band(qb)), z3.Not(state_))))


def in_arena(c: Config, st: State) -> z3.BoolRef:
    return z3.And(*[z3.And(st.lo[b] >= 0, st.lo[b] <= st.hi[b], hi_byte(c, st, b) <= c.C) for b in BANDS])


def disjoint(c: Config, st: State) -> z3.BoolRef:
    out = []
    for b1, b2 in ((LOW, FLOAT), (LOW, HIGH), (FLOAT, HIGH)):
        both = z3.And(st.lo[b1] < st.hi[b1], st.lo[b2] < st.hi[b2])
        out.append(z3.Implies(both, z3.Or(hi_byte(c, st, b1) <= lo_byte(c, st, b2),
                                          hi_byte(c, st, b2) <= lo_byte(c, st, b1))))
    return z3.And(*out)


def anchors(c: Config, st: State) -> z3.BoolRef:
    return z3.And(st.lo[LOW] == 0, st.hi[HIGH] == c.TOP)


def chain_order(c: Config, st: State) -> z3.BoolRef:
    return z3.And(hi_byte(c, st, LOW) <= lo_byte(c, st, HIGH),
                  z3.Implies(float_present(st), z3.And(hi_byte(c, st, LOW) <= lo_byte(c, st, FLOAT),
                                                       hi_byte(c, st, FLOAT) <= lo_byte(c, st, HIGH))))


def _hold_ok(st: State, u, b, s) -> z3.BoolRef:
    v = st.hold_vid[u, b, s]
    same = z3.And(st.live[b, s], st.p2v[b, s] == v, st.bound[v], st.gen[v] == st.hold_gen[u, b, s])
    return z3.Or(same, st.withheld[b, s])


def same_or_withheld(c: Config, st: State) -> z3.BoolRef:
    return z3.ForAll([qu, qb, qs], z3.Implies(z3.And(st.user[qu], st.holds[qu, qb, qs]), _hold_ok(st, qu, qb, qs)))


def writer_unmoved(c: Config, st: State) -> z3.BoolRef:
    v = st.hold_vid[qu, qb, qs]
    current = z3.And(st.bound[v], st.gen[v] == st.hold_gen[qu, qb, qs])
    return z3.ForAll([qu, qb, qs], z3.Implies(z3.And(st.user[qu], st.writes[qu], st.holds[qu, qb, qs], current),
                                              z3.And(st.vband[v] == qb, st.vslot[v] == qs)))


def withheld_has_user(c: Config, st: State) -> z3.BoolRef:
    u = st.holder[qb, qs]  # Skolemized: "some live user holds it" names that user
    return z3.ForAll([qb, qs], z3.Implies(st.withheld[qb, qs], z3.And(st.user[u], st.holds[u, qb, qs])))


def hole_has_no_user(c: Config, st: State) -> z3.BoolRef:
    return z3.ForAll([qu, qb, qs], z3.Implies(z3.And(st.holes[qb, qs], st.user[qu]), z3.Not(st.holds[qu, qb, qs])))


def serials_issued(c: Config, st: State) -> z3.BoolRef:
    return z3.And(
        st.next_gen >= 0,
        z3.ForAll([qv], z3.Implies(st.bound[qv], st.gen[qv] < st.next_gen)),
        z3.ForAll([qu, qb, qs], z3.Implies(z3.And(st.user[qu], st.holds[qu, qb, qs]),
                                           st.hold_gen[qu, qb, qs] < st.next_gen)))


def rows_at_live(c: Config, st: State) -> z3.BoolRef:
    return z3.ForAll([qb, qs, qe, qr], z3.Implies(st.content[qb, qs, qe, qr], st.live[qb, qs]))


def rows_in_layout(c: Config, st: State) -> z3.BoolRef:
    return z3.ForAll([qb, qs, qe, qr], z3.Implies(
        st.content[qb, qs, qe, qr],
        z3.And(is_band(qb), qe >= 0, qe < pick(qb, c.NE), qr >= 0, qr < pick(qb, c.NR))))


def p2v_inverse(c: Config, st: State) -> z3.BoolRef:
    v = st.p2v[qb, qs]
    return z3.ForAll([qb, qs], z3.Implies(st.live[qb, qs],
                                          z3.And(st.bound[v], st.vband[v] == qb, st.vslot[v] == qs)))


def v2p_inverse(c: Config, st: State) -> z3.BoolRef:
    b, s = st.vband[qv], st.vslot[qv]
    return z3.ForAll([qv], z3.Implies(st.bound[qv], z3.And(is_band(b), st.live[b, s], st.p2v[b, s] == qv)))


def owned_bound(c: Config, st: State) -> z3.BoolRef:
    return z3.ForAll([qo, qv], z3.Implies(st.held[qo, qv], z3.And(st.owner[qo], st.bound[qv])))


def no_leak(c: Config, st: State) -> z3.BoolRef:
    o = st.owner_of[qv]  # Skolemized: "some owner holds it" names that owner
    return z3.ForAll([qv], z3.Implies(st.bound[qv], z3.And(st.owner[o], st.held[o, qv])))


def free_unbound(c: Config, st: State) -> z3.BoolRef:
    return z3.ForAll([qv], z3.Implies(st.free[qv], z3.Not(st.bound[qv])))


def ids_issued(c: Config, st: State) -> z3.BoolRef:
    return z3.And(st.next_vid >= 0, z3.ForAll([qv], z3.Implies(z3.Or(st.bound[qv], st.free[qv]),
                                                               z3.And(qv >= 0, qv < st.next_vid))))


def census(c: Config, st: State) -> z3.BoolRef:
    lv, hl, wh = st.live[qb, qs], st.holes[qb, qs], st.withheld[qb, qs]
    one = z3.Or(z3.And(lv, z3.Not(hl), z3.Not(wh)), z3.And(hl, z3.Not(lv), z3.Not(wh)),
                z3.And(wh, z3.Not(lv), z3.Not(hl)))
    none = z3.And(z3.Not(lv), z3.Not(hl), z3.Not(wh))
    return z3.ForAll([qb, qs], z3.If(z3.And(is_band(qb), in_span(st, qb, qs)), one, none))


def terms_nonnegative(c: Config, st: State) -> z3.BoolRef:
    low_pad = lo_byte(c, st, LOW)
    top_pad = c.C - hi_byte(c, st, HIGH)
    gaps = z3.If(float_present(st),
                 z3.And(lo_byte(c, st, FLOAT) - hi_byte(c, st, LOW) >= 0,
                        lo_byte(c, st, HIGH) - hi_byte(c, st, FLOAT) >= 0),
                 lo_byte(c, st, HIGH) - hi_byte(c, st, LOW) >= 0)
    return z3.And(low_pad >= 0, top_pad >= 0, gaps, *[st.hi[b] >= st.lo[b] for b in BANDS])


def capacity_sum(c: Config, st: State) -> z3.BoolRef:
    span = [(st.hi[b] - st.lo[b]) * c.P[b] for b in BANDS]
    gaps = z3.If(float_present(st),
                 lo_byte(c, st, FLOAT) - hi_byte(c, st, LOW) + lo_byte(c, st, HIGH) - hi_byte(c, st, FLOAT),
                 lo_byte(c, st, HIGH) - hi_byte(c, st, LOW))
    flt = z3.If(float_present(st), span[FLOAT], 0)
    total = span[LOW] + flt + span[HIGH] + gaps + lo_byte(c, st, LOW) + (c.C - hi_byte(c, st, HIGH))
    return total == c.C


def feasibility_floor(c: Config, st: State) -> z3.BoolRef:
    return floor_ok(c)


def is_state(c: Config, st: State, v) -> z3.BoolRef:
    """``v`` is a bound page of the recurrent class (the low band's, when the model has one)."""
    return z3.And(c.REC, st.bound[v], st.vband[v] == LOW)


def state_one_owner(c: Config, st: State) -> z3.BoolRef:
    o2 = bvar("owner", "q2")
    return z3.ForAll([qo, o2, qv], z3.Implies(z3.And(is_state(c, st, qv), st.held[qo, qv], st.held[o2, qv]),
                                              qo == o2))


def state_slots(c: Config, st: State) -> z3.BoolRef:
    """At most R recurrent pages per owner, as pigeonholes: each takes an index below R (the ghost ``sidx``),
    and two of one owner's never take the same."""
    v2 = bvar("vid", "q2")
    return z3.And(
        z3.ForAll([qv], z3.Implies(is_state(c, st, qv), z3.And(st.sidx[qv] >= 0, st.sidx[qv] < c.R))),
        z3.ForAll([qo, qv, v2], z3.Implies(z3.And(is_state(c, st, qv), is_state(c, st, v2), st.held[qo, qv],
                                                  st.held[qo, v2], qv != v2), st.sidx[qv] != st.sidx[v2])))


GEOM = frozenset({"lo", "hi"})
SLOTS = frozenset({"live", "holes", "withheld"})
LEDGER = frozenset({"user", "writes", "holds", "hold_vid", "hold_gen"})
VMAP = frozenset({"bound", "vband", "vslot"})

CONJUNCTS: tuple[Conjunct, ...] = (
    Conjunct("INV-NO-OVERLAP", "partition", SLOTS, partition,
             mirrors="no slot is in two of live / hole / withheld"),
    Conjunct("INV-NO-OVERLAP", "span-covers", GEOM | SLOTS, span_covers,
             mirrors="live | holes | withheld == range(lo, hi) for each band"),
    Conjunct("INV-NO-OVERLAP", "in-arena", GEOM, in_arena, mirrors="0 <= lo <= hi and hi_byte <= capacity"),
    Conjunct("INV-NO-OVERLAP", "disjoint", GEOM, disjoint, mirrors="non-empty extents pairwise disjoint in bytes"),
    Conjunct("INV-BAND-ORDER", "anchors", GEOM, anchors, mirrors="low.lo == 0 and high.hi == high.top"),
    Conjunct("INV-BAND-ORDER", "chain-order", GEOM, chain_order,
             mirrors="present bands: below.hi_byte <= above.lo_byte"),
    Conjunct("INV-LEDGER-SAFETY", "same-or-withheld", LEDGER | SLOTS | {"p2v", "bound", "gen"}, same_or_withheld,
             mirrors="each hold: same vid and serial at the slot, or the slot is withheld"),
    Conjunct("INV-LEDGER-SAFETY", "writer-unmoved", LEDGER | VMAP | {"gen"}, writer_unmoved,
             mirrors="a page held by a writer (same allocation) is still where it was acquired"),
    Conjunct("INV-LEDGER-SAFETY", "withheld-has-user", {"withheld", "user", "holds", "holder"}, withheld_has_user,
             mirrors="every withheld slot has a user"),
    Conjunct("INV-LEDGER-SAFETY", "hole-has-no-user", {"holes", "user", "holds"}, hole_has_no_user,
             mirrors="no hole has a user"),
    Conjunct("INV-LEDGER-SAFETY", "serials-issued", {"bound", "gen", "next_gen", "user", "holds", "hold_gen"},
             serials_issued, aux=True,
             mirrors="(aux) every serial in use was issued: gen < next_gen for bound ids and holds"),
    Conjunct("INV-PAGE-ATOMIC", "rows-at-live", {"content", "live"}, rows_at_live,
             mirrors="content only at live slots"),
    Conjunct("INV-PAGE-ATOMIC", "rows-in-layout", {"content"}, rows_in_layout,
             mirrors="content only for entries < entries_per_page and rows < len(layout)"),
    Conjunct("INV-VMAP-BIJECTIVE", "p2v-inverse", {"live", "p2v"} | VMAP, p2v_inverse,
             mirrors="p2v[(b, s)] = v implies v2p[v] = (b, s) (no stale map, no double binding)"),
    Conjunct("INV-VMAP-BIJECTIVE", "v2p-inverse", {"live", "p2v"} | VMAP, v2p_inverse,
             mirrors="v2p[v] = (b, s) implies p2v[(b, s)] = v"),
    Conjunct("INV-VMAP-BIJECTIVE", "owned-bound", {"owner", "held", "bound"}, owned_bound,
             mirrors="every page an owner holds is bound"),
    Conjunct("INV-VMAP-BIJECTIVE", "no-leak", {"owner", "held", "bound", "owner_of"}, no_leak,
             mirrors="no bound page is ownerless"),
    Conjunct("INV-VMAP-BIJECTIVE", "free-unbound", {"free", "bound"}, free_unbound,
             mirrors="no id is both free and bound"),
    Conjunct("INV-VMAP-BIJECTIVE", "ids-issued", {"free", "bound", "next_vid"}, ids_issued, aux=True,
             mirrors="(aux) bound and free ids are below next_vid"),
    Conjunct("INV-BYTE-CONSERVATION", "census", GEOM | SLOTS, census,
             mirrors="live + withheld + holes counts the span exactly (each slot once, none outside)"),
    Conjunct("INV-BYTE-CONSERVATION", "terms-nonnegative", GEOM, terms_nonnegative,
             mirrors="gaps, low and top padding are >= 0"),
    Conjunct("INV-BYTE-CONSERVATION", "capacity-sum", GEOM, capacity_sum,
             mirrors="spans + gaps + padding = capacity (with the census: live + withheld + holes + ...)"),
    Conjunct("INV-FEASIBILITY-FLOOR", "floor", frozenset(), feasibility_floor,
             mirrors="place(worst_case_demand) fits the empty arena"),
    Conjunct("INV-STATE-PRIVATE", "state-one-owner", {"bound", "vband", "held"}, state_one_owner,
             mirrors="a recurrent page is held by exactly one owner (copied, never shared)"),
    Conjunct("INV-STATE-PRIVATE", "state-slots", {"bound", "vband", "held", "sidx"}, state_slots,
             mirrors="no owner holds more than recurrent_slots recurrent pages"),
)

# Conjuncts of the reference's predicates that the model makes true by construction.
DEFINITIONAL: dict[str, str] = {
    "INV-BAND-ORDER": "chain roles are low / high at the ends: band 0 is LOW and band 2 is HIGH by construction",
    "INV-LEDGER-SAFETY": "reader / writer counts equal the recount: the model has no counters, 'in use' and "
                         "'has a writer' are existentials over the live users",
    "INV-VMAP-BIJECTIVE": "refs equal the number of owners and serials exist exactly for bound ids: refs is the "
                          "owner count by definition and gen is read only for bound ids",
    "INV-BYTE-CONSERVATION": "used_bytes() == live + withheld: both are the same sum in the model",
    "INV-PAGE-ATOMIC": "",
    "INV-NO-OVERLAP": "",
    "INV-FEASIBILITY-FLOOR": "the configuration is immutable: no transition writes a Config constant",
    "INV-STATE-PRIVATE": "",
}


def conjuncts(inv: str | None = None) -> tuple[Conjunct, ...]:
    return tuple(c for c in CONJUNCTS if inv is None or c.inv == inv)


def invariant(c: Config, st: State) -> z3.BoolRef:
    return z3.And(*[k.formula(c, st) for k in CONJUNCTS])


def some_live_page(st: State, tag: str) -> z3.BoolRef:
    b, s = z3.Ints(f"{tag}.wb {tag}.ws")
    return z3.And(is_band(b), st.live[b, s])
