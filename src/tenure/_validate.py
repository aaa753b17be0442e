"""Argument checks shared by the service, the stores and the scheduler.

Every check raises before anything reaches a store, so bad input changes
nothing.
"""

from __future__ import annotations

import math
import re

from .errors import InvalidArgument

MAX_NAME_BYTES = 255
"""Longest lock name, in UTF-8 bytes: fits every store's key limit with room for a prefix."""

MIN_TTL = 0.5
"""Shortest TTL, in seconds. The renewer renews at TTL/3 and gives up at the
local deadline (TTL minus a margin); below half a second a single slow round
trip or a garbage-collection pause would lose locks that are in fact alive."""

DEFAULT_TTL = 30.0

# Unicode's control characters (category Cc) and lone surrogates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


_valid_names: set[str] = set()
"""Names that passed, so that an application's few hot names skip the checks;
emptied when it grows past _KNOWN_NAMES (names made of ids need not stay)."""
_KNOWN_NAMES = 4096


def check_name(name: object, what: str = "lock name") -> str:
    if name.__class__ is str and name in _valid_names:
        return name
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise InvalidArgument(f"{what} must not be empty")
    size = len(name) if name.isascii() else len(name.encode("utf-8", errors="surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise InvalidArgument(
            f"{what} {name[:40]!r}... is {size} UTF-8 bytes; the limit is {MAX_NAME_BYTES}"
        )
    bad = _CONTROL.search(name)
    if bad is not None:
        raise InvalidArgument(
            f"{what} {name!r} holds the control character {bad.group()!r}; "
            "use printable characters only"
        )
    if len(_valid_names) >= _KNOWN_NAMES:
        _valid_names.clear()
    _valid_names.add(name)
    return name


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{what} must be a number of seconds, got {value!r}")
    return float(value)


def check_ttl(ttl: object, what: str = "ttl") -> float:
    if ttl.__class__ is float and MIN_TTL <= ttl < math.inf:  # the common case, quickly
        return ttl
    seconds = _number(ttl, what)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidArgument(f"{what} must be finite, got {ttl!r}")
    if seconds <= 0:
        raise InvalidArgument(f"{what} must be positive, got {ttl!r}")
    if seconds < MIN_TTL:
        raise InvalidArgument(
            f"{what} {ttl!r} is too short for the renewer to keep the lock alive; "
            f"the minimum is {MIN_TTL} s"
        )
    return seconds


def check_wait(wait: object) -> float:
    """A wait in seconds: 0 means do not wait, ``math.inf`` waits without limit."""
    seconds = _number(wait, "wait")
    if math.isnan(seconds):
        raise InvalidArgument("wait must be a number of seconds, got nan")
    if seconds < 0:
        raise InvalidArgument(f"wait must not be negative, got {wait!r}")
    return seconds


def check_count(value: object, what: str) -> int:
    """A bound such as ``threads=`` or ``waiters=``: a whole number from 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a whole number from 1, got {value!r}")
    return value
