"""Planted bugs in gpu/: each is a textual change to one gpu module that a check must catch.

Same rules as tests/quality/mutants.py: a mutant names its module, the exact original snippet (it must occur
once, so a refactor that removes it fails loudly instead of silently retiring the mutant), the replacement and
why it is a bug. Two things differ for gpu/:

* Other gpu modules imported names from the mutated one (``from kvarena.gpu.kernels.move import move_pages``),
  so :func:`applied` patches every such name, in every gpu module, with the mutant's object; the allocator that
  ``kvarena.gpu.allocator:make`` builds then runs the mutated code.
* Triton's interpreter re-reads a kernel's source (``inspect.getsourcelines``) when it first runs it, so the
  mutated source is registered in ``linecache`` under a file name of its own: the interpreter runs the mutated
  kernel, not the one in the file on disk at the same line numbers.

How each mutant is killed:

``lockstep``  ``run_lockstep(make, "exact", ci profile)`` must fail: on the ``"torch"`` path (the plain-torch
              branch of every kernel wrapper, fast) when the bug lives in host code (planner, allocator,
              tables, arena views), on the ``"interpreter"`` path (the Triton kernels under
              ``TRITON_INTERPRET=1``, what CI runs) when it lives in a kernel the allocator calls.
``kernel``    the kernel file's own ``check()`` on fresh random data must fail, on each path in ``paths``: for
              kernel bugs the allocator's calls never reach (a multi-request batch of the alloc kernel, an
              unmapped id in translate, an overlapping batch the allocator never forms).

The kernels must have been decorated under ``TRITON_INTERPRET=1`` (set it before anything imports triton or
kvarena.gpu); :func:`applied` refuses to run an interpreter mutant otherwise.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import torch

import kvarena.gpu.allocator as allocator_mod
import kvarena.gpu.arena as arena_mod
import kvarena.gpu.batch as batch_mod
import kvarena.gpu.hoststate as hoststate_mod
import kvarena.gpu.kernels as kernels
import kvarena.gpu.kernels.alloc as alloc_mod
import kvarena.gpu.kernels.move as move_mod
import kvarena.gpu.kernels.translate as translate_mod
import kvarena.gpu.kernels.zero as zero_mod
import kvarena.gpu.moves as moves_mod
import kvarena.gpu.planner as planner_mod
import kvarena.gpu.staging as staging_mod
import kvarena.gpu.tables as tables_mod
from kvarena.spec.errors import PlanError, UnknownOwnerError
from kvarena.spec.models import ArenaConfig, preset

GPU_MODULES: tuple[types.ModuleType, ...] = (allocator_mod, arena_mod, batch_mod, hoststate_mod, moves_mod, planner_mod,
                                             staging_mod, tables_mod, kernels, move_mod, zero_mod, translate_mod,
                                             alloc_mod)
KERNELS = {move_mod: "move_pages_kernel", zero_mod: "zero_pages_kernel", translate_mod: "translate_kernel",
           alloc_mod: "alloc_tokens_kernel"}
SEEDS = (0, 1, 2)


# ---------------------------------------------------------------------------------------------
# Kernel checks: each runs the kernel file's own check() (or the refusal gpu/'s tests assert) against a module,
# the real one or a mutant, on one path; AssertionError means the kernel is wrong.


def _padded_as_index(values: object, device: torch.device) -> torch.Tensor:
    """``as_index`` with 1,024 words of -1 after every host list: a kernel that reads past its page list reads
    -1, and any store that feeds lands in check()'s guard words, never outside a buffer (the interpreter has no
    bounds checks; without this an over-read of ``vids`` stores at a garbage address)."""
    if isinstance(values, torch.Tensor):
        return values.to(device=device, dtype=torch.int64)
    xs = list(values)  # type: ignore[call-overload]
    buf = torch.full((len(xs) + 1024,), -1, dtype=torch.int64, device=device)
    if xs:
        buf[:len(xs)] = torch.tensor(xs, dtype=torch.int64)
    return buf[:len(xs)]


def check_alloc(mod: types.ModuleType, path: str) -> None:
    """alloc.check() as tests/fast/test_gpu_kernels.py runs it (extends and decodes, several page sizes)."""
    with mock.patch.object(mod, "as_index", _padded_as_index):
        for seed in SEEDS:
            for epp in (1, 2, 4):
                mod.check(path=path, seed=seed, epp=epp)
                mod.check(path=path, seed=seed, epp=epp, decode=True, bs=13)


def check_probe(mod: types.ModuleType, path: str) -> None:
    """planner.py's O(1) rung-2 probe against the slot walk (tests/fast/test_gpu_probe.py); host code, one path."""
    from tests.fast.test_gpu_probe import probe_matches_walk, scans_match

    for seed in SEEDS:
        probe_matches_walk(mod, seed)
        scans_match(mod, seed)


def check_translate(mod: types.ModuleType, path: str) -> None:
    for seed in SEEDS:
        for epp in (1, 4):
            mod.check(path=path, seed=seed, epp=epp)


def check_zero(mod: types.ModuleType, path: str) -> None:
    for seed in SEEDS:
        mod.check(path=path, seed=seed)


