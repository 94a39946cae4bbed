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
from typing import TYPE_CHECKING, Protocol

from kvarena.spec.errors import (
    ConfigError,
    DoubleFreeError,
    DuplicateOwnerError,
    DuplicateUserError,
    InvalidArgumentError,
    ReleaseWithoutAcquireError,
    UnknownOwnerError,
    UnknownPageError,
)
from kvarena.spec.types import UserKind

if TYPE_CHECKING:
    from kvarena.spec.models import Shape

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
        if not is_state(cls):  # first: an implementation may compute an owner's pages of a class on demand
            continue
        have = len(held[cls]) if held is not None else 0
        if have + n > cap:
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


# ---------------------------------------------------------------------------------------------
# The guard of each operation, once: the ordered checks of spec/arena.md §Operations. The reference, gpu/ and
# PoolAdapter call these at the top of each operation (after its poll()), so the order in which refusals are
# raised (normative: the first that applies is raised) cannot drift apart between them. What an implementation
# answers for them is its host state only (``Lookup``); what the configuration fixes is a ``Shape`` (spec/models.py).


class Lookup(Protocol):
    """What the guards ask an implementation about its state (host-side: gpu/ answers from its mirrors)."""

    def class_of(self, vid: int) -> str | None:
        """The class of bound page ``vid``; None when it is not bound."""
        ...

    def pages_of(self, owner: object) -> Mapping[str, Collection[int]] | None:
        """The pages ``owner`` holds per class; None when there is no such owner (``owner`` is hashable)."""
        ...

    def user_live(self, user: object) -> bool:
        """Whether ledger user ``user`` is live (``user`` is hashable)."""
        ...


def check_demand(s: Shape, demand: object, is_count: Callable[[object], bool] = is_int) -> dict[str, int]:
    """A demand (spec/arena.md §Operations): a mapping of known classes to int page counts ``>= 0``, none above the
    class's grid, the whole within the arena's bytes; the non-zero part, or ``InvalidArgument``."""
    if not isinstance(demand, Mapping):
        raise InvalidArgumentError(f"demand must be a mapping class -> pages, got {type(demand).__name__}")
    out: dict[str, int] = {}
    for cls, n in demand.items():
        check_class(cls, s.top, "demand")  # an unknown (or unhashable) name
        if not is_count(n) or n < 0:
            raise InvalidArgumentError(f"demand for {cls!r} must be an int >= 0 pages, got {n!r}")
        if n > s.top[cls]:
            raise InvalidArgumentError(f"demand of {n} {cls!r} pages exceeds the {s.top[cls]} pages the whole arena "
                                       "holds; split the request or raise capacity")
        if n:
            out[cls] = int(n)
    total = sum(n * s.page_bytes[c] for c, n in out.items())
    if total > s.capacity:
        raise InvalidArgumentError(f"demand of {total} B exceeds the arena's {s.capacity} B and can never fit; "
                                   "split the request or raise capacity")
    return out


def check_bound(v: Lookup, vids: Iterable[object], what: str, is_id: Callable[[object], bool] = is_int) -> list[int]:
    """A list of ids (spec/arena.md §Operations): ints, none twice (``InvalidArgument``), each bound
    (``UnknownPage``)."""
    got = check_ids(vids, what, is_id)
    if len(set(got)) != len(got):
        raise InvalidArgumentError(f"{what}: duplicate virtual page ids {sorted(got)}; name each page once")
    for x in got:
        if v.class_of(x) is None:
            raise UnknownPageError(f"{what}: virtual page {x} is not bound (never allocated or already freed); pass "
                                   "only pages returned by admit/extend and still owned")
    return [int(x) for x in got]


def _known_owner(v: Lookup, owner: object) -> Mapping[str, Collection[int]]:
    check_hashable_id(owner, "owner")
    held = v.pages_of(owner)
    if held is None:
        raise UnknownOwnerError(f"owner {owner!r} holds no pages; admit it first (a freed owner is forgotten)")
    return held


