"""Lockstep rules for the batched engine calls (spec/arena.md §Batched operations).

A batched rule issues one ``admit_batch`` / ``extend_batch`` / ``free_batch`` on the implementation and the same
operations **sequentially**, in batch order, on the reference; each owner's result (pages, virtual ids, plan, or
the error class and shortfall) is reconciled at the conductor's level exactly as a single step would be, and
the level's checks run once after the batch. So at ``exact`` the batch must be indistinguishable from the
sequential calls. Also:

``event_forward``  a FORWARD user acquired with an event on the implementation (a plain acquire on the
                   reference); ``event_done`` completes the event and releases the user on both sides. An
                   implementation that releases an event user before its event completed diverges.
``token_locs``     the physical entry of tokens ``[pre, seq)`` of each owner's pages of a class (SGLang's
                   ``alloc_extend`` / ``alloc_decode`` output) against the reference's v->p.
``translate_pad``  ``translate_tokens(out=, out_width=)``: every id's lane against the reference's slot, every
                   padding lane the implementation's padding entry, which must lie past the arena's last byte.

    batched_lockstep_for(factory, "exact")      # LockstepMachine + these rules
    run_batched_lockstep(factory, "exact", settings)

The implementation must have the batched methods (``kvarena.gpu.allocator.GpuArena`` does); rules whose method
is missing are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import settings as Settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena.conformance.adapter.protocol import LEVELS, AdapterError, ids_of, pages_of, plan_of, takes
from kvarena.conformance.machine.below import offers_below, random_below
from kvarena.conformance.machine.conductor import Conductor
from kvarena.conformance.machine.harness import Expect, Outcome
from kvarena.conformance.machine.lockstep import (
    Chooser,
    LockstepMachine,
    as_rule,
    held_flat,
    live,
    requests,
)
from kvarena.spec.errors import ArenaError
from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import UserKind

FORWARD = [UserKind.FORWARD_READ.value, UserKind.FORWARD_WRITE.value]


class ManualEvent:
    """A stand-in for ``torch.cuda.Event``: completes when a rule says so."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def _has(c: Conductor, method: str) -> bool:
    return c.impl is not None and callable(getattr(c.impl.alloc, method, None))


def _outcome(op: str, r: Any, order: Sequence[str]) -> Outcome:
    if isinstance(r, ArenaError):
        return Outcome(code=r.code, error=r, shortfall=getattr(r, "shortfall", None),
                       shortfall_bytes=getattr(r, "shortfall_bytes", None))
    if isinstance(r, BaseException):
        return Outcome(code=f"{type(r).__name__} (not a kvarena error)", error=r, foreign=True)
    if op == "free":
        return Outcome(value=ids_of(r, "free_batch"))
    return Outcome(value=pages_of(r, f"{op}_batch", order), plan=plan_of(r))


def batch(c: Conductor, op: str, items: list[dict], call: Callable[[Any, list[dict]], Sequence[Any]]) -> list[Expect]:
    """``op`` for every item on the oracle, in order (one trace line each); one batched ``call`` on the
    implementation; each result reconciled as a single step; the level's checks once after."""
    c.serial += 1
    tag = f"batch{c.serial}"
    exps = []
    for args in items:
        c.nstep += 1
        exp = c.oracle.apply(op, args)
        c.steps.append({"step": c.nstep, "op": op, "args": args, "expect": exp.to_json(op), "batch": tag})
        exps.append(exp)
    if c.impl is None:
        for args, exp in zip(items, exps):
            c._bookkeep(op, args, exp)
        return exps
    side = c.impl
    resolved = [side.h.args_for_call(op, a) for a in items]
    try:
        results = list(call(side.alloc, resolved))
    except AdapterError:
        raise
    except Exception as e:  # a batched call refuses per owner, never as a whole
        c.fail(f"{op}_batch of {len(items)} owners raised {type(e).__name__}: {e}; it must return one result "
               "per owner (errors in place)")
    if len(results) != len(items):
        c.fail(f"{op}_batch returned {len(results)} results for {len(items)} owners")
    out = []
    for args, exp, r in zip(items, exps, results):
        o = _outcome(op, r, c.order)
        c._out = o
        c._account_outcome(op, o)
        out.append(c._reconcile(op, args, exp, o))
    c.check_after(f"{op}_batch", unchanged=False)
    return out


