"""Recurrent state in a vector (conformance/vectors/recurrent-copy-state.jsonl; spec/arena.md §INV-STATE-PRIVATE).

A request's recurrent state is its own: prefix caching copies it (``copy_state``) into a cache node or into a
request that hits the cache, never shares it; an owner holds at most ``recurrent_slots`` recurrent pages. The
script asserts on the reference what an engine relies on (the copy reads back the source's rows, the source keeps
its own, a copy that does not fit is rejected and fits after an eviction) and records every refusal: sharing a
state page, admitting with one shared, an owner over its slot, copying a token page, an unbound or freed source,
an acquire of no pages, and a relayout that moves nothing (a bare NONE plan). Helpers come from scenarios.py,
imported when the script runs (scenarios.py imports this module for VECTORS).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from kvarena.conformance.machine.harness import CACHE

if TYPE_CHECKING:
    from kvarena.conformance.machine.conductor import Conductor
    from kvarena.conformance.vectors.steps import VectorSpec

WEIGHTS = {"copy_state": 6, "state_refusals": 3, "acquire_nothing": 1, "write_page": 3, "free": 5,
           "cache_evict": 3}


def recurrent_copy_state(c: Conductor, rng: random.Random) -> None:
    from kvarena.conformance.vectors.steps import ScenarioError, fill, must, readback, walk, write_page

    r1 = must(c.run("admit", owner="r1", demand={"state": 1, "window": 1, "full": 2}, shared=[]), "r1")
    src = r1.pages["state"][0]
    token = r1.pages["full"][0]
    write_page(c, src)
    node = must(c.run("copy_state", owner="cache/n1", page=src), "copy r1's state to a cache node")
    copy = node.pages["state"][0]
    for row in range(c.geo.rows["state"]):
        want = c.expected[src][(0, row)]
        got = must(c.run("read", page=copy, entry=0, row=row), "the copy reads the source's row").value
        if got != want:
            raise ScenarioError(f"copy_state: row {row} reads {got}, the source wrote {want}")
    c.serial += 1
    must(c.run("write", page=copy, entry=0, row=0, tag=c.serial), "write the copy")
    must(c.run("read", page=src, entry=0, row=0), "the source keeps its own row")
    must(c.run("share", owner=CACHE, pages=r1.pages["full"] + r1.pages["window"]), "cache the KV prefix")
    # refusals: each InvalidArgument / UnknownPage, nothing changes
    must(c.run("share", owner=CACHE, pages=[src]), "share a state page", code="InvalidArgument")
    must(c.run("admit", owner="hit0", demand={"full": 1}, shared=[src]), "admit sharing a state page",
         code="InvalidArgument")
    must(c.run("admit", owner="big", demand={"state": 2}, shared=[]), "two states for one request",
         code="InvalidArgument")
    must(c.run("extend", owner="r1", demand={"state": 1}), "r1's second state", code="InvalidArgument")
    must(c.run("copy_state", owner="r1", page=copy), "a copy into an owner with no free slot",
         code="InvalidArgument")
    must(c.run("copy_state", owner="cache/n2", page=token), "copy a token page", code="InvalidArgument")
    must(c.run("copy_state", owner="cache/n2", page={"vid": -1}), "copy an unbound id", code="UnknownPage")
    must(c.run("acquire", user="u-none", kind="forward_read", pages=[]), "acquire of no pages", code="InvalidArgument")
    # a prefix hit: the KV pages shared, the state copied into the request (it has no state yet)
    hit = must(c.run("admit", owner="hit1", demand={"window": 1, "full": 1}, shared=r1.pages["full"]), "prefix hit")
    must(c.run("copy_state", owner="hit1", page=copy), "the hit copies the cached state")
    must(c.run("free", owner="r1"), "r1 finishes")
    must(c.run("copy_state", owner="cache/n3", page={"dead": src}), "copy a freed page", code="UnknownPage")
    must(c.run("acquire", user="fwd", kind="forward_read", pages=[copy]), "a forward pass reads the cached state")
    must(c.run("copy_state", owner="cache/n3", page=copy), "a copy while a reader holds the source")
    must(c.run("release", user="fwd"), "the forward pass ends")
    must(c.run("relayout", demand={}), "a relayout that moves nothing (a bare NONE plan)")
    # full pages, then cache nodes, until a copy no longer fits; evicting makes room (the ladder compacts for it)
    fill(c, "f", {"full": 2})
    nodes: list[str] = []
    rejected = None
    for k in range(64):
        e = c.run("copy_state", owner=f"cache/m{k}", page=copy)
        if not e.ok:
            rejected = e
            break
        nodes.append(f"cache/m{k}")
    if rejected is None or rejected.code != "AdmissionRejected":
        raise ScenarioError("copy_state never ran out of room")
    for n in nodes[:2]:
        must(c.run("free", owner=n), "evict a cached state")
    if not nodes:
        must(c.run("free", owner=next(o for o in c.oracle.owners() if o.startswith("f"))), "evict a request")
    must(c.run("copy_state", owner="cache/retry", page=copy), "the copy fits after the eviction")
    del hit
    walk(c, rng, 80, WEIGHTS)
    readback(c)


def recurrent_vectors() -> tuple[VectorSpec, ...]:
    from kvarena.conformance.vectors.steps import VectorSpec

    spec: Any = VectorSpec("recurrent-copy-state", "recurrent state is copied (copy_state), never shared; one "
                           "state per owner; acquire of no pages and a relayout that moves nothing",
                           "toy-tri", 3616, 4, recurrent_copy_state, seed=18)
    return (spec,)
