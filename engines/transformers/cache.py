"""``ArenaCache``: a ``transformers.Cache`` whose K/V and recurrent state live in one kvarena arena.

Every decoder layer of the model keeps its cache in the ``GpuArena`` ``cache.arena``: batch row ``b`` is the owner
``row{b}``; a full-attention or sliding-window page holds ``page_size`` tokens of *every* layer of its class (one
entry per token, a row per layer, spec/arena.md §Layouts), a recurrent page holds one request's conv and SSM state
of every linear layer. So pages are taken once per class per step, by the first layer of the class (the batched
``extend_batch`` on the rows' int handles), window pages slide out as the window passes (``slide``), and every
owner is freed by ``release()`` (also on ``reset()``; ``with ArenaCache(...) as cache:`` releases on exit).

Reads go through the arena's own translation: a class keeps each row's *virtual* token ids (stable across moves),
and each step translates them once through the device v->p table (``translate_tokens``) into physical entries of
the typed row views, which are gathered (K/V) or scattered (writes). So an engine may move live pages between
steps — ``cache.arena.compact()`` / ``relayout(...)``, e.g. from a ``LogitsProcessor`` — and the next step reads
the moved bytes at their new place: INV-CONTENT-FOLLOWS-VID through a real model.

What each layer returns is what transformers' own layer returns (``DynamicLayer``: the whole K/V;
``DynamicSlidingWindowLayer``: the last ``window - 1`` cached tokens and the new ones; ``LinearAttentionLayer``:
the conv state padded or extended, the SSM state), bit for bit, so greedy tokens equal the default cache's.

State handed out (``get_conv_state`` / ``get_recurrent_state``) is a gathered copy that the model may update in
place (the decode kernels ``causal_conv1d_update`` / ``selective_state_update`` do); it is written back at the
next call into the cache or to ``cache.arena``, before anything else reads or moves those pages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionLayer,
)

from kvarena.engines.transformers.layout import layer_types, model_layout
from kvarena.gpu.allocator import GpuArena, make
from kvarena.spec.errors import ArenaError, ConfigError, InvalidArgumentError
from kvarena.spec.layout import Kind
from kvarena.spec.models import ArenaConfig

DEFAULT_PAGE_SIZE = 16


class CacheFullError(ArenaError):
    """The arena refused the pages a step needs (every row of the batch grows in the same step)."""


class _TokenClass:
    """One full-attention or window class: its rows' virtual token ids and how many tokens it has taken."""

    def __init__(self, name: str, epp: int, window: int) -> None:
        self.name, self.epp, self.window = name, epp, window
        self.vtok: torch.Tensor | None = None  # (rows, held pages * epp): virtual token ids, oldest page first
        self.first_page = 0  # token page index of vtok's first column
        self.length = 0  # tokens this class has pages for (the longest layer's length)
        self.memo: tuple[tuple[int, int, int], torch.Tensor] | None = None  # this step's translation

    def kept_from(self, length: int) -> int:
        """First token a layer must still hold at ``length`` tokens (a window keeps its last ``window - 1``)."""
        return max(0, length - self.window + 1) if self.window else 0


