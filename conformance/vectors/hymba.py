"""Rung 3 on a published model (conformance/vectors/hymba-rung3.jsonl): NVIDIA Hymba-1.5B, whose layers keep all
three kinds of state (Mamba state in every layer | sliding-window KV | full KV), so its window band floats between
the state band and the full band and the default ladder relayouts it (the fewest float pages outside the room).

The real geometry (every row of every entry) at 32 MiB, page size 64: 4 state pages of 7,168,000 B, 29 window
pages of 1,146,880 B, 136 full pages of 245,760 B. The full band grows down onto the window float until rung 3
moves it toward the state band; a forward pass then reads float pages (obstacles, never moved) while the full
band asks again; frees, a stand-alone relayout and a random walk follow. Helpers come from scenarios.py, imported
when the script runs (scenarios.py imports this module for VECTORS).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvarena.conformance.machine.conductor import Conductor
    from kvarena.conformance.vectors.steps import VectorSpec

WEIGHTS = {"free": 5, "write_page": 0, "relayout": 4, "compact": 3, "squeeze": 4, "moves_under_users": 3}


def write_corners(c: Conductor, h: int) -> None:
    """The first and last row of the first and last entry of page ``h`` (a real page has thousands of rows: all
    of them would make the file large; corners catch a move that copies part of a page)."""
    from kvarena.conformance.vectors.steps import must

    cls = c.oracle.cls_of(h)
    for entry in sorted({0, c.geo.entries[cls] - 1}):
        for row in sorted({0, c.geo.rows[cls] - 1}):
            c.serial += 1
            must(c.run("write", page=h, entry=entry, row=row, tag=c.serial), f"write {h}")


def hymba_rung3(c: Conductor, rng: random.Random) -> None:
    from kvarena.conformance.vectors.steps import ScenarioError, fill, flat, must, readback, walk

    w = must(c.run("admit", owner="w1", demand={"window": 6}, shared=[]), "the window float at its hint", rung=1)
    write_corners(c, flat(w)[0])
    s = must(c.run("admit", owner="s1", demand={"state": 1, "window": 2, "full": 2}, shared=[]), "s1", rung=1)
    write_corners(c, s.pages["state"][0])
    got = fill(c, "f", {"full": 4})  # the full band grows down onto the float: rung 3 moves the float
    if not any((e.plan or {}).get("rung") == 3 for e in got if e.ok):
        raise ScenarioError("hymba-rung3: no admission took rung 3")
    for o in [o for o in c.oracle.owners() if o.startswith("f")][::3]:
        c.run("free", owner=o)  # holes in the full band
    c.run("acquire", user="fwd", kind="forward_read", pages=c.oracle.held("w1")["window"][:2])
    fill(c, "g", {"full": 4})  # the float moves again, around the pages the forward pass reads
    c.run("release", user="fwd")
    c.run("relayout", demand={"state": 1, "window": 0, "full": 0})
    walk(c, rng, 20, WEIGHTS)
    readback(c)


def hymba_vectors() -> tuple[VectorSpec, ...]:
    from kvarena.conformance.vectors.steps import VectorSpec

    spec: Any = VectorSpec("hymba-rung3", "rung 3 on hymba-1.5b's real geometry: the window float relayouts for "
                           "the full band, around a forward pass's pages", "hymba-1.5b", 32 << 20, 64, hymba_rung3,
                           seed=19, max_context_len=64)
    return (spec,)
