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
        # Kind is a str enum, so a plain "full" compares equal to Kind.FULL yet fails every `is` test below and in
        # the chain: refuse it here, before it ends in a bare StopIteration deep in the sizing.
        if not isinstance(self.kind, Kind):
            raise ConfigError(f"state class {self.name!r}: kind {self.kind!r} must be a Kind; pass Kind.FULL, "
                              "Kind.WINDOW or Kind.RECURRENT, not a string")
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


def pack_rows(sizes: list[int]) -> tuple[list[int], int]:
    """Offsets of rows of ``sizes`` bytes packed in order, each aligned up to ``ROW_ALIGN``, and the entry's
    bytes, aligned up to ``ENTRY_ALIGN``.

    pre: all(n > 0 for n in sizes)
    post: len(__return__[0]) == len(sizes)
    post: all(o % ROW_ALIGN == 0 for o in __return__[0])
    post: all(a + n <= b for a, n, b in zip(__return__[0], sizes, __return__[0][1:]))
    post: __return__[1] % ENTRY_ALIGN == 0
    post: not sizes or __return__[0][-1] + sizes[-1] <= __return__[1]
    post: any(n % ROW_ALIGN for n in sizes) or __return__[1] - sum(sizes) <= ENTRY_ALIGN - ROW_ALIGN
    """
    offset = 0
    offsets = []
    for n in sizes:
        offset = align_up(offset, ROW_ALIGN)
        offsets.append(offset)
        offset += n
    return offsets, align_up(offset, ENTRY_ALIGN)


def entry_layout(cls: StateClass) -> EntryLayout:
    """Pack the rows of ``cls`` in declaration order (the presets list them layer by layer,
    except Kimi-K3, whose DSA index rows follow all latent rows)."""
    offsets, entry_bytes = pack_rows([row.nbytes for row in cls.rows])
    return EntryLayout(cls, tuple(RowSlot(row, o) for row, o in zip(cls.rows, offsets)), entry_bytes)


def entries_per_page(cls: StateClass, page_size: int) -> int:
    """A token class's page is ``page_size`` entries; a recurrent slot is one entry."""
    return 1 if cls.kind is Kind.RECURRENT else page_size


def page_bytes(cls: StateClass, page_size: int) -> int:
    return entries_per_page(cls, page_size) * entry_layout(cls).entry_bytes
