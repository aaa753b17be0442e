"""This instance's presence lease, held while it runs scheduled tasks.

Readers call a ``running`` record ``abandoned`` once the presence lease of its
instance is gone (``stores._presence``), so an instance holds it for as long as
its service is open: taken before its first run (``serve()`` and a run by
hand wait up to ``READY_WAIT`` for it; a run record written before it would
read ``abandoned``), renewed by the service's renewer like any lock, and taken
again when it was lost (the store was out of reach for longer than its TTL).
One per LockService: its holder names the instance in every run record,
whichever of its schedulers wrote it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from ..errors import StoreUnavailable, TenureError
from ..locks import Lock, LockService
from ..stores.runlog import presence_name

__all__ = ("READY_WAIT", "Presence", "presence_of")

log = logging.getLogger("tenure.scheduler")

READY_WAIT = 2.0
"""Seconds a first run waits for the presence lease (the store may be out of reach)."""

_RETRY_FIRST = 0.05
_RETRY_MOST = 2.0

_presences: weakref.WeakKeyDictionary[LockService, Presence] = weakref.WeakKeyDictionary()


def presence_of(locks: LockService, ttl: float) -> Presence:
    """The presence of the instance ``locks`` stands for (made with ``ttl`` by its first caller)."""
    presence = _presences.get(locks)
    if presence is None:
        presence = _presences[locks] = Presence(locks, ttl)
    return presence


class Presence:
    """Keeps the lease ``presence_name(locks.holder)`` held while the service is open."""

    def __init__(self, locks: LockService, ttl: float) -> None:
        self._locks = locks
        self.ttl = ttl
        self.name = presence_name(locks.holder)
        self._lock: Lock | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._held = asyncio.Event()
        self.taken_once = False
        """Whether it was ever held: only the first runs wait for it."""

    @property
    def held(self) -> bool:
        return self._lock is not None and self._lock.held

    def keep(self) -> None:
        """Hold the lease from now on (taken in the background; returns at once)."""
        keeper = self._keeper
        if keeper is not None and not keeper.done() and keeper.get_loop().is_running():
            return
        self._held = asyncio.Event()
        if self.held:
            self._held.set()
        self._keeper = asyncio.ensure_future(self._keep())

    async def ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lease to be held; whether it is."""
        self.keep()
        if not self.held:
            try:
                async with asyncio.timeout(timeout):  # (wait_for may drop a cancel on 3.11)
                    await self._held.wait()
            except TimeoutError:
                return False
        return True

    async def taken(self) -> None:
        """Before the first run: wait up to ``READY_WAIT`` for the lease. Later
        runs do not wait, even while it is being taken again: during an
        outage every tick would stall."""
        self.keep()
        if not self.taken_once:
            await self.ready(READY_WAIT)

    async def _keep(self) -> None:
        pause = _RETRY_FIRST
        while True:
            lock = self._lock
            if lock is None or not lock.held:
                self._held.clear()
                try:
                    lock = await self._locks.acquire(self.name, ttl=self.ttl, wait=self.ttl)
                except StoreUnavailable as exc:
                    log.debug("could not take this instance's presence lease yet: %s", exc)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _RETRY_MOST)
                    continue
                except TenureError:  # the service was closed: nothing left to be present for
                    return
                if lock is None:  # an earlier grant of ours, unanswered: it lapses
                    continue
                self._lock = lock
                self.taken_once = True
                self._held.set()
                pause = _RETRY_FIRST
            await lock.wait_lost()
            if self._locks.closed:
                return
