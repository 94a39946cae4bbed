"""gpu/planner.py's rung-2 probe against the walk it replaces (spec/arena.md §Rung 2, shortfall-sized compaction).

``EndSeq.view(k)`` gives an end band as it will be after the first k moves of its two-pointer sequence in O(1):
the retracted frontier from three numbers (the farthest unmoved source, the farthest filled hole, the farthest
slot no move frees), the hole count from the slots the frontier gave back, the holes lazily. ``_packed_view``
computes the same band by walking it slot by slot (the occupancy after the moves, then its last occupied slot).
On random bands of either end, with holes, withheld slots and a barrier or none, every k must give the same span,
hole count and holes taken. tests/quality/gpu_mutants.py plants three bugs in the probe that this check kills.
"""

from __future__ import annotations

import random
import types
from collections import Counter

import numpy as np
import pytest

import kvarena.gpu.planner as planner
from kvarena.gpu.hoststate import LiveMap
from kvarena.spec.types import Role


def probe_matches_walk(mod: types.ModuleType, seed: int, trials: int = 400) -> int:
    """Random bands, every k of each one's sequence: ``mod.EndSeq(...).view(k)`` equals ``mod._packed_view``
    (AssertionError naming the first difference); returns the number of views compared."""
    rng = random.Random(seed)
    checked = 0
    for trial in range(trials):
        role = rng.choice([Role.LOW, Role.HIGH])
        top = rng.randint(4, 48)
        band = mod.Band("x", role, 4, top * 4)
        band.live = LiveMap(top)
        span = rng.randint(0, top)
        band.lo, band.hi = (0, span) if role is Role.LOW else (top - span, top)
        vid = 0
        for s in range(band.lo, band.hi):
            r = rng.random()
            if r < 0.5:
                band.live.put(np.array([s]), np.array([vid]))
                vid += 1
            elif r < 0.85:
                band.holes.add(s)
            else:
                band.withheld.add(s)
        edge = band.hi - 1 if role is Role.LOW else band.lo  # settled: the growing edge is not a hole
        if band.hi > band.lo and edge in band.holes:
            band.holes.remove(edge)
            band.live.put(np.array([edge]), np.array([vid]))
        wh = sorted(band.withheld)
        barrier = (max(wh) if role is Role.LOW else min(wh)) if wh and rng.random() < 0.7 else None
        seq = mod.EndSeq(band, barrier, None)
        line = seq.line()  # every k at once, as the shortfall search reads it
        for k in range(len(seq) + 1):
            got, want = seq.view(k), mod._packed_view(band, seq.src[:k], seq.dst[:k], None)
            where = f"trial {trial} ({role.name}, span [{band.lo}, {band.hi}), barrier {barrier}), k={k}"
            assert (got.lo, got.hi, got.n_holes) == (want.lo, want.hi, want.n_holes), \
                f"{where}: probe {(got.lo, got.hi, got.n_holes)}, walk {(want.lo, want.hi, want.n_holes)}"
            lane = tuple(int(x[k]) for x in line)
            assert lane == (want.lo, want.hi, want.n_holes), f"{where}: line {lane}, walk {want.lo, want.hi}"
            for n in (1, 3, want.n_holes, want.n_holes + 2):
                assert got.take(n) == want.take(n), f"{where}: the {n} nearest holes differ"
            checked += 1
    return checked


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_probe_is_the_walk(seed: int) -> None:
    assert probe_matches_walk(planner, seed) > 1000


def _random_band(mod: types.ModuleType, rng: random.Random, role: Role, top: int, p_live: float,
                 p_withheld: float) -> planner.Band:
    band = mod.Band("x", role, 4, top * 4)
    band.live = LiveMap(top)
    span = rng.randint(0, top)
    band.lo, band.hi = (0, span) if role is Role.LOW else (top - span, top)
    for s in range(band.lo, band.hi):
        r = rng.random()
        if r < p_live:
            band.live.put(np.array([s]), np.array([s]))
        elif r < p_live + p_withheld:
            band.withheld.add(s)
        else:
            band.holes.add(s)
    return band


