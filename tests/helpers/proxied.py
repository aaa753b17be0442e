"""A store of the tests' Redis or PostgreSQL server, reached directly and through a fault proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from ..conftest import postgres_server, redis_server
from ..faults.proxy import Proxy


@contextmanager
def proxied(store: str, timeout: float = 0.5) -> Iterator[tuple[str, str, Proxy]]:
    """``(direct URL, URL through the proxy, proxy)`` on a fresh prefix; calls time out
    after ``timeout`` seconds. ``store`` is ``redis`` or ``postgres``."""
    prefix = f"t{uuid.uuid4().hex[:12]}"
    if store == "redis":
        direct = f"{redis_server().url}?prefix={prefix}&socket_timeout={timeout}"
    else:
        direct = f"{postgres_server().url()}?prefix={prefix}&timeout={timeout}"
    port = int(direct.split("://", 1)[1].split("/")[0].rsplit(":", 1)[1])
    proxy = Proxy(port)
    try:
        yield direct, direct.replace(f":{port}/", f":{proxy.port}/"), proxy
    finally:
        proxy.close()
