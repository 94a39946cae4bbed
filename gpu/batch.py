"""The engine-facing batched calls: one call per scheduler step (spec/arena.md §Batched operations).

``admit_batch`` / ``extend_batch`` / ``free_batch`` return one result per owner, each exactly what the
sequential ``admit`` / ``extend`` / ``free`` calls in batch order would have returned or raised (the error
object in its place: a batch is not atomic). How:

* **Rung 1, vectorized.** While no float band has demand, rung 1 of a request only takes the end bands'
  nearest holes, then frontier slots into the gap, so the sequential placements of requests ``0..m-1`` are
  the first ``sum(demand)`` slots of ``[holes in anchor order..., frontier slots...]`` per end band, cut at
  the prefix sums: one slice of the sorted holes and one ``arange`` per band, whatever the batch size. A
  request fits iff the prefix sums of the gap slots it needs fit the gap (one byte budget when the two ends
  share a gap, one per end when a float sits between them); virtual ids are the ``sum`` lowest free ones, in
  (request, class, page) order, as the sequential binds take them.
* **The ladder, one request.** The first request rung 1 cannot place that way (a float demand, or the gap
  ran out) runs the sequential ladder (compaction, relayout, or AdmissionRejected); the batch then resumes
  vectorized after it.

Host cost per call: numpy over the batch's pages, plus one dict lookup per owner name; device work: one upload
and one table scatter, one zero launch per class with new pages (the lean decode step: an index fill for the
pages from holes and a memset for the frontier run; a frontier run of consecutive ids writes both tables with
one strided copy and no scatter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kvarena.gpu.hoststate import distinct, first_occurrence
from kvarena.gpu.kernels.zero import zero_run, zero_slots
from kvarena.gpu.results import BatchResult, FreeResult
from kvarena.spec.errors import (
    AdmissionRejectedError,
    ArenaError,
    DuplicateOwnerError,
    InvalidArgumentError,
)
from kvarena.spec.guards import state_slots_error

_EMPTY = np.zeros(0, dtype=np.int64)
_I64 = np.dtype(np.int64)
_ONE_CUT = np.zeros(1, dtype=np.int64)  # FreeResult.cuts when no owner is freed: one more cut than owners


class BatchOps:
    """Mixed into :class:`kvarena.gpu.allocator.GpuArena` (it owns the state these methods use)."""

    order: list[str]
    owners: Any
    pool: Any
    _chain: list[Any]
    _state_cols: set[int]
    config: Any

    # -- demands --------------------------------------------------------------------------------
    def _demand_matrix(self, demands: Any, n: int) -> tuple[np.ndarray, dict[int, ArenaError]]:
        """``(requests, classes)`` pages (chain order) and the requests whose demand is malformed.

        ``demands`` is an int array of that shape (the engine's form: validated vectorized) or a sequence of
        ``{class: pages}`` mappings (validated one by one, as ``extend`` does)."""
        k = len(self.order)
        errors: dict[int, ArenaError] = {}
        if isinstance(demands, (np.ndarray, torch.Tensor)):
            d = np.asarray(demands.cpu() if isinstance(demands, torch.Tensor) else demands)
            if d.shape != (n, k) or not np.issubdtype(d.dtype, np.integer):
                raise InvalidArgumentError(f"demands must be an int array of shape ({n}, {k}) (requests, classes "
                                           f"{self.order}), got {d.dtype} {d.shape}")
            d = d.astype(np.int64, copy=True)  # never the caller's array: refused rows are zeroed below
            tops, pbytes = self._limits()
            if d.min(initial=0) >= 0 and (d <= tops).all() and (d @ pbytes).max(initial=0) <= self.capacity:
                return d, errors  # the common case: one test for the whole batch
            bad = (d < 0).any(axis=1) | (d > tops).any(axis=1) | (d @ pbytes > self.capacity)
            for r in np.flatnonzero(bad).tolist():
                try:
                    self._demand(dict(zip(self.order, d[r].tolist())))
                except ArenaError as e:
                    errors[r] = e
                d[r] = 0
            return d, errors
        if len(demands) != n:
            raise InvalidArgumentError(f"{len(demands)} demands for {n} owners; pass one demand per owner")
        d = np.zeros((n, k), dtype=np.int64)
        for r, dem in enumerate(demands):
            try:
                for c, pages in self._demand(dem).items():
                    d[r, self.cidx[c]] = pages
            except ArenaError as e:
                errors[r] = e
        return d, errors

    def _limits(self) -> tuple[np.ndarray, np.ndarray]:
        lim = getattr(self, "_limits_np", None)
        if lim is None:
            lim = self._limits_np = (np.array([b.top for b in self._chain], dtype=np.int64),
                                     np.array([b.page_bytes for b in self._chain], dtype=np.int64))
        return lim

    # -- the batched calls ---------------------------------------------------------------------
    def extend_batch(self, owners: Sequence[str] | np.ndarray, demands: Any,
                     below: Mapping[str, int] | None = None) -> BatchResult:
        """``extend(owners[k], demands[k], below)`` for every k, in order; one result per owner. ``owners``: names,
        or the int rows ``admit_batch`` returned (``result.rows``: an engine's request handles, no name lookup).
        ``below``: one placement limit for every lane (a malformed one refuses the whole call after its poll)."""
        if self.users:  # nothing to release without a ledger user (the decode step's common case)
            self.poll()  # first: a refused call changes nothing beyond its poll (spec §Ledger, Event users)
        lim = self._below(below) if below is not None else None
        lean = self._extend_lean(owners, demands, lim)
        if lean is not None:
            return lean
        n = len(owners)
        rows = self.owners.lookup(owners)
        unknown = np.flatnonzero(rows < 0)
        errors: dict[int, ArenaError] = {
            int(r): self.owners.missing(owners, int(r)) for r in unknown}
        d, bad = self._demand_matrix(demands, n)
        errors.update({r: e for r, e in bad.items() if r not in errors})  # the owner is checked first
        d[unknown] = 0
        if self._state_cols and not self._state_caps(owners, d, rows, errors):
            return self._sequential_extends(owners, demands, below)  # an owner twice with state: order matters
        res = self._place_rows(d, rows, errors, lim)
        res.rows = rows
        return res

    def admit_batch(self, owners: Sequence[str], demands: Any, below: Mapping[str, int] | None = None
                    ) -> BatchResult:
        """``admit(owners[k], demands[k], below=below)`` (no shared pages) for every k, in order; one result per
        owner. ``below``: one placement limit for every lane (a malformed one refuses the whole call)."""
        self.poll()  # first: a refused call changes nothing beyond its poll (spec §Ledger, Event users)
        lim = self._below(below) if below is not None else None
        n = len(owners)
        try:
            distinct = len(set(owners)) == n
        except TypeError:  # an unhashable name: admit refuses that lane (InvalidArgument), lane by lane
            distinct = False
        if not distinct:  # a name twice: whether the second is a duplicate depends on the first
            return self._sequential_admits(owners, demands, below)
        errors: dict[int, ArenaError] = {}
        for r, o in enumerate(owners):
            if o in self.owners:
                errors[r] = DuplicateOwnerError(f"owner {o!r} is already admitted; use extend() to grow it, or "
                                                "free() it first")
        d, bad = self._demand_matrix(demands, n)
        errors.update({r: e for r, e in bad.items() if r not in errors})
        d[list(errors)] = 0
        if self._state_cols:
            self._state_caps(owners, d, np.full(n, -1, dtype=np.int64), errors)
        rows = np.array([-1 if r in errors else self.owners.add(o) for r, o in enumerate(owners)], dtype=np.int64)
        d[list(errors)] = 0
        out = self._place_rows(d, rows, errors, lim)
        for r in out.errors:
            if rows[r] >= 0:  # admitted by name above, then refused by the ladder: never admitted
                self.owners.forget(owners[r])
                rows[r] = -1
        out.rows = rows
        return out

    def _extend_lean(self, owners: Any, demands: Any, lim: Mapping[str, int] | None = None) -> BatchResult | None:
        """The engine's decode step on its shortest path, or None when the general path must run: int handles,
        an int64 demand array, every owner admitted, one end band growing, every page from rung 1. The same
        placement as ``_place_fast`` with the checks folded into whole-batch tests and O(1) scalar tests
        (nothing differs from the general path but the number of numpy calls: ~15 numpy and ~5 torch calls
        for any batch size; no per-axis reduction, which costs more than the rest on a (N, 2) array).

        Device work. Pages from the frontier only (the common decode step): their slots are a run, so p->v is
        one slice copy from the staging buffer, v->p one more when the ids are a run (the pool's lowest ids
        usually are), the pages one memset; no scatter. Pages from holes too: one staged upload and one
        scatter per table row, the hole pages zeroed by one index fill, the frontier ones by one memset."""
        if not (isinstance(owners, np.ndarray) and isinstance(demands, np.ndarray) and owners.dtype is _I64
                and demands.dtype is _I64 and self.graph is None):  # ``is``: a dtype equal to int64 but another
            return None  # object (a non-native byte order) takes the general path
        n, k = len(owners), len(self.order)
        if demands.shape != (n, k) or not n:
            return None
        log = self.owners
        if not (owners.ndim == 1 and log.all_live(owners)):  # every handle admitted (no ufunc)
            return None
        decode = self._decode_demand(demands, n, k)
        ones = decode is not None
        counts = None
        if decode is not None:  # one page of class c per lane: every check below holds; the log's rows are the handles
            c, counts = decode
            total = n
        else:
            if demands.min() < 0:  # a malformed demand: the general path refuses that request alone
                return None
            everything = int(demands.sum())  # all >= 0: the batch grows one end band iff its column holds it all
            c = k - 1
            col = demands[:, c]
            total = int(col.sum())
            if total != everything:
                c, col = 0, demands[:, 0]
                total = int(col.sum())
                if total != everything:
                    return None
        if not total or c in self._state_cols:  # recurrent pages: the per-owner slot cap (general path)
            return None
        band = self._chain[c]
        cap = min(band.top, self.capacity // band.page_bytes)
        if total > cap and (ones or col.max() > cap):  # a lane over the class's limit (none is if the sum is not)
            return None
        holes = band.holes
        h = min(total, len(holes))
        g = total - h
        low, high = self._chain[0], self._chain[-1]
        floats = [b for b in self._chain[1:-1] if not b.empty]
        if floats:
            room = (floats[0].lo_byte - low.hi_byte if c == 0 else high.lo_byte - floats[-1].hi_byte) // band.page_bytes
        else:
            room = (high.lo * high.page_bytes - low.hi * low.page_bytes) // band.page_bytes  # the gap
        if g > room:
            return None
        vids = self.pool.take(total)
        run = self._slot_run(c, band)  # the frontier slots: a read-only view of one array made per band
        if c == 0:  # low end: holes ascending, then up from hi
            first = band.hi
            front = run[first:first + g]
            band.hi += g
        else:  # high end: holes descending, then down from lo
            first = band.lo - g
            front = run[band.top - band.lo:band.top - first]
            band.lo = first
        if h:  # the holes as rung 1 takes them: nearest the anchor, or under the limit (one slice either way)
            taken = band.pop_holes(h, lim.get(band.name) if lim else None)
            slots = np.concatenate([taken, front])
            band.live.put(slots, vids)
        else:
            slots = front
            by_slot = vids if c == 0 else vids[::-1]  # the frontier run's ids in slot order
            band.live.put_run(first, by_slot)
        v0 = int(vids[0])
        v_run = int(vids[-1]) - v0 == total - 1  # ascending distinct ids: a run, so the mirrors take slices
        if v_run:
            self.vcls[v0:v0 + total] = c
            self.vslot[v0:v0 + total] = slots
            self.refs[v0:v0 + total] = 1
        else:
            self.vcls[vids] = c
            self.vslot[vids] = slots
            self.refs[vids] = 1
        # one page per lane (sum n, no lane 0): the log's rows are the handles themselves, no repeat
        log.append(owners if ones else np.repeat(owners, col), c, vids)
        if h:
            dev = self.tables.bind(c, vids, slots)  # one upload, one scatter per row; its v->p values are the slots
            assert dev is not None
            zero_slots(self.mem.words, dev[:h], band.page_bytes)
        else:
            self.tables.bind_run(c, vids, slots, first, by_slot, v_run)
        zero_run(self.mem.words, first, g, band.page_bytes)
        self.stats["zero_launches"] += (h > 0) + (g > 0)
        self.stats["lean_steps"] += 1  # what the decode benches rest on: a test holds the engine's step to it
        return BatchResult(list(self.order), demands.copy() if counts is None else counts, vids, slots,
                           rows=owners.copy())

    def _decode_demand(self, demands: np.ndarray, n: int, k: int) -> tuple[int, np.ndarray] | None:
        """``(c, pattern)`` when ``demands`` is one page of end class ``c`` per lane and nothing else (the decode
        step's demand): one byte comparison with a pattern made once per ``(n, c)``, in place of the four
        reductions (min, sum, column sum, nonzero count) the general lean checks take; the pattern (read-only)
        is the result's counts. None for any other demand."""
        pats = self.__dict__.setdefault("_decode_pats", {})
        raw = demands.tobytes()
        for c in (k - 1, 0):
            pat = pats.get((n, c))
            if pat is None:
                a = np.zeros((n, k), dtype=np.int64)
                a[:, c] = 1
                a.flags.writeable = False
                pat = pats[(n, c)] = (a.tobytes(), a)
                if len(pats) > 16:  # batch sizes vary: keep the cache small
                    del pats[next(iter(pats))]
            if raw == pat[0]:
                return c, pat[1]
        return None

    def _slot_run(self, c: int, band: Any) -> np.ndarray:
        """Band ``c``'s slots in the order its frontier hands them out (ascending for the low end, descending
        from the top for the high end), read-only, made once: a step's frontier slots are one slice of it."""
        runs = self.__dict__.setdefault("_slot_runs", {})
        run = runs.get(c)
        if run is None:
            run = np.arange(band.top, dtype=np.int64) if c == 0 else np.arange(band.top - 1, -1, -1, dtype=np.int64)
            run.flags.writeable = False
            runs[c] = run
        return run

    def _state_caps(self, owners: Any, d: np.ndarray, rows: np.ndarray, errors: dict[int, ArenaError]) -> bool:
        """The recurrent-slot cap per lane (``admit`` / ``extend``: held + new state pages <= recurrent_slots),
        after the lane's other checks: a lane over it gets InvalidArgumentError and no pages. False (nothing
        changed) when an owner with state demand appears twice: its second lane's count depends on the first."""
        cols = sorted(self._state_cols)
        want = d[:, cols]
        lanes = np.flatnonzero(want.any(axis=1))
        if not len(lanes):
            return True
        live = rows[lanes]
        if not distinct(live[live >= 0]):
            return False
        cap = self.config.recurrent_slots
        for r in lanes.tolist():
            if r in errors:
                continue
            for j, c in enumerate(cols):
                have = len(self.owners.entries(int(rows[r]), c)) if rows[r] >= 0 else 0
                if have + want[r, j] > cap:
                    errors[r] = state_slots_error(self.owners.name(owners, r), int(have + want[r, j]),
                                                  self.order[c], cap)
                    d[r] = 0
                    break
        return True

    def _sequential_extends(self, owners: Any, demands: Any, below: Mapping[str, int] | None = None
                            ) -> BatchResult:
        n, k = len(owners), len(self.order)
        rows = self.owners.lookup(owners)
        d = np.asarray(demands) if isinstance(demands, (np.ndarray, torch.Tensor)) else None
        counts = np.zeros((n, k), dtype=np.int64)
        vids: list[int] = []
        slots: list[int] = []
        res = BatchResult(list(self.order), counts, _EMPTY, _EMPTY, rows=rows)
        for r in range(n):
            dem = dict(zip(self.order, d[r].tolist())) if d is not None else demands[r]
            try:
                if rows[r] < 0:
                    raise self.owners.missing(owners, r)
                adm = self.extend(self.owners.names[int(rows[r])], dem, below)
            except ArenaError as e:
                res.errors[r] = e
                continue
            self._collect(res, r, adm, vids, slots)
        res.vids, res.slots = np.array(vids, dtype=np.int64), np.array(slots, dtype=np.int64)
        return res

    def _collect(self, res: BatchResult, r: int, adm: Any, vids: list[int], slots: list[int]) -> None:
        """Lane ``r``'s sequential admission into the batch result: counts per class, ids and slots in order."""
        for c, name in enumerate(self.order):
            got = adm.pages.get(name, ())
            res.counts[r, c] = len(got)
            vids += got
            slots += adm.plan.placements.get(name, ())
        res.plans[r] = adm.plan

    def _sequential_admits(self, owners: Sequence[str], demands: Any, below: Mapping[str, int] | None = None
                           ) -> BatchResult:
        n, k = len(owners), len(self.order)
        rows_d = np.asarray(demands) if isinstance(demands, np.ndarray) else None
        counts = np.zeros((n, k), dtype=np.int64)
        vids: list[int] = []
        slots: list[int] = []
        res = BatchResult(list(self.order), counts, _EMPTY, _EMPTY)
        for r, o in enumerate(owners):
            dem = dict(zip(self.order, rows_d[r].tolist())) if rows_d is not None else demands[r]
            try:
                adm = self.admit(o, dem, below=below)
            except ArenaError as e:
                res.errors[r] = e
                continue
            self._collect(res, r, adm, vids, slots)
        res.vids, res.slots = np.array(vids, dtype=np.int64), np.array(slots, dtype=np.int64)
        return res

    def free_batch(self, owners: Sequence[str] | np.ndarray) -> FreeResult:
        """``free(owners[k])`` for every k, in order: the freed pages per owner (or the error object). ``owners``:
        names or rows (see ``extend_batch``)."""
        self.poll()
        errors: dict[int, ArenaError] = {}
        all_rows = self.owners.lookup(owners)
        first = first_occurrence(all_rows)  # an owner named twice: the second free finds it gone
        ok = first & (all_rows >= 0)
        for k in np.flatnonzero(~ok).tolist():
            errors[k] = self.owners.missing(owners, k)
        pos = np.flatnonzero(ok).tolist()
        rows = all_rows[ok].tolist()
        names = [self.owners.names[r] for r in rows]
        if not rows:
            return FreeResult(len(owners), _EMPTY, _ONE_CUT, {}, errors)
        log, kk = self.owners, len(self.order)
        rows_a = np.array(rows, dtype=np.int64)
        e = log.entries_of_rows(rows_a)
        rank = np.zeros(int(rows_a.max()) + 1, dtype=np.int64)
        rank[rows_a] = np.arange(len(rows_a))
        who = rank[log.row[e]]
        e = e[np.argsort(who * kk + log.cls[e], kind="stable")]  # owner by owner; class, then acquisition
        who, vids = rank[log.row[e]], log.vid[e]
        occ = _occurrence(vids)
        freed_mask = occ == self.refs[vids]  # the owner whose let-go takes the count to 0 frees the page
        np.subtract.at(self.refs, vids, 1)
        log.kill(e)
        for o in names:
            log.forget(o)
        if self.ptab is not None:
            self.ptab.clear(rows_a)
        freed = vids[freed_mask]
        self._free_pages(freed)
        cuts = np.searchsorted(who[freed_mask], np.arange(len(rows) + 1))
        return FreeResult(len(owners), freed, cuts, dict(zip(pos, range(len(pos)))), errors)

    # -- placement -----------------------------------------------------------------------------
    def _place_rows(self, d: np.ndarray, rows: np.ndarray, errors: dict[int, ArenaError],
                    lim: Mapping[str, int] | None = None) -> BatchResult:
        n = len(d)
        counts = d.copy()
        parts_v: list[np.ndarray] = []
        parts_s: list[np.ndarray] = []
        res = BatchResult(list(self.order), counts, _EMPTY, _EMPTY, errors)
        k = 0
        while k < n:
            m = self._fast_prefix(d[k:], self._hole_counts())  # counts now: a fallback may have compacted
            if m:
                v, s = self._place_fast(d[k:k + m], rows[k:k + m], lim)
                parts_v.append(v)
                parts_s.append(s)
                k += m
                continue
            dem = {self.order[c]: int(x) for c, x in enumerate(d[k].tolist()) if x}
            try:
                plan = self.ladder.admission(dem, lim)
            except AdmissionRejectedError as e:
                errors[k] = e
                counts[k] = 0
                k += 1
                continue
            pages = self._apply(plan)
            v = np.array([x for c in self.order for x in pages.get(c, ())], dtype=np.int64)
            self._hold(int(rows[k]), v)
            parts_v.append(v)
            parts_s.append(np.array([x for c in self.order for x in plan.placements.get(c, ())], dtype=np.int64))
            res.plans[k] = plan
            k += 1
        if parts_v:
            res.vids, res.slots = np.concatenate(parts_v), np.concatenate(parts_s)
        return res

    def _hole_counts(self) -> tuple[int, int]:
        return len(self._chain[0].holes), len(self._chain[-1].holes)

    def _fast_prefix(self, d: np.ndarray, holes: tuple[int, int]) -> int:
        """How many leading requests of ``d`` rung 1 places vectorized (see the module docstring), given the
        end bands' hole counts."""
        n, k = d.shape  # n >= 1 (a lane is left), k >= 2 (spec/models.py: a model has two classes or more)
        lim = n
        if k > 2:
            fl = d[:, 1:-1].any(axis=1)
            if fl.any():
                lim = int(np.argmax(fl))
        if not lim:
            return 0
        low, high = self._chain[0], self._chain[-1]
        floats = [b for b in self._chain[1:-1] if not b.empty]

        def fits(gl: Any, gh: Any) -> Any:
            if not floats:
                return gl * low.page_bytes + gh * high.page_bytes <= high.lo_byte - low.hi_byte
            return ((gl <= (floats[0].lo_byte - low.hi_byte) // low.page_bytes)
                    & (gh <= (high.lo_byte - floats[-1].hi_byte) // high.page_bytes))

        # gap slots needed grow with the prefix, so "fits" holds for a prefix of the requests: the totals first
        head = d[:lim]
        if fits(max(int(head[:, 0].sum()) - holes[0], 0), max(int(head[:, -1].sum()) - holes[1], 0)):
            return lim
        ok = fits(np.maximum(np.cumsum(head[:, 0]) - holes[0], 0), np.maximum(np.cumsum(head[:, -1]) - holes[1], 0))
        return int(np.argmin(ok))  # the first request that does not fit (ok is True, then False)

    def _place_fast(self, d: np.ndarray, rows: np.ndarray, lim: Mapping[str, int] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Rung 1 for requests whose demand is on the end bands only and fits: holes, then frontiers. Under a
        limit the holes come in the limited order, which is one fixed order of the band's holes, so the lanes'
        sequential takes are still consecutive pieces of it."""
        n, k = d.shape
        counts = d.ravel()
        total = int(counts.sum())
        if not total:
            return _EMPTY, _EMPTY
        vids = self.pool.take(total)
        per_class = d.sum(axis=0)
        single = np.count_nonzero(per_class) == 1  # a decode step: one class grows, no interleaving to undo
        if single:
            classes = np.full(total, int(np.flatnonzero(per_class)[0]), dtype=np.int64)
        else:
            classes = np.repeat(np.tile(np.arange(k, dtype=np.int64), n), counts)
        slots = np.empty(total, dtype=np.int64)
        for c in (0, k - 1):
            want = int(per_class[c])
            if not want:
                continue
            band = self._chain[c]
            h = min(want, len(band.holes))
            g = want - h
            taken = band.pop_holes(h, lim.get(band.name) if lim else None)  # anchor order or the limited one
            if c == 0:  # low end: then up from hi
                front = np.arange(band.hi, band.hi + g, dtype=np.int64)
                band.hi += g
            else:  # high end: then down from lo
                front = np.arange(band.lo - 1, band.lo - 1 - g, -1, dtype=np.int64)
                band.lo -= g
            sl = np.concatenate([taken, front]) if h else front
            if single:
                slots = sl
                band.live.put(sl, vids)
                continue
            mine = classes == c
            slots[mine] = sl
            band.live.put(sl, vids[mine])
        self.vcls[vids], self.vslot[vids] = classes, slots
        self.refs[vids] = 1
        self.owners.append(np.repeat(rows, d.sum(axis=1)), classes, vids)
        self._device_bind(classes, vids, slots)
        return vids, slots

    # -- token level ---------------------------------------------------------------------------
    def token_locs(self, cls: str, owners: Sequence[str], pre_lens: Any, seq_lens: Any,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """Physical entry (on ``cls``'s grid) of every new token of each owner, request after request: tokens
        ``[pre_lens[k], seq_lens[k])`` of owner k's ``cls`` pages in the order it holds them (SGLang's
        ``out_indices`` of ``alloc_extend``; decode is ``seq = pre + 1``). The lens are the host's; the result
        is computed from the host mirrors and uploaded once (staged), so nothing is read back."""
        if cls not in self.bands:
            raise InvalidArgumentError(f"unknown class {cls!r}; use one of {self.order}")
        n = len(owners)
        rows = self.owners.lookup(owners)
        if (rows < 0).any():
            raise self.owners.missing(owners, int(np.argmax(rows < 0)), "token_locs: ")
        if not self.owners.distinct_rows(rows):
            raise InvalidArgumentError("token_locs: an owner appears twice; name each request once")
        pre, seq = _int_lens(pre_lens, "pre_lens"), _int_lens(seq_lens, "seq_lens")
        if pre.shape != (n,) or seq.shape != (n,) or (pre < 0).any() or (seq < pre).any():
            raise InvalidArgumentError("token_locs: pre_lens and seq_lens need one entry per owner, 0 <= pre <= seq")
        log, c, epp = self.owners, self.cidx[cls], self.mem.epp[cls]
        ext = seq - pre
        pt = self.ptab
        use_table = pt is not None and not pt.overflowed(cls, rows) and int(seq.max(initial=0)) <= pt.width * epp
        if use_table:  # the per-request page tables: O(tokens), no log scan
            held = pt.count[c, rows]
        else:  # the owner log, in acquisition order per owner
            e = log.entries_of_rows(rows)
            e = e[log.cls[e] == c]
            rank = np.zeros(int(rows.max()) + 1 if n else 1, dtype=np.int64)
            rank[rows] = np.arange(n)
            e = e[np.argsort(rank[log.row[e]], kind="stable")]
            held = np.bincount(rank[log.row[e]], minlength=n)
        req = np.repeat(np.arange(n), ext)
        q = pre[req] + np.arange(len(req)) - (np.cumsum(ext) - ext)[req]
        page = q // epp
        if (page >= held[req]).any():
            bad = int(req[np.argmax(page >= held[req])])
            raise InvalidArgumentError(f"token_locs: owner {self.owners.name(owners, bad)!r} holds {held[bad]} "
                                       f"{cls} pages, too few for {seq[bad]} tokens; extend it first")
        if use_table:
            vids = pt.host[c, rows[req], page]
        else:
            first = np.concatenate([[0], np.cumsum(held)])[:-1]
            vids = log.vid[e][first[req] + page]
        return self._staged_out(self.vslot[vids] * epp + q % epp, out)

    def _staged_out(self, loc: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        dev = self.staging.upload(loc)  # a slice of a staging buffer the next upload reuses: copy it out
        if out is None:
            out = torch.empty(len(loc), dtype=torch.int64, device=self.device)
        out[:len(loc)].copy_(dev)
        return out[:len(loc)]


def _int_lens(lens: Any, what: str) -> np.ndarray:
    """Token counts as int64, refusing what would be truncated or reinterpreted (floats, bools, strings)."""
    a = np.asarray(lens.cpu() if isinstance(lens, torch.Tensor) else lens)
    if a.size and a.dtype.kind not in "iu":  # an empty list is float64 and means no lens
        raise InvalidArgumentError(f"token_locs: {what} must be ints (token counts), got {a.dtype}; pass "
                                   "one int per owner")
    return a.astype(np.int64)


def _occurrence(v: np.ndarray) -> np.ndarray:
    """1-based count of each element's value among the elements up to it (``[7, 3, 7] -> [1, 1, 2]``)."""
    order = np.argsort(v, kind="stable")
    s = v[order]
    idx = np.arange(len(v))
    start = np.maximum.accumulate(np.where(np.r_[True, s[1:] != s[:-1]], idx, 0))
    occ = np.empty(len(v), dtype=np.int64)
    occ[order] = idx - start + 1
    return occ


__all__ = ["BatchOps"]
