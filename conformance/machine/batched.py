"""Lockstep rules for the batched engine calls (spec/arena.md §Batched operations).

A batched rule issues one ``admit_batch`` / ``extend_batch`` / ``free_batch`` on the implementation and the same
operations **sequentially**, in batch order, on the reference; each owner's result (pages, virtual ids, plan, or
the error class and shortfall) is reconciled at the conductor's level exactly as a single step would be, and
the level's checks run once after the batch. So at ``exact`` the batch must be indistinguishable from the
sequential calls. Also:

``decode_engine``  the engine's own form of a decode step: the int row handles earlier batch results returned
                   (``result.rows``) and an int64 demand array, so gpu/'s lean decode path runs; lanes that are
                   refused (the -1 row of a refused admission, a freed owner's stale handle, one past every
                   table) are named again; then a row of each new page is written (and read back every step).
``free_shared``    one ``free_batch`` naming every owner of a shared page, in any order: the last let-go frees it.
``event_forward``  a FORWARD user acquired with an event, on both sides (each its own event object);
                   ``event_done`` completes several pending events, in any order, on both sides at the same step:
                   the next call that polls releases them on both sides, by the implementation's own polling
                   (or, sometimes, one by hand); ``poll`` compares the names ``poll()`` releases, in order. An
                   implementation that releases an event user before its event completed, or after the call
                   that must poll it, diverges.
``token_locs``     the physical entry of tokens ``[pre, seq)`` of each owner's pages of a class (SGLang's
                   ``alloc_extend`` / ``alloc_decode`` output) against the reference's v->p; asked past what an
                   owner holds, or for an owner that is not admitted, it must refuse (typed) and change nothing.
``translate_pad``  ``translate_tokens(out=, out_width=)``: every id's lane against the reference's slot, every
                   padding lane the implementation's padding entry, which must lie past the arena's last byte;
                   an ``out_width`` narrower than the ids is refused and leaves ``out`` untouched.

A refused ``admit_batch`` lane's name is tried again later (a new admission; extends and frees of it are refused).
The trace lines of ``event_done`` (``"op": "complete"``) and ``poll`` are the machine's own: no vector has them.

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
    _tag,
    as_rule,
    held_flat,
    live,
    requests,
)
from kvarena.spec.errors import ArenaError, InvalidArgumentError, UnknownOwnerError
from kvarena.spec.models import ArenaConfig
from kvarena.spec.types import UserKind

FORWARD = [UserKind.FORWARD_READ.value, UserKind.FORWARD_WRITE.value]


class ManualEvent:
    """A stand-in for ``torch.cuda.Event``: completes when a rule says so."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def _state(c: Conductor, key: str, default: Any) -> Any:
    """The machine's own bookkeeping on the conductor (handles, refused names, pending events)."""
    return c.__dict__.setdefault(key, default)


def _handles(c: Conductor) -> dict[str, int]:
    """Owner name -> the row handle a batch result reported for it. A name is never admitted twice in this
    machine (names are fresh), so the handle of an owner that is gone is stale: it must be refused."""
    return _state(c, "handles", {})


def _keep(c: Conductor, names: Sequence[str], result: Any) -> Any:
    """Remember the row handles of the lanes both sides admitted (``result.rows``); the result unchanged."""
    rows = getattr(result, "rows", None)
    if rows is not None and len(rows) == len(names):
        live = set(c.oracle.owners())
        for name, r in zip(names, np.asarray(rows).tolist()):
            if r >= 0 and name in live:
                _handles(c)[name] = int(r)
    return result


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
    pool = [*reqs, "ghost", *_refused(c)[-2:]]
    out = [ch.choice(pool, "owner") for _ in range(ch.integer(lo, hi, "n"))]
    if out and ch.integer(0, 4, "repeat") == 0:
        out.append(out[0])
    return out


# ---------------------------------------------------------------------------------------------
# The rules


def _refused(c: Conductor) -> list[str]:
    """Names of admit_batch lanes both sides refused and nobody admitted since (in refusal order)."""
    live = set(c.oracle.owners())
    return [o for o in _state(c, "refused", []) if o not in live]


