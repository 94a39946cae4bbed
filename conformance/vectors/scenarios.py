"""The committed vector set: what each file of conformance/vectors/ exercises, and how it is generated.

Each :class:`VectorSpec` is a configuration, a seed and a script over the reference (a
:class:`~kvarena.conformance.machine.harness.Conductor` with no implementation).  Scripts are scripted
scenarios (named after the behaviour or the SGLang bug they pin down), random walks over the
lockstep machine's alphabet (lockstep.RULES) drawn with ``random.Random(seed)``, or both.  A
scenario asserts that the reference does what it is meant to show (e.g. that an admission really
took rung 2), so a change to the reference that retires a scenario fails generation loudly.

Regenerate with ``kvarena vectors --write``; ``kvarena vectors --check`` (and
tests/fast/test_vectors.py) fail when a committed file differs from what the reference gives now.
"""

from __future__ import annotations

import random
from typing import Any

from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import CACHE
from kvarena.conformance.vectors.steps import (  # noqa: F401 - re-exported: the scenario vocabulary
    ScenarioError,
    Script,
    VectorSpec,
    by_slot,
    fill,
    flat,
    mixed,
    must,
    owners_of,
    readback,
    walk,
    write_page,
)

# ---------------------------------------------------------------------------------------------
# Scenarios


LEDGER_WEIGHTS = {"acquire": 8, "release": 6, "moves_under_users": 8, "compact": 5, "relayout": 5, "squeeze": 3,
                  "churn": 4, "write_page": 3, "duplicate_user": 2, "release_unknown": 2}


def rung1_reuse(c: Conductor, rng: random.Random) -> None:
    """Rung 1: holes nearest each anchor first, then frontiers into the gap; nothing moves."""
    r1 = must(c.run("admit", owner="r1", demand={"state": 1, "window": 2, "full": 2}, shared=[]), "r1", rung=1)
    must(c.run("admit", owner="r2", demand={"state": 1, "window": 1, "full": 2}, shared=[]), "r2", rung=1)
    r3 = must(c.run("admit", owner="r3", demand={"state": 1, "window": 1, "full": 1}, shared=[]), "r3", rung=1)
    for h in flat(r1)[:3] + flat(r3)[:2]:
        write_page(c, h)
    must(c.run("free", owner="r2"), "free r2")  # holes in the middle of every band
    must(c.run("admit", owner="r4", demand={"state": 1, "window": 1, "full": 2}, shared=[]), "r4 reuses holes",
         rung=1)
    must(c.run("extend", owner="r1", demand={"window": 1, "full": 1}), "extend r1", rung=1)
    must(c.run("slide", owner="r1", cls="window", n=1), "slide r1")
    must(c.run("admit", owner="r5", demand={"full": 1}, shared=[r1.pages["full"][0]]), "prefix hit", rung=1)
    for h in flat(r3):
        c.run("translate", page=h)
    walk(c, rng, 90)
    readback(c)


def rung2_compact(c: Conductor, rng: random.Random) -> None:
    """Rung 2: the low band's holes are reachable only by compaction; compact() with a budget, under a
    writer (the page stays) and under a reader (its old slot is withheld until release)."""
    made = fill(c, "s", {"state": 1}, limit=20)  # one state per request (recurrent_slots 1)
    owners = [f"s{i}" for i in range(1, c.serial + 1) if any(s.get("args", {}).get("owner") == f"s{i}"
                                                              for s in c.steps)]
    admitted = [o for o, e in zip(owners, made) if e.ok]
    for h in flat(made[len(admitted) - 1]):
        write_page(c, h)
    for o in admitted[1::2]:
        c.run("free", owner=o)
    got = fill(c, "f", {"full": 2})
    if not any((e.plan or {}).get("rung") == 2 for e in got if e.ok):
        raise ScenarioError("rung2-compact: no admission took rung 2")
    c.run("free", owner=admitted[0])
    must(c.run("compact", max_moves=1), "compact(1)")
    for user, kind in (("w1", "forward_write"), ("r1", "host_save")):
        far = by_slot(c, "state")[-1]  # the page farthest from the anchor
        must(c.run("acquire", user=user, kind=kind, pages=[far]), user)
        near = owners_of(c, by_slot(c, "state")[0])
        if near and near[0] != owners_of(c, far)[0]:
            c.run("free", owner=near[0])  # a hole nearer the anchor than `far`
        plan = must(c.run("compact", max_moves=None), f"compact under {kind}").plan or {}
        moved = any(m[0] == "state" and m[1] == c.oracle.snapshot().pages.get(far, ("", -1))[1] for m in plan["moves"])
        if kind == "forward_write" and moved:
            raise ScenarioError("compaction moved a page with a writer")
        c.run("admit", owner=c.fresh("after"), demand={"state": 1}, shared=[])
        must(c.run("release", user=user), f"release {user}")
        must(c.run("compact", max_moves=None), "compact after release")
    walk(c, rng, 80, {"squeeze": 6, "compact": 6, "churn": 4})
    readback(c)


