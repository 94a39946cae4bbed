"""Canonical states: two states that differ only in names count once.

A state's key names every page by where it is (class, slot): owners, virtual ids, handles, user names and tags
drop out. Owners become the multiset of their holdings (each class's slots in acquisition order, the prefix
cache told apart, since the alphabet shares into it by name); users the multiset of (kind, holds), each hold
saying whether the page it was acquired on is still the one there; tags are renumbered by first appearance
(rows of pages in slot order), so only which rows hold equal tags remains. With an implementation in lockstep, its
observation joins the key with its virtual ids named by the reference's slot of the same handle: two states
of the pair are one only when both sides are.

The key is hashed (BLAKE2b, 16 bytes) for the visited set and the Ray shards (shard.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import CACHE
from kvarena.reference.arena import Arena


def arena_key(a: Arena) -> tuple:
    """The reference's state with every name renamed away."""
    v2p = a.v2p
    bands = tuple((b.lo, b.hi, tuple(b.holes), tuple(sorted(b.withheld))) for b in a.bands.values())
    owners = tuple(sorted(
        (o == CACHE, tuple((c, tuple(v2p[v][1] for v in vs)) for c, vs in held.items() if vs))
        for o, held in a.owners.items()))
    users = tuple(sorted(
        (u.kind.value, tuple((h.cls, h.slot, v2p.get(h.vid) == (h.cls, h.slot) and a.gen.get(h.vid) == h.gen)
                             for h in u.holds))
        for u in a.users.values()))
    tags: dict[int, int] = {}
    content = tuple(
        (p, tuple((k, tags.setdefault(t, len(tags))) for k, t in sorted(rows.items())))
        for p, rows in sorted(a.content.items()) if rows)
    return bands, owners, users, content


def _freeze(x: Any) -> Any:
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [_freeze(v) for v in x]
        return tuple(sorted(items)) if isinstance(x, (set, frozenset)) else tuple(items)
    return x


def impl_key(c: Conductor) -> tuple:
    """The implementation's last observation, its virtual ids named by the reference's slot of the same handle."""
    obs = c._obs
    if obs is None or c.impl is None:
        return ()
    handle_of, vid_of, ref = c.impl.h.handle_of, c.oracle.h.vid_of, c.oracle.arena.v2p

    def name(v: int) -> Any:
        h = handle_of.get(v)
        return tuple(ref[vid_of[h]]) if h is not None and h in vid_of else ("unnamed",)

    out = []
    for f in dataclasses.fields(obs):
        val = getattr(obs, f.name)
        if f.name in ("v2p", "pages"):  # Observation / PoolObservation: virtual id -> where
            val = tuple(sorted((name(v), _freeze(p)) for v, p in val.items()))
        else:
            val = _freeze(val)
        out.append((f.name, val))
    return tuple(out)


def state_key(c: Conductor) -> tuple:
    return arena_key(c.oracle.arena), impl_key(c)


def digest(key: tuple) -> bytes:
    return hashlib.blake2b(repr(key).encode(), digest_size=16).digest()