def r_admit_batch(c: Conductor, ch: Chooser, limited: bool = False) -> None:
    n = ch.integer(1, 6, "n")
    owners = [c.fresh("ab") for _ in range(n)]
    if c.oracle.owners() and ch.integer(0, 5, "dup") == 0:
        owners[-1] = ch.choice(c.oracle.owners(), "existing")
    again = _refused(c)
    if again and ch.integer(0, 2, "again") == 0:  # a refused lane named again: a new admission of that name
        owners[0] = ch.choice(again, "refused")
    demands = _demands(c, ch, n, 3)
    form = _as_array(c, ch, demands)
    items = [{"owner": o, "demand": d, "shared": []} for o, d in zip(owners, demands)]
    kw = {}
    if limited:  # one placement limit for every lane: the sequential calls each take it
        kw["below"] = random_below(c, ch)
        items = [{**x, "below": kw["below"]} for x in items]
    exps = batch(c, "admit", items, lambda a, res: _keep(c, owners, a.admit_batch(owners, form, **kw)))
    seen = _state(c, "refused", [])
    live = set(c.oracle.owners())
    seen.extend(o for o, e in zip(owners, exps) if not e.ok and o not in live and o not in seen)


def r_extend_batch(c: Conductor, ch: Chooser, limited: bool = False) -> None:
    owners = _owners(c, ch, 1, 8)
    demands = _demands(c, ch, len(owners), 2)
    form = _as_array(c, ch, demands)
    items = [{"owner": o, "demand": d} for o, d in zip(owners, demands)]
    kw = {}
    if limited:
        kw["below"] = random_below(c, ch)
        items = [{**x, "below": kw["below"]} for x in items]
    batch(c, "extend", items, lambda a, res: _keep(c, owners, a.extend_batch(owners, form, **kw)))


def _limited(c: Conductor, method: str) -> bool:
    """The batched ``method`` takes ``below`` (a malformed one refuses the whole call: gpu/'s own tests check it)."""
    return _has(c, method) and offers_below(c) and takes(getattr(c.impl.alloc, method), "below")


def r_decode_step(c: Conductor, ch: Chooser, owners: list[str] | None = None) -> None:
    """Every request (or ``owners``), one page each of the classes a token crossing a page boundary needs (some
    requests only)."""
    owners = requests(c) if owners is None else owners
    grow = [k for k in c.order if c.geo.kind[k].value != "recurrent"]
    demands = [{k: (1 if k in grow and ch.boolean("crosses") else 0) for k in c.order} for _ in owners]
    form = _as_array(c, ch, demands)
    items = [{"owner": o, "demand": d} for o, d in zip(owners, demands)]
    batch(c, "extend", items, lambda a, res: _keep(c, owners, a.extend_batch(owners, form)))


def _stale(c: Conductor) -> list[tuple[str, int]]:
    """(name, handle) of owners that are gone: their handles must be refused."""
    live = set(c.oracle.owners())
    return [(o, r) for o, r in _handles(c).items() if o not in live]


def r_decode_engine(c: Conductor, ch: Chooser) -> None:
    """One to four decode steps as an engine issues them: row handles and an int64 (requests, classes) array;
    one end class grows (one page per lane, or some lanes), sometimes with a refused lane; then one row of
    some new pages is written, so every later step reads it back (moves must carry it)."""
    missing = [o for o in requests(c) if o not in _handles(c)]
    if missing:  # the engine learns its handles from a step by name (``result.rows``): a decode step of theirs
        r_decode_step(c, ch, missing)
    for _ in range(ch.integer(1, 4, "steps")):
        _decode_engine_step(c, ch)


