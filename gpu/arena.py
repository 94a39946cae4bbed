"""The arena's bytes: one ``torch.uint8`` tensor of ``capacity`` bytes and typed views of every row.

Every class's page grid is anchored at byte 0 (spec/arena.md §Bands and roles): physical entry ``e`` of class
``c`` starts at byte ``e * entry_bytes(c)``, and slot ``s`` is entries ``[s * EPP, (s + 1) * EPP)``. A row
``(layer, part)`` of class ``c`` is, for every entry on the grid, ``row.nbytes`` bytes at
``e * entry_bytes + row_offset``; ``views(c)`` gives each as a tensor of shape ``(entries, *row.shape)`` in the
row's own dtype, built with ``view(dtype)`` and ``as_strided`` (entry stride ``entry_bytes / itemsize``), so an
attention kernel reads K/V/state where the allocator put them. The same bytes are also seen as int64 words
(``words``) by the page kernels: every page is a multiple of 32 B.

Data tags (``write``/``read`` of the adapter protocol) are real bytes in the rows: ``encode`` spreads a tag
over every 8-byte word of the row, ``word_k = tag * S * B_k (mod 2**64)``, where ``S`` is an odd key of
(virtual page, entry, row) and ``B_k`` odd per word position. A tag of 0 is all-zero bytes, so a zeroed
recurrent slot reads 0; any other content (a page left behind by a move, bytes of another page, a torn copy)
fails the cross-check of all words and is reported, not decoded into a plausible tag.
"""

from __future__ import annotations

import torch

from kvarena.spec.errors import InvariantViolation
from kvarena.spec.layout import Kind, Row, entries_per_page, entry_layout
from kvarena.spec.models import ArenaConfig

TORCH_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                                        "fp8": torch.uint8, "uint8": torch.uint8, "int32": torch.int32}
MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64 finaliser on Python ints (keys of the tag code)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _signed(x: int) -> int:
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