def rung3_relayout(c: Conductor, rng: random.Random) -> None:
    """Rung 3: the window float moves between the compacted ends to make room for the ends."""
    w = must(c.run("admit", owner="w1", demand={"window": 2}, shared=[]), "float placed at its hint", rung=1)
    for h in flat(w):
        write_page(c, h)
    got = fill(c, "s", {"state": 1}, limit=192)
    got += fill(c, "f", {"full": 1})
    if not any((e.plan or {}).get("rung") == 3 for e in got if e.ok):
        raise ScenarioError("rung3-relayout: no admission took rung 3")
    for o in [o for o in c.oracle.owners() if o.startswith("s")][::2]:
        c.run("free", owner=o)
    c.run("relayout", demand={"state": 2, "window": 0, "full": 0})
    c.run("acquire", user="fwd", kind="forward_read", pages=c.oracle.held("w1")["window"])
    c.run("relayout", demand={"state": 0, "window": 1, "full": 2})
    c.run("release", user="fwd")
    c.run("relayout", demand={"state": 0, "window": 1, "full": 2})
    walk(c, rng, 80, {"squeeze": 6, "relayout": 6, "moves_under_users": 4})
    readback(c)


BAD = [{"vid": -1}, {"vid": -7}, {"vid": 2**31 - 1}]


def errors_every_code(c: Conductor, rng: random.Random) -> None:
    """Every error code every operation can raise, each checked to leave the state unchanged."""
    g = c.geo
    r1 = must(c.run("admit", owner="r1", demand={"state": 1, "window": 1, "full": 2}, shared=[]), "r1")
    r2 = must(c.run("admit", owner="r2", demand={"full": 1}, shared=[]), "r2")
    h0, h1 = r1.pages["full"]
    other = r2.pages["full"][0]

    def expect(code: str, op: str, **args: Any) -> None:
        must(c.run(op, **args), f"{op} {args}", code=code)

    expect("DuplicateOwner", "admit", owner="r1", demand={"full": 1}, shared=[])
    expect("InvalidArgument", "admit", owner="x", demand={"nope": 1}, shared=[])
    expect("InvalidArgument", "admit", owner="x", demand={"full": -1}, shared=[])
    expect("InvalidArgument", "admit", owner="x", demand={"full": g.top["full"] + 1}, shared=[])
    expect("InvalidArgument", "admit", owner="x", demand={"state": g.top["state"], "full": g.top["full"]}, shared=[])
    expect("InvalidArgument", "admit", owner="x", demand={"full": 1}, shared=[h0, h0])
    expect("UnknownPage", "admit", owner="x", demand={"full": 1}, shared=[BAD[0]])
    expect("AdmissionRejected", "admit", owner="x", demand={"full": g.top["full"]}, shared=[])
    expect("UnknownOwner", "extend", owner="ghost", demand={"full": 1})
    expect("InvalidArgument", "extend", owner="r1", demand={"full": -2})
    expect("AdmissionRejected", "extend", owner="r1", demand={"full": g.top["full"]})
    must(c.run("share", owner=CACHE, pages=[h0]), "cache")
    expect("InvalidArgument", "share", owner=CACHE, pages=[h0])
    expect("InvalidArgument", "share", owner="cache2", pages=[h1, h1])
    expect("UnknownPage", "share", owner=CACHE, pages=[BAD[2]])
    expect("UnknownOwner", "drop", owner="ghost", pages=[])
    expect("InvalidArgument", "drop", owner="r1", pages=[h1, h1])
    expect("DoubleFree", "drop", owner="r1", pages=[BAD[1]])
    expect("DoubleFree", "drop", owner="r1", pages=[other])
    expect("UnknownOwner", "slide", owner="ghost", cls="full", n=0)
    expect("InvalidArgument", "slide", owner="r1", cls="nope", n=0)
    expect("InvalidArgument", "slide", owner="r1", cls="full", n=3)
    expect("InvalidArgument", "slide", owner="r1", cls="full", n=-1)
    expect("UnknownOwner", "free", owner="ghost")
    must(c.run("acquire", user="u1", kind="forward_read", pages=[h0]), "u1")
    expect("DuplicateUser", "acquire", user="u1", kind="net_send", pages=[h1])
    expect("InvalidArgument", "acquire", user="u2", kind="bogus", pages=[h1])
    expect("InvalidArgument", "acquire", user="u3", kind="net_recv", pages=[h1, h1])
    expect("UnknownPage", "acquire", user="u4", kind="host_load", pages=[BAD[0]])
    expect("ReleaseWithoutAcquire", "release", user="never")
    must(c.run("release", user="u1"), "release u1")
    expect("ReleaseWithoutAcquire", "release", user="u1")
    expect("InvalidArgument", "compact", max_moves=-1)
    expect("InvalidArgument", "relayout", demand={"nope": 1})
    expect("AdmissionRejected", "relayout", demand={"window": g.top["window"]})
    expect("InvalidArgument", "write", page=h0, entry=g.entries["full"], row=0, tag=1)
    expect("InvalidArgument", "write", page=h0, entry=0, row=-1, tag=1)
    expect("UnknownPage", "write", page=BAD[0], entry=0, row=0, tag=1)
    expect("InvalidArgument", "read", page=h0, entry=0, row=g.rows["full"])
    expect("UnknownPage", "read", page=BAD[1], entry=0, row=0)
    expect("UnknownPage", "translate", page=BAD[2])
    walk(c, rng, 60)
    readback(c)


