"""The engine integrations of spec/arena.md §Integrations, one vector each (conformance/vectors/integration-*.jsonl).

Each script issues the operations in the order a serving engine issues them for one integration (overlap
scheduling, the radix cache, HiCache, PD disaggregation, speculative decoding with a fused draft, DSA index keys,
CUDA-graph padding lanes, priority preemption, unsupported configurations) and asserts on the reference what the
integration relies on (a freed page stays withheld while a forward pass reads it, a pinned page does not move, the
draft rows move with the target rows, ...), so a change to the reference that breaks an integration fails
generation loudly. :data:`INTEGRATIONS` names each integration's spec subsection and vector; tests/fast/
test_integrations.py fails when one of the two is missing. Helpers come from scenarios.py, imported when a script
runs (scenarios.py imports this module for VECTORS).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvarena.conformance.machine.harness import CACHE, OPS, Expect
from kvarena.conformance.vectors.sglang import _s, ok, refused  # the scripted scenarios' shared steps

if TYPE_CHECKING:
    from kvarena.conformance.machine.conductor import Conductor
    from kvarena.conformance.vectors.steps import VectorSpec


def check(cond: bool, what: str) -> None:
    if not cond:
        raise _s().ScenarioError(what)


def admit(c: Conductor, prefix: str, demand: dict[str, int], shared: list[int] | None = None,
          rung: int | None = None) -> tuple[str, Expect]:
    owner = c.fresh(prefix)
    return owner, ok(c, f"admit {owner} {demand}", "admit", rung=rung, owner=owner, demand=demand,
                     shared=shared or [])


def pages(c: Conductor, owner: str, cls: str | None = None) -> list[int]:
    held = c.oracle.held(owner)
    return [h for k, hs in held.items() if cls is None or k == cls for h in hs]


def put(c: Conductor, h: int, rows: list[int] | None = None, entries: list[int] | None = None) -> None:
    """What a kernel writes: a tag in ``rows`` (default: the first and the last) of ``entries`` (default: the
    first and the last) of page ``h``."""
    cls = c.oracle.cls_of(h)
    n_e, n_r = c.geo.entries[cls], c.geo.rows[cls]
    for entry in sorted(set(entries if entries is not None else [0, n_e - 1])):
        for row in sorted(set(rows if rows is not None else [0, n_r - 1])):
            c.serial += 1
            ok(c, f"write {h}", "write", page=h, entry=entry, row=row, tag=c.serial)


def withheld(c: Conductor) -> int:
    return sum(len(v) for v in c.oracle.snapshot().withheld.values())


def slot_of(c: Conductor, h: int) -> tuple[str, int]:
    cls, slot, _vid = c.oracle.snapshot().pages[h]
    return cls, slot


def forward(c: Conductor, step: str, write: list[int], read: list[int]) -> list[str]:
    """A forward pass is launched: its users are acquired first (writers on the pages it writes, a reader on the
    pages it only reads), then the kernels write. Returns the users (released on the forward's event)."""
    users = []
    if write:
        ok(c, f"{step} writes", "acquire", user=f"{step}.w", kind="forward_write", pages=write)
        users.append(f"{step}.w")
    if read:
        ok(c, f"{step} reads", "acquire", user=f"{step}.r", kind="forward_read", pages=read)
        users.append(f"{step}.r")
    for h in write:
        put(c, h)
    return users


def done(c: Conductor, users: list[str]) -> None:
    """The forward's event completed: its users are released (each exactly once)."""
    for u in users:
        ok(c, f"release {u}", "release", user=u)


def at_least(c: Conductor, n: int) -> None:
    """Read back every written row, then translate and read live pages until the file has ``n`` steps: a fixed
    tail (no random walk), so the vector depends only on the operations of its integration."""
    _s().readback(c, limit=64)
    live = c.oracle.live()
    k = 0
    while c.nstep < n and live:
        h = live[k % len(live)]
        if k % 2 == 0:
            c.run("translate", page=h)
        else:
            c.run("read", page=h, entry=0, row=0)
        k += 1


# ---------------------------------------------------------------------------------------------
# The integrations


def overlap(c: Conductor, rng: random.Random) -> None:
    """Overlap scheduling: step N+1 is scheduled on the CPU while step N's forward still runs. Users are acquired
    before each launch and released on the forward's event; a request that finished is freed while the forward
    in flight still reads it (its pages are withheld, never handed out), and compaction meanwhile moves only
    pages no writer holds."""
    r1, _ = admit(c, "r", {"state": 1, "window": 2, "full": 2})
    r2, _ = admit(c, "r", {"state": 1, "window": 1, "full": 2})
    for h in pages(c, r1) + pages(c, r2):
        put(c, h)
    step1_writes = pages(c, r1, "full")[-1:] + pages(c, r1, "state")
    users = forward(c, "step1", write=step1_writes + pages(c, r2, "state"),
                    read=pages(c, r1, "window") + pages(c, r2, "full") + pages(c, r2, "window"))
    saved = pages(c, r2, "full")
    ok(c, "a host save of r2's KV runs beside step 1", "acquire", user="save2", kind="host_save", pages=saved)
    # scheduled while step 1 runs: r2 finished at step 0, r1 grows, a new request arrives
    r2_pages = pages(c, r2)
    ok(c, "free r2 while step 1 still reads it", "free", owner=r2)
    check(withheld(c) == len(r2_pages), "r2's pages step 1 reads or writes are withheld, not holes")
    ok(c, "extend r1 while step 1 runs", "extend", owner=r1, demand={"full": 1, "window": 1})
    r3, e3 = admit(c, "r", {"state": 1, "window": 1, "full": 2})
    held = {(k, s) for k, ss in c.oracle.snapshot().withheld.items() for s in ss}
    check(not any((k, s) in held for k, ss in (e3.plan or {}).get("placements", {}).items() for s in ss),
          "an admission reused a withheld slot")
    pinned = {slot_of(c, h) for h in step1_writes}  # where step 1 writes, before the compaction
    plan = ok(c, "compact while step 1 runs", "compact", max_moves=None).plan or {}
    check(not any((m[0], m[1]) in pinned for m in plan["moves"]), "compaction moved a page step 1 writes")
    done(c, users)
    check(withheld(c) == len(saved), "the save still holds r2's full pages after step 1's release")
    r6, _ = admit(c, "r", {"state": 1, "full": 2})  # must not reuse the pages the save still reads
    ok(c, "the save's event", "release", user="save2")
    check(withheld(c) == 0, "step 1's and the save's events released every withheld page")
    ok(c, f"{r6} finishes", "free", owner=r6)
    # step 2: r1 and r3 decode; r1 finishes while step 2 runs
    users = forward(c, "step2", write=pages(c, r1, "full")[-1:] + pages(c, r3, "full")[-1:],
                    read=pages(c, r1, "window") + pages(c, r3, "window") + pages(c, r1, "full")[:-1])
    ok(c, "free r1 while step 2 runs", "free", owner=r1)
    check(withheld(c) > 0, "r1's pages are withheld while step 2 holds them")
    r4, _ = admit(c, "r", {"state": 1, "window": 2, "full": 2})
    ok(c, "compact while step 2 runs", "compact", max_moves=None)
    done(c, users)
    ok(c, "idle compaction after the event", "compact", max_moves=None)
    for h in pages(c, r3) + pages(c, r4):
        c.run("translate", page=h)
    users = forward(c, "step3", write=pages(c, r4, "full")[-1:], read=pages(c, r3, "full"))
    ok(c, "free r3 while step 3 reads it", "free", owner=r3)
    done(c, users)
    at_least(c, 60)


def radix(c: Conductor, rng: random.Random) -> None:
    """The radix (prefix) cache: a finished request's KV pages are inserted into the cache (``share`` with the
    cache owner) and the request freed; a prefix hit admits with those pages shared. Recurrent state is never
    shared (refused): the cache keeps a copy (``copy_state``) and a hit forks it into the request's own slot. When
    an admission is rejected the caller evicts cache-only pages (pages no request holds) and retries."""
    copy = "copy_state" in OPS  # spec §Integrations: without copy_state the cache holds KV pages only
    r1, e1 = admit(c, "r", {"state": 1, "window": 2, "full": 3})
    for h in pages(c, r1):
        put(c, h)
    ok(c, "cache inserts r1's KV prefix", "share", owner=CACHE, pages=e1.pages["full"] + e1.pages["window"])
    cached_state = None
    if copy:
        cp = ok(c, "cache copies r1's state", "copy_state", owner=CACHE, page=e1.pages["state"][0])
        cached_state = next(h for hs in (cp.pages or {}).values() for h in hs)
    ok(c, "r1 finishes", "free", owner=r1)
    r2, _ = admit(c, "r", {"window": 1, "full": 1} if copy else {"state": 1, "window": 1, "full": 1},
                  shared=e1.pages["full"][:2])
    if cached_state is not None:
        ok(c, "the hit forks the cached state into r2's own slot", "copy_state", owner=r2, page=cached_state)
        for row in range(c.geo.rows["state"]):
            c.run("read", page=pages(c, r2, "state")[0], entry=0, row=row)
    refused(c, "DoubleFree", "a request cannot drop the cache's page it does not hold", "drop", owner=r2,
            pages=e1.pages["full"][2:])
    for h in pages(c, r2):
        put(c, h)
    ok(c, "cache inserts r2's new KV page", "share", owner=CACHE, pages=pages(c, r2, "full")[-1:])
    ok(c, "r2 finishes", "free", owner=r2)
    live_req, _ = admit(c, "live", {"state": 1, "full": 1}, shared=c.oracle.held(CACHE)["full"][:1])
    # fill the arena with cached prefixes until an admission is rejected
    rejected, o = None, ""
    for _ in range(40):
        o = c.fresh("r")
        e = c.run("admit", owner=o, demand={"state": 1, "window": 1, "full": 2}, shared=[])
        if not e.ok:
            rejected = e
            break
        ok(c, f"cache inserts {o}", "share", owner=CACHE, pages=e.pages["full"] + e.pages["window"])
        ok(c, f"{o} finishes", "free", owner=o)
    check(rejected is not None and rejected.code == "AdmissionRejected", "the cache never filled the arena")
    # evict cache-only pages, oldest first, until the rejected demand fits; a page a live request shares is kept
    in_use = {h for w in c.oracle.owners() if w != CACHE for h in pages(c, w)}
    cache_only = [h for h in pages(c, CACHE) if h not in in_use]
    check(bool(cache_only), "nothing to evict")
    evict = cache_only[:2 * sum(rejected.shortfall.values()) + 2]
    freed = ok(c, "evict cache-only pages", "drop", owner=CACHE, pages=evict).freed or []
    check(sorted(freed) == sorted(evict), "an evicted cache-only page was not freed")
    ok(c, "the rejected request retries", "admit", owner=o, demand={"state": 1, "window": 1, "full": 2}, shared=[])
    check(ok(c, "evicting a page a live request shares frees nothing", "drop", owner=CACHE,
             pages=pages(c, live_req, "full")[:1]).freed == [], "a shared page was freed")
    for w in (live_req, o):
        ok(c, f"{w} finishes", "free", owner=w)
    at_least(c, 90)


def hicache(c: Conductor, rng: random.Random) -> None:
    """HiCache: a save (device -> host) is a reader of the pages it copies, a load (host -> device) a writer of
    freshly admitted pages. A request freed while its save runs keeps its pages withheld until the copy's event;
    a load's pages read zero until the load writes them, and stay where they are while it runs."""
    r1, _ = admit(c, "r", {"state": 1, "window": 2, "full": 3})
    for h in pages(c, r1):
        put(c, h)
    r1_kv = pages(c, r1, "full") + pages(c, r1, "window") + pages(c, r1, "state")
    ok(c, "save r1 to the host cache", "acquire", user="save1", kind="host_save", pages=r1_kv)
    ok(c, "r1's device pages are evicted while the save runs", "free", owner=r1)
    check(withheld(c) == len(r1_kv), "the saved pages are withheld until the save completes")
    r2, _ = admit(c, "r", {"state": 1, "window": 1, "full": 2})
    ok(c, "compact while the save reads", "compact", max_moves=None)
    ok(c, "the save's event completed", "release", user="save1")
    check(withheld(c) == 0, "the save's release freed the withheld pages")
    ok(c, "idle compaction packs r2 against the anchors", "compact", max_moves=None)
    # a host hit for r1's prefix: fresh pages past r2's, loaded, then the forward reads them
    r3, e3 = admit(c, "r", {"state": 1, "window": 2, "full": 3})
    r5, _ = admit(c, "r", {"state": 1, "full": 1})
    fresh = e3.pages["full"] + e3.pages["window"] + e3.pages["state"]
    for h in fresh[:3]:
        for row in range(c.geo.rows[c.oracle.cls_of(h)]):
            ok(c, "a freshly admitted page reads zero", "read", page=h, entry=0, row=row)
    ok(c, "load into the fresh pages", "acquire", user="load3", kind="host_load", pages=fresh)
    for h in fresh:
        put(c, h)
    ok(c, "r2 finishes while the load runs", "free", owner=r2)
    loading = {slot_of(c, h) for h in fresh}
    plan = ok(c, "compact while the load writes", "compact", max_moves=None).plan or {}
    check(not any((m[0], m[1]) in loading for m in plan["moves"]), "a page being loaded moved")
    check(bool(c.oracle.snapshot().holes["full"]), "the load pinned nothing: no hole it kept from compaction")
    ok(c, f"{r5} finishes", "free", owner=r5)
    ok(c, "the load's event completed", "release", user="load3")
    ok(c, "compact after the load", "compact", max_moves=None)
    users = forward(c, "step", write=pages(c, r3, "full")[-1:], read=pages(c, r3, "full")[:-1])
    done(c, users)
    # a second save and a load at once, then a load refused for a page that is not bound
    ok(c, "save r3", "acquire", user="save3", kind="host_save", pages=pages(c, r3, "full"))
    _r4, e4 = admit(c, "r", {"state": 1, "full": 2})
    ok(c, "load r4", "acquire", user="load4", kind="host_load", pages=e4.pages["full"])
    refused(c, "UnknownPage", "a load into a page that is not bound", "acquire", user="load5", kind="host_load",
            pages=[{"vid": -1}])
    for h in e4.pages["full"]:
        put(c, h)
    ok(c, "save done", "release", user="save3")
    ok(c, "load done", "release", user="load4")
    at_least(c, 80)


def pd(c: Conductor, rng: random.Random) -> None:
    """PD disaggregation: the prefill instance sends a request's KV (a reader: ``net_send``) and may free the
    request while the transfer runs; the decode instance receives it into freshly admitted pages (a writer:
    ``net_recv``), then decodes. In a deployment these are two arenas; this trace plays both roles on one (the
    prefill side's requests are ``p*``, the decode side's ``d*``), which is what each arena sees."""
    p1, _ = admit(c, "p", {"state": 1, "window": 2, "full": 3})
    users = forward(c, "prefill1", write=pages(c, p1), read=[])
    done(c, users)
    ok(c, "send p1's KV", "acquire", user="send1", kind="net_send", pages=pages(c, p1))
    sent = len(pages(c, p1))
    ok(c, "p1 leaves the prefill instance while its KV is in flight", "free", owner=p1)
    check(withheld(c) == sent, "pages in flight are withheld")
    ok(c, "compact on the prefill side during the transfer", "compact", max_moves=None)
    d1, e1 = admit(c, "d", {"state": 1, "window": 2, "full": 3})
    recv = e1.pages["full"] + e1.pages["window"] + e1.pages["state"]
    ok(c, "receive into d1's fresh pages", "acquire", user="recv1", kind="net_recv", pages=recv)
    for h in recv:
        put(c, h)
    p2, _ = admit(c, "p", {"state": 1, "window": 1, "full": 2})
    receiving = {slot_of(c, h) for h in recv}
    plan = ok(c, "compact during the receive", "compact", max_moves=None).plan or {}
    check(not any((m[0], m[1]) in receiving for m in plan["moves"]), "a page being received moved")
    ok(c, "the send completed", "release", user="send1")
    check(all(not ss for ss in c.oracle.snapshot().withheld.values()), "the send's pages are holes now")
    ok(c, "the receive completed", "release", user="recv1")
    for step in range(3):
        ok(c, f"decode d1, step {step}", "extend", owner=d1, demand={"full": 1})
        users = forward(c, f"decode{step}", write=pages(c, d1, "full")[-1:] + pages(c, d1, "state"),
                        read=pages(c, d1, "full")[:-1] + pages(c, d1, "window"))
        done(c, users)
    ok(c, "send p2", "acquire", user="send2", kind="net_send", pages=pages(c, p2))
    refused(c, "DuplicateUser", "a transfer id is live until released", "acquire", user="send2", kind="net_send",
            pages=pages(c, p2))
    ok(c, "p2 freed in flight", "free", owner=p2)
    ok(c, "send2 completed", "release", user="send2")
    refused(c, "ReleaseWithoutAcquire", "a completed transfer is released once", "release", user="send2")
    at_least(c, 80)


TARGET_ROWS = 24  # gpt-oss-20b-eagle3's full entry: rows 0..23 the target's fp8 K/V, 24 and 25 the draft's bf16


def spec_decode(c: Conductor, rng: random.Random) -> None:
    """Speculative decoding with an EAGLE3 draft whose KV rows are fused into the target's full-attention entries
    (gpt-oss-20b-eagle3: target fp8, draft bf16, one entry). One admission gives both; each round the draft writes
    its rows for ``k`` speculated tokens, the target verifies (writes its rows for the same entries), and the pages
    past the accepted tokens are dropped. A move carries the target and the draft rows of every entry together."""
    draft = [TARGET_ROWS, TARGET_ROWS + 1]
    target = [0, 1, TARGET_ROWS - 1]
    r1, e1 = admit(c, "r", {"window": 2, "full": 2})
    ok(c, "prefill: target and draft write", "acquire", user="prefill.w", kind="forward_write",
       pages=pages(c, r1))
    for h in e1.pages["full"]:
        put(c, h, rows=target + draft)
    for h in e1.pages["window"]:
        put(c, h, rows=[0, c.geo.rows["window"] - 1])
    ok(c, "prefill done", "release", user="prefill.w")
    r2, e2 = admit(c, "r", {"window": 1, "full": 1})
    put(c, e2.pages["full"][0], rows=target + draft)
    k = 2  # tokens speculated per round: at page_size 2, one new page per round
    for rnd, accepted in enumerate((2, 0, 1)):  # of the k; a page of only rejected tokens is given back
        ext = ok(c, f"round {rnd}: room for {k} draft tokens", "extend", owner=r1, demand={"full": 1})
        new = ext.pages["full"]
        ok(c, f"round {rnd}: draft forward", "acquire", user=f"draft{rnd}", kind="forward_write", pages=new)
        for h in new:
            put(c, h, rows=draft)
        ok(c, f"round {rnd}: draft done", "release", user=f"draft{rnd}")
        ok(c, f"round {rnd}: verify forward", "acquire", user=f"verify{rnd}", kind="forward_write", pages=new)
        ok(c, f"round {rnd}: verify reads the prefix", "acquire", user=f"verify{rnd}.r", kind="forward_read",
           pages=pages(c, r1, "full")[:-1])
        for h in new:
            put(c, h, rows=target)
        ok(c, f"round {rnd}: verify done", "release", user=f"verify{rnd}")
        ok(c, f"round {rnd}: verify reads done", "release", user=f"verify{rnd}.r")
        if accepted == 0:  # every speculated token rejected: the round's page is given back
            ok(c, f"round {rnd}: rejected tokens' page dropped", "drop", owner=r1, pages=new)
    ok(c, "r2 finishes", "free", owner=r2)
    plan = ok(c, "compaction moves fused pages", "compact", max_moves=None).plan or {}
    check(any(m[0] == "full" for m in plan["moves"]), "no fused page moved")
    for h in pages(c, r1, "full"):
        for row in target + draft:
            c.run("read", page=h, entry=0, row=row)
    r3, _ = admit(c, "r", {"window": 2, "full": 3})
    for h in pages(c, r3, "full"):
        put(c, h, rows=draft)
    ok(c, "r1 finishes", "free", owner=r1)
    ok(c, "compact", "compact", max_moves=None)
    at_least(c, 80)


def dsa(c: Conductor, rng: random.Random) -> None:
    """DeepSeek sparse attention beside MLA (Kimi K3's geometry at toy size: toy-dsa): each full-attention entry
    holds the MLA latent row and the DSA index key + scale rows of every MLA layer. The indexer reads index keys of
    every page (a reader), the sparse attention reads the latents of the pages it selects; one allocation, one move
    and one free carry both, so an index key never outlives or outruns its latent."""
    latent, index = [0, 1], [2, 3, 4, 5]  # rows: latent L1, latent L3, index_k L1, index_scale L1, index_k L3, ...
    r1, e1 = admit(c, "r", {"state": 1, "full": 3})
    r2, e2 = admit(c, "r", {"state": 1, "full": 2})
    users = forward(c, "prefill", write=pages(c, r1) + pages(c, r2), read=[])
    for h in e1.pages["full"] + e2.pages["full"]:
        put(c, h, rows=latent + index)
    done(c, users)
    ok(c, "r1 finishes", "free", owner=r1)
    ok(c, "the indexer reads r2's index keys", "acquire", user="indexer", kind="forward_read",
       pages=e2.pages["full"])
    plan = ok(c, "compaction moves r2's pages under the indexer", "compact", max_moves=None).plan or {}
    check(any(m[0] == "full" for m in plan["moves"]), "no full page moved under the reader")
    check(withheld(c) > 0, "the reader's old slots are withheld")
    for h in e2.pages["full"]:
        for row in latent + index:
            c.run("read", page=h, entry=0, row=row)
    ok(c, "indexer done", "release", user="indexer")
    for step in range(3):
        ok(c, f"decode step {step}", "extend", owner=r2, demand={"full": 1})
        new = pages(c, r2, "full")[-1]
        ok(c, f"step {step}: latent and index key of the new token", "acquire", user=f"d{step}",
           kind="forward_write", pages=[new])
        put(c, new, rows=latent + index, entries=[0])
        ok(c, f"step {step} done", "release", user=f"d{step}")
    ok(c, "sparse attention selects r2's first pages", "acquire", user="select", kind="forward_read",
       pages=pages(c, r2, "full")[:2])
    r3, _ = admit(c, "r", {"state": 1, "full": 2})
    ok(c, "selection done", "release", user="select")
    for h in pages(c, r2, "full")[-2:]:
        c.run("read", page=h, entry=0, row=index[0])
    ok(c, "r3 finishes", "free", owner=r3)
    at_least(c, 80)


def cuda_graph(c: Conductor, rng: random.Random) -> None:
    """CUDA-graph decode at a fixed batch width: every step the graph writes every lane; lanes past the running
    requests are padding lanes, which translate to each class's padding entry past the arena's last byte
    (spec §Padding lanes). A vector step cannot name a padding lane, so tests/fast/test_padding.py replays this
    file with padding writes (garbage through every class's padding lanes, after every step) on the reference
    and on gpu/; the rows written here, in the top page of the high band (the capacity is a multiple of its page
    bytes, so that page ends where the padding entries begin) and in the low end, must read back unchanged."""
    reqs = []
    for demand in ({"state": 1, "window": 1, "full": 1}, {"state": 1, "window": 2, "full": 2}):
        o, _e = admit(c, "r", demand)
        reqs.append(o)
        for h in pages(c, o):
            put(c, h)
    top = max(pages(c, reqs[0], "full") + pages(c, reqs[1], "full"), key=lambda h: slot_of(c, h)[1])
    check(slot_of(c, top)[1] == c.geo.top["full"] - 1, "no full page at the top of the grid")
    for step in range(4):  # width-4 graph, 2 or 3 requests running
        if step == 2:
            o, _e = admit(c, "r", {"state": 1, "window": 1, "full": 1})
            reqs.append(o)
        for o in reqs:
            if step % 2:
                ok(c, f"step {step}: {o} crosses a page", "extend", owner=o, demand={"full": 1})
        write = [pages(c, o, "full")[-1] for o in reqs] + [h for o in reqs for h in pages(c, o, "state")]
        read = [h for o in reqs for h in pages(c, o, "window") + pages(c, o, "full")[:-1]]
        users = forward(c, f"graph{step}", write=write, read=read)
        done(c, users)
    ok(c, "a request finishes", "free", owner=reqs[0])
    ok(c, "compact", "compact", max_moves=None)
    for h in [top] if top in c.oracle.live() else []:
        put(c, h, entries=[c.geo.entries["full"] - 1], rows=[c.geo.rows["full"] - 1])
    at_least(c, 70)


def preemption(c: Conductor, rng: random.Random) -> None:
    """Priority preemption: the ladder never evicts, so a high-priority admission that does not fit is refused
    with its shortfall, and the caller retracts low-priority requests (saving their KV first, if it will resume
    them), then retries. The ladder's refusal changes nothing; the retraction is an ordinary ``free``."""
    low = []
    for _ in range(30):
        o = c.fresh("low")
        e = c.run("admit", owner=o, demand={"state": 1, "window": 1, "full": 2}, shared=[])
        if not e.ok:
            break
        low.append(o)
        for h in pages(c, o)[:2]:
            put(c, h)
    check(len(low) >= 3, "too few low-priority requests fit")
    high = {"state": 1, "window": 2, "full": 3}
    rej = refused(c, "AdmissionRejected", "the high-priority request does not fit", "admit", owner="high",
                  demand=high, shared=[])
    check(bool(rej.shortfall), "a rejection names its shortfall")
    victim = low.pop()  # the most recently admitted low-priority request first (SGLang's retraction order differs)
    ok(c, f"save {victim} before retracting it", "acquire", user="save", kind="host_save", pages=pages(c, victim))
    ok(c, f"retract {victim}", "free", owner=victim)
    e = c.run("admit", owner="high", demand=high, shared=[])
    while not e.ok and low:
        victim = low.pop()
        ok(c, f"retract {victim}", "free", owner=victim)
        e = c.run("admit", owner="high", demand=high, shared=[])
    check(e.ok, "retracting every low-priority request did not make room")
    ok(c, "the save completed", "release", user="save")
    users = forward(c, "high", write=pages(c, "high"), read=[])
    done(c, users)
    back = c.run("admit", owner=c.fresh("resume"), demand={"state": 1, "window": 1, "full": 2}, shared=[])
    if back.ok:  # the retracted request resumes from the host copy
        owner = c.steps[-1]["args"]["owner"]
        ok(c, "load the resumed request", "acquire", user="load", kind="host_load", pages=pages(c, owner))
        ok(c, "load done", "release", user="load")
    at_least(c, 70)


def unsupported(c: Conductor, rng: random.Random) -> None:
    """Configurations the arena refuses, each with its reason (spec §Integrations, unsupported): DeepSeek-V4, an
    MLA class beside a sliding-window class, a model with full-attention layers only. (The presets this section adds
    build in their own vectors.)"""
    base = dict(c.config_json)

    def construct(code: str | None, **changes: Any) -> None:
        _s().must(c.run("construct", config={**base, **changes}), f"construct {changes}", code=code)

    construct("ConfigError", model="deepseek-v4")
    construct("ConfigError", model="toy-mla-swa")
    construct("ConfigError", model="toy-full-only")
    construct(None)
    r1, _ = admit(c, "r", {"state": 1, "window": 1, "full": 2})
    for h in pages(c, r1):
        put(c, h)
    at_least(c, 60)


# ---------------------------------------------------------------------------------------------
# The registry: spec subsection, vector, configuration


@dataclass(frozen=True)
class Integration:
    name: str  # the vector is conformance/vectors/integration-<name>.jsonl
    heading: str  # its subsection of spec/arena.md §Integrations ("### <heading>")
    description: str
    model: str
    capacity: int
    page_size: int
    script: Any
    seed: int

    @property
    def vector(self) -> str:
        return f"integration-{self.name}"


INTEGRATIONS: tuple[Integration, ...] = (
    Integration("overlap", "Overlap scheduling", "overlap scheduling: acquire before launch, release on the "
                "event, free while in flight, compaction around the forward's users", "toy-tri", 3360, 2, overlap,
                201),
    Integration("radix", "Radix cache", "radix cache: KV pages shared with the cache, prefix hits, eviction of "
                "cache-only pages after a rejection", "toy-tri", 3360, 2, radix, 202),
    Integration("hicache", "HiCache", "HiCache: save = a reader of the copied pages, load = a writer of freshly "
                "admitted pages", "toy-tri", 3360, 2, hicache, 203),
    Integration("pd", "PD disaggregation", "PD disaggregation: send = a reader, receive = a writer of fresh pages",
                "toy-tri", 3360, 2, pd, 204),
    Integration("spec-decode", "Speculative decoding with a fused draft", "speculative decoding: EAGLE3 draft KV "
                "(bf16) fused into GPT-OSS-20B's fp8 full-attention entries", "gpt-oss-20b-eagle3", 1 << 20, 2,
                spec_decode, 205),
    Integration("dsa", "DSA index keys beside the MLA latent", "Kimi K3's DSA index keys in the MLA latent's entry "
                "(toy geometry): one allocation, move and free", "toy-dsa", 4096, 2, dsa, 206),
    Integration("cuda-graph", "CUDA-graph padding lanes", "fixed-width decode steps; padding writes replayed by "
                "tests/fast/test_padding.py must reach no live page", "toy-tri", 3328, 2, cuda_graph, 207),
    Integration("preemption", "Priority preemption", "priority preemption: the ladder refuses, the caller "
                "retracts (saving first) and retries", "toy-tri", 3360, 2, preemption, 208),
    Integration("unsupported", "Unsupported configurations", "refused configurations, with the reason: "
                "DeepSeek-V4, MLA + sliding window, full attention only", "toy-tri", 3360, 2, unsupported, 209),
)

# Where SGLang 0.5.23's adapter (engines/sglang/adapter.py, at `safety`) cannot follow a vector, and why; the
# SGLang suite checks each one fails exactly so (tests/sglang/test_sglang_conformance.py), and passes the rest.
SGLANG_EXPECTED: dict[str, tuple[str, str]] = {
    "integration-spec-decode": (
        "cannot express class full (parts ['draft_k', 'draft_v', 'k', 'v'])",
        "the adapter builds one MHASubPoolSpec (one store dtype) per class, without SGLang's DenseDraftRegion; "
        "SGLang's fused entry is byte-identical to the preset's (tests/fast/test_integrations.py), but with it the "
        "adapter's grid mapping would still fail: it shifts kvarena's grids by a whole number of pages of every "
        "class, and 14,336 B and 12,288 B entries share no such shift with SGLang's one-page sink floor"),
    "integration-dsa": (
        "cannot express class full (parts ['index_k', 'index_scale', 'latent'])",
        "SGLang 0.5.23's MLASubPoolSpec lays out one latent row per layer and has no part for DSA index keys, so no "
        "SGLang sub-pool has kvarena's entry (latent + index key + scale) and the vector does not run against it"),
    "hymba-rung3": (
        "do not map onto kvarena's",
        "hymba-1.5b's 7,168,000 B state pages share no whole-page shift of every class's grid with SGLang's one-page "
        "sink floor, so the adapter cannot lay kvarena's grids onto SGLang's (the integration-spec-decode limit)"),
    "mixed-toy-two-float": (
        "do not map onto kvarena's",
        "toy-two-float's four classes (64 B state slots, 64 B and 96 B window entries, 32 B full entries) share no "
        "whole-page shift of every grid with SGLang's one-page sink floor (the integration-spec-decode limit); the "
        "lockstep machine runs toy-tri instead when the adapter refuses a toy's geometry at safety"),
    "mixed-toy-win-float": (
        "do not map onto kvarena's",
        "toy-win-float's window low end (64 B entries) beside a 96 B window float shares no whole-page shift of every "
        "grid with SGLang's one-page sink floor (the integration-spec-decode limit)"),
}


def integration_vectors() -> tuple[VectorSpec, ...]:
    from kvarena.conformance.vectors.steps import VectorSpec

    return tuple(VectorSpec(i.vector, i.description, i.model, i.capacity, i.page_size, i.script, seed=i.seed)
                 for i in INTEGRATIONS)