class ArenaCache(Cache):
    """A transformers ``Cache`` on one kvarena ``GpuArena`` of ``capacity`` bytes (see the module docstring).

    ``page_size``: tokens per page (default 16; small pages let windows slide and holes form on tiny models).
    ``policy``: the arena's admission policy; gpu/ runs the spec's default ladder, so only ``None``/"default".
    ``max_context_len``: the longest sequence a row reaches (the arena's floor holds one such request).
    """

    def __init__(self, config: Any, capacity: int, device: str | torch.device = "cpu", page_size: int | None = None,
                 policy: str | None = None, max_context_len: int | None = None) -> None:
        if policy not in (None, "default"):
            raise ConfigError(f"policy {policy!r}: the gpu/ arena runs the spec's default ladder; check other policies "
                              "on the reference with `kvarena check-policy`")
        self.model = model_layout(config, max_context_len=max_context_len)
        ps = DEFAULT_PAGE_SIZE if page_size is None else page_size
        self._arena: GpuArena = make(ArenaConfig(self.model, capacity, page_size=ps), device=device)
        self.device = torch.device(device)
        kinds = {c.name: c for c in self.model.classes}
        self._state_cls = next((c.name for c in self.model.classes if c.kind is Kind.RECURRENT), None)
        self._tokens = {c.name: _TokenClass(c.name, ps, c.window) for c in self.model.classes
                        if c.kind is not Kind.RECURRENT}
        # which class each layer's K/V rows are in (spec rows name their layer)
        cls_of = {r.layer: c.name for c in self.model.classes if c.kind is not Kind.RECURRENT for r in c.rows}
        layers: list[Any] = []
        for i, t in enumerate(layer_types(config)):
            if t == "hybrid":
                layers.append(_HybridLayer(self, i, self._tokens[cls_of[i]]))
            elif t in ("linear_attention", "conv"):
                layers.append(_StateLayer(self, i))
            elif t == "sliding_attention":
                tc = self._tokens[cls_of[i]]
                layers.append(_SlidingLayer(self, i, tc, kinds[tc.name].window))
            elif t == "full_attention":
                layers.append(_FullLayer(self, i, self._tokens[cls_of[i]]))
            else:
                layers.append(DummyLayer())
        super().__init__(layers=layers)
        self.rows: np.ndarray | None = None  # the owners' int handles, batch order
        self.owners: list[str] = []
        self._state_vids: torch.Tensor | None = None  # (rows,) each row's recurrent page
        self._pending: dict[tuple[int, str], torch.Tensor] = {}  # handed-out state, written back at the next call
        self._epoch = 0  # bumped whenever pages may have moved (an extend's ladder, an engine's compact)

    # ---- the arena ------------------------------------------------------------------------------------------
    @property
    def arena(self) -> GpuArena:
        """The arena (write-back first: what the model changed in place is in the arena before anyone moves it)."""
        self.flush()
        self._epoch += 1  # the caller may move pages: translate again
        return self._arena

    def flush(self) -> None:
        """Write every handed-out state buffer back into its rows. They stay handed out (the model may still be
        changing them in place) until the layer writes a new state or takes a new copy."""
        if self._pending:
            e = self._state_entries()
            for (layer, part), buf in self._pending.items():
                self._state_view(layer, part)[e] = buf

    def release(self) -> None:
        """Free every row's pages (the end of a generation); the cache can be used again from an empty state."""
        self._pending.clear()
        if self.owners:
            res = self._arena.free_batch(self.owners)
            bad = [res[k] for k in range(len(res)) if isinstance(res[k], ArenaError)]
            if bad:
                raise bad[0]
        self.rows, self.owners, self._state_vids = None, [], None
        for tc in self._tokens.values():
            tc.vtok, tc.first_page, tc.length = None, 0, 0
        for layer in self.layers:
            _reset_layer(layer)

    def __enter__(self) -> ArenaCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- rows -----------------------------------------------------------------------------------------------
    def _admit(self, batch: int, demand: dict[str, int]) -> None:
        """Admit ``batch`` rows, each with ``demand`` pages (the first class to grow, and its state page)."""
        self.owners = [f"row{b}" for b in range(batch)]
        d = np.tile([[demand.get(c, 0) for c in self._arena.order]], (batch, 1)).astype(np.int64)
        res = self._arena.admit_batch(self.owners, d)
        if res.errors:  # all rows or none: free the rows that got in
            self._arena.free_batch([o for k, o in enumerate(self.owners) if res.ok[k]])
            self.owners = []
        self._check(res, f"admit {batch} rows with {demand}")
        self.rows = np.asarray(res.rows, dtype=np.int64)
        if self._state_cls is not None:
            self._state_vids = self._pages(res, self._state_cls, batch, 1)[:, 0]

    def _check(self, res: Any, what: str) -> None:
        if res.errors:
            k, err = next(iter(sorted(res.errors.items())))
            raise CacheFullError(f"ArenaCache: the arena ({self._arena.capacity} B) refused to {what} (row {k}: "
                                 f"{err}); raise capacity=, or lower the batch size or max_new_tokens") from err

    def _pages(self, res: Any, cls: str, batch: int, per_row: int) -> torch.Tensor:
        """The new ``cls`` pages of every row (rows in order, pages in binding order): a (batch, per_row) tensor."""
        c, k = self._arena.order.index(cls), len(self._arena.order)
        starts = res.starts()
        idx = np.concatenate([np.arange(starts[r * k + c], starts[r * k + c + 1]) for r in range(batch)])
        return torch.as_tensor(res.vids[idx].reshape(batch, per_row), dtype=torch.int64)

    def _grow(self, tc: _TokenClass, batch: int, length: int) -> None:
        """Give every row pages for tokens up to ``length`` (window pages that slid out are dropped first)."""
        keep = tc.kept_from(tc.length) if tc.length else tc.kept_from(length)
        first = keep // tc.epp
        held = 0 if tc.vtok is None else tc.vtok.shape[1] // tc.epp
        drop = min(max(0, first - tc.first_page), held)
        if drop:
            for o in self.owners:
                self._arena.slide(o, tc.name, drop)
            tc.vtok = tc.vtok[:, drop * tc.epp:]
            tc.first_page += drop
            held -= drop
        if held == 0:
            tc.first_page = first
        need = -(-length // tc.epp) - tc.first_page - held
        if need > 0:
            d = np.zeros((batch, len(self._arena.order)), dtype=np.int64)
            d[:, self._arena.order.index(tc.name)] = need
            res = self._arena.extend_batch(self.rows, d)
            self._epoch += 1  # rung 2/3 may have moved pages
            if res.errors:  # every row grows or none: give back what the other rows got
                for k in np.flatnonzero(res.ok).tolist():
                    self._arena.drop(self.owners[k], list(res.pages_of(k).get(tc.name, ())))
            self._check(res, f"extend {batch} rows by {need} {tc.name} pages to {length} tokens")
            vids = self._pages(res, tc.name, batch, need)
            cols = (vids[:, :, None] * tc.epp + torch.arange(tc.epp)).reshape(batch, need * tc.epp)
            tc.vtok = cols if tc.vtok is None else torch.cat([tc.vtok, cols], dim=1)
        tc.length = max(tc.length, length)

    def entries(self, tc: _TokenClass, lo: int, hi: int) -> torch.Tensor:
        """Physical entries (rows, hi - lo) of tokens [lo, hi) of ``tc`` through the device translation (once per
        class and step: the class's other layers reuse it until the arena may have moved a page)."""
        key = (lo, hi, self._epoch)
        if tc.memo is not None and tc.memo[0] == key:
            return tc.memo[1]
        a = lo - tc.first_page * tc.epp
        assert tc.vtok is not None and a >= 0 and hi - tc.first_page * tc.epp <= tc.vtok.shape[1], (lo, hi)
        v = tc.vtok[:, a:hi - tc.first_page * tc.epp]
        out = self._arena.translate_tokens(tc.name, v.reshape(-1).to(self.device)).view(v.shape)
        tc.memo = (key, out)
        return out

    def ensure(self, tc: _TokenClass, batch: int, length: int) -> None:
        """Pages for ``length`` tokens of ``tc`` (the first layer of the class in a step takes them)."""
        if self.rows is not None and batch != len(self.owners):
            raise InvalidArgumentError(f"ArenaCache holds {len(self.owners)} rows, the step has {batch}; call "
                                       "release() (or reset()) before a new batch")
        if length > tc.length:
            if self.rows is None:
                self._admit_with(tc, batch, length)
            else:
                self._grow(tc, batch, length)

    def _admit_with(self, tc: _TokenClass, batch: int, length: int) -> None:
        """First contact of a batch: admit its rows with ``tc``'s pages for ``length`` tokens (and a state page)."""
        tc.first_page = tc.kept_from(length) // tc.epp
        need = -(-length // tc.epp) - tc.first_page
        self._admit(batch, {tc.name: need, **({self._state_cls: 1} if self._state_cls else {})})
        vids = self._owned(tc.name)
        tc.vtok = (vids[:, :, None] * tc.epp + torch.arange(tc.epp)).reshape(batch, need * tc.epp)
        tc.length = length

    def _owned(self, cls: str) -> torch.Tensor:
        return torch.tensor([self._arena.held(o).get(cls, ()) for o in self.owners], dtype=torch.int64)

    def ensure_state(self, batch: int) -> None:
        if self.rows is None:
            if self._state_cls is None:
                raise ConfigError("this model has no recurrent class")
            self._admit(batch, {self._state_cls: 1})
        elif batch != len(self.owners):
            raise InvalidArgumentError(f"ArenaCache holds {len(self.owners)} rows, the step has {batch}; call "
                                       "release() (or reset()) before a new batch")

    # ---- recurrent state ------------------------------------------------------------------------------------
    def _state_entries(self) -> torch.Tensor:
        assert self._state_vids is not None
        return self._arena.translate_tokens(self._state_cls, self._state_vids.to(self.device))

    def _state_view(self, layer: int, part: str) -> torch.Tensor:
        return self._arena.views(self._state_cls)[(layer, part)]

    def read_state(self, layer: int, part: str, hand_out: bool) -> torch.Tensor:
        self._pending.pop((layer, part), None)  # flushed by the caller: the rows hold what the model left there
        buf = self._state_view(layer, part)[self._state_entries()]
        if hand_out:
            self._pending[(layer, part)] = buf
        return buf

    def write_state(self, layer: int, part: str, value: torch.Tensor) -> None:
        view = self._state_view(layer, part)
        if tuple(value.shape[1:]) != tuple(view.shape[1:]) or value.dtype != view.dtype:
            raise ConfigError(f"layer {layer} {part} state is {tuple(value.shape[1:])} {value.dtype}; the arena's row "
                              f"is {tuple(view.shape[1:])} {view.dtype} (model_layout's geometry for this family is "
                              "wrong: fix STATE_GEOMETRY)")
        self._pending.pop((layer, part), None)  # flushed by the caller, and now superseded
        view[self._state_entries()] = value

    # ---- what generate calls on the cache -------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        self.flush()
        return super().get_seq_length(layer_idx)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        self.flush()
        return self.layers[layer_idx].get_state("conv", state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        self.flush()
        return self.layers[layer_idx].get_state("ssm", state_idx)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.flush()
        return self.layers[layer_idx].update(key_states, value_states)

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          **kwargs: Any) -> torch.Tensor:
        self.flush()
        return self.layers[layer_idx].update_conv_state(conv_states, state_idx, **kwargs)

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                               **kwargs: Any) -> torch.Tensor:
        self.flush()
        return self.layers[layer_idx].update_recurrent_state(recurrent_states, state_idx, **kwargs)

    def reset(self) -> None:
        """transformers' reset: every row's pages are freed (the arena holds nothing of this cache after it)."""
        self.release()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row ``b`` takes row ``beam_idx[b]``'s content, copied page for page within the arena (every
        row holds the same pages of each class, so the copy is one gather and one scatter per row view)."""
        self.flush()
        if self.rows is None:
            return
        idx = beam_idx.to(self.device)
        for tc in self._tokens.values():
            if tc.vtok is None:
                continue
            e = self.entries(tc, tc.first_page * tc.epp, tc.first_page * tc.epp + tc.vtok.shape[1])
            for view in self._arena.views(tc.name).values():
                view[e] = view[e[idx]]
        if self._state_cls is not None:
            self._pending.clear()  # flushed: the copies below supersede every handed-out buffer
            e = self._state_entries()
            for view in self._arena.views(self._state_cls).values():
                view[e] = view[e[idx]]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (in that order); the other rows' pages are freed."""
        self.flush()
        self._pending.clear()  # written back; a handed-out buffer still has the old rows
        if self.rows is None:
            return
        keep = [int(i) for i in indices.tolist()]
        if len(set(keep)) != len(keep):
            raise InvalidArgumentError("batch_select_indices: a row twice would share its pages; use "
                                       "reorder_cache for beam search")
        gone = [o for i, o in enumerate(self.owners) if i not in set(keep)]
        if gone:
            self._arena.free_batch(gone)
        sel = torch.tensor(keep, dtype=torch.int64)
        self.owners = [self.owners[i] for i in keep]
        self.rows = self.rows[keep]
        if self._state_vids is not None:
            self._state_vids = self._state_vids[sel]
        for tc in self._tokens.values():
            if tc.vtok is not None:
                tc.vtok = tc.vtok[sel]

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise InvalidArgumentError("ArenaCache.batch_repeat_interleave: expand the inputs before the first step "
                                   "(generate does, for num_beams and num_return_sequences) instead of the cache")

    def crop(self, tokens_to_remove: int) -> None:
        """Refused unless it removes nothing: every model the arena serves has sliding-window or recurrent layers
        (a full-attention-only model is served by a plain paged pool), and neither can be rolled back without the
        past recording transformers' own layers keep for it; assisted decoding needs the default cache."""
        if tokens_to_remove != 0:
            raise InvalidArgumentError(f"ArenaCache.crop({tokens_to_remove!r}): sliding-window and recurrent layers "
                                       "cannot be rolled back; use the default cache for assisted decoding")


