"""URL options every store shares: parsing them, masking secrets, and the bound on calls in flight.

A store declares the options it takes (name -> kind) and :func:`options`
reads them from the URL's query, each converted to its kind, with one message
form for a bad value; the options it does not know are its driver's (Redis,
PostgreSQL) or an error naming the known ones (SQLite, etcd). :func:`mask`
makes any URL safe to show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from ..errors import ConfigurationError

__all__ = (
    "POOL_MAX",
    "POOL_MAX_LIMIT",
    "check_pool_max",
    "check_timeout",
    "mask",
    "number",
    "options",
)

POOL_MAX = 10
"""Connections (etcd: calls in flight) a store uses at most by default. A few
hundred concurrent callers queue for them (see ``_gate``) rather than opening
one each; a renewer has its own."""

POOL_MAX_LIMIT = 1000

_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")


def number(store: str, key: str, value: str, kind: type[float] | type[int]) -> float | int:
    """A URL option's text as a number; ConfigurationError naming it otherwise."""
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigurationError(
            f"{store} URL option {key} must be {what}, got {value!r}"
        ) from None


def _flag(key: str, value: str) -> bool:
    if value.lower() not in (*_TRUE, *_FALSE):
        raise ConfigurationError(f"{key} must be true or false, got {value!r}")
    return value.lower() in _TRUE


def options(
    store: str, query: str, known: Mapping[str, type[Any]], *, others: bool
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The options of a URL's ``query`` that ``known`` names, each as its kind
    (``str``, ``int``, ``float`` or ``bool``: true/yes/1, false/no/0), and
    the rest in order. With ``others`` False, an unknown option is a
    ConfigurationError listing the known ones."""
    found: dict[str, Any] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        kind = known.get(key)
        if kind is None:
            if not others:
                raise ConfigurationError(
                    f"unknown {store} URL option {key!r}; known: {', '.join(sorted(known))}"
                )
            rest.append((key, value))
        elif kind is bool:
            found[key] = _flag(key, value)
        elif kind is int or kind is float:
            found[key] = number(store, key, value, kind)
        else:
            found[key] = value
    return found, rest


def mask(url: str) -> str:
    """The URL with any password replaced, safe to put in a message: the one
    before the host and a ``password=`` query option (redis-py and libpq take
    both), or any other ending in ``password`` (``sentinel_password=``)."""
    base, mark, query = url.partition("?")
    if mark:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower().endswith("password") for key, _ in pairs):
            masked = [(k, "***" if k.lower().endswith("password") else v) for k, v in pairs]
            query = urlencode(masked, safe="*/")
    parts = urlsplit(base)
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        # Spliced, not urlunsplit: that writes unix:///path back as unix:/path.
        base = base.replace(parts.netloc, f"{user}:***@{netloc}", 1)
    return f"{base}{mark}{query}"


def check_pool_max(value: object, option: str = "pool_max") -> int:
    """``value`` if it is an int from 1 to ``POOL_MAX_LIMIT``; ConfigurationError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= POOL_MAX_LIMIT:
        raise ConfigurationError(
            f"{option} must be a whole number from 1 to {POOL_MAX_LIMIT}, got {value!r}"
        )
    return value


def check_timeout(value: object, option: str = "timeout") -> float:
    """``value`` as seconds if it is a number in (0, 3600]; ConfigurationError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ConfigurationError(f"{option} must be between 0 and 3600 seconds, got {value!r}")
    return float(value)
