"""Waiting for a held lock: in this process's line first, then on the store
(its release notification, or its queue that a release hands the lease to)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from .._aio import shielded
from .._tokens import new_token
from ..lease import handover_lease, safety_margin
from ..stores.base import HandsOver
from .lock import Lock

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("acquire_waiting",)


async def acquire_waiting(service: LockService, name: str, ttl: float, wait: float) -> Lock | None:
    """``LockService.acquire`` with a ``wait``: in this process's line, then on the store."""
    if wait == 0:
        return await service._try_acquire(name, ttl)
    line = service._line
    handed_over = isinstance(service.store, HandsOver)
    if not handed_over and not line.waiting(name):
        lock = await service._try_acquire(name, ttl)
        if lock is not None:
            return lock
    deadline = time.monotonic() + wait
    turn = line.join(name)
    try:
        if not turn.done():
            left = deadline - time.monotonic()
            await asyncio.wait((turn,), timeout=None if left == math.inf else max(left, 0))
            if not turn.done():
                return None
        # First in line. The caller before has the lock now (or gave up):
        # the store's wait says at once when the name is free after all.
        if handed_over:
            return await _acquire_handed_over(service, name, ttl, deadline)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            line.store_waits += 1
            await service.store.wait_released(name, min(remaining, 3600.0))
            lock = await service._try_acquire(name, ttl)
            if lock is not None:
                return lock
    finally:
        line.leave(name, turn)


async def _acquire_handed_over(
    service: LockService, name: str, ttl: float, deadline: float
) -> Lock | None:
    """Wait in the store's queue: a release hands the lock over in the same step."""
    while True:
        token = new_token()
        service._line.store_waits += 1
        assert isinstance(service.store, HandsOver)
        got = await service.store.acquire_waiting(
            name,
            token,
            ttl,
            service.holder,
            timeout=max(deadline - time.monotonic(), 0.0),
            handover=handover_lease(ttl),
        )
        if got is None:
            return None
        # The lease is sure for got.lease seconds from got.sent: as if an
        # acquire for the whole TTL had been sent earlier. The same local
        # deadline, and a renewal due at once when it is a short hand-over.
        sent = got.sent + got.lease - ttl
        if time.monotonic() < sent + ttl - safety_margin(ttl):
            lock = service._granted(name, token, ttl, sent, got.grant)
            assert lock is not None
            lock.acquired_at = got.sent
            return lock
        # Handed over while this waiter could not run (a blocked loop, a
        # stopped process) for longer than the hand-over lease is trusted:
        # never return a lock that may be gone. Give it back; wait on.
        await shielded(service.store.release(name, token))
        if time.monotonic() >= deadline:
            return None
