"""Shared vocabulary of operations: band roles, ledger users and their holds, moves, plans, admissions
(spec/arena.md §State, §Ledger, §Admission ladder). Every implementation uses these types; none defines its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Role(str, Enum):
    """Where a band sits in the chain (spec/arena.md §Bands and roles)."""

    LOW = "low"  # first in the chain: span [0, hi), anchored at byte 0, grows up
    FLOAT = "float"  # between the ends, grows either way, empty when lo == hi
    HIGH = "high"  # last in the chain: span [lo, top), anchored at the top of its grid, grows down


class Mode(str, Enum):
    READ = "read"
    WRITE = "write"


class UserKind(str, Enum):
    """Who holds a page's physical address, and whether it reads or writes it."""

    FORWARD_READ = "forward_read"  # a forward pass reading KV / state
    FORWARD_WRITE = "forward_write"  # a forward pass writing new KV / state
    HOST_SAVE = "host_save"  # device -> host cache copy (reads the page)
    HOST_LOAD = "host_load"  # host cache -> device copy (writes the page)
    NET_SEND = "net_send"  # RDMA / PD transfer out (reads)
    NET_RECV = "net_recv"  # RDMA / PD transfer in (writes)

    @property
    def mode(self) -> Mode:
        return Mode.WRITE if self in _WRITERS else Mode.READ


_WRITERS = {UserKind.FORWARD_WRITE, UserKind.HOST_LOAD, UserKind.NET_RECV}


@dataclass(frozen=True)
class Hold:
    """One page a ledger user holds: where it was when acquired (a hold does not follow a move), which virtual
    page, and which allocation of that id (``gen``: its serial, so INV-LEDGER-SAFETY tells a moved page from a
    reused id; an implementation that keeps no serials records 0)."""

    cls: str
    slot: int
    vid: int
    gen: int = 0


@dataclass(frozen=True)
class User:
    """A ledger user: a forward pass, host copy or transfer holding physical pages (spec/arena.md §Ledger)."""

    kind: UserKind
    holds: tuple[Hold, ...]
    event: Any = None  # with query(): released by the poll() of the first call after it is true (§Event users)

    @property
    def mode(self) -> Mode:
        return self.kind.mode


class Rung(int, Enum):
    """The admission ladder's rungs (0 = nothing placed)."""

    NONE = 0
    REUSE = 1  # holes, then frontiers into the adjacent gap; nothing moves
    COMPACT = 2  # pack the end bands toward their anchors, retry
    RELAYOUT = 3  # move float bands within the room between the compacted ends, retry


@dataclass(frozen=True)
class Move:
    """Copy every row of every entry of page ``src`` to ``dst`` (same class) and remap its virtual id."""

    cls: str
    src: int  # physical slot on the class's page grid
    dst: int


@dataclass(frozen=True)
class Plan:
    """What one admission (or flush / relayout) does: moves in order, then placements."""

    rung: Rung
    moves: tuple[Move, ...] = ()
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bytes_moved: dict[int, int] = field(default_factory=dict)  # rung -> bytes
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # float target spans (rung 3)

    @property
    def total_bytes_moved(self) -> int:
        return sum(self.bytes_moved.values())


@dataclass(frozen=True)
class Observation:
    """The placement-level state an implementation exposes to the conformance harness (plain ints, sorted)."""

    v2p: dict[int, tuple[str, int]]  # virtual page -> (class, slot)
    spans: dict[str, tuple[int, int]]  # class -> [lo, hi) slots
    holes: dict[str, tuple[int, ...]]
    withheld: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Admission:
    """What admit / extend / copy return: the new virtual pages per class and the plan that placed them."""

    pages: dict[str, tuple[int, ...]]
    plan: Plan
