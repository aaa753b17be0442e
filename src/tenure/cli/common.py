"""What the commands share: the store URL (given, or $TENURE_URL), the user's
Scheduler loaded from ``MODULE:ATTR`` (and served: ``tenure run``), and times
printed in UTC."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigurationError
from ..locks import LockService
from ..schedule import Scheduler


def url_of(given: str | None) -> str:
    url = given or os.environ.get("TENURE_URL")
    if not url:
        raise ConfigurationError("no store URL: pass --url URL or set TENURE_URL")
    return url


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def load_target(target: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(
            f"expected MODULE:ATTR (like myapp.cron:scheduler), got {target!r}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def load_scheduler(target: str, url: str | None) -> tuple[Scheduler, LockService]:
    """The Scheduler that ``MODULE:ATTR`` names (or makes from a LockService on ``url``)."""
    obj = load_target(target)
    if isinstance(obj, Scheduler):
        if url is not None:
            raise ConfigurationError(
                f"{target} is a Scheduler that already has its store; drop --url, or point "
                "at a function that takes a LockService and returns a Scheduler"
            )
        scheduler = obj
        locks = obj.locks
    elif callable(obj):
        locks = LockService.from_url(url_of(url))
        scheduler = obj(locks)
        if not isinstance(scheduler, Scheduler):
            raise ConfigurationError(f"{target}(locks) returned {scheduler!r}, not a Scheduler")
    else:
        raise ConfigurationError(f"{target} is neither a Scheduler nor a function making one")
    return scheduler, locks


async def serve_app(target: str, url: str | None) -> None:
    scheduler, locks = load_scheduler(target, url)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, scheduler.stop)
    async with locks:
        await scheduler.serve()