def _decode_engine_step(c: Conductor, ch: Chooser) -> None:
    hs = _handles(c)
    mine = [o for o in requests(c) if o in hs]
    ends = [k for k in dict.fromkeys((c.order[0], c.order[-1])) if c.geo.kind[k].value != "recurrent"]
    if not mine or not ends:
        return
    owners = ch.subset(mine, 1, 8, "owners")
    cls = ch.choice(ends, "cls")
    j = c.order.index(cls)
    shape = ch.integer(0, 2, "shape")  # 0: one page per lane (the decode pattern), 1: some lanes, 2: 0..2 a lane
    per = [1 if shape == 0 else ch.integer(0, 1 if shape == 1 else 2, "pages") for _ in owners]
    handles = [hs[o] for o in owners]
    if ch.integer(0, 5, "refused") == 0:  # a lane the arena must refuse, named as an engine names it
        stale = _stale(c)
        name, h = ch.choice([*stale, ("ghost", -1), ("ghost", 1 << 40)], "bad_lane")
        at = ch.integer(0, len(owners), "at")
        owners.insert(at, name)
        handles.insert(at, h)
        per.insert(at, 1)
    rows = np.array(handles, dtype=np.int64)
    demands = np.zeros((len(owners), len(c.order)), dtype=np.int64)
    demands[:, j] = per
    items = [{"owner": o, "demand": {k: (p if k == cls else 0) for k in c.order}} for o, p in zip(owners, per)]
    exps = batch(c, "extend", items, lambda a, res: a.extend_batch(rows, demands))
    completed = _state(c, "completed", [])
    if completed and ch.integer(0, 3, "late_release") == 0:  # refused on both sides iff a poll released it
        c.run("release", user=ch.choice(completed[-4:], "user"))
    if ch.boolean("write_back"):
        for e in exps:
            for h in (e.pages or {}).get(cls, []) if e.ok else []:
                c.run("write", page=h, entry=ch.integer(0, c.geo.entries[cls] - 1, "entry"),
                      row=ch.integer(0, c.geo.rows[cls] - 1, "row"), tag=_tag(c))
    # what the engine does next in the same step: the new tokens' locations (by handle); the step's forward
    # holding the batch's pages until its event completes; requests finishing (freed by handle: their pages
    # stay withheld while a forward reads them); earlier forwards completing, released by the next call's poll
    ok = [o for o, e in zip(owners, exps) if e.ok and o in set(requests(c))]
    if ok and _has(c, "token_locs") and ch.boolean("locs"):
        epp = c.geo.entries[cls]
        seq = [len(c.oracle.arena.owners[o][cls]) * epp - ch.integer(0, epp - 1, "slack") for o in ok]
        seq = [max(s, 0) for s in seq]
        _token_locs_agree(c, cls, ok, [max(s - 1, 0) for s in seq], seq, True)
    if ok and _has(c, "poll") and ch.boolean("forward"):
        r_event_forward(c, ch, ch.subset(ok, 1, len(ok), "in_forward"))
    if ok and ch.boolean("finish"):
        done = ch.subset(ok, 1, 2, "finished")
        _free(c, done, _engine_form(c, done))
    if _pending(c) and ch.boolean("completes"):
        r_event_done(c, ch)


def _engine_form(c: Conductor, owners: Sequence[str]) -> Any:
    """``owners`` as an engine names them, the row handles results reported, where every one is known; else
    the names."""
    hs = _handles(c)
    if all(o in hs for o in owners):
        return np.array([hs[o] for o in owners], dtype=np.int64)
    return list(owners)


def _free(c: Conductor, owners: Sequence[str], form: Any) -> None:
    """One ``free_batch`` of ``owners``, called with ``form`` (their names or their handles)."""
    batch(c, "free", [{"owner": o} for o in owners], lambda a, res: a.free_batch(form))


def r_free_batch(c: Conductor, ch: Chooser) -> None:
    owners = _owners(c, ch, 1, 4)
    _free(c, owners, _engine_form(c, owners) if ch.boolean("handles") else list(owners))


def _sharers(c: Conductor) -> dict[int, list[str]]:
    """Live pages held by two or more requests -> their holders."""
    by: dict[int, list[str]] = {}
    for o in requests(c):
        for h in held_flat(c, o):
            by.setdefault(h, []).append(o)
    return {h: os for h, os in by.items() if len(os) > 1}


