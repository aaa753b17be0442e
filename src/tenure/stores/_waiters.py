"""Waiters of one process woken from one shared stream.

``Wakeups`` is for a store that learns of releases through one subscription
(one watch, one LISTEN) per process: it dispatches each to the waiters of that
name, instead of opening a subscription per waiter. (The in-process line of
callers waiting for one name is the core's: ``tenure.locks.line``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ("QUEUE_LIFE", "Wakeups")

K = TypeVar("K", bound=Hashable)

QUEUE_LIFE = 1.0
"""Seconds a waiter's entry in a store's queue (the waiter a release hands the
lease to) lives unless the waiter calls again, which it does every third of
that: how long a dead waiter can stay queued."""


class Wakeups(Generic[K]):
    """Waiters on one event loop, keyed by name (or channel): each is a future
    that the next wake-up of its key settles (``woken_within`` waits on it)."""

    def __init__(self) -> None:
        self._waiting: dict[K, set[asyncio.Future[None]]] = {}
        self._owed: dict[asyncio.Future[None], int] = {}
        """Counted futures: the wake-ups that came once each was already settled."""

    def add(
        self, key: K, instead_of: asyncio.Future[None] | None = None, *, counted: bool = False
    ) -> asyncio.Future[None]:
        """A new wake-up future for ``key`` (replacing ``instead_of``, a spent one).
        A ``counted`` waiter hears every wake-up: those that came while it was
        awake settle its next futures, one each."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, set())
        waiting.add(woken)
        owed = 0
        if instead_of is not None:
            waiting.discard(instead_of)
            owed = self._owed.pop(instead_of, 0)
            if owed:
                woken.set_result(None)
                owed -= 1
        if counted:
            self._owed[woken] = owed
        return woken

    def remove(self, key: K, woken: asyncio.Future[None]) -> None:
        self._owed.pop(woken, None)
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.discard(woken)
            if not waiting:
                del self._waiting[key]

    def wake(self, key: K) -> None:
        for woken in self._waiting.get(key, ()):
            if not woken.done():
                woken.set_result(None)
            elif woken in self._owed:
                self._owed[woken] += 1

    def wake_all(self) -> None:
        """The stream failed: every waiter looks again (a spurious wake-up)."""
        for key in list(self._waiting):
            self.wake(key)

    def __contains__(self, key: object) -> bool:
        return key in self._waiting

    def __len__(self) -> int:
        return sum(len(waiting) for waiting in self._waiting.values())