def scans_match(mod: types.ModuleType, seed: int, trials: int = 150) -> None:
    """``mod._beyond`` (chunked from the far edge, at most ``need``) is the live slots beyond the barrier
    farthest first, cut at ``need``; ``mod._anchor_holes`` (from the page map or from the sorted holes) is the m
    holes nearest the anchor. Bands of up to 3,000 slots, sparse and dense, so both read paths and several
    chunks run."""
    rng = random.Random(seed)
    for _ in range(trials):
        role = rng.choice([Role.LOW, Role.HIGH])
        band = _random_band(mod, rng, role, rng.randint(1, 3000), rng.choice([0.02, 0.5, 0.97]),
                            rng.choice([0, 0.05]))
        up = role is Role.LOW
        live = sorted(s for s in range(band.lo, band.hi) if band.live.arr[s] >= 0)
        barrier = rng.choice(live) if live and rng.random() < 0.5 else None
        far_first = [s for s in (reversed(live) if up else live)
                     if barrier is None or (s > barrier if up else s < barrier)]
        for need in (None, 0, 1, 2, 63, 64, 65, 300, len(far_first), len(far_first) + 1):
            got = mod._beyond(band, barrier, need).tolist()
            assert got == far_first[:need], (role.name, band.lo, band.hi, barrier, need)
        holes = list(band.holes) if up else list(reversed(band.holes))
        for m in (0, 1, 2, 5, 40, len(holes), len(holes) + 3):
            assert mod._anchor_holes(band, m).tolist() == holes[:m], (role.name, band.lo, band.hi, m)


@pytest.mark.parametrize("seed", [0, 1])
def test_scans_are_their_definitions(seed: int) -> None:
    scans_match(planner, seed)


@pytest.mark.parametrize("name", ["toy-tri", "toy-swa"])
def test_a_line_is_place_at_every_depth(name: str) -> None:
    """``Lines.along`` (every move count of one end band as one lane, counted by ``fits_along``) answers as the
    scalar ``place`` does at each point of the line, on arenas left with holes in both end bands by random
    admits and frees, for demands from one page to past what compaction can give."""
    from kvarena.gpu.allocator import make
    from kvarena.spec.errors import AdmissionRejectedError
    from kvarena.spec.models import ArenaConfig, preset, request_pages

    rng = random.Random(name)
    lines_checked, answers = 0, Counter()
    for trial in range(12):
        a = make(ArenaConfig(preset(name), 1 << 15, page_size=2, max_context_len=16), device="meta")
        lad, live = a.ladder, []
        i = misses = 0
        while misses < 5:  # fill until refused, then free a scattered part: holes in both end bands
            i += 1
            try:
                a.admit(f"o{i}", request_pages(preset(name), 2, rng.randint(1, 16)))
                live.append(f"o{i}")
            except AdmissionRejectedError:  # full (a refusal changes nothing)
                misses += 1
        for _ in range(len(live) * 2 // 5):
            a.free(live.pop(rng.randrange(len(live))))
        views = lad.views()
        low, high = (planner.EndSeq(b, lad.barrier(b), lad._reader(b.name)) for b in (lad.bands[0], lad.bands[-1]))
        for _ in range(6):
            demand = {v.name: rng.randint(0, 2 * v.n_holes + 2) for v in views}  # around what the holes hold
            lines = planner.Lines(views, low, high, demand, lad.hints)
            for end, seq, other in ((0, low, high), (1, high, low)):
                for o in sorted({0, len(other) // 2, len(other)}):
                    got = lines.along(end, o)
                    for k in range(len(seq) + 1):
                        kl, kh = (k, o) if end == 0 else (o, k)
                        want = planner.place([low.view(kl), *views[1:-1], high.view(kh)], demand, lad.hints).ok
                        assert got(k) == want, (trial, demand, end, o, k)
                        answers[want, k > 0] += 1
                    lines_checked += 1
    # both answers, at depth 0 and deeper: the lines cross from "short" to "fits"
    assert lines_checked >= 100 and len(answers) == 4 and min(answers.values()) >= 20, answers
