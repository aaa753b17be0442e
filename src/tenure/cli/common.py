"""What the commands share: the store URL (given, or $TENURE_URL), the user's
Scheduler loaded from ``MODULE:ATTR`` (and served: ``tenure run``), and times
printed in UTC."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigurationError
from ..locks import LockService
from ..schedule import Scheduler
from ..stores import for_reading
from ..stores.runlog import RunOutcome

log = logging.getLogger("tenure.run")


def url_of(given: str | None, *, reading: bool = False) -> str:
    """The store URL: ``--url``, else $TENURE_URL. ``reading``: for a command
    that only reads, which must not create a store that is not there (a
    mistyped SQLite path would read as empty: "no lock is held")."""
    url = given or os.environ.get("TENURE_URL")
    if not url:
        raise ConfigurationError("no store URL: pass --url URL or set TENURE_URL")
    return for_reading(url) if reading else url


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


def load_scheduler(
    target: str, url: str | None, *, reading: bool = False
) -> tuple[Scheduler, LockService]:
    """The Scheduler that ``MODULE:ATTR`` names (or makes from a LockService on
    ``url``; ``reading`` as for :func:`url_of`)."""
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
        locks = LockService.from_url(url_of(url, reading=reading))
        scheduler = obj(locks)
        if not isinstance(scheduler, Scheduler):
            raise ConfigurationError(f"{target}(locks) returned {scheduler!r}, not a Scheduler")
    else:
        raise ConfigurationError(f"{target} is neither a Scheduler nor a function making one")
    return scheduler, locks


async def serve_app(target: str, url: str | None) -> int:
    """``tenure run``: serve the Scheduler until SIGINT or SIGTERM; its exit status.

    A signal stops it gracefully (runs finish, up to the scheduler's
    ``shutdown_timeout``) and says what it did: 0 after SIGTERM, a
    supervisor's ordinary way to stop a service; 130 after SIGINT (Ctrl-C),
    as a shell expects."""
    # INFO: the scheduler's line at start, and this one at stop. A no-op
    # when the application configured logging itself (at import).
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    scheduler, locks = load_scheduler(target, url)
    loop = asyncio.get_running_loop()
    stopped_by: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        scheduler.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    async with locks:
        await scheduler.serve()
    counts = scheduler.tasks.counts
    log.info(
        "stopped%s: %d task(s); %d occurrence(s) ran here, %d failed; %d running cancelled",
        f" by {stopped_by[0].name}" if stopped_by else "",
        len(scheduler.tasks),
        counts[RunOutcome.RAN],
        counts[RunOutcome.FAILED] + counts[RunOutcome.LOST],
        scheduler.cancelled,
    )
    return 130 if stopped_by and stopped_by[0] is signal.SIGINT else 0
