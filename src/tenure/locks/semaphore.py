"""Semaphores: at most ``limit`` holders of a name across every process.

A permit is a ``Lock`` in all but its store calls: the same local deadline,
loss, renewal by the service's one renewer, ``wait_lost`` and context
manager; its acquire, release and renewal go to ``store.semaphores`` (the
rules are in ``tenure.stores.semaphores``). Waiters queue in the store, so a
freed permit goes to the longest-waiting caller of any process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _validate
from .._aio import shielded
from .._tokens import new_token
from ..errors import InvalidArgument, StoreUnavailable, TenureError
from ..lease import LeaseState
from ..stores.base import Grant
from ..stores.semaphores import Changes, SemaphoreState
from .lock import Lock
from .running import Outcome

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("Permit", "PermitState", "Semaphore", "check_limit")

log = logging.getLogger("tenure")

QUEUE_LIFE = 1.0
"""Seconds a waiter's entry in a semaphore's queue lives unless the waiter
calls again, which it does every third of that (sooner when a release wakes
it): how long a waiter that died keeps its place."""


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument(f"a semaphore's limit must be a whole number from 1, got {limit!r}")
    return limit


class PermitState(LeaseState):
    """A permit's lease: the renewer renews it through ``store.semaphores``."""

    __slots__ = ()


class Permit(Lock):
    """One permit of a :class:`Semaphore`: the ``Lock`` surface (``held``,
    ``lost``, ``fencing_token``, ``release()``, ``wait_lost()``, ``async with``).
    Its fencing token is larger than every earlier permit's of the semaphore."""

    __slots__ = ()

    _State = PermitState

    async def release(self) -> bool:
        """Give the permit back: True only when it was still valid, locally and
        in the store; a stale release changes nothing (compare-and-set)."""
        lease = self._lease
        if lease.released:
            return False
        was_held = self._leave()
        in_store = await self._service.store.semaphores.release(lease.name, lease.token)
        return was_held and in_store

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost else "released")
        return f"<Permit of {self.name!r} fencing_token={self.fencing_token} {state}>"


class Semaphore:
    """A cluster-wide limit: at most ``limit`` permits of ``name`` at once.

    From ``LockService.semaphore(name, limit)``. Semaphores have a namespace
    of their own: a lock of the same name is another thing. Every caller must
    ask the same ``limit`` while the semaphore has a permit or a waiter
    (``LimitMismatch`` otherwise); once it is idle, the next caller's holds.
    """

    __slots__ = ("limit", "name", "service")

    def __init__(self, service: LockService, name: str, limit: int) -> None:
        self.service = service
        self.name = _validate.check_name(name, "semaphore name")
        self.limit = check_limit(limit)

    async def acquire(
        self, *, ttl: float = _validate.DEFAULT_TTL, wait: float = 0.0
    ) -> Permit | None:
        """A permit, or None when all ``limit`` are held (after ``wait`` seconds,
        if given: ``math.inf`` waits without limit). Waiters are served in the
        order they queued, across processes. Raises StoreUnavailable when the
        store cannot be reached, LimitMismatch as the class says."""
        service = self.service
        ttl, wait = service._admit(self.name, ttl, wait)
        token = new_token()
        if not wait:
            return await self._attempt(token, ttl, 0.0)
        deadline = time.monotonic() + wait
        permits = service.store.semaphores
        done = False
        try:
            async with permits.changes(self.name) as changes:
                changes.follow(token)
                while True:
                    permit = await self._attempt(token, ttl, QUEUE_LIFE, changes)
                    if permit is not None:
                        done = True
                        return permit
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    # Back before the queue entry lapses, at the latest.
                    await changes.wait(min(remaining, QUEUE_LIFE / 3))
        finally:
            if not done:
                await self._withdraw(token)

    async def _attempt(
        self, token: str, ttl: float, queue: float, changes: Changes | None = None
    ) -> Permit | None:
        service = self.service
        sent = time.monotonic()
        try:
            answer = await service.store.semaphores.acquire(
                self.name, token, ttl, service.holder, self.limit, queue=queue
            )
        except (asyncio.CancelledError, StoreUnavailable):
            if not queue:  # a waiter withdraws in acquire's finally
                await self._withdraw(token)
            raise
        if not isinstance(answer, Grant):
            if answer is not None and changes is not None:
                changes.queued(answer.ahead)
            return None
        permit = Permit(service, self.name, token, ttl, sent=sent, fence=answer.fencing_token)
        service._held.add(permit)
        service._renewer.add(permit._lease)
        return permit

    async def _withdraw(self, token: str) -> None:
        """Take back whatever ``token`` may have in the store (a queue entry, a
        permit whose answer was lost): it would otherwise lapse by itself."""
        try:
            await shielded(self.service.store.semaphores.release(self.name, token))
        except TenureError as exc:
            log.debug(
                "withdrawing from semaphore %r failed; what it left lapses by itself: %s",
                self.name,
                exc,
            )

    async def run_exclusively(
        self, fn: Callable[..., Any], *args: Any, ttl: float = _validate.DEFAULT_TTL, **kwargs: Any
    ) -> Outcome:
        """Run ``fn(*args, **kwargs)`` under a permit if one is free, else skip:
        ``LockService.run_exclusively``'s rules (an async ``fn`` is cancelled
        when the permit is lost, LockLost is raised), with a permit."""
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, got {fn!r}")
        permit = await self.acquire(ttl=ttl)
        if permit is None:
            return Outcome.SKIPPED
        try:
            await self.service.run_under(permit, fn, *args, **kwargs)
        finally:
            await shielded(self.service._release_quietly(permit))
        return Outcome.RAN

    async def state(self) -> SemaphoreState:
        """The store's view: the live limit, the permits (never their tokens)
        and how many wait."""
        return await self.service.store.semaphores.state(self.name)

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit={self.limit}>"