def check_move(mod: types.ModuleType, path: str) -> None:
    for seed in SEEDS:
        mod.check(path=path, seed=seed)
        mod.check(path=path, seed=seed + 100, page_bytes=32, n_pages=40, n_moves=15)


def check_move_refuses_overlap(mod: types.ModuleType, path: str) -> None:
    """One launch runs its programs in any order (the interpreter: in grid order), so a batch in which a
    destination is also a source must be refused before anything runs (test_gpu_kernels.py's
    test_move_refuses_batches_one_launch_cannot_run)."""
    check_move(mod, path)
    words = torch.arange(64, dtype=torch.int64)
    for src, dst in (([1, 2], [2, 3]), ([2, 1], [3, 2])):
        try:
            mod.move_pages(words, src, dst, 64, path=path)
        except PlanError:
            continue
        raise AssertionError(f"move_pages ran the batch {src} -> {dst}, in which page 2 is both a source and a "
                             f"destination; the result depends on program order (now {words.view(8, 8)[3, 0]} "
                             "in page 3)")


def check_staging(mod: types.ModuleType, path: str) -> None:
    """staging.check(): uploads whose copies have not completed never share a host buffer (path-independent: the
    ring is host logic; it runs once per path like every kernel check)."""
    mod.check()


def check_zeroing(mod: types.ModuleType, path: str) -> None:
    """Every page a batch hands out reads as zero bytes, on an arena whose bytes were all 0xFF before: token pages
    and recurrent slots, the last page of each class's batch included."""
    factory = getattr(mod, "make", allocator_mod.make)
    if mod.__name__.startswith(batch_mod.__name__):  # batch.py or a mutant of it: GpuArena with its methods
        cls = type("GpuArena", (allocator_mod.GpuArena,), {k: v for k, v in vars(mod.BatchOps).items()
                                                            if callable(v) and not k.startswith("__")})
        factory = cls
    with contextlib.ExitStack() as stack:
        if path == "torch":
            stack.enter_context(mock.patch.object(kernels.common, "interpreted", lambda kernel: False))
        for model in ("toy-tri", "toy-state"):
            a = factory(ArenaConfig(preset(model), 8192, page_size=2, max_context_len=8))
            a.mem.raw.fill_(0xFF)
            k = len(a.order)
            res = a.admit_batch([f"z{i}" for i in range(3)], torch.tensor(
                [[1 if a.mem.is_recurrent(c) else 1 + (i + j) % 2 for j, c in enumerate(a.order)]
                 for i in range(3)]).numpy())  # one recurrent slot per request (recurrent_slots = 1)
            assert not res.errors, res.errors
            step = torch.zeros((3, k), dtype=torch.int64)
            step[:, -1] = 1
            assert not a.extend_batch(res.rows, step.numpy()).errors  # the lean decode path: int handles, one band
            words = a.mem.words
            for c, band in a.bands.items():
                pw = band.page_bytes // 8
                for slot in band.live.items():
                    got = words[slot[0] * pw:(slot[0] + 1) * pw]
                    if bool((got != 0).any()):
                        raise AssertionError(f"{model}: {c} page at slot {slot[0]} was handed out with stale bytes")


def check_decode_handles(mod: types.ModuleType, path: str) -> None:
    """The lean decode step against the reference's sequential extends: handles of no owner (negative, past every
    row) get UnknownOwnerError, one page per lane of either end class lands in that class (test_gpu_batch.py's
    test_decode_step_refuses_handles_of_no_owner). ``mod``: batch.py or hoststate.py, or a mutant of either."""
    from kvarena.conformance.adapter.protocol import observe_reference
    from kvarena.reference.arena import Arena

    cls: Any = allocator_mod.GpuArena
    if mod.__name__.startswith(batch_mod.__name__):
        cls = type("GpuArena", (allocator_mod.GpuArena,), {k: v for k, v in vars(mod.BatchOps).items()
                                                            if callable(v) and not k.startswith("__")})
    config = ArenaConfig(preset("toy-swa"), 8192, page_size=2, max_context_len=8)
    with mock.patch.object(allocator_mod, "OwnerLog", getattr(mod, "OwnerLog", allocator_mod.OwnerLog)):
        a = cls(config)
    ref = Arena(config)
    k = len(a.order)
    rows = [int(r) for r in a.admit_batch(["a", "b"], np.zeros((2, k), dtype=np.int64)).rows]
    for o in ("a", "b"):
        ref.admit(o, {})
    for c in (k - 1, 0):  # each batch alone: one dead handle sends the whole batch to the general path
        for handles in ([rows[0], rows[1]], [rows[0], -1, rows[1]], [rows[0], rows[1] + 5, rows[1]]):
            d = np.zeros((len(handles), k), dtype=np.int64)
            d[:, c] = 1
            res = a.extend_batch(np.array(handles, dtype=np.int64), d)
            for i, h in enumerate(handles):
                if h not in rows:
                    if not isinstance(res[i], UnknownOwnerError):
                        raise AssertionError(f"decode lane {i} (handle {h}: no owner) got {res[i]!r}, not "
                                             "UnknownOwnerError")
                    continue
                o = "ab"[rows.index(h)]
                want = ref.extend(o, {a.order[c]: 1}).pages
                if dict(res[i].pages) != dict(want):
                    raise AssertionError(f"decode lane {i} ({o}, one {a.order[c]} page) got {dict(res[i].pages)}, "
                                         f"the reference {dict(want)}")
            if observe_reference(ref) != a.observe():
                raise AssertionError(f"after a decode step of {handles} on {a.order[c]}: the observations differ "
                                     "from the reference's (a page in the wrong class or slot)")