def guard_admit(s: Shape, v: Lookup, owner: object, demand: object, shared: Iterable[object], below: object,
                is_id: Callable[[object], bool] = is_int) -> tuple[dict[str, int], list[int], dict[str, int]]:
    """§admit, in order: a hashable owner id; a new owner (``DuplicateOwner``); the demand; the shared ids; no
    shared recurrent page; the recurrent-slot bound; the placement limit. Returns (demand, shared, limit slots)."""
    check_hashable_id(owner, "owner")
    if v.pages_of(owner) is not None:
        raise DuplicateOwnerError(f"owner {owner!r} is already admitted; use extend() to grow it, or free() it first")
    d = check_demand(s, demand, is_id)
    got = check_bound(v, shared, f"admit({owner!r}) shared", is_id)
    check_not_state(got, v.class_of, s.is_state, f"admit({owner!r}, shared=)")  # type: ignore[arg-type]
    check_state_slots(owner, None, d, s.is_state, s.recurrent_slots)
    return d, got, check_below(below, s.ends, s.capacity, is_id)


def guard_extend(s: Shape, v: Lookup, owner: object, demand: object, below: object,
                 is_id: Callable[[object], bool] = is_int) -> tuple[dict[str, int], dict[str, int]]:
    """§extend, in order: a known owner (``UnknownOwner``); the demand; the recurrent-slot bound; the limit."""
    held = _known_owner(v, owner)
    d = check_demand(s, demand, is_id)
    check_state_slots(owner, held, d, s.is_state, s.recurrent_slots)
    return d, check_below(below, s.ends, s.capacity, is_id)


def guard_share(s: Shape, v: Lookup, owner: object, vids: Iterable[object],
                is_id: Callable[[object], bool] = is_int) -> list[int]:
    """§share, in order: a hashable owner id; the ids; no recurrent page; none the owner holds already."""
    check_hashable_id(owner, "owner")
    got = check_bound(v, vids, f"share({owner!r})", is_id)
    check_not_state(got, v.class_of, s.is_state, f"share({owner!r})")  # type: ignore[arg-type]
    held = v.pages_of(owner)
    if held is not None:
        dup = [x for x in got if x in held[v.class_of(x)]]  # type: ignore[index]
        if dup:
            raise InvalidArgumentError(f"share({owner!r}): already holds {dup}; an owner holds a page once, so drop "
                                       "it first or pass only pages it does not hold")
    return got


def guard_copy_state(s: Shape, v: Lookup, owner: object, src: object,
                     is_id: Callable[[object], bool] = is_int) -> tuple[int, str]:
    """§copy_state, in order: a hashable owner id; ``src`` an int and bound; recurrent; the recurrent-slot bound.
    Returns (src, its class)."""
    check_hashable_id(owner, "owner")
    (page,) = check_bound(v, [src], f"copy_state({owner!r})", is_id)
    cls = v.class_of(page)
    assert cls is not None
    if not s.is_state(cls):
        raise InvalidArgumentError(f"copy_state({owner!r}, {page}): page {page} is a {cls!r} page, not recurrent "
                                   "state; token pages are shared, not copied: use share(owner, [src])")
    check_state_slots(owner, v.pages_of(owner), {cls: 1}, s.is_state, s.recurrent_slots)
    return page, cls


def guard_drop(s: Shape, v: Lookup, owner: object, vids: Iterable[object],
               is_id: Callable[[object], bool] = is_int) -> list[int]:
    """§drop, in order: a known owner; int ids, none twice; each held by the owner (``DoubleFree``)."""
    held = _known_owner(v, owner)
    got = check_ids(vids, f"drop({owner!r})", is_id)
    if len(set(got)) != len(got):
        raise InvalidArgumentError(f"drop({owner!r}): duplicate ids {sorted(got)}; name each page once")
    missing = [x for x in got if (c := v.class_of(x)) is None or x not in held[c]]
    if missing:
        raise DoubleFreeError(f"drop({owner!r}): owner does not hold {missing} (double free, or another owner's "
                              "page); drop only pages this owner holds")
    return [int(x) for x in got]