def _smallest_capacity(config_json: dict) -> int:
    """The smallest capacity the reference builds for this configuration (binary search)."""
    from kvarena.conformance.machine.harness import config_from_json
    from kvarena.reference.arena import Arena
    from kvarena.spec.errors import CapacityTooSmallError

    def builds(cap: int) -> bool:
        try:
            Arena(config_from_json({**config_json, "capacity": cap}))
        except CapacityTooSmallError:
            return False
        return True

    lo, hi = 1, config_json["capacity"]
    assert builds(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if builds(mid) else (mid + 1, hi)
    return lo


def config_refusals(c: Conductor, rng: random.Random) -> None:
    """Construction refusals (ConfigError, CapacityTooSmall) and the smallest arena that builds."""
    base = dict(c.config_json)

    def construct(code: str | None, **changes: Any) -> None:
        must(c.run("construct", config={**base, **changes}), f"construct {changes}", code=code)

    construct("ConfigError", page_size=3)
    construct("ConfigError", page_size=0)
    construct("ConfigError", capacity=0)
    construct("ConfigError", capacity=-64)
    construct("ConfigError", swa_full_tokens_ratio=0.0)
    construct("ConfigError", swa_full_tokens_ratio=1.5)
    construct("ConfigError", mamba_full_memory_ratio=0.0)
    construct("ConfigError", max_context_len=0)
    smallest = _smallest_capacity(c.config_json)
    construct("CapacityTooSmall", capacity=smallest - 1)
    construct(None, capacity=smallest)
    construct("CapacityTooSmall", max_context_len=1024)
    construct("CapacityTooSmall", model="toy-state", capacity=1000)
    construct(None)
    construct(None, swa_full_tokens_ratio=1.0, mamba_full_memory_ratio=50.0)
    construct(None, model="toy-swa", capacity=2400, page_size=2)
    construct(None, page_size=2)
    walk(c, rng, 50)
    readback(c)


def sglang_double_free(c: Conductor, rng: random.Random) -> None:
    """sglang §8.4: lazy and float frees accept a double free; the -1 joins the free list and later
    translates to the sink.  Here every double free is a typed error and reference counts stay exact."""
    r1 = must(c.run("admit", owner="r1", demand={"state": 1, "window": 1, "full": 2}, shared=[]), "r1")
    r2 = must(c.run("admit", owner="r2", demand={"full": 1}, shared=[]), "r2")
    for h in flat(r1) + flat(r2):
        write_page(c, h)
    h0, h1 = r1.pages["full"]
    must(c.run("share", owner=CACHE, pages=[h0]), "cache keeps h0")
    must(c.run("drop", owner="r1", pages=[h0]), "r1 drops h0 (the cache still holds it)")
    must(c.run("drop", owner="r1", pages=[h0]), "second drop of h0", code="DoubleFree")
    must(c.run("drop", owner="r1", pages=[h1, h1]), "duplicate ids in one free", code="InvalidArgument")
    must(c.run("drop", owner="r1", pages=[{"vid": -1}]), "drop of -1", code="DoubleFree")
    must(c.run("drop", owner="r1", pages=[r2.pages["full"][0]]), "another owner's page", code="DoubleFree")
    must(c.run("free", owner="r1"), "free r1")
    must(c.run("free", owner="r1"), "second free of r1", code="UnknownOwner")
    must(c.run("drop", owner="r1", pages=[]), "drop after free", code="UnknownOwner")
    must(c.run("drop", owner=CACHE, pages=[h0]), "the cache lets h0 go: freed now")
    must(c.run("drop", owner=CACHE, pages=[{"dead": h0}]), "drop of a freed page", code="DoubleFree")
    must(c.run("translate", page={"dead": h0}), "translate a freed page", code="UnknownPage")
    must(c.run("write", page={"dead": h0}, entry=0, row=0, tag=7), "write a freed page", code="UnknownPage")
    must(c.run("acquire", user="u1", kind="net_send", pages=r2.pages["full"]), "u1")
    must(c.run("release", user="u1"), "release u1")
    must(c.run("release", user="u1"), "double release", code="ReleaseWithoutAcquire")
    must(c.run("admit", owner="r3", demand={"state": 1, "window": 1, "full": 2}, shared=[]), "reuse freed ids")
    readback(c)
    walk(c, rng, 60, {"double_free": 6, "drop_some": 5, "cache_evict": 4, "cache_insert": 4})
    readback(c)


def sglang_transfer_compaction(c: Conductor, rng: random.Random) -> None:
    """sglang PRs #37507 / #39982 / #37496: pages moved under an in-flight transfer, logical ids used as
    physical ones after compaction.  Here a transfer's pages are pinned (writer) or their old slots
    withheld (reader) exactly as long as the transfer holds them; everything else still moves."""
    for o in ("r1", "r2", "r3"):
        must(c.run("admit", owner=o, demand={"state": 1, "window": 2, "full": 2}, shared=[]), o)
    for o in ("r2", "r3"):
        for h in [h for hs in c.oracle.held(o).values() for h in hs]:
            write_page(c, h)
    r2 = [h for hs in c.oracle.held("r2").values() for h in hs]
    r3 = [h for hs in c.oracle.held("r3").values() for h in hs]
    must(c.run("acquire", user="send", kind="net_send", pages=r2), "transfer out of r2 (reader)")
    must(c.run("free", owner="r1"), "free r1: holes nearest the anchors")
    must(c.run("compact", max_moves=None), "compact while r2 is being sent")
    for h in r2:
        c.run("translate", page=h)
    readback(c)
    c.run("admit", owner="r4", demand={"state": 1, "full": 2}, shared=[])
    must(c.run("acquire", user="load", kind="host_load", pages=r3), "host load into r3 (writer)")
    must(c.run("free", owner="r2"), "free r2 while it is still being sent: withheld")
    must(c.run("compact", max_moves=None), "compact: r3 is pinned by its writer")
    c.run("relayout", demand={"state": 2, "window": 0, "full": 2})
    c.run("admit", owner="r5", demand={"state": 1, "window": 1, "full": 2}, shared=[])
    must(c.run("release", user="send"), "transfer out done: withheld slots become holes")
    must(c.run("compact", max_moves=None), "compact")
    must(c.run("release", user="load"), "host load done")
    must(c.run("compact", max_moves=None), "compact")
    readback(c)
    walk(c, rng, 96, LEDGER_WEIGHTS)  # (the vector stays within 300 steps)
    readback(c)


def sglang_one_side_starves(c: Conductor, rng: random.Random) -> None:
    """sglang PR #34441: "Can not alloc mamba cache" while the arena was full of the other kind and mamba
    eviction freed only mamba pages.  Here the caller evicts cache-only pages of *either* class and the
    ladder compacts the band they were in to make room for the starved one."""
    got = fill(c, "f", {"full": 2}, cache=True)
    if got[-1].ok:
        raise ScenarioError("the cache never filled the arena")
    starved = must(c.run("admit", owner="s1", demand={"state": 1}, shared=[]), "state starved",
                   code="AdmissionRejected")
    assert starved.shortfall
    cached = c.oracle.held(CACHE)["full"]
    must(c.run("drop", owner=CACHE, pages=cached[:2]), "evict the two oldest cache-only full pages")
    must(c.run("admit", owner="s1", demand={"state": 1}, shared=[]), "state fits after eviction + compaction",
         rung=2)
    must(c.run("drop", owner=CACHE, pages=c.oracle.held(CACHE)["full"]), "evict the rest")
    # cached recurrent state: a finished request's state copied into cache nodes (one owner each) until the arena
    # is full, then the request freed: every state page is cache-only
    t = must(c.run("admit", owner="t", demand={"state": 1}, shared=[]), "a request with a state")
    nodes = []
    for k in range(128):
        if not c.run("copy_state", owner=f"{CACHE}/t{k}", page=t.pages["state"][0]).ok:
            break
        nodes.append(f"{CACHE}/t{k}")
    must(c.run("free", owner="t"), "the request finishes")
    must(c.run("admit", owner="f1", demand={"full": 2}, shared=[]), "full starved", code="AdmissionRejected")
    for node in nodes[:8]:
        must(c.run("free", owner=node), "evict a cached state")
    must(c.run("admit", owner="f1", demand={"full": 2}, shared=[]), "full fits after eviction + compaction", rung=2)
    walk(c, rng, 60, {"cache_insert": 5, "cache_evict": 5, "squeeze": 3})
    readback(c)


def sglang_sink_page(c: Conductor, rng: random.Random) -> None:
    """sglang §8.8 (and Refinement 3): unmapped, negative or out-of-range ids resolve to a shared sink
    page 0 that is never re-zeroed.  Here every such id is UnknownPage (DoubleFree for drop) and nothing
    is written anywhere; a fresh recurrent slot reads as zeroed state."""
    r1 = must(c.run("admit", owner="r1", demand={"state": 1, "window": 1, "full": 1}, shared=[]), "r1")
    for h in flat(r1):
        write_page(c, h)
    for bad in BAD:
        must(c.run("write", page=bad, entry=0, row=0, tag=99), f"write {bad}", code="UnknownPage")
        must(c.run("read", page=bad, entry=0, row=0), f"read {bad}", code="UnknownPage")
        must(c.run("translate", page=bad), f"translate {bad}", code="UnknownPage")
        must(c.run("acquire", user=c.fresh("u"), kind="net_recv", pages=[bad]), f"acquire {bad}", code="UnknownPage")
        must(c.run("share", owner=CACHE, pages=[bad]), f"share {bad}", code="UnknownPage")
        must(c.run("admit", owner=c.fresh("r"), demand={"full": 1}, shared=[bad]), f"admit shared {bad}",
             code="UnknownPage")
        must(c.run("drop", owner="r1", pages=[bad]), f"drop {bad}", code="DoubleFree")
    readback(c)
    state = r1.pages["state"][0]
    must(c.run("free", owner="r1"), "free r1")
    for op in ("read", "translate"):
        args: dict[str, Any] = {"page": {"dead": state}}
        if op == "read":
            args.update(entry=0, row=0)
        must(c.run(op, **args), f"{op} a freed recurrent page", code="UnknownPage")
    r2 = must(c.run("admit", owner="r2", demand={"state": 1, "full": 1}, shared=[]), "r2 reuses the slot")
    for h in r2.pages["state"]:
        for row in range(c.geo.rows["state"]):
            must(c.run("read", page=h, entry=0, row=row), "fresh recurrent rows read 0")
    walk(c, rng, 60, {"unknown_page": 6, "write": 6, "read": 4})
    readback(c)


def sglang_off_grid_frontier(c: Conductor, rng: random.Random) -> None:
    """sglang §8.2: the grow-down backstop floors the neighbour's frontier onto its own page grid and can
    land up to one entry below it (an overlap).  Here the low frontier sits off the high band's grid
    (state pages of 64 B, full pages of 128 B) and the high band stops above it, then the low band
    takes exactly the 64 B left between them."""
    for s in ("s", "s_b", "s_c"):  # one state each: the low frontier at 192 B
        must(c.run("admit", owner=s, demand={"state": 1}, shared=[]), f"{s}: low frontier at 192 B")
    must(c.run("admit", owner="w", demand={"window": 1}, shared=[]), "a float at its hint")
    fill(c, "f", {"full": 1})
    must(c.run("free", owner="w"), "the float empties (parked)")
    fill(c, "g", {"full": 1})
    must(c.run("admit", owner="s2", demand={"state": 1}, shared=[]), "the 64 B between the frontiers")
    c.run("admit", owner="s3", demand={"state": 1}, shared=[])
    walk(c, rng, 60, {"squeeze": 4})
    readback(c)


def float_hint_exact(c: Conductor, rng: random.Random) -> None:
    """The empty window float starts at its hint, computed in exact rationals: at 3264 B and mamba ratio 0.7 the
    state region is 3264 * 7 / 17 = 1344 B exactly, so the window's region (and hint) starts at byte 1408, slot 11;
    binary floating point gives 1343.99... -> 1343 B and slot 10 (spec/arena.md §Split-pool baseline)."""
    w = must(c.run("admit", owner="w1", demand={"window": 2}, shared=[]), "w1 at the hint", rung=1)
    slots = list(w.plan["placements"]["window"])
    if slots != [11, 12]:
        raise ScenarioError(f"the empty window float opened at {slots}, not at its exact hint [11, 12]")
    must(c.run("admit", owner="r1", demand={"state": 1, "full": 4}, shared=[]), "ends around the float", rung=1)
    must(c.run("free", owner="w1"), "the float parks")
    w = must(c.run("admit", owner="w2", demand={"window": 1}, shared=[]), "reopens at the hint", rung=1)
    if list(w.plan["placements"]["window"]) != [11]:
        raise ScenarioError(f"the parked float reopened at {w.plan['placements']['window']}, not at its hint [11]")
    walk(c, rng, 60)
    readback(c)


def flush_idle(c: Conductor, rng: random.Random) -> None:
    """The idle-time flush (spec/arena.md §flush_idle): holes in both end bands, then budgets of nothing, less
    than a page, one page, a writer's barrier and everything; malformed budgets refused; the data follows."""
    pb = c.geo.page_bytes
    got = [must(c.run("admit", owner=f"r{i}", demand={"state": 1, "full": 2}, shared=[]), f"r{i}", rung=1)
           for i in range(1, 7)]
    for e in got:
        for h in flat(e):
            write_page(c, h)
    for i in (1, 3, 5):
        must(c.run("free", owner=f"r{i}"), f"free r{i}")  # holes near both anchors
    if must(c.run("flush_idle", budget_bytes=0), "budget 0").plan["moves"]:
        raise ScenarioError("flush_idle(0) moved a page")
    if must(c.run("flush_idle", budget_bytes=pb["state"] - 1), "under one page").plan["moves"]:
        raise ScenarioError("flush_idle below one page's bytes moved a page")
    one = must(c.run("flush_idle", budget_bytes=pb["state"]), "one state page").plan
    if [m[0] for m in one["moves"]] != ["state"]:
        raise ScenarioError(f"flush_idle of one state page's bytes moved {one['moves']}")
    far = by_slot(c, "full")[0]  # the high band's page farthest from its anchor
    must(c.run("acquire", user="w", kind="forward_write", pages=[far]), "a writer pins the far page")
    pinned = must(c.run("flush_idle", budget_bytes=c.geo.capacity), "flush under a writer").plan
    slot = c.oracle.snapshot().pages[far][1]
    if any(m[0] == "full" and m[1] == slot for m in pinned["moves"]):
        raise ScenarioError("flush_idle moved a page with a writer")
    must(c.run("release", user="w"), "release w")
    must(c.run("flush_idle", budget_bytes=c.geo.capacity), "flush everything")
    if must(c.run("flush_idle", budget_bytes=c.geo.capacity), "nothing left").plan["moves"]:
        raise ScenarioError("a second full flush moved pages")
    for bad in (-1, 1.5, True, "64", None):
        must(c.run("flush_idle", budget_bytes=bad), f"budget {bad!r}", "InvalidArgument")
    walk(c, rng, 40, {"flush_idle": 6, "free": 6, "churn": 4})
    readback(c, limit=24)


VECTORS: tuple[VectorSpec, ...] = (
    VectorSpec("mixed-toy-tri-a", "random walk over every operation and error path; state | window | full",
               "toy-tri", 3616, 4, mixed(230), seed=1),
    VectorSpec("mixed-toy-tri-b", "random walk, page_size 2 (more, smaller pages)", "toy-tri", 2912, 2,
               mixed(230), seed=2),
    VectorSpec("mixed-toy-swa", "random walk on window | full (no float: relayout has nothing to move)", "toy-swa",
               2816, 4, mixed(200), seed=3),
    VectorSpec("mixed-toy-state", "random walk on state | full", "toy-state", 2624, 2, mixed(200), seed=4),
    VectorSpec("mixed-toy-two-float", "random walk on state | long window | short window | full: two float bands",
               "toy-two-float", 5632, 2, mixed(90), seed=21),
    VectorSpec("mixed-toy-win-float", "random walk on long window | short window | full: a window-only float chain",
               "toy-win-float", 3104, 4, mixed(90), seed=23),
    VectorSpec("mixed-gpt-oss-20b", "random walk on the real GPT-OSS-20B geometry (24 rows per entry), page_size 1",
               "gpt-oss-20b", 1 << 20, 1, mixed(120), seed=5),
    VectorSpec("ledger-toy-tri", "random walk weighted to ledger users, moves under forward passes, compaction "
               "and relayout", "toy-tri", 3360, 2, mixed(230, LEDGER_WEIGHTS), seed=6),
    VectorSpec("rung1-reuse", "rung 1: holes nearest the anchors, frontiers, a prefix hit; nothing moves",
               "toy-tri", 6144, 4, rung1_reuse, seed=7),
    VectorSpec("rung2-compact", "rung 2: admissions that need compaction; compact() with a budget, under a "
               "writer and under a reader", "toy-state", 2624, 2, rung2_compact, seed=8),
    VectorSpec("rung3-relayout", "rung 3: the window float moves for the ends; relayout() with and without "
               "a user on the float", "toy-tri", 2912, 2, rung3_relayout, seed=9),
    VectorSpec("errors-every-code", "every error code each operation can raise; state unchanged after each",
               "toy-tri", 3616, 4, errors_every_code, seed=10),
    VectorSpec("config-refusals", "construction: ConfigError and CapacityTooSmall (the feasibility floor); the "
               "smallest toy-tri arena that builds", "toy-tri", 3104, 4, config_refusals, seed=11),
    VectorSpec("sglang-double-free", "sglang §8.4: double frees, -1 ids, a page freed twice through two owners",
               "toy-tri", 3616, 4, sglang_double_free, seed=12),
    VectorSpec("sglang-transfer-compaction", "sglang #37507 / #39982 / #37496: compaction and relayout while "
               "transfers read and write pages", "toy-tri", 3360, 2, sglang_transfer_compaction, seed=13),
    VectorSpec("sglang-one-side-starves", "sglang #34441: one class fills the arena with cache-only pages and "
               "starves the other until the caller evicts", "toy-state", 2624, 2, sglang_one_side_starves,
               seed=14),
    VectorSpec("sglang-sink-page", "sglang §8.8: unbound, negative and huge ids are errors, never a shared sink",
               "toy-tri", 3616, 4, sglang_sink_page, seed=15),
    VectorSpec("float-hint-exact", "the empty float opens at its hint in exact rationals (3264 * 7 / 17 = 1344 B of "
               "state; binary floating point gives 1343)", "toy-tri", 3264, 1, float_hint_exact, seed=17,
               mamba_full_memory_ratio=0.7),
    VectorSpec("flush-idle", "the idle-time flush under a byte budget: nothing, under a page, one page, a writer's "
               "barrier, everything; malformed budgets refused", "toy-tri", 6144, 4, flush_idle, seed=22),
    VectorSpec("sglang-off-grid-frontier", "sglang §8.2: a low frontier off the high band's page grid; no overlap",
               "toy-tri", 2912, 2, sglang_off_grid_frontier, seed=16),
)

from kvarena.conformance.vectors.sglang import unit_vectors  # noqa: E402 (SGLang's own unit tests, ported)

VECTORS += unit_vectors()

from kvarena.conformance.vectors.integrations import integration_vectors  # noqa: E402 (spec §Integrations)

VECTORS += integration_vectors()

from kvarena.conformance.vectors.recurrent import recurrent_vectors  # noqa: E402 (spec/arena.md §INV-STATE-PRIVATE)

VECTORS += recurrent_vectors()

from kvarena.conformance.vectors.hymba import hymba_vectors  # noqa: E402 (rung 3 on a published model)

VECTORS += hymba_vectors()

from kvarena.conformance.vectors.below import below_vectors  # noqa: E402 (spec/arena.md §Placement limit)

VECTORS += below_vectors()
