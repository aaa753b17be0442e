"""The ``tenure.sync.LockService`` of a Celery app in this process: one per
app and process, made at first use, on ``tenure_url`` or ``$TENURE_URL``."""

from __future__ import annotations

import os
import threading
from typing import Any

from ..errors import ConfigurationError
from ..sync import LockService

__all__ = ("locks_for", "url_for")

_services: dict[tuple[int, int], LockService] = {}
_guard = threading.Lock()


def url_for(app: Any) -> str:
    """The store URL of ``app``: its ``tenure_url`` setting, else ``$TENURE_URL``."""
    url = app.conf.get("tenure_url") or os.environ.get("TENURE_URL")
    if not isinstance(url, str) or not url:
        raise ConfigurationError(
            "no tenure store URL for this Celery app: set app.conf.tenure_url "
            f"(or the TENURE_URL environment variable), got {url!r}"
        )
    return url


def locks_for(app: Any) -> LockService:
    """This process's service for ``app`` (a new one in a forked child)."""
    key = (id(app), os.getpid())
    with _guard:
        service = _services.get(key)
        if service is None:
            service = _services[key] = LockService.from_url(url_for(app))
        return service