def guard_slide(s: Shape, v: Lookup, owner: object, cls: object, n: object,
                is_count: Callable[[object], bool] = is_int) -> int:
    """§slide, in order: a known owner; a known class; ``n`` an int in ``[0, pages of cls the owner holds]``."""
    held = _known_owner(v, owner)
    check_class(cls, s.top, "slide")
    have = len(held[cls])  # type: ignore[index]
    if not is_count(n) or not 0 <= n <= have:  # type: ignore[operator]
        raise InvalidArgumentError(f"slide({owner!r}, {cls!r}, {n!r}): owner holds {have} {cls} pages; n must be "
                                   f"in [0, {have}]")
    return int(n)  # type: ignore[call-overload]


def guard_free(s: Shape, v: Lookup, owner: object) -> None:
    """§free: a known owner."""
    _known_owner(v, owner)


def guard_acquire(s: Shape, v: Lookup, user: object, kind: object, vids: Iterable[object], event: object = None,
                  is_id: Callable[[object], bool] = is_int) -> list[int]:
    """§acquire, in order: a hashable user id; not live (``DuplicateUser``); a ``UserKind``; the ids; at least
    one; an event with ``query()`` (or none)."""
    check_hashable_id(user, "ledger user")
    if v.user_live(user):
        raise DuplicateUserError(f"ledger user {user!r} is live; release it first or pick a fresh id")
    if not isinstance(kind, UserKind):
        raise InvalidArgumentError(f"acquire: kind must be a UserKind, got {kind!r}; pass one of "
                                   f"{[k.value for k in UserKind]}")
    got = check_bound(v, vids, f"acquire({user!r})", is_id)
    if not got:
        raise InvalidArgumentError(f"acquire({user!r}): no pages; a ledger user holds at least one page, so pass the "
                                   "pages it reads or writes (or do not acquire)")
    if event is not None and not callable(getattr(event, "query", None)):
        raise InvalidArgumentError(f"acquire: event must have query() (pass a torch.cuda.Event), got {event!r}")
    return got


def guard_release(v: Lookup, user: object) -> None:
    """§release: a hashable user id that is live (``ReleaseWithoutAcquire``, also for a second release)."""
    check_hashable_id(user, "ledger user")
    if not v.user_live(user):
        raise ReleaseWithoutAcquireError(f"release({user!r}): no such live ledger user (never acquired, or already "
                                         "released); release each acquire exactly once")


def guard_row(s: Shape, v: Lookup, vid: object, entry: object, row: object, what: str,
              is_id: Callable[[object], bool] = is_int) -> str:
    """§write / §read, in order: ``vid`` an int and bound; ``entry`` in ``[0, EPP)`` and ``row`` in ``[0, rows)``.
    Returns the page's class (``write`` then checks the tag)."""
    (page,) = check_ids([vid], what, is_id)
    cls = v.class_of(page)
    if cls is None:
        raise UnknownPageError(f"{what}: virtual page {page} is not bound; pass only pages returned by admit/extend "
                               "and still owned")
    n_e, n_r = s.entries[cls], s.rows[cls]
    if not (is_int(entry) and is_int(row) and 0 <= entry < n_e and 0 <= row < n_r):  # type: ignore[operator]
        raise InvalidArgumentError(f"page {page} ({cls}) got entry {entry!r}, row {row!r}; pass an int entry in "
                                   f"[0, {n_e}) and an int row in [0, {n_r})")
    return cls


def guard_max_moves(max_moves: object) -> None:
    """§compact: ``max_moves`` None or an int ``>= 0``."""
    if max_moves is not None and (not is_int(max_moves) or max_moves < 0):  # type: ignore[operator]
        raise InvalidArgumentError(f"compact: max_moves must be None or an int >= 0, got {max_moves!r}")


def guard_budget(budget_bytes: object) -> None:
    """§flush_idle: ``budget_bytes`` an int ``>= 0``."""
    if not is_int(budget_bytes) or budget_bytes < 0:  # type: ignore[operator]
        raise InvalidArgumentError(f"flush_idle: budget_bytes must be an int >= 0 (bytes this call may move), got "
                                   f"{budget_bytes!r}")
