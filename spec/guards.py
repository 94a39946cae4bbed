"""The argument guards every implementation shares (spec/arena.md §Operations, §Errors, §Configuration and refusals).

The reference, gpu/ and ``PoolAdapter`` call these, so one malformed argument gets one error class and one message
everywhere, raised before anything changes. Each message names the valid form (the project's rule: a typed error
whose message names the fix). A guard that takes ``is_int``-like callables lets an implementation widen what an int
is (gpu/ accepts numpy integers, which engines pass as array elements); the default is the reference's notion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sized
from numbers import Real

from kvarena.spec.errors import ConfigError, InvalidArgumentError

# The tags ``write`` stores: a signed 64-bit int, because an implementation keeps a row's tag as its 8 bytes
# (gpu/ does); the reference, which keeps Python ints, refuses the same range so the two cannot disagree.
TAG_MIN = -(1 << 63)
TAG_END = 1 << 63


def is_int(x: object) -> bool:
    """An int argument: a bool is an int to Python but never a count, an index or a page id here."""
    return isinstance(x, int) and not isinstance(x, bool)


def ceil_div(a: int, b: int) -> int:
    """pre: b > 0
    post: __return__ * b >= a
    post: (__return__ - 1) * b < a
    """
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# Operations


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
        out[cls] = int(b) // p if low else ceil_div(int(b), p)
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


def check_state_slots(owner: object, held: Mapping[str, Sized] | None, demand: Mapping[str, int],
                      is_state: Callable[[str], bool], cap: int) -> None:
    """An owner holds at most ``cap`` (``ArenaConfig.recurrent_slots``) recurrent pages: its own plus the new."""
    for cls, n in demand.items():
        have = len(held[cls]) if held is not None else 0
        if is_state(cls) and have + n > cap:
            raise state_slots_error(owner, have + n, cls, cap)


def state_slots_error(owner: object, would_hold: int, cls: str, cap: int) -> InvalidArgumentError:
    """The refusal of a state demand over the cap, one message for the reference and gpu/ (which checks
    batched lanes itself and raises or records this per lane)."""
    return InvalidArgumentError(
        f"owner {owner!r} would hold {would_hold} recurrent {cls!r} pages, more than recurrent_slots="
        f"{cap}; a request holds one state (raise ArenaConfig.recurrent_slots, e.g. 3 for SGLang's "
        "extra_buffer mode), or drop one first")


def check_class(cls: object, known: Collection[str], what: str) -> str:
    """A class name of the model (``known``: the classes in chain order). A name that is not one, an unhashable
    one included, is ``InvalidArgument``, never a KeyError from an implementation's tables."""
    try:
        ok = cls in known
    except TypeError:  # an unhashable name against a dict or set of classes
        ok = False
    if not ok:
        raise InvalidArgumentError(f"{what}: unknown class {cls!r}; use one of {list(known)}")
    return cls  # type: ignore[return-value]


def check_tokens(n: object, what: str, is_count: Callable[[object], bool] = is_int) -> int:
    """A token count: an int >= 0. A float or a bool is refused, not rounded: ``ceil_pages(c, 2.5)`` is a caller's
    bug, and True is not one token. ``is_count``: an implementation's wider notion of an int, as for ``check_ids``."""
    if not is_count(n) or n < 0:  # type: ignore[operator]
        raise InvalidArgumentError(f"{what}: tokens {n!r} must be an int >= 0 (a token count); pass the number "
                                   "of tokens as an int")
    return int(n)  # type: ignore[call-overload]


def check_tag(tag: object) -> int:
    """A content tag for ``write``: an int in ``[TAG_MIN, TAG_END)`` = ``[-2**63, 2**63)`` (spec/arena.md §write)."""
    if not is_int(tag):
        raise InvalidArgumentError(f"write: tag must be an int (a content fingerprint), got {tag!r}")
    if not TAG_MIN <= tag < TAG_END:  # type: ignore[operator]
        raise InvalidArgumentError(f"write: tag {tag} is outside [-2**63, 2**63), the signed 64-bit range a row "
                                   "stores; pass a 64-bit fingerprint (fold a wider one into that range)")
    return tag  # type: ignore[return-value]


def check_hashable_id(x: object, what: str) -> None:
    """An owner or ledger-user id is any hashable value (a str or an int in practice): the arena keys its tables
    by it. ``what``: "owner" or "ledger user". ``hash`` rather than ``isinstance(x, Hashable)``: a tuple holding a
    list claims to be hashable and is not."""
    try:
        hash(x)
    except TypeError:
        raise InvalidArgumentError(f"{what} ids must be hashable: str or int, got {type(x).__name__} {x!r}; pass "
                                   "a str or an int (e.g. the request id)") from None


def check_out_width(width: object, n: int) -> int:
    """The width of a fixed-width (CUDA-graph) ``translate_tokens`` step: None (the ``n`` ids) or an int >= ``n``.
    ``n`` is a host int (a tensor's ``numel``), so gpu/ checks this without reading device memory."""
    if width is None:
        return n
    if not is_int(width) or width < n:  # type: ignore[operator]
        raise InvalidArgumentError(f"translate_tokens: out_width {width!r} must be an int >= the {n} ids; pass the "
                                   "graph's captured width, or None")
    return width  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Configuration (raised by ArenaConfig.validate / validate_model / StateClass, before any implementation exists)


def check_config_int(value: object, field: str, lo: int, form: str) -> None:
    """A config field that is an int ``>= lo`` (``page_size``, ``capacity``, ``max_context_len``): a float, a bool
    or a str is refused by type, not converted. ``form``: the valid form the message names."""
    if not is_int(value) or value < lo:  # type: ignore[operator]
        raise ConfigError(f"{field} {value!r} must be {form}")


def check_config_ratio(value: object, field: str, hi: float | None, form: str) -> None:
    """A sizing ratio: a finite real number (an int, a float, a Fraction; not a bool) ``> 0`` and, with ``hi``,
    ``<= hi``. NaN and inf are refused: the split sizing turns ratios into exact fractions."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0 \
        and (hi is None or value <= hi)
    if not ok:
        raise ConfigError(f"{field} {value!r} must be {form}")
