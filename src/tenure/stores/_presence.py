"""Which run records are abandoned: their instance's presence lease is gone.

A scheduler instance holds one lease while it runs tasks, named after its
``holder`` (``PRESENCE_PREFIX + holder``) and renewed like any other. A run
record that still says ``running`` is the record of a live run only while that
lease is live: once it has run out, the instance died (SIGKILL, OOM, a lost
host) or could not reach the store for a whole ``PRESENCE_TTL``, and the run
reads ``abandoned``. Deciding this when reading needs no write from anyone and
cannot race a run's own final record; the scheduler's prune task then stores
the outcome (only where the record still says ``running``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import RunRecord, Store

__all__ = (
    "ABANDONED",
    "PRESENCE_PREFIX",
    "PRESENCE_TTL",
    "RUNNING",
    "abandoned",
    "live_instances",
    "presence_name",
)

PRESENCE_PREFIX = "tenure.instance/"
PRESENCE_TTL = 15.0
"""Seconds: how long after its instance stopped renewing a run reads abandoned."""
RUNNING = "running"
ABANDONED = "abandoned"


def presence_name(instance: str) -> str:
    """The name of the presence lease of the instance whose holder is ``instance``."""
    return PRESENCE_PREFIX + instance


async def live_instances(store: Store) -> set[str]:
    """The holders of every live presence lease (one store call)."""
    return {
        info.name.removeprefix(PRESENCE_PREFIX)
        for info in await store.holders(PRESENCE_PREFIX)
        if info.name.startswith(PRESENCE_PREFIX)
    }


def abandoned(
    records: Sequence[RunRecord], live: Iterable[str], *, seen: float | None = None
) -> list[RunRecord]:
    """``records`` with each ``running`` one of an instance not in ``live`` as ``abandoned``.

    ``seen`` (POSIX seconds), when given, is when its presence was found gone:
    the record's ``ended``, the latest its lease can have run out.
    """
    alive = set(live)
    return [
        record
        if record.outcome != RUNNING or record.instance in alive
        else dataclasses.replace(
            record, outcome=ABANDONED, ended=seen, error=_why(record.instance, seen)
        )
        for record in records
    ]


def _why(instance: str, seen: float | None) -> str:
    by = (
        ""
        if seen is None
        else " by " + datetime.datetime.fromtimestamp(seen, datetime.UTC).isoformat()
    )
    return (
        f"its instance {instance} stopped renewing its presence lease{by}: it died "
        f"(killed, out of memory, host lost) or could not reach the store for {PRESENCE_TTL:g} s"
    )