def _reset_layer(layer: Any) -> None:
    if hasattr(layer, "cumulative_length"):
        layer.cumulative_length = 0
    if hasattr(layer, "has_previous_state"):
        for i in layer.has_previous_state:
            layer.has_previous_state[i] = False


# ---- layers: transformers' layer kinds, their tensors in the arena ---------------------------------------------

class _KVMixin:
    """K/V of one layer in its class's rows; ``cumulative_length`` is the layer's token count."""

    cache: ArenaCache
    index: int
    tc: _TokenClass
    window: int = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self._kv_update(key_states, value_states)

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def reset(self) -> None:
        self.cumulative_length = 0

    def _kv_update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, _, t, _ = key_states.shape
        old = self.cumulative_length
        new = old + t
        cache, tc = self.cache, self.tc
        cache.ensure(tc, b, new)
        lo = tc.kept_from(old) if self.window else 0  # what the layer returns of the past: transformers' own cut
        w_lo = max(old, tc.kept_from(new))  # new tokens the layer keeps
        views = cache._arena.views(tc.name)
        kv = views[(self.index, "k")], views[(self.index, "v")]
        start = lo if old > lo else w_lo  # [lo, old) then [old, new) are held: one translation for both
        e = cache.entries(tc, start, new)
        past, fresh = e[:, : max(0, old - start)], e[:, w_lo - start:]
        out = []
        for view, states in zip(kv, (key_states, value_states)):
            if tuple(states.shape[1:2] + states.shape[3:]) != tuple(view.shape[1:]) or states.dtype != view.dtype:
                raise ConfigError(f"layer {self.index}: K/V of {tuple(states.shape)} {states.dtype}, the arena's row "
                                  f"is {tuple(view.shape[1:])} {view.dtype}; build the cache from this model's config")
            seq = states.transpose(1, 2)  # (rows, tokens, heads, dim): the rows' layout
            view[fresh] = seq[:, w_lo - old:]
            out.append(torch.cat([view[past], seq], dim=1).transpose(1, 2).contiguous())
        self.cumulative_length = new
        return out[0], out[1]