def r_free_shared(c: Conductor, ch: Chooser) -> None:
    """Every owner of a shared page freed by one ``free_batch``, in any order (and sometimes another owner): the
    page is freed by the lane whose let-go takes its count to 0, and reported there."""
    sharers = _sharers(c)
    if not sharers:
        return
    page = ch.choice(sorted(sharers), "page")
    owners = ch.subset(sharers[page], len(sharers[page]), len(sharers[page]), "order")
    others = [o for o in requests(c) if o not in owners]
    if others and ch.boolean("another"):
        owners.insert(ch.integer(0, len(owners), "at"), ch.choice(others, "other"))
    _free(c, owners, _engine_form(c, owners) if ch.boolean("handles") else list(owners))


def r_event_forward(c: Conductor, ch: Chooser, owners: Sequence[str] | None = None) -> None:
    """A forward pass over one request's pages (or every page of ``owners``: an engine step's batch), acquired
    with an event on both sides."""
    if owners is None:
        owners = [ch.choice(requests(c), "owner")]
    pages = [h for o in owners for h in held_flat(c, o)]
    if not pages:
        return
    user, kind = c.fresh("ev"), ch.choice(FORWARD, "kind")
    event = ManualEvent()
    args = {"user": user, "kind": kind, "pages": pages}

    ref_event = ManualEvent()  # the reference's own: completed at the same step as the implementation's

    def acquire(a: Any, res: list[dict]) -> list[Any]:
        x = res[0]
        try:
            return [a.acquire(x["user"], x["kind"], x["pages"], event=event)]
        except ArenaError as e:
            return [e]

    c.nstep += 1
    polls = c.completed_events()
    exp = c.oracle.apply("acquire", args, event=ref_event)
    c.steps.append({"step": c.nstep, "op": "acquire", "args": args, "expect": exp.to_json("acquire"),
                    "event": True})
    if c.impl is None:
        c._bookkeep("acquire", args, exp)
        return
    r = acquire(c.impl.alloc, [c.impl.h.args_for_call("acquire", args)])[0]
    out = _outcome("acquire", r, c.order) if isinstance(r, BaseException) else Outcome()
    c._reconcile("acquire", args, exp, out)
    c.check_after("acquire", unchanged=not exp.ok and not polls)
    if exp.ok:
        _state(c, "events", {})[user] = (event, ref_event)


def _pending(c: Conductor) -> list[str]:
    """Event users whose events have not completed (acquisition order)."""
    return [u for u in _state(c, "events", {}) if u in c.users]


def r_event_done(c: Conductor, ch: Chooser) -> None:
    """Several forwards' events complete, in any order, on both sides at once. Nobody releases them: each side's
    next call that polls does (spec §Ledger, Event users), the same call on both; sometimes one is released by
    hand first (rule 3: released once, its event then ignored)."""
    events = _state(c, "events", {})
    pending = _pending(c)
    users = ch.subset(pending, min(2, len(pending)), 4, "users")
    for u in users:
        for e in events.pop(u):
            e.done = True
    _state(c, "completed", []).extend(users)
    c.steps.append({"step": c.nstep, "op": "complete", "args": {"users": users}, "note": "events completed"})
    then = ch.integer(0, 3, "then")
    if then == 0:
        c.run("release", user=ch.choice(users, "user"))
    elif then < 3:  # the engine polls at the step boundary
        r_poll(c, ch)


def r_poll(c: Conductor, ch: Chooser) -> None:
    """``poll()`` on both sides: the same users released, in acquisition order (the event objects are each
    side's own, so the reference's poll is compared directly)."""
    c.nstep += 1
    want = c.oracle.arena.poll()
    c.steps.append({"step": c.nstep, "op": "poll", "args": {}, "expect": {"returns": want}})
    try:
        got = list(c.impl.alloc.poll())
    except Exception as e:
        c.fail(f"poll() raised {type(e).__name__}: {e}; it never refuses")
    if got != want:
        c.fail(f"poll() released {got}, the reference {want} (every event user whose event completed, in "
               "acquisition order; none before)", inv="INV-LEDGER-SAFETY")
    c.check_after("poll", unchanged=False)


