"""Waiting for a MySQL/MariaDB lease: MySQL has no LISTEN/NOTIFY, so a short bounded poll.

A waiter reads how long the current lease has left and sleeps until the
sooner of its expiry and ``POLL`` seconds, then reads again; a release made
in this process (by any store on the same database and prefix) wakes it at
once. Only the first waiter of a name in a process waits on the store (the
core's line serves the rest in turn), so a process polls each name it waits
for at most every ``POLL`` seconds however many wait: a handoff to a waiter
in another process takes up to ``POLL``, ``POLL / 2`` on average.
"""

from __future__ import annotations

import time

from ..semaphores import local_changes, wake_local
from .transport import Transport

__all__ = ("POLL", "Waiting")

POLL = 0.02
"""Seconds between two reads of a held lease by its waiting process."""

_LOCK = "\x1flock\x1f"
"""What this process's lock wake-ups are keyed by, beside the name (semaphores use theirs)."""


class Waiting:
    """``wait_released`` of one store (see the module docstring)."""

    def __init__(self, transport: Transport, remaining_sql: str, data_key: str) -> None:
        self.transport = transport
        self.remaining_sql = remaining_sql
        self.data_key = data_key

    async def wait_released(self, name: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        async with local_changes(self.data_key, _LOCK + name) as changes:
            while True:
                rows = await self.transport.query(self.remaining_sql, (name,))
                if not rows or rows[0][0] is None:
                    return  # free, or expired
                left = end - time.monotonic()
                if left <= 0:
                    return
                await changes.wait(min(left, max(float(rows[0][0]), 0.001), POLL))

    def released(self, name: str) -> None:
        """A lease of ``name`` was released here: wake this process's waiters."""
        wake_local(self.data_key, _LOCK + name)