class _FullLayer(_KVMixin, DynamicLayer):
    def __init__(self, cache: ArenaCache, index: int, tc: _TokenClass) -> None:
        DynamicLayer.__init__(self)
        self.cache, self.index, self.tc = cache, index, tc
        self.cumulative_length = 0
        self.is_initialized = True


class _SlidingLayer(_KVMixin, DynamicSlidingWindowLayer):
    def __init__(self, cache: ArenaCache, index: int, tc: _TokenClass, window: int) -> None:
        DynamicSlidingWindowLayer.__init__(self, sliding_window=window)
        self.cache, self.index, self.tc, self.window = cache, index, tc, window
        self.is_initialized = True


class _StateMixin:
    """Conv and SSM state of one linear layer in the recurrent class's rows (one state per layer)."""

    cache: ArenaCache
    index: int

    def _one(self, state_idx: int) -> None:
        if state_idx != 0:
            raise ConfigError(f"layer {self.index}: state {state_idx}: the arena keeps one conv and one SSM state per "
                              "linear layer (number_of_conv_states 1)")

    def get_state(self, part: str, state_idx: int) -> torch.Tensor | None:
        self._one(state_idx)
        if not self.has_previous_state[state_idx]:
            return None
        return self.cache.read_state(self.index, part, hand_out=True)

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs: Any) -> torch.Tensor:
        self._one(state_idx)
        self.cache.ensure_state(conv_states.shape[0])
        width = self.cache._state_view(self.index, "conv").shape[-1]
        if conv_kernel_size is not None and conv_kernel_size != width:
            raise ConfigError(f"layer {self.index}: conv kernel {conv_kernel_size}, the arena's conv row keeps {width} "
                              "columns; build the cache with conv_state='transformers'")
        if not self.has_previous_state[state_idx]:
            full = conv_states
            if full.shape[-1] < width:
                full = torch.nn.functional.pad(full, (width - full.shape[-1], 0), value=0)
            self.has_previous_state[state_idx] = True
        else:
            full = torch.cat([self.cache.read_state(self.index, "conv", hand_out=False), conv_states], dim=-1)
        self.cache.write_state(self.index, "conv", full[..., -width:])
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        self._one(state_idx)
        self.cache.ensure_state(recurrent_states.shape[0])
        self.cache.write_state(self.index, "ssm", recurrent_states)
        return self.cache.read_state(self.index, "ssm", hand_out=True)


class _StateLayer(_StateMixin, LinearAttentionLayer):
    def __init__(self, cache: ArenaCache, index: int) -> None:
        LinearAttentionLayer.__init__(self, number_of_states=1)
        self.cache, self.index = cache, index

    def reset(self) -> None:
        self.has_previous_state[0] = False

    @property
    def is_croppable(self) -> bool:
        return False


class _HybridLayer(_StateMixin, _KVMixin, LinearAttentionAndFullAttentionLayer):
    """Falcon-H1: attention (full class) and mamba heads (state class) in the same layer."""

    def __init__(self, cache: ArenaCache, index: int, tc: _TokenClass) -> None:
        LinearAttentionAndFullAttentionLayer.__init__(self, number_of_states=1)
        self.cache, self.index, self.tc = cache, index, tc
        self.cumulative_length = 0
        self.is_initialized = True

    def reset(self) -> None:
        _KVMixin.reset(self)
        self.has_previous_state[0] = False

    @property
    def is_croppable(self) -> bool:
        return False


__all__ = ["ArenaCache", "CacheFullError"]