class DeviceArena:
    """The byte range ``[0, capacity)`` on ``device``, and every class's rows as typed views."""

    def __init__(self, config: ArenaConfig, device: str | torch.device = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.capacity = config.capacity
        self.classes = {c.name: c for c in config.model.classes}
        self.layouts = {n: entry_layout(c) for n, c in self.classes.items()}
        # the padding entry of each class (graph-padding lanes of translate_tokens write there) lies past the
        # arena's last byte, in bytes no page of any class covers: two entries of the widest class suffice
        self.pad_bytes = 2 * max(lay.entry_bytes for lay in self.layouts.values())
        self.epp = {n: entries_per_page(c, config.page_size) for n, c in self.classes.items()}
        self.page_bytes = {n: self.epp[n] * self.layouts[n].entry_bytes for n in self.classes}
        # then a dump page per class (fixed-width graph steps zero their unused lanes there), page aligned
        self.dump_slot = {n: -(-(config.capacity + self.pad_bytes) // p) for n, p in self.page_bytes.items()}
        total = max((s + 1) * self.page_bytes[n] for n, s in self.dump_slot.items())
        self.raw = torch.zeros(total, dtype=torch.uint8, device=self.device)
        # int64 words for the page kernels: every page ends on a 32 B boundary, so all of them are inside
        self.words = self.raw[: config.capacity // 8 * 8].view(torch.int64)
        self.words_all = self.raw[: total // 8 * 8].view(torch.int64)  # the grids plus the dump pages
        self.top = {n: config.capacity // p for n, p in self.page_bytes.items()}  # whole pages on each grid
        self._views: dict[str, dict[tuple[int, str], torch.Tensor]] = {n: self._build_views(n) for n in self.classes}
        self._row_views = {n: list(self._views[n].values()) for n in self.classes}  # by row index
        self._basis: dict[int, torch.Tensor] = {}

    # -- typed views --------------------------------------------------------------------------
    def _build_views(self, cls: str) -> dict[tuple[int, str], torch.Tensor]:
        layout = self.layouts[cls]
        # every entry on the grid and on through the padding entry: a kernel's index_put / gather through a
        # padded lane lands in the padding bytes instead of raising (they lie past capacity, before the dump pages)
        n_entries = self.pad_entry(cls) + 1
        used = self.raw[: n_entries * layout.entry_bytes]
        out: dict[tuple[int, str], torch.Tensor] = {}
        for slot in layout.slots:
            row = slot.row
            dtype = TORCH_DTYPES[row.dtype]
            size = torch.empty((), dtype=dtype).element_size()
            assert layout.entry_bytes % size == 0 and slot.offset % size == 0, "rows are 16 B aligned"
            inner = [1]
            for d in reversed(row.shape[1:]):
                inner.insert(0, inner[0] * d)
            key = (row.layer, row.part)
            assert key not in out, f"class {cls} has two rows {key}"
            out[key] = used.view(dtype).as_strided((n_entries, *row.shape), (layout.entry_bytes // size, *inner),
                                                   slot.offset // size)
        return out

    def pad_entry(self, cls: str) -> int:
        """The physical entry (on ``cls``'s grid) a padding lane points at: the first that starts at or past
        byte ``capacity``, so a kernel that writes a padded lane writes only the arena's padding bytes."""
        eb = self.layouts[cls].entry_bytes
        return -(-self.capacity // eb)

    def views(self, cls: str) -> dict[tuple[int, str], torch.Tensor]:
        """``{(layer, part): tensor of shape (pad_entry(cls) + 1, *row.shape)}`` in each row's dtype: the grid's
        entries, then the few past its last whole page up to and including the padding entry."""
        return self._views[cls]

    def row_view(self, cls: str, row: int) -> torch.Tensor:
        return self._row_views[cls][row]

    def row(self, cls: str, row: int) -> Row:
        return self.layouts[cls].slots[row].row

    def is_recurrent(self, cls: str) -> bool:
        return self.classes[cls].kind is Kind.RECURRENT

    # -- tags as row bytes --------------------------------------------------------------------
    def _words_of(self, nbytes: int) -> torch.Tensor:
        """``B_k``: one odd constant per 8-byte word of a row (cached per row size)."""
        n = nbytes // 8
        if n not in self._basis:
            self._basis[n] = torch.tensor([_signed(_mix(k) | 1) for k in range(n)], dtype=torch.int64,
                                          device=self.device)
        return self._basis[n]

    @staticmethod
    def _key(vid: int, entry: int, row: int) -> int:
        return _mix((vid * 0x100000001B3 + entry) * 0x1F3 + row) | 1  # odd: invertible mod 2**64

    def write_tag(self, cls: str, slot: int, vid: int, entry: int, row: int, tag: int) -> None:
        """Write the bytes of ``tag`` into one row of one entry through that row's typed view."""
        view = self.row_view(cls, row)
        c = _signed(tag * self._key(vid, entry, row))
        words = torch.mul(self._words_of(self.row(cls, row).nbytes), c)  # int64 multiply wraps mod 2**64
        view[slot * self.epp[cls] + entry] = words.view(view.dtype).view(view.shape[1:])

    def read_tag(self, cls: str, slot: int, vid: int, entry: int, row: int) -> int:
        """Decode one row's bytes (read through its typed view) back into the tag that wrote them."""
        view = self.row_view(cls, row)
        got = view[slot * self.epp[cls] + entry].clone().view(-1).view(torch.int64)  # a copy: any alignment
        basis = self._words_of(self.row(cls, row).nbytes)
        c = (int(got[0]) * pow(int(basis[0]) & MASK64, -1, 1 << 64)) & MASK64
        if not torch.equal(got, torch.mul(basis, _signed(c))):
            raise InvariantViolation(
                "INV-PAGE-ATOMIC", f"page {vid} ({cls}:{slot}) entry {entry} row {row}: its bytes are not a tag "
                "written to this row of this page (torn or misplaced move, or another page's bytes)")
        return _signed(c * pow(self._key(vid, entry, row), -1, 1 << 64))
