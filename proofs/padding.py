"""Padding lanes (spec/arena.md §Padding lanes): no padding write reaches a page, for every geometry.

A CUDA-graph step writes every lane of its fixed width; lanes past the running tokens, and ids the arena does not
bind, translate to the class's **padding entry** ``pad(c) = ceil(capacity / E_c)`` (``Arena.pad_entry``). Two
obligations, unbounded (all capacities, entry sizes, page sizes, slots), and one mutant:

* **PAD-OUTSIDE-PAGES**: the padding entry's bytes ``[pad(c) * E_c, (pad(c) + 1) * E_c)`` meet no page of any class
  ``d``: every page is a slot ``s < top_d = floor(capacity / P_d)`` of bytes ``[s * P_d, (s + 1) * P_d)``, and
  ``(s + 1) * P_d <= top_d * P_d <= capacity <= pad(c) * E_c``. So a padding write reaches no live page, no
  withheld page and no hole (INV-NO-OVERLAP extended to the bytes past the arena).
* **PAD-IN-ALLOCATION**: the padding entry ends within ``capacity + 2 * max E`` bytes (what gpu/ allocates past the
  arena), so a padded write stays inside the implementation's buffer.
* **PAD-IN-LAST-BAND** (the mutant, refuted): the padding entry moved to the last entry that starts inside the arena,
  ``ceil(capacity / E_c) - 1``. Z3 finds a geometry where it lies in a page; the counterexample is searched in the
  toy-tri geometry and replayed in the reference (``replay_inside``): a live page written at the top of the high
  band holds that entry, and ``check_padding`` raises INV-NO-OVERLAP.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import z3

from kvarena.proofs.ladder import Theorem, _ceil_div, _floor_div, _prove
from kvarena.reference.arena import Arena
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.models import ArenaConfig, preset

PadFn = Callable[[Arena, str], int]


def check_padding(arena: Arena, pad: PadFn | None = None) -> None:
    """INV-NO-OVERLAP for padding lanes: every class's padding entry (``pad``, default ``Arena.pad_entry``) lies
    past byte ``capacity`` and overlaps no live or withheld page of any class."""
    pad = pad or (lambda a, c: a.pad_entry(c))
    for c in arena.order:
        e = arena.layouts[c].entry_bytes
        lo, hi = pad(arena, c) * e, (pad(arena, c) + 1) * e
        for d in arena.order:
            band = arena.bands[d]
            for s in sorted(set(band.live) | band.withheld):
                p_lo = arena.page_offset(d, s)
                if lo < p_lo + band.page_bytes and p_lo < hi:
                    raise InvariantViolation("INV-NO-OVERLAP", f"the {c!r} padding entry {pad(arena, c)} (bytes "
                                             f"[{lo}, {hi})) overlaps {d!r} page at slot {s} (bytes [{p_lo}, "
                                             f"{p_lo + band.page_bytes})): a padded lane writes into that page")
        if lo < arena.capacity:
            raise InvariantViolation("INV-NO-OVERLAP", f"the {c!r} padding entry starts at byte {lo}, inside the "
                                     f"{arena.capacity} B arena")


def _geometry(tag: str):
    cap, e_c, e_d, epp, s = z3.Ints(f"{tag}.capacity {tag}.E_c {tag}.E_d {tag}.epp_d {tag}.slot")
    p_d = epp * e_d
    top, d_top = _floor_div(cap, p_d, f"{tag}.top_d")
    pad, d_pad = _ceil_div(cap, e_c, f"{tag}.pad_c")
    pre = z3.And(cap > 0, e_c > 0, e_d > 0, epp >= 1, d_top, d_pad, s >= 0, s < top)
    return cap, e_c, e_d, epp, s, p_d, top, pad, pre


def theorem_outside(timeout_ms: int) -> Theorem:
    th = Theorem("PAD-OUTSIDE-PAGES", "a class's padding entry ceil(capacity / E_c) meets no page of any class "
                                      "(all capacities, entry and page sizes, slots)")
    cap, e_c, _e_d, _epp, s, p_d, _top, pad, pre = _geometry("po")
    disjoint = z3.Or(pad * e_c >= (s + 1) * p_d, (pad + 1) * e_c <= s * p_d)
    t0 = time.perf_counter()
    status, _m = _prove([pre], z3.And(disjoint, pad * e_c >= cap), timeout_ms)
    if status == "proven" and not _satisfiable(pre, timeout_ms):
        status = "vacuous: no geometry meets the hypotheses"
    th.seconds, th.status, th.bound = time.perf_counter() - t0, status, "unbounded (nonlinear integer arithmetic)"
    return th


def _satisfiable(pre: z3.BoolRef, timeout_ms: int) -> bool:
    s = z3.Solver()
    s.set(timeout=timeout_ms)
    s.add(pre)
    return s.check() == z3.sat


def theorem_allocation(timeout_ms: int) -> Theorem:
    th = Theorem("PAD-IN-ALLOCATION", "the padding entry ends before capacity + 2 * max entry bytes (gpu/'s buffer "
                                      "past the arena)")
    cap, e_c, _e_d, _epp, _s, _p_d, _top, pad, pre = _geometry("pa")
    e_max = z3.Int("pa.E_max")
    t0 = time.perf_counter()
    status, _m = _prove([pre, e_max >= e_c], (pad + 1) * e_c <= cap + 2 * e_max, timeout_ms)
    th.seconds, th.status, th.bound = time.perf_counter() - t0, status, "unbounded"
    return th


TOY = {"model": "toy-tri", "page_size": 4, "max_context_len": 8}  # entries 64 | 128 | 64 B; pages 64 | 512 | 256


def theorem_inside_mutant(timeout_ms: int) -> Theorem:
    th = Theorem("PAD-IN-LAST-BAND", "mutant: the padding entry at the last entry inside the arena "
                                     "(ceil(capacity / E_c) - 1) lies in a page; Z3 finds it, the reference replays it")
    cap, e_c, e_d, epp, s, p_d, top, pad, pre = _geometry("pm")
    bad = pad - 1
    overlaps = z3.And(bad * e_c < (s + 1) * p_d, s * p_d < (bad + 1) * e_c)
    # search where the reference can replay it: toy-tri's full class (64 B entries, 4 per page) against itself, the
    # page at the top of the high band, a capacity the toy builds
    toy = z3.And(e_c == 64, e_d == 64, epp == 4, s == top - 1, cap >= 2048, cap <= 4096)
    t0 = time.perf_counter()
    status, model = _prove([pre, toy], z3.Not(overlaps), timeout_ms)
    th.seconds = time.perf_counter() - t0
    th.bound = "counterexample searched in the toy-tri geometry so the reference can replay it"
    if status != "counterexample" or model is None:
        th.status = f"no counterexample ({status})"
        return th
    capacity = model.eval(cap, model_completion=True).as_long()
    try:
        th.detail = replay_inside(capacity)
        th.status = "counterexample (expected)"
    except AssertionError as e:
        th.status = f"counterexample did not replay: {e}"
    return th


def replay_inside(capacity: int) -> str:
    """The toy-tri arena of the counterexample: the first full page sits at the top of the high band and is
    written; the correct padding entry passes ``check_padding``, the mutant's raises INV-NO-OVERLAP."""
    a = Arena(ArenaConfig(preset(TOY["model"]), capacity, page_size=TOY["page_size"],
                          max_context_len=TOY["max_context_len"]))
    got = a.admit("r", {"full": 1})
    vid = got.pages["full"][0]
    a.write(vid, TOY["page_size"] - 1, 0, 7)  # the page's last entry, nearest the padding entry
    check_padding(a)
    try:
        check_padding(a, lambda ar, c: ar.pad_entry(c) - 1)
    except InvariantViolation as e:
        assert e.inv == "INV-NO-OVERLAP", e
        return f"toy-tri {capacity} B: {e}"
    raise AssertionError("the mutant's padding entry overlaps no live page here: not a counterexample")


def run(timeout_ms: int = 30_000) -> list[Theorem]:
    return [theorem_outside(timeout_ms), theorem_allocation(timeout_ms), theorem_inside_mutant(timeout_ms)]
