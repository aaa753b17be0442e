"""Stores, chosen by URL scheme.

The registry maps a scheme to ``"module:Class"``; a store's module (and so its
driver) is imported only when a URL with its scheme is opened, so the core
imports cleanly with no optional driver installed. Each store class offers
``from_url(url)``.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ._options import mask as mask_url
from .base import Grant, LeaseInfo, RenewItem, Store

__all__ = (
    "Grant",
    "LeaseInfo",
    "RenewItem",
    "Store",
    "for_reading",
    "from_url",
    "known_schemes",
    "mask_url",
    "store_class",
)

# scheme -> (module, class, the extra that installs its driver or None)
_REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "memory": ("tenure.stores.memory", "MemoryStore", None),
    "sqlite": ("tenure.stores.sqlite", "SQLiteStore", None),
    "redis": ("tenure.stores.redis", "RedisStore", "redis"),
    "rediss": ("tenure.stores.redis", "RedisStore", "redis"),
    "redis+sentinel": ("tenure.stores.redis", "RedisStore", "redis"),
    "unix": ("tenure.stores.redis", "RedisStore", "redis"),
    "postgresql": ("tenure.stores.postgres", "PostgresStore", "postgres"),
    "postgres": ("tenure.stores.postgres", "PostgresStore", "postgres"),
    "etcd": ("tenure.stores.etcd", "EtcdStore", "etcd"),
    "mysql": ("tenure.stores.mysql", "MySQLStore", "mysql"),
    "mariadb": ("tenure.stores.mysql", "MySQLStore", "mysql"),
}


def known_schemes() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def from_url(url: str) -> Store:
    """Open the store a URL names. Raises ConfigurationError for a bad URL."""
    return store_class(url).from_url(url)


def for_reading(url: str) -> str:
    """The URL as read-only tools open it: storage that is not there (a
    mistyped SQLite path) is a ConfigurationError, never created empty. See
    :meth:`Store.for_reading`."""
    return store_class(url).for_reading(url)


def store_class(url: str) -> type[Store]:
    """The class of the store a URL names, opening nothing (its driver is
    imported). Raises ConfigurationError for an unknown scheme or a missing
    driver."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a store URL must be a str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme.lower() if ":" in url else ""
    entry = _REGISTRY.get(scheme)
    if entry is None:
        raise ConfigurationError(
            f"unknown store URL scheme {scheme!r} in {mask_url(url)!r}; "
            f"known schemes: {', '.join(known_schemes())}"
        )
    module_name, class_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {scheme!r} store needs a driver that is not installed ({exc.name}); "
            f"install it with: pip install 'tenure[{extra}]'"
        ) from exc
    found: type[Store] = getattr(module, class_name)
    return found