def _refuses(c: Conductor, what: str, fn: Callable[[], Any], error: type[ArenaError]) -> None:
    """``fn`` must raise ``error`` and leave the observable state unchanged (a query refused)."""
    before = c.impl.observe()
    try:
        got = fn()
    except error:
        pass
    except Exception as e:
        c.fail(f"{what} raised {type(e).__name__}: {e}; it must raise {error.__name__} (typed: the call is "
               "malformed or asks past what is held)")
    else:
        c.fail(f"{what} returned {got!r:.200}; it must raise {error.__name__}", inv="INV-VMAP-BIJECTIVE")
    if c.impl.observe() != before:
        c.fail(f"{what} was refused but changed the observable state", inv="INV-REFUSAL-IS-NOOP")


def r_token_locs(c: Conductor, ch: Chooser) -> None:
    owners = sorted(set(_owners(c, ch, 1, 6)) & set(requests(c)))
    token = [k for k in c.order if c.geo.kind[k].value != "recurrent"]
    if not owners or not token:
        return
    cls = ch.choice(token, "cls")
    epp = c.geo.entries[cls]
    ref = c.oracle.arena
    pre, seq = [], []
    for o in owners:
        hi = len(ref.owners[o][cls]) * epp
        p = ch.integer(0, hi, "pre")
        pre.append(p)
        seq.append(ch.integer(p, min(hi, p + 2 * epp), "seq"))
    past = ch.integer(0, 3, "past")
    if past == 1:  # one owner asked for tokens past the pages it holds
        k = ch.integer(0, len(owners) - 1, "which")
        seq[k] = len(ref.owners[owners[k]][cls]) * epp + ch.integer(1, epp, "beyond")
    elif past == 2:  # a lane of no owner: a stale handle or a name never admitted
        stale = _stale(c)
        bad = ch.choice([o for o, _ in stale] or ["ghost"], "nobody")
        owners, pre, seq = [*owners, bad], [*pre, 0], [*seq, 1]
    if past in (1, 2):
        _refuses(c, f"token_locs({cls!r}, {owners}, pre {pre}, seq {seq})",
                 lambda: c.impl.alloc.token_locs(cls, owners, np.array(pre), np.array(seq)),
                 InvalidArgumentError if past == 1 else UnknownOwnerError)
        return
    _token_locs_agree(c, cls, owners, pre, seq, ch.boolean("handles"))


def _token_locs_agree(c: Conductor, cls: str, owners: list[str], pre: list[int], seq: list[int],
                      handles: bool) -> None:
    """``token_locs`` (by name, or by the engine's row handles where all are known) against the reference's v->p."""
    ref = c.oracle.arena
    epp = c.geo.entries[cls]
    want = []
    for o, p, s in zip(owners, pre, seq):
        vids = list(ref.owners[o][cls])
        want += [ref.v2p[vids[q // epp]][1] * epp + q % epp for q in range(p, s)]
    names = _engine_form(c, owners) if handles else owners
    try:
        got = c.impl.alloc.token_locs(cls, names, np.array(pre), np.array(seq)).cpu().tolist()
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
    if ch.integer(0, 4, "narrow") == 0:  # an out_width narrower than the ids: refused, out untouched
        out = torch.full((len(vt) + 3,), -7, dtype=torch.int64, device=a.device)
        narrow = ch.integer(0, len(vt) - 1, "width")
        _refuses(c, f"translate_tokens({cls!r}, {vt}, out_width={narrow})",
                 lambda: a.translate_tokens(cls, torch.tensor(vt, dtype=torch.int64, device=a.device), out=out,
                                            out_width=narrow), InvalidArgumentError)
        if out.cpu().tolist() != [-7] * (len(vt) + 3):
            c.fail(f"translate_tokens({cls!r}, {vt}, out_width={narrow}) was refused but wrote into out")
        return
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
    "decode_engine": (lambda c: _has(c, "extend_batch") and bool(requests(c)), r_decode_engine),
    "free_batch": (lambda c: _has(c, "free_batch") and bool(requests(c)), r_free_batch),
    "free_shared": (lambda c: _has(c, "free_batch") and bool(_sharers(c)), r_free_shared),
    "event_forward": (lambda c: _has(c, "poll") and bool(requests(c)), r_event_forward),
    "event_done": (lambda c: bool(_pending(c)), r_event_done),
    "poll": (lambda c: _has(c, "poll"), r_poll),
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
