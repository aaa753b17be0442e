"""URL options that several stores share: numbers, and the bound on calls in flight."""

from __future__ import annotations

from ..errors import ConfigurationError

__all__ = ("POOL_MAX", "POOL_MAX_LIMIT", "check_pool_max", "number")

POOL_MAX = 10
"""Connections (etcd: calls in flight) a store uses at most by default. A few
hundred concurrent callers queue for them (see ``_gate``) rather than opening
one each; a renewer has its own."""

POOL_MAX_LIMIT = 1000


def number(store: str, key: str, value: str, kind: type[float] | type[int]) -> float | int:
    """A URL option's text as a number; ConfigurationError naming it otherwise."""
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigurationError(
            f"{store} URL option {key} must be {what}, got {value!r}"
        ) from None


def check_pool_max(value: object, option: str = "pool_max") -> int:
    """``value`` if it is an int from 1 to ``POOL_MAX_LIMIT``; ConfigurationError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= POOL_MAX_LIMIT:
        raise ConfigurationError(
            f"{option} must be a whole number from 1 to {POOL_MAX_LIMIT}, got {value!r}"
        )
    return value
