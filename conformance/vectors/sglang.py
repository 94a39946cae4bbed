"""SGLang's own CPU unit tests for its unified allocator, ported as vectors (conformance/vectors/sglang-unit-*.jsonl).

Each script replays the scenarios of one SGLang test file (or one coherent group of its test classes,
test/registered/unit/mem_cache/ in sgl-project/sglang) on a toy model, and asserts on the reference the outcome
SGLang's test expects wherever kvarena's contract shares it.  docs/sglang-unit-ports.md has the operation mapping
(``alloc`` -> admit, ``free_swa`` -> slide, ``retain`` -> share, ``_flush`` -> compact, ``make_room`` -> relayout,
data markers -> write/read), the commits read, and a table of every expectation the contract deliberately does not
share, with the vector step that shows kvarena's behaviour.  Ids are pages; every request holds one recurrent slot.
Helpers come from scenarios.py, imported when a script runs (scenarios.py imports this module for VECTORS).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from kvarena.conformance.machine.harness import CACHE, Expect

if TYPE_CHECKING:
    from kvarena.conformance.machine.conductor import Conductor
    from kvarena.conformance.vectors.steps import VectorSpec

BAD = {"vid": -1}  # an id no implementation binds (SGLang resolves -1 and unbound ids to its sink page 0)


def _s() -> Any:
    from kvarena.conformance.vectors import steps

    return steps


def ok(c: Conductor, what: str, op: str, rung: int | None = None, **args: Any) -> Expect:
    return _s().must(c.run(op, **args), what, rung=rung)


def refused(c: Conductor, code: str, what: str, op: str, **args: Any) -> Expect:
    return _s().must(c.run(op, **args), what, code=code)


def admit(c: Conductor, prefix: str, demand: dict[str, int], rung: int | None = None) -> tuple[str, Expect]:
    owner = c.fresh(prefix)
    return owner, ok(c, f"admit {owner} {demand}", "admit", rung=rung, owner=owner, demand=demand, shared=[])


def mark(c: Conductor, *pages: int) -> None:
    """SGLang's data marker: a tag in the first and the last row of each page (both must follow every move)."""
    for h in pages:
        cls = c.oracle.cls_of(h)
        for entry, row in {(0, 0), (c.geo.entries[cls] - 1, c.geo.rows[cls] - 1)}:
            c.serial += 1
            ok(c, f"write {h}", "write", page=h, entry=entry, row=row, tag=c.serial)


def span(c: Conductor, cls: str) -> tuple[int, int]:
    return tuple(c.oracle.snapshot().spans[cls])  # type: ignore[return-value]


def holes(c: Conductor, cls: str) -> tuple[int, ...]:
    return tuple(c.oracle.snapshot().holes.get(cls, ()))


def slot(c: Conductor, h: int) -> int:
    return c.oracle.snapshot().pages[h][1]


def live(c: Conductor, cls: str) -> int:
    return sum(1 for k, _s, _v in c.oracle.snapshot().pages.values() if k == cls)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise _s().ScenarioError(what)