def _demands(c: Conductor, ch: Chooser, n: int, hi: int) -> list[dict[str, int]]:
    out = [{k: ch.integer(0, hi, f"pages[{k}]") for k in c.order} for _ in range(n)]
    if n and ch.integer(0, 9, "malformed") == 0:
        out[ch.integer(0, n - 1, "which")][c.order[0]] = ch.choice([-1, c.geo.top[c.order[0]] + 1], "bad")
    return out


def _as_array(c: Conductor, ch: Chooser, demands: list[dict[str, int]]) -> Any:
    """The engine's form (an int array, chain order) or mappings: both must agree with the sequential calls."""
    if ch.boolean("array"):
        return np.array([[d.get(k, 0) for k in c.order] for d in demands], dtype=np.int64).reshape(len(demands),
                                                                                                    len(c.order))
    return demands


def _owners(c: Conductor, ch: Chooser, lo: int, hi: int) -> list[str]:
    reqs = requests(c)
    pool = [*reqs, "ghost"] if reqs else ["ghost"]
    out = [ch.choice(pool, "owner") for _ in range(ch.integer(lo, hi, "n"))]
    if out and ch.integer(0, 4, "repeat") == 0:
        out.append(out[0])
    return out


# ---------------------------------------------------------------------------------------------
# The rules


def r_admit_batch(c: Conductor, ch: Chooser, limited: bool = False) -> None:
    n = ch.integer(1, 6, "n")
    owners = [c.fresh("ab") for _ in range(n)]
    if c.oracle.owners() and ch.integer(0, 5, "dup") == 0:
        owners[-1] = ch.choice(c.oracle.owners(), "existing")
    demands = _demands(c, ch, n, 3)
    form = _as_array(c, ch, demands)
    items = [{"owner": o, "demand": d, "shared": []} for o, d in zip(owners, demands)]
    if limited:  # one placement limit for every lane: the sequential calls each take it
        below = random_below(c, ch)
        items = [{**x, "below": below} for x in items]
        batch(c, "admit", items, lambda a, res: a.admit_batch([x["owner"] for x in res], form, below=below))
        return
    batch(c, "admit", items, lambda a, res: a.admit_batch([x["owner"] for x in res], form))


def r_extend_batch(c: Conductor, ch: Chooser, limited: bool = False) -> None:
    owners = _owners(c, ch, 1, 8)
    demands = _demands(c, ch, len(owners), 2)
    form = _as_array(c, ch, demands)
    items = [{"owner": o, "demand": d} for o, d in zip(owners, demands)]
    if limited:
        below = random_below(c, ch)
        items = [{**x, "below": below} for x in items]
        batch(c, "extend", items, lambda a, res: a.extend_batch([x["owner"] for x in res], form, below=below))
        return
    batch(c, "extend", items, lambda a, res: a.extend_batch([x["owner"] for x in res], form))


def _limited(c: Conductor, method: str) -> bool:
    """The batched ``method`` takes ``below`` (a malformed one refuses the whole call: gpu/'s own tests check it)."""
    return _has(c, method) and offers_below(c) and takes(getattr(c.impl.alloc, method), "below")


def r_decode_step(c: Conductor, ch: Chooser) -> None:
    """Every request, one page each of the classes a token crossing a page boundary needs (some requests only)."""
    owners = requests(c)
    grow = [k for k in c.order if c.geo.kind[k].value != "recurrent"]
    demands = [{k: (1 if k in grow and ch.boolean("crosses") else 0) for k in c.order} for _ in owners]
    form = _as_array(c, ch, demands)
    items = [{"owner": o, "demand": d} for o, d in zip(owners, demands)]
    batch(c, "extend", items, lambda a, res: a.extend_batch([x["owner"] for x in res], form))


