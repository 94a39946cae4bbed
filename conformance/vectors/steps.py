"""The building blocks of the vector scenarios: a vector's spec, a step that must succeed, random walks through
the lockstep rules, page writes and read-backs, filling a class. The scenario modules (scenarios.py and one per
family) build on these; scenarios.py collects every family's vectors into ``VECTORS``."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import CACHE, Expect
from kvarena.conformance.machine.lockstep import RULES, RandomChooser
from kvarena.spec.models import ArenaConfig, preset

Script = Callable[[Conductor, random.Random], None]


@dataclass(frozen=True)
class VectorSpec:
    name: str
    description: str
    model: str
    capacity: int
    page_size: int
    script: Script
    seed: int = 0
    max_context_len: int | None = 16
    swa_full_tokens_ratio: float = 0.8
    mamba_full_memory_ratio: float = 0.9

    def config(self) -> ArenaConfig:
        return ArenaConfig(preset(self.model), self.capacity, page_size=self.page_size,
                           swa_full_tokens_ratio=self.swa_full_tokens_ratio,
                           mamba_full_memory_ratio=self.mamba_full_memory_ratio, max_context_len=self.max_context_len)


# ---------------------------------------------------------------------------------------------
# Script helpers


class ScenarioError(AssertionError):
    """The reference no longer does what a scenario is meant to show: update the scenario."""


def must(exp: Expect, what: str, code: str | None = None, rung: int | None = None) -> Expect:
    if exp.code != code:
        raise ScenarioError(f"{what}: expected {'success' if code is None else code}, the reference gave "
                            f"{exp.code or 'success'}")
    if rung is not None and (exp.plan or {}).get("rung") != rung:
        raise ScenarioError(f"{what}: expected rung {rung}, the reference used {(exp.plan or {}).get('rung')}")
    return exp


def flat(exp: Expect) -> list[int]:
    return [h for hs in (exp.pages or {}).values() for h in hs]


def by_slot(c: Conductor, cls: str) -> list[int]:
    """Live handles of ``cls`` in slot order."""
    return [h for _s, h in sorted((s, h) for h, (k, s, _v) in c.oracle.snapshot().pages.items() if k == cls)]


def owners_of(c: Conductor, h: int) -> list[str]:
    return [o for o, held in c.oracle.snapshot().owners.items() if o != CACHE and any(h in hs for hs in held.values())]


def walk(c: Conductor, rng: random.Random, steps: int, weights: dict[str, int] | None = None) -> None:
    """At least ``steps`` more steps of the lockstep alphabet, rules drawn by weight among the enabled ones."""
    ch = RandomChooser(rng)
    target = c.nstep + steps
    while c.nstep < target:
        enabled = [(n, (weights or {}).get(n, w)) for n, (pre, _fn, w) in RULES.items() if pre is None or pre(c)]
        enabled = [(n, w) for n, w in enabled if w > 0]
        r = rng.randrange(sum(w for _, w in enabled))
        for n, w in enabled:
            if r < w:
                RULES[n][1](c, ch)
                break
            r -= w


def write_page(c: Conductor, h: int) -> None:
    cls = c.oracle.cls_of(h)
    for entry in range(c.geo.entries[cls]):
        for row in range(c.geo.rows[cls]):
            c.serial += 1
            must(c.run("write", page=h, entry=entry, row=row, tag=c.serial), f"write {h}")


def readback(c: Conductor, limit: int = 48) -> None:
    """Explicit reads of written rows (the data assertions a language-neutral runner sees)."""
    n = 0
    for h in sorted(c.expected):
        for (entry, row) in sorted(c.expected[h]):
            if n >= limit:
                return
            c.run("read", page=h, entry=entry, row=row)
            n += 1


def fill(c: Conductor, prefix: str, demand: dict[str, int], limit: int = 64, cache: bool = False) -> list[Expect]:
    """Admit ``demand`` as new requests until one is rejected; optionally hand each to the prefix cache and
    finish the request (cache-only pages)."""
    out = []
    for _ in range(limit):
        owner = c.fresh(prefix)
        e = c.run("admit", owner=owner, demand=demand, shared=[])
        out.append(e)
        if not e.ok:
            break
        if cache:
            c.run("share", owner=CACHE, pages=flat(e))
            c.run("free", owner=owner)
    return out


def mixed(steps: int, weights: dict[str, int] | None = None) -> Script:
    def script(c: Conductor, rng: random.Random) -> None:
        walk(c, rng, steps, weights)
        readback(c)
    return script
