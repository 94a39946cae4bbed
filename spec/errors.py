"""The one exception hierarchy of kvarena (spec/arena.md §Errors).

Every failed operation raises a subclass of :class:`ArenaError` whose message
names the fix, and leaves the allocator's state bit-identical.  Implementations
under test (gpu/, an engine's adapter) raise the same classes so the
conformance harness can compare rejections by type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sized


class ArenaError(Exception):
    """Base of every kvarena error. ``code`` is the stable name used in vectors."""

    code = "ArenaError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ArenaError):
    """The model / arena configuration cannot be served (raised at construction)."""

    code = "ConfigError"


class MisalignedRowError(ConfigError):
    """A layer row is not a multiple of ROW_ALIGN bytes."""

    code = "MisalignedRow"


class CapacityTooSmallError(ConfigError):
    """The arena cannot hold one worst-case request (the feasibility floor)."""

    code = "CapacityTooSmall"


class InvalidArgumentError(ArenaError):
    """A malformed argument: negative or oversized demand, duplicate ids, bad row index."""

    code = "InvalidArgument"


def is_int(x: object) -> bool:
    """An int argument: a bool is an int to Python but never a count, an index or a page id here."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_ids(vids: Iterable[object], what: str, is_id: Callable[[object], bool] = is_int) -> list:
    """Virtual ids are ints (spec/arena.md §Errors): a float or a bool hashes like an int and would name a page,
    so it is refused before any duplicate or bound check. ``is_id``: an implementation's wider notion of an int
    (gpu/ accepts numpy integers, which engines pass as array elements)."""
    vids = list(vids)
    bad = [v for v in vids if not is_id(v)]
    if bad:
        raise InvalidArgumentError(f"{what}: virtual page ids must be ints, got {bad[0]!r} "
                                   f"({type(bad[0]).__name__}); pass the ids admit/extend returned")
    return vids


def check_below(below: object, ends: Mapping[str, tuple[int, bool]], capacity: int,
                is_byte: Callable[[object], bool] = is_int) -> dict[str, int]:
    """A placement limit (spec/arena.md §Placement limit) as limit slots per class, or ``InvalidArgument``: None,
    or a mapping from an end-band class to a byte offset in ``[0, capacity]``. ``ends``: class -> (page bytes,
    whether it is the low band); the low band's limit slot is ``b // P``, the high band's ``ceil(b / P)``.
    ``is_byte``: an implementation's wider notion of an int, as for ``check_ids``."""
    if below is None:
        return {}
    if not isinstance(below, Mapping):
        raise InvalidArgumentError(f"below must be a mapping class -> byte offset, got {type(below).__name__}")
    out: dict[str, int] = {}
    for cls, b in below.items():
        if cls not in ends:
            raise InvalidArgumentError(f"below names class {cls!r}; a placement limit is for an end band, "
                                       f"use one of {list(ends)}")
        if not is_byte(b) or not 0 <= b <= capacity:
            raise InvalidArgumentError(f"below[{cls!r}] must be an int byte offset in [0, {capacity}], got {b!r}")
        p, low = ends[cls]
        out[cls] = int(b) // p if low else -(-int(b) // p)
    return out


def check_not_state(vids: Iterable[int], class_of: Callable[[int], str], is_state: Callable[[str], bool],
                    what: str) -> None:
    """A recurrent page is one owner's state (INV-STATE-PRIVATE): it is never shared; prefix caching copies it.
    ``class_of``: the class of a page id; ``is_state``: whether a class is recurrent."""
    state = [v for v in vids if is_state(class_of(v))]
    if state:
        raise InvalidArgumentError(f"{what}: page {state[0]} is recurrent state ({class_of(state[0])!r}), "
                                   "which one owner holds alone; give the other owner its own copy with "
                                   "copy_state(owner, src) instead of sharing it")


def check_state_slots(owner: str, held: Mapping[str, Sized] | None, demand: Mapping[str, int],
                      is_state: Callable[[str], bool], cap: int) -> None:
    """An owner holds at most ``cap`` (``ArenaConfig.recurrent_slots``) recurrent pages: its own plus the new."""
    for cls, n in demand.items():
        have = len(held[cls]) if held is not None else 0
        if is_state(cls) and have + n > cap:
            raise state_slots_error(owner, have + n, cls, cap)


def state_slots_error(owner: str, would_hold: int, cls: str, cap: int) -> InvalidArgumentError:
    """The refusal of a state demand over the cap, one message for the reference and gpu/ (which checks
    batched lanes itself and raises or records this per lane)."""
    return InvalidArgumentError(
        f"owner {owner!r} would hold {would_hold} recurrent {cls!r} pages, more than recurrent_slots="
        f"{cap}; a request holds one state (raise ArenaConfig.recurrent_slots, e.g. 3 for SGLang's "
        "extra_buffer mode), or drop one first")


class UnknownOwnerError(ArenaError):
    """The request / cache owner does not exist."""

    code = "UnknownOwner"


class DuplicateOwnerError(ArenaError):
    """``admit`` named an owner that already holds pages."""

    code = "DuplicateOwner"


class UnknownPageError(ArenaError):
    """A virtual page id that is not bound (never allocated, or already freed)."""

    code = "UnknownPage"


class DoubleFreeError(ArenaError):
    """An owner let go of a page it does not hold."""

    code = "DoubleFree"


class UnknownUserError(ArenaError):
    """A ledger user id that was never acquired."""

    code = "UnknownUser"


class ReleaseWithoutAcquireError(UnknownUserError):
    """``release`` of a ledger user that holds nothing (never acquired or already released)."""

    code = "ReleaseWithoutAcquire"


class DuplicateUserError(ArenaError):
    """``acquire`` reused a live ledger user id."""

    code = "DuplicateUser"


class PlanError(ArenaError):
    """A plan (placements and moves) breaks a rule of the spec; raised by the validator.

    ``rule`` is the validator rule (e.g. ``PLAN-MOVE-WRITER``), ``inv`` the invariant it protects.
    """

    code = "InvalidPlan"

    def __init__(self, message: str, rule: str | None = None, inv: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.inv = inv


class AdmissionRejectedError(ArenaError):
    """No rung of the ladder fits the demand. ``shortfall`` is pages per class.

    The caller's fix is to evict cache-only pages (``drop``) or retract a request, then retry.
    """

    code = "AdmissionRejected"

    def __init__(self, message: str, shortfall: Mapping[str, int], shortfall_bytes: int) -> None:
        super().__init__(message)
        self.shortfall = dict(shortfall)
        self.shortfall_bytes = shortfall_bytes


ERROR_CODES: dict[str, type[ArenaError]] = {
    cls.code: cls
    for cls in (
        ArenaError,
        ConfigError,
        MisalignedRowError,
        CapacityTooSmallError,
        InvalidArgumentError,
        UnknownOwnerError,
        DuplicateOwnerError,
        UnknownPageError,
        DoubleFreeError,
        UnknownUserError,
        ReleaseWithoutAcquireError,
        DuplicateUserError,
        PlanError,
        AdmissionRejectedError,
    )
}


class InvariantViolation(AssertionError):
    """An implementation broke an invariant: a bug, never bad input. ``inv`` is the stable ID."""

    def __init__(self, inv: str, message: str) -> None:
        super().__init__(f"{inv}: {message}")
        self.inv, self.message = inv, message

    def __reduce__(self):  # picklable, so a replay side in a child process can report it
        return type(self), (self.inv, self.message)