def check_below(mod: types.ModuleType, path: str) -> None:
    """The placement limit ``below`` against the reference (spec/arena.md §Placement limit): on holes left in both
    end bands, every plan_admission under limits at every slot line, then admits, extends and a lean decode step
    under a limit, lane by lane, with the same placements (slot order included) and observations. ``mod``:
    planner.py or a mutant of it (its names patched into every gpu module that imported them)."""
    from kvarena.conformance.adapter.protocol import observe_reference
    from kvarena.reference.arena import Arena

    with contextlib.ExitStack() as stack:
        if path == "torch":
            stack.enter_context(mock.patch.object(kernels.common, "interpreted", lambda kernel: False))
        if mod is not planner_mod:
            for importer in GPU_MODULES:
                for name, home in imported_names(importer, planner_mod).items():
                    stack.enter_context(mock.patch.object(importer, name, getattr(mod, home)))
        config = ArenaConfig(preset("toy-swa"), 16384, page_size=2, max_context_len=8)
        a, ref = allocator_mod.make(config), Arena(config)
        low, high = a.order[0], a.order[-1]

        def same(what: str, x: Any, y: Any) -> None:
            if x != y:
                raise AssertionError(f"{what}: gpu {x}, the reference {y}")

        for i in range(12):
            for arena in (a, ref):
                arena.admit(f"o{i}", {low: 1 + i % 2, high: 1 + (i + 1) % 3})
        for i in range(0, 12, 3):
            for arena in (a, ref):
                arena.free(f"o{i}")
        same("holes", a.observe().holes, observe_reference(ref).holes)
        for cls in (low, high):
            p = a.bands[cls].page_bytes
            for b in range(0, min(config.capacity, (a.bands[cls].top + 1) * p) + 1, p // 2):
                lim = {cls: min(b, config.capacity)}
                same(f"plan_admission(below={lim})", a.plan_admission({low: 3, high: 3}, below=lim),
                     ref.plan_admission({low: 3, high: 3}, below=lim))
        for j, lim in enumerate(({low: 7 * a.bands[low].page_bytes}, {high: config.capacity // 2}, {low: 0, high: 0})):
            same(f"admit(below={lim})", a.admit(f"n{j}", {low: 2, high: 2}, below=lim).plan.placements,
                 ref.admit(f"n{j}", {low: 2, high: 2}, below=lim).plan.placements)
            same(f"extend(below={lim})", a.extend("o1", {low: 1, high: 1}, below=lim).plan.placements,
                 ref.extend("o1", {low: 1, high: 1}, below=lim).plan.placements)
        for i in range(1, 12, 3):
            for arena in (a, ref):
                arena.free(f"o{i}")
        k, names = len(a.order), ["o2", "o5", "o8", "o11"]
        handles = np.array([a.owners.rows[o] for o in names], dtype=np.int64)
        for c, line in ((0, 3), (k - 1, a.bands[high].top - 4), (0, 8)):  # the limit slot: few holes on its anchor side
            cls = a.order[c]
            lim = {cls: line * a.bands[cls].page_bytes}
            step = np.zeros((len(names), k), dtype=np.int64)
            step[:, c] = 1
            res = a.extend_batch(handles, step, below=lim)  # the lean decode step: int handles, one page per lane
            for r, o in enumerate(names):
                same(f"decode lane {r} under {lim}", dict(res[r].pages), dict(ref.extend(o, {cls: 1}, below=lim).pages))
            same(f"observations after the decode step under {lim}", a.observe(), observe_reference(ref))


def check_error_table(mod: types.ModuleType, path: str) -> None:
    """The error table's gpu/ rows (tests/fast/test_errors_impls.py: tests/fast/test_errors.py's CASES on gpu/)
    against ``mod``'s allocator: each refusal of the reference's class, with a message that names the fix, nothing
    changed. ``mod``: allocator.py or a mutant of it."""
    from tests.fast.test_errors_impls import failures

    with contextlib.ExitStack() as stack:
        if path == "torch":
            stack.enter_context(mock.patch.object(kernels.common, "interpreted", lambda kernel: False))
        bad = failures("gpu", getattr(mod, "make", allocator_mod.make))
    if bad:
        raise AssertionError(f"{len(bad)} rows of the error table fail on gpu/: " + "; ".join(bad[:3]))


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    name: str
    module: types.ModuleType
    original: str
    replacement: str
    why: str
    also: tuple[tuple[str, str], ...] = ()  # further (original, replacement) edits of the same bug
    lockstep: str | tuple[str, ...] | None = None  # the path(s) of the lockstep kill: "torch", "interpreter"
    kernel: Callable[[types.ModuleType, str], None] | None = None  # the kernel check that must fail
    paths: tuple[str, ...] = ("triton", "torch")  # the paths on which the kernel check must fail
    steps: int | None = None  # steps per example of the lockstep kill, where the ci profile's 50 are too few
    machine: str = "lockstep"  # "batched": the lockstep kill runs conformance/machine/batched.py's machine


MUTANTS: tuple[Mutant, ...] = (
    Mutant("off-by-one-frontier", planner_mod,
           "        return (g.top - g.bot) // v.page_bytes\n",
           "        return (g.top - g.bot) // v.page_bytes + 1\n",
           "rung 1 counts one page more room in a gap than there is: a frontier grows one page into its "
           "neighbour's bytes (host planner: lockstep on the torch path)",
           lockstep="torch"),
    Mutant("stale-translation-after-move", move_mod,
           "        v2p.index_copy_(0, vids, d)\n",
           "",
           "a move updates p->v but not the device v->p row the translate kernel reads: attention follows the "
           "page's old slot (the fused move's torch path: lockstep on the torch path; observe() reads the tables "
           "back)",
           lockstep="torch"),
    Mutant("partial-row-move", move_mod,
           "    mask = offs < page_words\n    data = tl.load(",
           "    mask = offs < page_words // 2\n    data = tl.load(",
           "a move copies only the first half of each page's words: a one-entry recurrent page's ssm row is "
           "torn in two, a token page's later entries stay behind (move kernel and its torch path: lockstep on "
           "the interpreter path, and move.check() on both paths)",
           also=(("    pages.index_copy_(0, d, pages.index_select(0, s))",
                  "    pages[:, : page_words // 2].index_copy_(0, d,\n"
                  "                                         pages[:, : page_words // 2].index_select(0, s))"),),
           lockstep="interpreter", kernel=check_move),
    Mutant("reuse-withheld-page", allocator_mod,
           "        if self.ledger.in_use(band.name, slot):\n            band.withheld.add(slot)",
           "        if False:\n            band.withheld.add(slot)",
           "a freed or moved-away page that a forward pass or copy still uses becomes a reusable hole "
           "(allocator: lockstep on the torch path)",
           lockstep="torch"),
    Mutant("move-page-with-writer", planner_mod,
           "        pinned = band.withheld | {s for c, s in self.ledger.writers if c == band.name}\n",
           "        pinned = set(band.withheld)\n",
           "compaction moves a page that a forward pass or host load is writing (host planner: lockstep on the "
           "torch path)",
           lockstep="torch"),
    Mutant("double-free-accepted", allocator_mod,
           "        vids = guard_drop(self.shape, self, owner, vids, _is_id)\n",
           "        guard_free(self.shape, self, owner)\n        vids = [int(v) for v in vids]\n",
           "drop checks only the owner, not that it holds the pages (spec/guards.py guard_drop bypassed): a page the "
           "owner does not hold is accepted (unknown ids ignored) and decrements another owner's count (allocator: "
           "lockstep on the torch path)",
           also=(("        arr = np.array(vids, dtype=np.int64)\n",
                  "        arr = np.array([v for v in vids if self._loc(v) is not None], dtype=np.int64)\n"),),
           lockstep="torch"),
    Mutant("recurrent-slot-not-zeroed", allocator_mod,
           "zero_slots(self.mem.words, dev[a:a + k], self._chain[c].page_bytes)",
           "pass",
           "a new recurrent slot keeps the bytes of whatever page was there before (SGLang's mamba slots; "
           "allocator: lockstep on the torch path, an unwritten recurrent row must read 0)",
           lockstep="torch"),
    Mutant("overlapping-move-check-removed", move_mod,
           "    both = np.intersect1d(s, d)\n",
           "    both = np.zeros(0, dtype=np.int64)\n",
           "move_pages runs a batch in which a destination is also a source: its result depends on the order "
           "the programs run in (a race on a GPU). The allocator never forms such a batch, so lockstep cannot "
           "see it: the refusal gpu/'s kernel tests assert kills it, on both paths",
           kernel=check_move_refuses_overlap),
    Mutant("wrong-dtype-view-offset", arena_mod,
           "slot.offset // size)",
           "slot.offset // 8)",
           "a row's typed view starts at its byte offset divided by 8 (the int64 word size) instead of the "
           "row dtype's itemsize: bf16/fp32 rows after the first overlap the rows before them (arena views: "
           "lockstep on the torch path, rows read back through the views)",
           lockstep="torch"),
    Mutant("alloc-one-page-too-many", alloc_mod,
           "    n_new = (seq + EPP - 1) // EPP - first_new\n",
           "    n_new = (seq + EPP) // EPP - first_new\n",
           "the batched alloc kernel counts one new page too many for a request that ends on a page boundary, "
           "so every later request of the batch takes its neighbour's pages and binds them. The allocator binds "
           "pages as one request (no later request), so lockstep cannot see it: alloc.check() on a random batch "
           "kills it, on the Triton kernel and its torch path",
           also=(("    n_new = (seq + epp - 1) // epp - first_new\n", "    n_new = (seq + epp) // epp - first_new\n"),),
           kernel=check_alloc),
    # -- beyond the ten --------------------------------------------------------------------------
    Mutant("withheld-freed-by-first-release", allocator_mod,
           "            if h.slot in band.withheld and not self.ledger.in_use(*page):\n",
           "            if h.slot in band.withheld:\n",
           "a withheld slot becomes a hole when the first of its users releases, while another still uses it "
           "(allocator: lockstep on the torch path, 80 steps per example: in the ci profile's 50 the machine never "
           "releases one of two users of a withheld slot)",
           lockstep="torch", steps=80),
    Mutant("translate-unmapped-to-sink-page", translate_mod,
           "    phys = tl.where(slot >= 0, slot * EPP + t % EPP, pad)\n",
           "    phys = tl.where(slot >= 0, slot * EPP + t % EPP, t % EPP)\n",
           "an unmapped virtual token translates into page 0 (SGLang's sink page) instead of the padding entry: a "
           "stray read hits a live page silently (translate.check() kills it)",
           also=(("    out[:n].copy_(torch.where(slot >= 0, slot * epp + t % epp, pad))\n",
                  "    out[:n].copy_(torch.where(slot >= 0, slot * epp + t % epp, t % epp))\n"),),
           kernel=check_translate),
    Mutant("zero-kernel-skips-first-word", zero_mod,
           "mask=(offs < page_words) & (page != skip))\n",
           "mask=(offs > 0) & (offs < page_words) & (page != skip))\n",
           "the zero kernel starts one word late: the first 8 bytes of a new recurrent slot (its conv row) keep "
           "the old bytes (zero kernel and its torch path: lockstep on the interpreter path, and zero.check() on "
           "both paths; the last word would be no test: it is row padding in every toy layout)",
           also=(("        words[: n_pages * page_words].view(n_pages, page_words).index_fill_(0, idx, 0)",
                  "        words[: n_pages * page_words].view(n_pages, page_words)[:, 1:].index_fill_(0, idx, 0)"),),
           lockstep="interpreter", kernel=check_zero),
    # -- the batched engine calls (issue: engine-grade allocator) ---------------------------------------------
    Mutant("batch-gives-request-k-page-to-k-plus-1", batch_mod,
           "        self.owners.append(np.repeat(rows, d.sum(axis=1)), classes, vids)\n",
           "        self.owners.append(np.roll(np.repeat(rows, d.sum(axis=1)), 1), classes, vids)\n",
           "the vectorized rung 1 records each new page for the request after the one it was placed for (batch "
           "placement: batched lockstep on the torch path, holdings after the batch)",
           lockstep="torch", machine="batched"),
    Mutant("staging-buffer-reused-in-flight", staging_mod,
           "            if s.event is None or s.event.query():",
           "            if True:",
           "a pinned staging buffer is rewritten while the copy queued from it has not run: the device would "
           "receive the next call's indices. On CPU copies are synchronous, so only the ring's own check, driven "
           "by events that have not completed, sees it",
           kernel=check_staging),
    Mutant("event-user-released-early", allocator_mod,
           "        done = [u for u, x in self.users.items() if x.event is not None and x.event.query()]\n",
           "        done = [u for u, x in self.users.items() if x.event is not None]\n",
           "a FORWARD user acquired with an event is released at the next call whether or not its event completed: "
           "pages the forward still reads become reusable holes (batched lockstep on the torch path)",
           lockstep="torch", machine="batched"),
    Mutant("padding-lane-writes-a-live-page", translate_mod,
           "    phys = tl.where(mask, phys, pad)\n",
           "    phys = tl.where(mask, phys, 0)\n",
           "a graph-padding lane of translate_tokens points at entry 0 (a live page's first token, SGLang's sink) "
           "instead of the padding entry past the arena: a padded forward writes into a request's KV "
           "(translate.check() on both paths; the batched lockstep's translate_pad rule on the interpreter path)",
           also=(("    out[n:].fill_(pad)\n", "    out[n:].fill_(0)\n"),),
           lockstep="interpreter", machine="batched", kernel=check_translate),
    Mutant("decode-skips-page-crossing", batch_mod,
           "\n        page = q // epp\n",
           "\n        page = (q - 1) // epp\n",
           "token_locs puts a token that opens a new page into the request's previous page (a decode step that "
           "skips the page a crossing request just got), from the owner log and from the page tables alike (one "
           "computation serves both): batched lockstep on the torch path, token_locs rule",
           lockstep="torch", machine="batched"),
    Mutant("fused-move-misses-remap", move_mod,
           "            tl.store(v2p_ptr + vid, dst)\n",
           "            tl.store(v2p_ptr + vid, src)\n",
           "the fused move kernel copies the bytes and updates p->v but leaves v->p at the old slot: translation "
           "follows the page's old bytes (lockstep on the interpreter path; move.check() of the Triton kernel)",
           lockstep="interpreter", kernel=check_move, paths=("triton",)),
    Mutant("stale-hole-count-after-fallback", batch_mod,
           "            m = self._fast_prefix(d[k:], self._hole_counts())",
           "            m = self._fast_prefix(d[k:], counts0)",
           "the batch's vectorized rung 1 keeps the end bands' hole counts from the start of the batch, after a "
           "request in the middle fell back to the ladder and compacted: later requests are planned against holes "
           "that are gone (batched lockstep on the torch path)",
           also=(("        k = 0\n        while k < n:\n", "        k = 0\n        counts0 = self._hole_counts()\n"
                  "        while k < n:\n"),),
           lockstep="torch", machine="batched"),
    Mutant("zeroing-misses-last-page-of-batch", allocator_mod,
           "                zero_slots(self.mem.words, dev[a:a + k], self._chain[c].page_bytes)",
           "                zero_slots(self.mem.words, dev[a:a + k - 1], self._chain[c].page_bytes)",
           "the per-step zeroing skips the last new page of each class: it is handed out with its previous "
           "owner's bytes (check_zeroing on both paths: every handed-out page reads zero on a dirtied arena)",
           kernel=check_zeroing),
    Mutant("lean-decode-misses-last-zeroing", batch_mod,
           "        zero_run(self.mem.words, first, g, band.page_bytes)\n",
           "        zero_run(self.mem.words, first, g - 1, band.page_bytes)\n",
           "the lean decode path (int handles, one end band) zeroes all but the last page of the step's frontier "
           "run (check_zeroing on both paths: the lean step included)",
           kernel=check_zeroing),
    Mutant("decode-liveness-row-zero-is-an-owner", hoststate_mod,
           '        self.names: list[str] = [""]  # row 0 is never an owner\'s: '
           "``all_live`` clips negative handles to it\n",
           "        self.names: list[str] = []\n",
           "row 0 is an owner's, so the decode step's clipped liveness take sends a negative handle to it: the "
           "lane extends owner 0 instead of raising UnknownOwnerError (check_decode_handles)",
           kernel=check_decode_handles, paths=("torch",)),
    Mutant("below-limit-holes-ascending", planner_mod,
           "            return list(h.islice(a, min(b, i), reverse=True)) + list(h.islice(i, max(b, i)))\n",
           "            return list(h.islice(a, min(b, i), reverse=False)) + list(h.islice(i, max(b, i)))\n",
           "under a placement limit rung 1 takes the low band's holes below the limit slot in ascending order, not "
           "nearest the limit first: the same holes, the new pages bound to them in the wrong order (check_below: "
           "plans, admits, extends and the lean decode step under limits against the reference)",
           kernel=check_below, paths=("torch",)),
    Mutant("below-batch-takes-far-side-first", planner_mod,
           "            taken = np.concatenate([lo, hi] if self.role is Role.LOW else [hi, lo])\n",
           "            taken = np.concatenate([hi, lo] if self.role is Role.LOW else [lo, hi])\n",
           "the batched calls' vectorized rung 1 (and the lean decode step) under a placement limit bind the new pages "
           "to the holes on the far side of the limit before the ones on the anchor side (check_below: the decode "
           "step under a limit against the reference's sequential extends)",
           kernel=check_below, paths=("torch",)),
    Mutant("decode-pattern-wrong-end", batch_mod,
           "            if raw == pat[0]:\n                return c, pat[1]\n",
           "            if raw == pat[0]:\n                return k - 1, pat[1]\n",
           "the decode step's demand pattern matches a step of one low-end page per lane but reports the high end "
           "class: every lane gets a page of the wrong class (check_decode_handles)",
           kernel=check_decode_handles, paths=("torch",)),
    # the argument guards gpu/ shares with the reference (spec/guards.py): a query that skips one answers garbage
    Mutant("ceil-pages-guard-dropped", allocator_mod,
           '        return ceil_div(check_tokens(tokens, "ceil_pages", _is_id), epp)\n',
           "        return ceil_div(tokens, epp)\n",
           "ceil_pages takes any token count: -5 tokens are -1 pages, 2.5 are 1.0, True is 1 (check_error_table: the "
           "ceil-pages rows of the error table)",
           kernel=check_error_table, paths=("torch",)),
    Mutant("pad-entry-class-unchecked", allocator_mod,
           '        return self.mem.pad_entry(check_class(cls, self.order, "pad_entry"))\n',
           "        return self.mem.pad_entry(cls)\n",
           "pad_entry of an unknown class is a KeyError from the arena's tables, not InvalidArgument "
           "(check_error_table)",
           kernel=check_error_table, paths=("torch",)),
    Mutant("translate-tokens-width-unchecked", allocator_mod,
           "        width = check_out_width(out_width, vtokens.numel())\n",
           "        width = vtokens.numel() if out_width is None else out_width\n",
           "translate_tokens takes an out_width narrower than its ids: the kernel wrapper's assert (gone under "
           "python -O) is all that stops it (check_error_table)",
           kernel=check_error_table, paths=("torch",)),
)

# -- the engine paths, as an engine drives them (conformance/machine/batched.py: decode_engine, free_shared, refused
# lanes named again, token_locs past what is held, event users released by gpu/'s own polling) -------------------
ENGINE: tuple[Mutant, ...] = (
    Mutant("engine-fast-path-zeroing-skips-hole-pages", batch_mod,
           "            zero_slots(self.mem.words, dev[:h], band.page_bytes)\n",
           "            zero_slots(self.mem.words, dev[:0], band.page_bytes)\n",
           "the lean decode step (int handles, one end band) hands out pages from the band's holes without zeroing "
           "them: a request reads its predecessor's KV (the hand-out sweep after an engine decode step)",
           lockstep=("torch", "interpreter"), machine="batched"),
    Mutant("engine-shared-free-in-one-batch-leaks", batch_mod,
           "        freed_mask = occ == self.refs[vids]  # the owner whose let-go takes the count to 0 frees "
           "the page\n",
           "        freed_mask = self.refs[vids] == 1\n",
           "free_batch frees a page only if one owner held it when the batch began: a page whose every sharer is "
           "freed by the same batch is never freed (it leaks, live with no owner)",
           lockstep=("torch", "interpreter"), machine="batched"),
    Mutant("engine-refused-lane-stays-admitted", batch_mod,
           "                self.owners.forget(owners[r])\n",
           "                pass\n",
           "an admit_batch lane the ladder refused keeps the row it was given: named again, its owner extends (or "
           "is a duplicate) where the sequential calls say it was never admitted",
           lockstep=("torch", "interpreter"), machine="batched"),
    Mutant("engine-token-locs-past-held", batch_mod,
           "        if (page >= held[req]).any():\n",
           "        if False:\n",
           "token_locs answers for tokens past the pages an owner holds (another owner's page, or a stale table "
           "entry) instead of refusing",
           lockstep=("torch", "interpreter"), machine="batched"),
    Mutant("engine-decode-step-skips-poll", batch_mod,
           "        if self.users:  # nothing to release without a ledger user (the decode step's common case)\n",
           "        if False:\n",
           "extend_batch does not poll: a forward whose event completed keeps its freed pages withheld through "
           "the decode step that needs them, while the sequential extends release them",
           lockstep=("torch", "interpreter"), machine="batched"),
    Mutant("engine-poll-releases-newest-first", allocator_mod,
           "        done = [u for u, x in self.users.items() if x.event is not None and x.event.query()]\n"
           "        for u in done:\n            self._release(u)\n        self.stats",
           "        done = [u for u, x in reversed(self.users.items()) if x.event is not None and x.event.query()]\n"
           "        for u in done:\n            self._release(u)\n        self.stats",
           "poll releases the completed event users newest first, not in acquisition order (the names poll() "
           "returns)",
           lockstep=("torch", "interpreter"), machine="batched"),
)

# -- gpu/'s own rung-2 probe (planner.py ``EndSeq.view``: the band after k moves from the sequence's arrays) -------
PLANNER: tuple[Mutant, ...] = (
    Mutant("planner-probe-ignores-withheld", planner_mod,
           "    wh = [w for w in band.withheld if lo <= w < hi]\n",
           "    wh = []\n",
           "the probe lets the frontier retract past a withheld slot (a freed page a forward still reads): rung 2 "
           "counts room that is not free and places a page onto the withheld one (the random lockstep rarely "
           "empties everything beyond a withheld slot: the probe's own check against the walk kills it)",
           kernel=check_probe, paths=("torch",)),
    Mutant("planner-probe-depth-one-short", planner_mod,
           "            v = self._views[k] = View.of(self.band) if k == 0 else self._after(k)\n",
           "            v = self._views[k] = View.of(self.band) if k <= 1 else self._after(k)\n",
           "the first move's probe sees the band unmoved: the depth search needs one move more than the shortfall "
           "(a plan one move longer than the reference's)",
           lockstep="torch", kernel=check_probe, paths=("torch",)),
    # the array form of the shortfall search (EndSeq.line, Lines, _anchor_holes) and of the relayout
    Mutant("planner-line-prefix-off-by-one", planner_mod,
           "            nx[:m] = nxt[1:m + 1]  # after k moves the farthest unmoved source is source k, if any\n",
           "            nx[:m - 1] = nxt[2:m + 1]\n",
           "the line's prefix is one source off (the probe skips the next source): after k moves it takes source "
           "k + 1 for the farthest unmoved page, so each lane's frontier, and view(k), retracts past a live page "
           "and the search stops one move early",
           lockstep="torch", kernel=check_probe, paths=("torch",)),
    Mutant("planner-depth-search-one-short", planner_mod,
           "        return lambda k: bool(ok[k])\n",
           "        return lambda k: bool(ok[min(k + 1, len(ok) - 1)])\n",
           "the depth search reads the lane one past the depth it asks for: it stops one move short of the "
           "shortfall, so the plan places onto a page that is still live (or rung 2 plans fewer moves than the "
           "reference)",
           lockstep="torch"),
    Mutant("planner-anchor-holes-count-withheld", planner_mod,
           "            free[w - a] = False\n",
           "            pass\n",
           "the page map's read of the nearest holes takes a withheld slot (not live) for a hole: compaction "
           "moves a page onto a slot a forward still reads",
           also=(("    return got if up else got[::-1]\n", "    return got[:m] if up else got[::-1][:m]\n"),),
           kernel=check_probe, paths=("torch",)),
    Mutant("planner-relayout-ignores-withheld", planner_mod,
           "                sorted(band.withheld | used))\n",
           "                sorted(used))\n",
           "the float's relayout forgets its withheld slots as obstacles: its target span can leave a withheld "
           "page outside, which then sits where a neighbour band grows",
           lockstep="torch"),
)
MUTANTS = MUTANTS + ENGINE + PLANNER

# The ten bug kinds the issue asks for, each a substring of at least one mutant's name.
REQUIRED = ("off-by-one-frontier", "stale-translation-after-move", "partial-row-move", "reuse-withheld-page",
            "move-page-with-writer", "double-free-accepted", "recurrent-slot-not-zeroed", "overlapping-move",
            "wrong-dtype-view-offset", "alloc-one-page-too-many")
# The eight bug kinds of the batched engine calls the issue asks for.
REQUIRED_BATCHED = ("batch-gives-request-k-page-to-k-plus-1", "staging-buffer-reused-in-flight",
                    "event-user-released-early", "padding-lane-writes-a-live-page", "decode-skips-page-crossing",
                    "fused-move-misses-remap", "stale-hole-count-after-fallback", "zeroing-misses-last-page-of-batch")


def source_of(m: Mutant) -> str:
    """The mutated source (AssertionError if a snippet does not occur exactly once)."""
    source = inspect.getsource(m.module)
    for original, replacement in ((m.original, m.replacement), *m.also):
        count = source.count(original)
        if count != 1:
            raise AssertionError(f"gpu mutant {m.name}: snippet {original.strip()!r} occurs {count} times in "
                                 f"{m.module.__name__}; update tests/quality/gpu_mutants.py to plant the same bug "
                                 "in the new code")
        source = source.replace(original, replacement)
    return source


def mutate(m: Mutant) -> types.ModuleType:
    """A fresh copy of the mutant's module with the change applied, its source visible to ``inspect`` (so
    Triton's interpreter runs the mutated kernel)."""
    source = source_of(m)
    mod = types.ModuleType(m.module.__name__ + "_mutant_" + m.name.replace("-", "_"))
    filename = f"{m.module.__file__}<mutant {m.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    mod.__file__ = filename
    sys.modules[mod.__name__] = mod  # dataclasses resolve string annotations through sys.modules
    exec(compile(source, filename, "exec"), mod.__dict__)
    if m.module in KERNELS:  # what the interpreter will re-read is the mutated text
        kernel = getattr(mod, KERNELS[m.module])
        assert inspect.getsourcefile(kernel.fn) == filename, f"{m.name}: the kernel's source is not the mutant's"
    return mod


def imported_names(mod: types.ModuleType, home: types.ModuleType) -> dict[str, str]:
    """``{name in mod: name in home}`` for the functions and classes ``mod`` imported from ``home``. Matched by
    defining module and name, not identity: ``use_interpreter()`` reloads a kernel module in place, after which
    an importer holds the old function object."""
    return {n: v.__name__ for n, v in vars(mod).items()
            if not n.startswith("__") and getattr(v, "__module__", None) == home.__name__
            and getattr(v, "__name__", None) in vars(home)}


@contextlib.contextmanager
def applied(m: Mutant, path: str = "torch") -> Iterator[Callable]:
    """Yield the allocator factory (``make``) with the mutant in place, its kernels on ``path`` ("torch": the
    plain-torch branch of every wrapper; "interpreter": the Triton kernels under TRITON_INTERPRET=1)."""
    if path not in ("torch", "interpreter"):
        raise ValueError(f"path must be 'torch' or 'interpreter', got {path!r}")
    if path == "interpreter":
        stale = [k for mod, k in KERNELS.items() if not kernels.interpreted(getattr(mod, k))]
        if stale:
            raise RuntimeError(f"{stale} were decorated without TRITON_INTERPRET=1: set it before importing "
                               "triton or kvarena.gpu, or call kvarena.gpu.kernels.use_interpreter()")
    mod = mutate(m)
    if path == "interpreter" and m.module in KERNELS:
        assert kernels.interpreted(getattr(mod, KERNELS[m.module])), f"{m.name}: the mutated kernel is compiled"
    with contextlib.ExitStack() as stack:
        if path == "torch":
            stack.enter_context(mock.patch.object(kernels.common, "interpreted", lambda kernel: False))
        if m.module is allocator_mod:
            yield mod.make
            return
        if m.module is batch_mod:  # GpuArena's base class is the real mixin: override its methods
            methods = {k: v for k, v in vars(mod.BatchOps).items() if callable(v) and not k.startswith("__")}
            cls = type("GpuArena", (allocator_mod.GpuArena,), methods)
            yield lambda config, device="cpu": cls(config, device)
            return
        for importer in GPU_MODULES:
            if importer is m.module:
                continue
            for name, home_name in imported_names(importer, m.module).items():
                stack.enter_context(mock.patch.object(importer, name, getattr(mod, home_name)))
        yield allocator_mod.make