def largest(c: Conductor, classes: tuple[str, ...], top: int) -> int:
    """The largest n for which a composite admission of n pages of every class fits: try n = top, top-1, ...
    (each refusal is an AdmissionRejected that must leave the state unchanged: SGLang's rollback of a failed
    composite alloc), admit the first that fits, then free it.  Returns n."""
    top = min(top, c.config_json["capacity"] // sum(c.geo.page_bytes[k] for k in classes))  # more: InvalidArgument
    for n in range(top, 0, -1):
        owner = c.fresh("probe")
        e = c.run("admit", owner=owner, demand=dict.fromkeys(classes, n), shared=[])
        if e.ok:
            ok(c, f"free {owner}", "free", owner=owner)
            return n
        check(e.code == "AdmissionRejected", f"composite admit of {n}: {e.code}")
    return 0


def free_all(c: Conductor, owners: Any = None) -> None:
    """Free ``owners`` in order (default: every owner)."""
    for o in list(c.oracle.owners() if owners is None else owners):
        ok(c, f"free {o}", "free", owner=o)


def pad(c: Conductor, rng: random.Random, at_least: int, weights: dict[str, int] | None = None) -> None:
    """A short random walk so the file has at least ``at_least`` steps, then read back every written row."""
    if c.nstep < at_least:
        _s().walk(c, rng, at_least - c.nstep, weights)
    _s().readback(c, limit=24)


# ---------------------------------------------------------------------------------------------
# test_multi_ended_allocator.py::TestMultiEndedAllocator (+ TestPagedMultiEndedAllocator), toy-state


def multi_ended(c: Conductor, rng: random.Random) -> None:
    S = _s()
    # test_basic_alloc_free_compaction: three batches on one end, free the middle one, the data follows
    _, a = admit(c, "a", {"full": 2})
    b_owner, _b = admit(c, "b", {"full": 3})
    _, cc = admit(c, "c", {"full": 1})
    mark(c, *(S.flat(a) + S.flat(cc)))
    ok(c, "free the middle batch", "free", owner=b_owner)
    check(len(holes(c, "full")) == 3, "the middle batch leaves 3 holes")
    plan = ok(c, "compact: the boundary page moves into a hole", "compact", max_moves=None).plan or {}
    check(len(plan["moves"]) == 1 and not holes(c, "full"), "one move packs the end")
    S.readback(c)
    for h in S.flat(a) + S.flat(cc):
        ok(c, "translate a survivor", "translate", page=h)
    ok(c, "free c (boundary, nothing moves)", "free", owner=next(o for o in c.oracle.owners() if o.startswith("c")))
    ok(c, "free a", "free", owner=next(o for o in c.oracle.owners() if o.startswith("a")))
    check(span(c, "full")[0] == span(c, "full")[1], "the end is empty again")
    # test_grow_down_side: the same on the other end (SGLang's mamba END; here the low end), one slot per request
    state_owners = [admit(c, "s", {"state": 1}) for _ in range(3)]
    for _o, e in state_owners:
        mark(c, S.flat(e)[0])
    ok(c, "free the interior state slot", "free", owner=state_owners[1][0])
    ok(c, "compact the low end", "compact", max_moves=None)
    S.readback(c)
    free_all(c, [o for o, _e in (state_owners[0], state_owners[2])])
    check(span(c, "state")[0] == span(c, "state")[1], "the low end is empty again")
    # test_byte_frontier_coordination: the other end's growth shrinks this end's room; alloc(available+1) fails
    alone = largest(c, ("full",), c.geo.top["full"])
    peers = [admit(c, "m", {"state": 1})[0] for _ in range(3)]
    beside = largest(c, ("full",), alone)
    check(beside < alone, "state slots shrink the full end's room")
    refused(c, "AdmissionRejected", "one page more than fits", "admit", owner="over", demand={"full": beside + 1},
            shared=[])
    free_all(c, peers)
    # TestPagedMultiEndedAllocator::test_paged_compaction_relocates_whole_pages: every row of a page moves with it
    pa, pb, pc = (admit(c, "p", {"full": 1}) for _ in range(3))
    for _o, e in (pa, pb, pc):
        S.write_page(c, S.flat(e)[0])
    ok(c, "free the middle page", "free", owner=pb[0])
    ok(c, "compact", "compact", max_moves=None)
    S.readback(c)
    free_all(c, [o for o, _e in (pa, pc)])
    # test_double_free_raises (SGLang: AssertionError on the eager END); kvarena: typed, state unchanged
    d_owner, _d = admit(c, "d", {"full": 3})
    ok(c, "free d", "free", owner=d_owner)
    refused(c, "UnknownOwner", "free d again", "free", owner=d_owner)
    keep, k = admit(c, "k", {"full": 2})
    ok(c, "drop one page", "drop", owner=keep, pages=[k.pages["full"][0]])
    refused(c, "DoubleFree", "drop it again", "drop", owner=keep, pages=[{"dead": k.pages["full"][0]}])
    # test_slot_zero_sink_invariant_survives_churn: SGLang keeps v0 -> sink p0; kvarena binds no such id
    refused(c, "UnknownPage", "translate an id nobody binds", "translate", page=BAD)
    refused(c, "UnknownPage", "write through it (SGLang: onto the sink page)", "write", page=BAD, entry=0, row=0,
            tag=1)
    ok(c, "free k", "free", owner=keep)
    # test_randomized: 60% full, 55% alloc 1..3 pages else free a random live batch; markers checked after moves
    live_owners: dict[str, list[str]] = {"full": [], "state": []}
    for _ in range(40):
        cls = "full" if rng.random() < 0.6 else "state"
        pool = live_owners[cls]
        if rng.random() < 0.55 or not pool:
            owner = c.fresh("r")
            n = rng.randint(1, 3) if cls == "full" else 1
            e = c.run("admit", owner=owner, demand={cls: n}, shared=[])
            if e.ok:
                pool.append(owner)
                mark(c, S.flat(e)[0])
        else:
            ok(c, "free a random batch", "free", owner=pool.pop(rng.randrange(len(pool))))
        if rng.random() < 0.2:
            ok(c, "compact", "compact", max_moves=None)
    S.readback(c)
    for pool in live_owners.values():
        free_all(c, pool)
    ok(c, "compact the drained arena", "compact", max_moves=None)
    check(all(lo == hi for lo, hi in c.oracle.snapshot().spans.values()), "drained: every band is empty")


# ---------------------------------------------------------------------------------------------
# test_multi_ended_allocator.py::TestLazyCompaction and ::test_lazy_retract_churn_no_ghost, toy-state


def lazy_compaction(c: Conductor, rng: random.Random) -> None:
    S = _s()
    # test_lazy_free_inward_walk: free a middle page, then the two topmost; the boundary holes go, 2 stay live
    o, a = admit(c, "a", {"full": 5})
    v = a.pages["full"]
    ok(c, "drop the middle page", "drop", owner=o, pages=[v[2]])
    refused(c, "DoubleFree", "drop it again (SGLang's lazy END accepts it: finding 1)", "drop", owner=o,
            pages=[{"dead": v[2]}])
    ok(c, "drop the topmost page", "drop", owner=o, pages=[v[4]])
    ok(c, "drop the next one", "drop", owner=o, pages=[v[3]])
    check(span(c, "full")[1] - span(c, "full")[0] == 2 and not holes(c, "full"), "boundary holes absorbed")
    ok(c, "free a", "free", owner=o)
    # test_lazy_take_physical_drains_holes_first: holes are reused before the frontier extends
    o, a = admit(c, "a", {"full": 5})
    v = a.pages["full"]
    ok(c, "drop an interior page", "drop", owner=o, pages=[v[1]])
    ok(c, "drop another", "drop", owner=o, pages=[v[3]])
    before = span(c, "full")
    admit(c, "h", {"full": 2}, rung=1)
    check(span(c, "full") == before and not holes(c, "full"), "both holes reused, frontier unchanged")
    admit(c, "h", {"full": 1}, rung=1)
    check(span(c, "full")[0] == before[0] - 1, "the next page extends the frontier")
    free_all(c)
    # test_lazy_available_size_includes_holes: holes stay available; only the 2 live pages are subtracted
    room = largest(c, ("full",), c.geo.top["full"])
    o, a = admit(c, "a", {"full": 5})
    ok(c, "drop the three pages nearest the anchor", "drop", owner=o, pages=a.pages["full"][:3])
    check(len(holes(c, "full")) == 3, "three holes")
    check(largest(c, ("full",), room) == room - 2, "room = initial - live")
    ok(c, "free a", "free", owner=o)
    # test_lazy_flush_compacts_holes_into_gap: a survivor moves into the hole, the frontier retreats
    o, a = admit(c, "a", {"full": 5})
    mark(c, *a.pages["full"])
    ok(c, "drop a low page", "drop", owner=o, pages=[a.pages["full"][1]])
    before = span(c, "full")
    plan = ok(c, "compact", "compact", max_moves=None).plan or {}
    check(len(plan["moves"]) >= 1 and span(c, "full")[0] > before[0] and live(c, "full") == 4, "packed")
    S.readback(c)
    ok(c, "free a", "free", owner=o)
    # test_lazy_flush_gathers_survivor_mappings_as_one_batch: 12 pages, 4 interior freed, 4 moves
    o, a = admit(c, "a", {"full": 12})
    mark(c, *a.pages["full"])
    ok(c, "drop four interior pages", "drop", owner=o, pages=a.pages["full"][1:5])
    plan = ok(c, "compact", "compact", max_moves=None).plan or {}
    check(len(plan["moves"]) == 4, "four moves")
    S.readback(c, limit=16)
    ok(c, "free a", "free", owner=o)
    # test_lazy_non_urgent_stops_at_write_set_blocker: a writer on the topmost survivor stops compaction
    o, a = admit(c, "a", {"full": 5})
    ok(c, "drop an interior page", "drop", owner=o, pages=[a.pages["full"][1]])
    ok(c, "forward pass writes the topmost page", "acquire", user="fwd", kind="forward_write",
       pages=[a.pages["full"][4]])
    check(not (ok(c, "compact under the writer", "compact", max_moves=None).plan or {})["moves"], "0 moves")
    check(len(holes(c, "full")) == 1, "the hole stays")
    ok(c, "the forward finishes", "release", user="fwd")
    check(len((ok(c, "compact", "compact", max_moves=None).plan or {})["moves"]) >= 1, "now it moves")
    ok(c, "free a", "free", owner=o)
    # test_lazy_non_urgent_read_race_uses_pending_reuse: a reader does not stop the move; its old slot is
    # withheld (SGLang: _pending_reuse) until the forward finishes, so no allocation lands under the read
    o, a = admit(c, "a", {"full": 5})
    top = a.pages["full"][4]
    mark(c, top)
    old = slot(c, top)
    ok(c, "drop an interior page", "drop", owner=o, pages=[a.pages["full"][1]])
    ok(c, "forward pass reads the topmost page", "acquire", user="fwd", kind="forward_read", pages=[top])
    ok(c, "compact under the reader", "compact", max_moves=None)
    check(old in c.oracle.snapshot().withheld.get("full", ()), "the source slot is withheld")
    _, n = admit(c, "n", {"full": 1})
    check(slot(c, S.flat(n)[0]) != old, "no allocation lands on the withheld slot")
    ok(c, "the forward finishes", "release", user="fwd")
    check(not c.oracle.snapshot().withheld.get("full"), "released: no longer withheld")
    S.readback(c)
    free_all(c)
    # test_lazy_retract_churn_no_ghost: churn with partial flushes (move cap 2, and 0: SGLang moves one page
    # at a cap of 0, finding 5), then drain to quiescence: the arena must end empty
    owners: list[str] = []
    for _ in range(30):
        if rng.random() < 0.55 or not owners:
            owner = c.fresh("r")
            if c.run("admit", owner=owner, demand={"full": rng.randint(1, 3)}, shared=[]).ok:
                owners.append(owner)
                mark(c, c.oracle.held(owner)["full"][0])
        else:
            ok(c, "free", "free", owner=owners.pop(rng.randrange(len(owners))))
        if rng.random() < 0.5:
            cap = rng.choice((0, 2))
            plan = ok(c, f"compact(max_moves={cap})", "compact", max_moves=cap).plan or {}
            check(len(plan["moves"]) <= cap, f"compact({cap}) moved {len(plan['moves'])} pages")
    S.readback(c)
    free_all(c, owners)
    check(all(lo == hi for lo, hi in c.oracle.snapshot().spans.values()), "drained: every band is empty")


# ---------------------------------------------------------------------------------------------
# test_multi_ended_allocator.py::TestUnifiedSWATokenToKVPoolAllocator, toy-swa (window | full)


def swa_composite(c: Conductor, rng: random.Random) -> None:
    S = _s()
    both = {"window": 1, "full": 1}
    # test_swa_alloc_both_peers_hold / test_swa_free_releases_both
    o, e = admit(c, "r", {"window": 3, "full": 3})
    check(len(e.pages["window"]) == 3 and len(e.pages["full"]) == 3, "both classes placed")
    for h in S.flat(e):
        ok(c, "translate", "translate", page=h)
    freed = ok(c, "free releases both classes", "free", owner=o).freed or []
    check(len(freed) == 6, "six pages freed")
    # test_swa_free_swa_keeps_virtual_alive: the window page slides out, the full page stays until free
    o, e = admit(c, "r", {"window": 3, "full": 3})
    ok(c, "slide the oldest window page out", "slide", owner=o, cls="window", n=1)
    check(len(c.oracle.held(o)["window"]) == 2 and len(c.oracle.held(o)["full"]) == 3, "full side kept")
    refused(c, "UnknownPage", "translate the slid page (SGLang: the sink)", "translate",
            page={"dead": e.pages["window"][0]})
    check(len(ok(c, "free the rest", "free", owner=o).freed or []) == 5, "the rest freed")
    # test_swa_compaction_diverges_physical_layout: a window hole compacts the window band only
    reqs = [admit(c, "q", both) for _ in range(3)]
    for _o, e in reqs:
        mark(c, *S.flat(e))
    full_before = {h: slot(c, h) for _o, e in reqs for h in e.pages["full"]}
    ok(c, "slide the middle request's window page", "slide", owner=reqs[1][0], cls="window", n=1)
    ok(c, "compact", "compact", max_moves=None)
    check(all(slot(c, h) == s for h, s in full_before.items()), "full pages did not move")
    check(not holes(c, "window"), "the window band packed")
    S.readback(c)
    free_all(c, [o for o, _e in reqs])
    # test_swa_byte_frontier_coordination: the joint budget shrinks; one page over it is refused, unchanged
    joint = largest(c, ("window", "full"), min(c.geo.top.values()))
    occupant = admit(c, "r", {"window": 1})[0]
    full_alone = largest(c, ("full",), c.geo.top["full"])
    refused(c, "AdmissionRejected", "each class fits alone, not together: neither is placed", "admit", owner="pair",
            demand={"window": 1, "full": full_alone}, shared=[])
    ok(c, f"free {occupant}", "free", owner=occupant)
    o, _e = admit(c, "r", both)
    check(largest(c, ("window", "full"), joint) < joint, "the joint budget shrank")
    ok(c, f"free {o}", "free", owner=o)
    # TestGeneralizedRebalance::test_two_pool_chain_rebalance_is_a_noop: no float, relayout moves nothing
    plan = ok(c, "relayout on a two-end chain", "relayout", demand={"window": 1, "full": 1}).plan or {}
    check(not plan["moves"], "nothing to move")
    # test_swa_randomized_alloc_free_freeswa: alloc / free / free_swa, markers checked, then drain
    owners: list[str] = []
    for _ in range(45):
        r = rng.random()
        if r < 0.5 or not owners:
            owner = c.fresh("x")
            n = rng.randint(1, 2)
            e = c.run("admit", owner=owner, demand={"window": n, "full": n}, shared=[])
            if e.ok:
                owners.append(owner)
                mark(c, e.pages["window"][0])
                mark(c, e.pages["full"][-1])
        elif r < 0.8:
            ok(c, "free", "free", owner=owners.pop(rng.randrange(len(owners))))
        else:
            owner = owners[rng.randrange(len(owners))]
            ok(c, "free_swa: slide every window page", "slide", owner=owner, cls="window",
               n=len(c.oracle.held(owner)["window"]))
        if rng.random() < 0.15:
            ok(c, "compact", "compact", max_moves=None)
    S.readback(c)
    free_all(c, owners)
    check(all(lo == hi for lo, hi in c.oracle.snapshot().spans.values()), "drained: every band is empty")


# ---------------------------------------------------------------------------------------------
# test_unified_tri_pool.py::TestUnifiedTriPool and ::TestGeneralizedRebalance, toy-tri (state | window | full)


def window_interior(c: Conductor, owners: list[str]) -> str:
    """The owner whose window page touches neither end of the float's span."""
    lo, hi = span(c, "window")
    for o in owners:
        if all(lo < slot(c, h) < hi - 1 for h in c.oracle.held(o)["window"]):
            return o
    raise _s().ScenarioError("no interior window page")


def until_rung3(c: Conductor, prefix: str, demand: dict[str, int], limit: int = 40) -> bool:
    """Admit ``demand`` as new owners until one takes rung 3 (the float moved for an end); False if none did."""
    for _ in range(limit):
        e = c.run("admit", owner=c.fresh(prefix), demand=demand, shared=[])
        if not e.ok:
            return False
        if (e.plan or {}).get("rung") == 3:
            return True
    return False


def tri_pool(c: Conductor, rng: random.Random) -> None:
    S = _s()
    both = {"window": 1, "full": 1}
    # test_empty_float_is_transparent_to_the_ends: with the float empty, the full end reaches the state end
    alone = largest(c, ("full",), c.geo.top["full"])
    # test_available_size_alloc_contract: the largest composite admission that fits is admitted; every larger
    # one is refused and leaves the state unchanged (the rollback of a failed composite alloc)
    joint = largest(c, ("window", "full"), min(c.geo.top["window"], c.geo.top["full"]))
    check(joint > 0, "a composite admission fits")
    # test_available_shrinks_as_state_slots_grow: state slots shrink the composite room; freed, it comes back
    slots = [admit(c, "m", {"state": 1})[0] for _ in range(4)]
    check(largest(c, ("window", "full"), joint) <= joint, "state slots do not grow the room")
    free_all(c, slots)
    check(largest(c, ("window", "full"), joint) == joint, "the room is back")
    check(largest(c, ("full",), alone) == alone, "the float parked again: the full end sees through")
    # test_free_swa_holes_recycled_in_place_zero_copy: an interior window page slides out -> a float hole, the
    # full page stays; the next admission reuses the hole in place (rung 1, no moves, span unchanged)
    reqs = [admit(c, "q", both)[0] for _ in range(3)]
    for o in reqs:
        mark(c, *[h for hs in c.oracle.held(o).values() for h in hs])
    before = span(c, "window")
    mid = window_interior(c, reqs)
    gone = c.oracle.held(mid)["window"][0]
    ok(c, "free_swa an interior block", "slide", owner=mid, cls="window", n=1)
    check(len(c.oracle.held(mid)["full"]) == 1 and len(holes(c, "window")) == 1, "a float hole; full kept")
    refused(c, "InvalidArgument", "free_swa it again (SGLang's float accepts it: finding 2)", "slide", owner=mid,
            cls="window", n=1)
    refused(c, "DoubleFree", "drop the slid page", "drop", owner=mid, pages=[{"dead": gone}])
    e = admit(c, "q", both, rung=1)[1]
    check(not (e.plan or {}).get("moves") and span(c, "window") == before and not holes(c, "window"),
          "the hole was reused in place")
    reqs.append([o for o in c.oracle.owners() if o.startswith("q")][-1])
    # test_free_swa_boundary_block_absorbed_zero_copy: a boundary block's window page leaves -> the span shrinks
    lo, hi = span(c, "window")
    edge = next(o for o in reqs if c.oracle.held(o)["window"] and slot(c, c.oracle.held(o)["window"][0]) in
                (lo, hi - 1))
    ok(c, "free_swa a boundary block", "slide", owner=edge, cls="window", n=1)
    check(span(c, "window")[1] - span(c, "window")[0] == hi - lo - 1 and not holes(c, "window"), "absorbed")
    S.readback(c)
    # test_urgent_flush_preserves_float_holes: compaction packs the ends, never the float's holes
    rest = [o for o in reqs if c.oracle.held(o)["window"]]
    mid = window_interior(c, rest) if len(rest) >= 3 else None
    if mid is None:
        rest.append(admit(c, "q", both)[0])
        rest.append(admit(c, "q", both)[0])
        mid = window_interior(c, rest)
    ok(c, "free_swa an interior block", "slide", owner=mid, cls="window", n=1)
    kept = holes(c, "window")
    ok(c, "compact", "compact", max_moves=None)
    check(holes(c, "window") == kept and kept, "float holes are kept by compaction")
    # test_free_releases_both_sides_and_filters_tombstones: free after free_swa; the emptied float parks
    free_all(c)
    check(span(c, "window")[0] == span(c, "window")[1], "the float is empty")
    S.readback(c)
    # TestGeneralizedRebalance::test_state_end_shortfall_slides_the_float_low: state slots fill the band below
    # the float; one more fits only if the float moves up (rung 3)
    w = admit(c, "w", {"window": 2})[0]
    mark(c, *c.oracle.held(w)["window"])
    check(until_rung3(c, "s", {"state": 1}), "a state admission moved the float (rung 3)")
    S.readback(c)
    # TestGeneralizedRebalance::test_index_cap_guard_never_moves_data_uselessly: beyond the grid, refused at once
    refused(c, "InvalidArgument", "more state slots than the grid holds", "admit", owner="huge",
            demand={"state": c.geo.top["state"] + 10}, shared=[])
    free_all(c)
    # test_direction_is_derived_from_growth_on_both_ends: the same from the full (high) end
    w = admit(c, "w", {"window": 2})[0]
    mark(c, *c.oracle.held(w)["window"])
    check(until_rung3(c, "f", {"full": 1}), "a full admission moved the float (rung 3)")
    pad(c, rng, 60)


# ---------------------------------------------------------------------------------------------
# test_multi_ended_allocator.py::TestFloatMultiEndedAllocator, toy-tri


def float_band(c: Conductor, rng: random.Random) -> None:
    S = _s()
    # test_midpoint_initial_placement: the first window pages open the float with a gap on both sides
    o, e = admit(c, "w", {"window": 4})
    mark(c, *e.pages["window"])
    lo, hi = span(c, "window")
    check(span(c, "state")[1] < lo and hi < span(c, "full")[0], "a gap on both sides of the float")
    ok(c, "free", "free", owner=o)
    # test_holes_first_reuse_is_zero_copy: an interior block freed -> holes, span unchanged; reused in place
    blocks = [admit(c, "b", {"window": 2})[0] for _ in range(3)]
    for b in blocks:
        mark(c, *c.oracle.held(b)["window"])
    before = span(c, "window")
    mid = window_interior(c, blocks)
    ok(c, "free the interior block", "free", owner=mid)
    check(len(holes(c, "window")) == 2 and span(c, "window") == before, "two holes, span unchanged")
    e = admit(c, "b", {"window": 2}, rung=1)[1]
    check(not (e.plan or {}).get("moves") and not holes(c, "window") and span(c, "window") == before, "in place")
    S.readback(c)
    # test_boundary_free_absorbed_at_the_deferred_point: a boundary block freed -> the span shrinks, no copies
    lo, hi = span(c, "window")
    edge = next(b for b in c.oracle.owners() if slot(c, c.oracle.held(b)["window"][0]) in (lo, hi - 1) or
                slot(c, c.oracle.held(b)["window"][-1]) in (lo, hi - 1))
    ok(c, "free a boundary block", "free", owner=edge)
    check(span(c, "window")[1] - span(c, "window")[0] == hi - lo - 2 and not holes(c, "window"), "absorbed")
    # test_park_on_empty_restores_transparency: the last block freed -> the float parks, the ends see through
    free_all(c)
    check(span(c, "window")[0] == span(c, "window")[1], "parked")
    # test_extends_toward_larger_gap: the full end takes most of the high gap; the float still grows
    o, e = admit(c, "w", {"window": 2})
    mark(c, *e.pages["window"])
    gap_high = span(c, "full")[0] * c.geo.page_bytes["full"] - span(c, "window")[1] * c.geo.page_bytes["window"]
    f = admit(c, "f", {"full": max(1, gap_high // c.geo.page_bytes["full"] - 1)})[0]
    ok(c, "extend the float", "extend", owner=o, demand={"window": 2})
    S.readback(c)
    ok(c, "free f", "free", owner=f)
    # test_make_room_boundary_relocation / test_make_room_leapfrog_cost_bounded_by_live: room for the high end
    # beyond its gap moves float pages (at most the live ones), the data follows
    gap_high = span(c, "full")[0] * c.geo.page_bytes["full"] - span(c, "window")[1] * c.geo.page_bytes["window"]
    ask = gap_high // c.geo.page_bytes["full"] + 2
    plan = ok(c, "relayout: room for the full end", "relayout", demand={"full": ask}).plan or {}
    check(0 < len(plan["moves"]) <= live(c, "window"), "moved at most the float's live pages")
    S.readback(c)
    admit(c, "f", {"full": ask})
    # test_make_room_impossible_leaves_state_unchanged: an impossible relayout is refused, nothing moves
    refused(c, "AdmissionRejected", "relayout that cannot fit", "relayout", demand={"window": c.geo.top["window"]})
    # test_make_room_uses_far_holes_before_far_gap: float holes absorb moved pages
    free_all(c)
    blocks = [admit(c, "b", {"window": 2})[0] for _ in range(3)]
    for b in blocks:
        mark(c, *c.oracle.held(b)["window"])
    ok(c, "free the interior block", "free", owner=window_interior(c, blocks))
    gap_high = span(c, "full")[0] * c.geo.page_bytes["full"] - span(c, "window")[1] * c.geo.page_bytes["window"]
    lo = span(c, "window")[0]
    ok(c, "relayout: room for the full end", "relayout",
       demand={"full": gap_high // c.geo.page_bytes["full"] + 1})
    check(span(c, "window")[0] == lo and not holes(c, "window"), "the holes took the moved pages; low side kept")
    S.readback(c)
    # test_float_free_has_no_stale_slot_item_sync (test_unified_tri_pool.py): "callers must not double-free" the
    # float; SGLang's float accepts it (finding 2), here it is refused and changes nothing
    b = next(iter(c.oracle.owners()))
    h = c.oracle.held(b)["window"][0]
    ok(c, "drop a float page", "drop", owner=b, pages=[h])
    refused(c, "DoubleFree", "drop it again", "drop", owner=b, pages=[{"dead": h}])
    ok(c, "free the block", "free", owner=b)
    refused(c, "UnknownOwner", "free the block again", "free", owner=b)
    pad(c, rng, 60, {"relayout": 6, "squeeze": 4})


# ---------------------------------------------------------------------------------------------
# test_allocator_cpu.py, test_allocator_refcount.py, test_allocator_page_aligned_free.py (the token and paged
# allocators: one class of pages), toy-state's full class


def token_allocators(c: Conductor, rng: random.Random) -> None:
    S = _s()
    top = c.geo.top["full"]
    # test_allocator_cpu.py::TestTokenAllocatorAlloc
    o, e = admit(c, "a", {"full": 4})  # test_returns_correct_count, test_returns_unique_indices
    check(len(set(slot(c, h) for h in e.pages["full"])) == 4, "four distinct slots")
    o2, e2 = admit(c, "a", {"full": 4})  # test_sequential_allocs_non_overlapping
    check(not {slot(c, h) for h in e.pages["full"]} & {slot(c, h) for h in e2.pages["full"]}, "disjoint")
    free_all(c, (o, o2))
    full = largest(c, ("full",), top)  # test_exact_capacity_succeeds
    o, _e = admit(c, "a", {"full": full})
    refused(c, "AdmissionRejected", "nothing left", "admit", owner="one", demand={"full": 1}, shared=[])
    ok(c, "free everything", "free", owner=o)  # TestTokenAllocatorFree::test_restores_available_size
    refused(c, "InvalidArgument", "test_over_capacity_returns_none (SGLang: None)", "admit", owner="big",
            demand={"full": top + 1}, shared=[])
    if full < top:
        refused(c, "AdmissionRejected", "test_over_capacity_returns_none within the grid", "admit", owner="big",
                demand={"full": full + 1}, shared=[])
    z = ok(c, "test_zero_alloc_is_noop", "admit", owner="zero", demand={"full": 0}, shared=[])
    check(not S.flat(z), "no pages")
    ok(c, "free the empty owner", "free", owner="zero")
    o, e = admit(c, "a", {"full": 4})  # TestTokenAllocatorFree::test_empty_tensor_is_noop
    check(ok(c, "free of no pages", "drop", owner=o, pages=[]).freed == [], "nothing freed")
    ok(c, "free", "free", owner=o)  # test_freed_indices_reusable / test_need_sort_triggers_merge_before_alloc
    o, _e = admit(c, "a", {"full": full})
    ok(c, "free", "free", owner=o)
    # test_allocator_refcount.py::test_token_allocator_retain_delays_reuse / ..._paged_allocator_retain_...
    o, e = admit(c, "r", {"full": 3})
    mark(c, *e.pages["full"])
    ok(c, "retain: a second owner", "share", owner=CACHE, pages=e.pages["full"])
    check(ok(c, "first free: nothing is released", "free", owner=o).freed == [], "retained")
    check(largest(c, ("full",), full) == full - 3, "available = capacity - 3")
    S.readback(c)
    check(len(ok(c, "second free releases them", "drop", owner=CACHE, pages=e.pages["full"]).freed or []) == 3,
          "released")
    check(largest(c, ("full",), full) == full, "available = capacity")
    # test_allocator_refcount.py::test_double_free_raises (ValueError); test_allocator_cpu.py::
    # TestPagedAllocatorDebugModeCPU::test_free_duplicate_pages_raises (debug mode only): always refused here
    o, e = admit(c, "d", {"full": 2})
    ok(c, "free", "free", owner=o)
    refused(c, "UnknownOwner", "free again", "free", owner=o)
    o, e = admit(c, "d", {"full": 4})
    v = e.pages["full"]
    # test_allocator_page_aligned_free.py::test_debug_free_rejects_malformed_or_duplicate_page_blocks,
    # ::test_token_free_group_and_debug_duplicate_contract: duplicates refused before any mutation
    refused(c, "InvalidArgument", "duplicate pages in one free", "drop", owner=o, pages=[v[0], v[1], v[0]])
    refused(c, "DoubleFree", "a page this owner does not hold", "drop", owner=o, pages=[v[0], BAD])
    ok(c, "drop one page", "drop", owner=o, pages=[v[0]])
    # ::test_debug_free_group_rejects_duplicate_merged_page: the same page freed twice -> refused, unchanged
    refused(c, "DoubleFree", "the same page again", "drop", owner=o, pages=[{"dead": v[0]}])
    ok(c, "free", "free", owner=o)
    pad(c, rng, 60, {"double_free": 5, "drop_some": 5, "cache_insert": 4, "cache_evict": 4})


# ---------------------------------------------------------------------------------------------
# test_allocator_lazy_free.py (the pending-free buffer), plus a free while a user still holds the pages


def lazy_free(c: Conductor, rng: random.Random) -> None:
    full = largest(c, ("full",), c.geo.top["full"])
    # TestLazyFreeCorrectness::test_freed_slots_returned_after_alloc
    o, _e = admit(c, "a", {"full": 5})
    ok(c, "free", "free", owner=o)
    admit(c, "a", {"full": 5}, rung=1)
    free_all(c)
    # ::test_multiple_frees_batched_into_one_flush
    a, b = admit(c, "a", {"full": 5})[0], admit(c, "b", {"full": 5})[0]
    ok(c, "free a", "free", owner=a)
    ok(c, "free b", "free", owner=b)
    o, _e = admit(c, "c", {"full": 10})
    ok(c, "free", "free", owner=o)
    # ::test_slot_values_preserved_through_pending: freed pages come back as valid pages of the grid
    first, _ = admit(c, "a", {"full": 3})
    keep, _ = admit(c, "k", {"full": 3})
    ok(c, "free the first three", "free", owner=first)
    o, e = admit(c, "a", {"full": 3})
    check(all(0 <= slot(c, h) < c.geo.top["full"] for h in e.pages["full"]), "valid slots")
    free_all(c, (o, keep))
    # TestAvailableSize::test_available_size_includes_pending / ::test_available_size_after_flush
    o, _e = admit(c, "a", {"full": 4})
    check(largest(c, ("full",), full) == full - 4, "4 fewer")
    ok(c, "free", "free", owner=o)
    check(largest(c, ("full",), full) == full, "all back")
    # TestEdgeCases::test_free_empty_tensor_is_noop, ::test_alloc_returns_none_when_truly_empty,
    # ::test_pending_does_not_exceed_pool_size
    o, _e = admit(c, "a", {"full": 3})
    check(ok(c, "free nothing", "drop", owner=o, pages=[]).freed == [], "nothing")
    ok(c, "free", "free", owner=o)
    o, _e = admit(c, "a", {"full": full})
    refused(c, "AdmissionRejected", "truly empty", "admit", owner="one", demand={"full": 1}, shared=[])
    ok(c, "free all", "free", owner=o)
    check(largest(c, ("full",), full) == full, "no double counting")
    # TestFreeGroupInterop::test_free_group_not_affected_by_pending: two frees, then 10 pages fit
    a, b = admit(c, "a", {"full": 5})[0], admit(c, "b", {"full": 5})[0]
    ok(c, "free b", "free", owner=b)
    ok(c, "free a", "free", owner=a)
    o, _e = admit(c, "c", {"full": 10})
    ok(c, "free", "free", owner=o)
    # kvarena's lazy free: a request freed while a forward pass still reads its pages; the slots are withheld
    # (not reused) until the pass is released, then become holes again
    o, e = admit(c, "r", {"full": 3})
    mark(c, *e.pages["full"])
    ok(c, "forward pass reads the request", "acquire", user="fwd", kind="forward_read", pages=e.pages["full"])
    slots = {slot(c, h) for h in e.pages["full"]}
    ok(c, "free while in flight", "free", owner=o)
    check(set(c.oracle.snapshot().withheld.get("full", ())) == slots, "withheld while read")
    _, n = admit(c, "n", {"full": 2})
    check(not {slot(c, h) for h in n.pages["full"]} & slots, "nothing lands on a withheld slot")
    ok(c, "the forward finishes", "release", user="fwd")
    check(not c.oracle.snapshot().withheld.get("full"), "no longer withheld")
    pad(c, rng, 60, {"acquire": 6, "release": 6, "free": 5, "moves_under_users": 4})


MEM = "sglang test/registered/unit/mem_cache/"
MULTI = MEM + "test_multi_ended_allocator.py"


def unit_vectors() -> tuple[VectorSpec, ...]:
    from kvarena.conformance.vectors.steps import VectorSpec

    def spec(name: str, source: str, model: str, capacity: int, script: Any, seed: int, **kw: Any) -> VectorSpec:
        return VectorSpec(f"sglang-unit-{name}", source, model, capacity, 2, script, seed=seed, **kw)

    return (
        spec("multi-ended", f"{MULTI}::TestMultiEndedAllocator (test_basic_alloc_free_compaction, test_grow_down_side, "
             "test_byte_frontier_coordination, test_double_free_raises, test_slot_zero_sink_invariant_survives_churn, "
             "test_randomized), ::TestPagedMultiEndedAllocator::test_paged_compaction_relocates_whole_pages",
             "toy-state", 2624, multi_ended, 101),
        spec("lazy-compaction", f"{MULTI}::TestLazyCompaction (inward walk, holes first, available size, flush, "
             "write-set blocker, read race), ::TestMultiEndedAllocator::test_lazy_retract_churn_no_ghost",
             "toy-state", 2624, lazy_compaction, 102),
        spec("swa-composite", f"{MULTI}::TestUnifiedSWATokenToKVPoolAllocator (both peers hold, free_swa, divergent "
             "compaction, joint budget, randomized alloc/free/free_swa)", "toy-swa", 4096, swa_composite, 103),
        spec("tri-pool", f"{MEM}test_unified_tri_pool.py::TestUnifiedTriPool and ::TestGeneralizedRebalance (joint "
             "availability, rollback of refused composite admissions, free_swa holes, float rebalance for either "
             "end)", "toy-tri", 4096, tri_pool, 104, mamba_full_memory_ratio=0.1),
        spec("float", f"{MULTI}::TestFloatMultiEndedAllocator (placement, holes-first reuse, boundary absorption, "
             "park on empty, make_room)", "toy-tri", 4096, float_band, 105),
        spec("token-allocators", f"{MEM}test_allocator_cpu.py (TestTokenAllocatorAlloc, TestTokenAllocatorFree), "
             "test_allocator_refcount.py (test_token_allocator_retain_delays_reuse, test_double_free_raises), "
             "test_allocator_page_aligned_free.py (test_debug_free_rejects_malformed_or_duplicate_page_blocks)",
             "toy-state", 2624, token_allocators, 106),
        spec("lazy-free", f"{MEM}test_allocator_lazy_free.py (TestLazyFreeCorrectness, TestAvailableSize, "
             "TestEdgeCases, TestFreeGroupInterop: pending frees count as available and are reused by the next "
             "alloc), and a free while a forward pass still reads", "toy-state", 2624, lazy_free, 107),
    )