def r_free_batch(c: Conductor, ch: Chooser) -> None:
    owners = _owners(c, ch, 1, 4)
    batch(c, "free", [{"owner": o} for o in owners], lambda a, res: a.free_batch([x["owner"] for x in res]))


def r_event_forward(c: Conductor, ch: Chooser) -> None:
    owner = ch.choice(requests(c), "owner")
    pages = held_flat(c, owner)
    if not pages:
        return
    user, kind = c.fresh("ev"), ch.choice(FORWARD, "kind")
    event = ManualEvent()
    args = {"user": user, "kind": kind, "pages": pages}

    def acquire(a: Any, res: list[dict]) -> list[Any]:
        x = res[0]
        try:
            return [a.acquire(x["user"], x["kind"], x["pages"], event=event)]
        except ArenaError as e:
            return [e]

    c.nstep += 1
    exp = c.oracle.apply("acquire", args)
    c.steps.append({"step": c.nstep, "op": "acquire", "args": args, "expect": exp.to_json("acquire"),
                    "event": True})
    if c.impl is None:
        c._bookkeep("acquire", args, exp)
        return
    r = acquire(c.impl.alloc, [c.impl.h.args_for_call("acquire", args)])[0]
    out = _outcome("acquire", r, c.order) if isinstance(r, BaseException) else Outcome()
    c._reconcile("acquire", args, exp, out)
    c.check_after("acquire", unchanged=not exp.ok)
    if exp.ok:
        c.__dict__.setdefault("events", {})[user] = event


def r_event_done(c: Conductor, ch: Chooser) -> None:
    """The forward's event completes: the implementation may release the user at its next call; the harness
    releases it on both sides now (the reference has no events)."""
    events = c.__dict__.get("events", {})
    user = ch.choice(sorted(u for u in events if u in c.users), "user")
    events.pop(user).done = True
    c.run("release", user=user)


