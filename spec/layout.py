"""Entry layouts: rows, state classes and their byte geometry (spec/arena.md §Layouts).

Shared spec types: reference/ and gpu/ both build typed views from these, so an
entry's bytes mean the same thing on both sides.  Pure arithmetic, no logic of
the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvarena.spec.errors import ConfigError, MisalignedRowError

ROW_ALIGN = 16  # bytes; every row offset and row size (as SGLang's ROW_ALIGN_BYTES)
ENTRY_ALIGN = 32  # bytes; every entry size (as SGLang's ENTRY_ALIGN_BYTES)

# Storage dtypes. fp8 KV is stored as uint8 (kernels reinterpret it).
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "uint8": 1, "int32": 4}


class Kind(str, Enum):
    """What a state class's pages hold, which fixes how they grow and die."""

    FULL = "full"  # full-attention token entries: grow with context
    WINDOW = "window"  # sliding-window token entries: a bounded suffix
    RECURRENT = "recurrent"  # recurrent / linear-attention state: one slot per request


def align_up(value: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` that is >= ``value``.

    pre: value >= 0
    pre: alignment > 0
    post: __return__ >= value
    post: __return__ % alignment == 0
    post: __return__ - value < alignment
    """
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class Row:
    """One layer's row of one part (K, V, latent, conv, ssm, ...) inside an entry."""

    layer: int
    part: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class StateClass:
    """A kind of page: every entry holds one row per participating layer."""

    name: str
    kind: Kind
    rows: tuple[Row, ...]
    window: int = 0  # tokens; WINDOW classes only

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigError(f"state class {self.name!r} has no rows; give it at least one layer row")
        if self.kind is Kind.WINDOW and self.window <= 0:
            raise ConfigError(f"window class {self.name!r} has no window; pass window=<tokens> > 0")
        for row in self.rows:
            if row.dtype not in DTYPE_BYTES:
                raise ConfigError(f"row {row.part}@L{row.layer}: unknown dtype {row.dtype!r}; "
                                  f"use one of {sorted(DTYPE_BYTES)}")
            if row.nbytes <= 0:
                raise ConfigError(f"row {row.part}@L{row.layer} of {self.name!r} has no bytes; "
                                  "every shape dimension must be > 0")
            if row.nbytes % ROW_ALIGN:
                raise MisalignedRowError(
                    f"row {row.part}@L{row.layer} of class {self.name!r} is {row.nbytes} B, not a multiple "
                    f"of {ROW_ALIGN} B; pad the head dimension or serve this model without the unified arena")


@dataclass(frozen=True)
class RowSlot:
    row: Row
    offset: int  # bytes from the start of the entry


@dataclass(frozen=True)
class EntryLayout:
    """Where each row sits in an entry: rows in declaration order, 16 B aligned; entry 32 B aligned."""

    cls: StateClass
    slots: tuple[RowSlot, ...]
    entry_bytes: int

    @property
    def payload_bytes(self) -> int:
        return sum(s.row.nbytes for s in self.slots)

    @property
    def padding_bytes(self) -> int:
        return self.entry_bytes - self.payload_bytes


def entry_layout(cls: StateClass) -> EntryLayout:
    """Pack the rows of ``cls`` in declaration order (the presets list them layer by layer,
    except Kimi-K3, whose DSA index rows follow all latent rows)."""
    offset = 0
    slots = []
    for row in cls.rows:
        offset = align_up(offset, ROW_ALIGN)
        slots.append(RowSlot(row, offset))
        offset += row.nbytes
    return EntryLayout(cls, tuple(slots), align_up(offset, ENTRY_ALIGN))


def entries_per_page(cls: StateClass, page_size: int) -> int:
    """A token class's page is ``page_size`` entries; a recurrent slot is one entry."""
    return 1 if cls.kind is Kind.RECURRENT else page_size


def page_bytes(cls: StateClass, page_size: int) -> int:
    return entries_per_page(cls, page_size) * entry_layout(cls).entry_bytes
