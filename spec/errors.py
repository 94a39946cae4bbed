"""The one exception hierarchy of kvarena (spec/arena.md §Errors).

Every failed operation raises a subclass of :class:`ArenaError` whose message
names the fix, and leaves the allocator's state bit-identical.  Implementations
under test (gpu/, an engine's adapter) raise the same classes so the
conformance harness can compare rejections by type.  The argument guards that raise them, shared by every
implementation, are in spec/guards.py (``check_ids``, ``is_int``, ... lived here before issue 23).
"""

from __future__ import annotations

from collections.abc import Mapping


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

    def __reduce__(self) -> tuple:
        return type(self), (self.message, self.rule, self.inv)


class AdmissionRejectedError(ArenaError):
    """No rung of the ladder fits the demand. ``shortfall`` is pages per class.

    The caller's fix is to evict cache-only pages (``drop``) or retract a request, then retry.
    """

    code = "AdmissionRejected"

    def __init__(self, message: str, shortfall: Mapping[str, int], shortfall_bytes: int) -> None:
        super().__init__(message)
        self.shortfall = dict(shortfall)
        self.shortfall_bytes = shortfall_bytes

    def __reduce__(self) -> tuple:  # pickled with its fields (a state kvarena explore ships holds refusals)
        return type(self), (self.message, self.shortfall, self.shortfall_bytes)


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