def r_token_locs(c: Conductor, ch: Chooser) -> None:
    owners = sorted(set(_owners(c, ch, 1, 6)) - {"ghost"})
    token = [k for k in c.order if c.geo.kind[k].value != "recurrent"]
    if not owners or not token:
        return
    cls = ch.choice(token, "cls")
    epp = c.geo.entries[cls]
    ref = c.oracle.arena
    pre, seq, want = [], [], []
    for o in owners:
        vids = list(ref.owners[o][cls])
        hi = len(vids) * epp
        p = ch.integer(0, hi, "pre")
        s = ch.integer(p, min(hi, p + 2 * epp), "seq")
        pre.append(p)
        seq.append(s)
        want += [ref.v2p[vids[q // epp]][1] * epp + q % epp for q in range(p, s)]
    try:
        got = c.impl.alloc.token_locs(cls, owners, np.array(pre), np.array(seq)).cpu().tolist()
    except Exception as e:
        c.fail(f"token_locs({cls!r}, {owners}, pre {pre}, seq {seq}) raised {type(e).__name__}: {e}")
    if got != want:
        c.fail(f"token_locs({cls!r}, {owners}, pre {pre}, seq {seq}) = {got}, the reference's v->p gives {want}",
               inv="INV-VMAP-BIJECTIVE")


def r_translate_pad(c: Conductor, ch: Chooser) -> None:
    import torch

    pages = ch.subset(live(c), 1, 4, "pages")
    cls = c.oracle.cls_of(pages[0])
    pages = [h for h in pages if c.oracle.cls_of(h) == cls]
    epp = c.geo.entries[cls]
    ref, imp = c.oracle, c.impl
    vt = [imp.h.vid_of[h] * epp + ch.integer(0, epp - 1, "i") for h in pages]
    want = [ref.arena.v2p[ref.h.vid_of[h]][1] * epp + t % epp for h, t in zip(pages, vt)]
    a = imp.alloc
    pad = a.pad_entry(cls)
    # foreign ids (spec §Padding lanes): negative, past every table, a live page of another class -> the padding entry
    other = [h for h in live(c) if c.oracle.cls_of(h) != cls][:1]
    foreign = [-1, 1 << 40] + [imp.h.vid_of[h] * epp for h in other]  # as tokens of cls's pages
    vt, want = vt + foreign, want + [pad] * len(foreign)
    width = len(vt) + ch.integer(0, 5, "padding")
    out = torch.full((width + 3,), -7, dtype=torch.int64, device=a.device)
    a.translate_tokens(cls, torch.tensor(vt, dtype=torch.int64, device=a.device), out=out, out_width=width)
    got = out.cpu().tolist()
    entry_bytes = c.geo.page_bytes[cls] // epp
    if got[:len(vt)] != want or got[width:] != [-7] * 3:
        c.fail(f"translate_tokens({cls!r}, {vt}, out_width={width}) = {got}, want {want} then padding",
               inv="INV-VMAP-BIJECTIVE")
    if got[len(vt):width] != [pad] * (width - len(vt)) or pad * entry_bytes < c.geo.capacity:
        c.fail(f"translate_tokens padding lanes {got[len(vt):width]} (padding entry {pad}, {entry_bytes} B entries): "
               f"a padding lane must point past the arena's {c.geo.capacity} B, where no page lies",
               inv="INV-NO-OVERLAP")


# name -> (precondition, rule)
BATCH_RULES: dict[str, tuple[Callable[[Conductor], bool] | None, Callable[[Conductor, Chooser], None]]] = {
    "admit_batch": (lambda c: _has(c, "admit_batch"), r_admit_batch),
    "extend_batch": (lambda c: _has(c, "extend_batch") and bool(requests(c)), r_extend_batch),
    "decode_step": (lambda c: _has(c, "extend_batch") and bool(requests(c)), r_decode_step),
    "admit_batch_below": (lambda c: _limited(c, "admit_batch"), lambda c, ch: r_admit_batch(c, ch, True)),
    "extend_batch_below": (lambda c: _limited(c, "extend_batch") and bool(requests(c)),
                           lambda c, ch: r_extend_batch(c, ch, True)),
    "free_batch": (lambda c: _has(c, "free_batch") and bool(requests(c)), r_free_batch),
    "event_forward": (lambda c: _has(c, "poll") and bool(requests(c)), r_event_forward),
    "event_done": (lambda c: any(u in c.users for u in c.__dict__.get("events", {})), r_event_done),
    "token_locs": (lambda c: _has(c, "token_locs") and bool(requests(c)), r_token_locs),
    "translate_pad": (lambda c: _has(c, "pad_entry") and bool(c.oracle.live()), r_translate_pad),
}


class BatchedLockstepMachine(LockstepMachine):
    """The lockstep machine plus the batched rules."""


for _name in BATCH_RULES:
    setattr(BatchedLockstepMachine, _name, as_rule(_name, *BATCH_RULES[_name]))


def batched_lockstep_for(factory: Callable[[ArenaConfig], Any], level: str = "exact", deep: bool = True,
                         name: str | None = None) -> type[BatchedLockstepMachine]:
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: choose one of {LEVELS}")
    return type(name or f"BatchedLockstep_{level}", (BatchedLockstepMachine,),
                {"factory": staticmethod(factory), "level": level, "deep": deep})


def run_batched_lockstep(factory: Callable[[ArenaConfig], Any], level: str = "exact",
                         settings: Settings | None = None, deep: bool = True) -> None:
    run_state_machine_as_test(batched_lockstep_for(factory, level, deep), settings=settings)
