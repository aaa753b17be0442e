"""Lock, one grant of a named lock, and current_lock: what a holder sees."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from .._aio import shielded, woken_within
from ..errors import LockLost, TenureError
from ..events import Event, EventKind
from ..lease import LOST_BY_DEADLINE, LeaseState

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("Lock", "as_current", "current_lock", "release_failed")

log = logging.getLogger("tenure")

_current: contextvars.ContextVar[Lock | None] = contextvars.ContextVar(
    "tenure_current_lock", default=None
)


def current_lock() -> Lock:
    """The lock of the innermost ``run_exclusively`` running this code.

    Works in the function itself, in tasks it starts, and in the worker thread
    of a plain function. Raises TenureError anywhere else.
    """
    lock = _current.get()
    if lock is None:
        raise TenureError("current_lock() was called outside run_exclusively")
    return lock


@contextlib.contextmanager
def as_current(lock: Lock) -> Iterator[None]:
    """Within it, :func:`current_lock` answers ``lock``: for code that runs a
    function under a lock itself (``run_under``, ``tenure.sync``)."""
    reset = _current.set(lock)
    try:
        yield
    finally:
        _current.reset(reset)


class Lock:
    """One grant of a named lock. Obtained from ``LockService.acquire``.

    Read ``name``, ``ttl``, ``fencing_token`` and ``token``. ``token`` is the
    secret (128 random bits, hex) that proves ownership to the store; it never
    appears in ``repr`` or in logs. ``fencing_token`` strictly increases with
    every grant of the name: pass it to resources that can reject stale writers.
    """

    __slots__ = ("__weakref__", "_lease", "_service", "acquired_at")

    _State: type[LeaseState] = LeaseState
    """What this grant's lease is (a semaphore's permit has its own kind)."""

    def __init__(
        self, service: LockService, name: str, token: str, ttl: float, *, sent: float, fence: int
    ) -> None:
        # What the renewer shares, in an object of its own: the renewer never
        # holds the Lock, and the Lock shows none of the renewer's fields.
        self._lease = self._State(
            name,
            token,
            ttl,
            sent,
            service._renewer.lease_guard,
            fence=fence,
            on_lost=service._lease_lost,
        )
        self._service = service
        self.acquired_at = sent
        """``time.monotonic()`` when the acquire that granted it was sent (for a
        lock a release handed over: a time no later than the hand-over)."""

    @property
    def name(self) -> str:
        return self._lease.name

    @property
    def token(self) -> str:
        """The secret that proves ownership to the store: never log it."""
        return self._lease.token

    @property
    def ttl(self) -> float:
        return self._lease.ttl

    @property
    def fencing_token(self) -> int:
        return self._lease.fence

    @property
    def held(self) -> bool:
        """True while the grant is valid by its local deadline: computed at each
        read, with no other effect (the renewer reports a loss)."""
        lease = self._lease
        return not lease.released and lease.loss is None and time.monotonic() < lease.deadline

    @property
    def held_until(self) -> float:
        """The ``time.monotonic()`` until which the grant is sure (its local
        deadline): each confirmed renewal moves it on. Work that must finish
        while the lock is held can check it has the time."""
        return self._lease.deadline

    @property
    def lost(self) -> bool:
        """True once the lock was lost (rather than released)."""
        return self.lost_reason is not None

    @property
    def lost_reason(self) -> str | None:
        """Why the lock was lost, or None."""
        lease = self._lease
        if lease.loss is None and not lease.released and time.monotonic() >= lease.deadline:
            return LOST_BY_DEADLINE
        return lease.loss

    def loss_error(self) -> LockLost:
        """The LockLost to raise for this lock's loss."""
        return LockLost(self.name, self.lost_reason or "lost")

    async def release(self) -> bool:
        """Give the lock back. True only when it was still valid, locally and in the store.

        After a loss it still removes the grant if the store has it, and returns
        False. Releasing twice returns False the second time and sends nothing.
        Raises StoreUnavailable if the store cannot be reached; the lease then
        lapses by itself within its TTL.
        """
        lease = self._lease
        if lease.released:
            return False
        was_held = self._leave()
        in_store = await self._service.store.release(lease.name, lease.token)
        if self._service._hooks.hooks:
            return self._left(was_held, in_store)
        return was_held and in_store

    def _leave(self) -> bool:
        """The local half of a release: stop renewing; whether it was still held."""
        lease = self._lease
        was_held = lease.mark_released()
        lease.say_lost()  # a loss found just before: its event precedes the release's
        service = self._service
        service._held.discard(self)
        service._renewer.discard(lease)
        return was_held

    def _left(self, was_held: bool, in_store: bool) -> bool:
        """The store's half is done: the event, and release()'s answer."""
        service = self._service
        if service._hooks.hooks:
            service._hooks.emit(
                Event(
                    EventKind.RELEASED,
                    self.name,
                    service.holder,
                    self.fencing_token,
                    seconds=time.monotonic() - self.acquired_at,
                    detail="held" if was_held and in_store else "lost",
                )
            )
        return was_held and in_store

    async def wait_lost(self) -> None:
        """Return as soon as the lock is no longer held: lost, or released."""
        loop = asyncio.get_running_loop()
        while True:
            future: asyncio.Future[None] = loop.create_future()
            waiter = (loop, future)
            remaining = self._lease.add_waiter(waiter)
            if remaining is None:
                return
            try:
                await woken_within(future, max(remaining, 0.0))
            finally:
                self._lease.remove_waiter(waiter)

    async def __aenter__(self) -> Lock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await shielded(self._service._release_quietly(self))

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost else "released")
        return f"<Lock {self.name!r} fencing_token={self.fencing_token} {state}>"


def release_failed(lock: Lock, exc: TenureError) -> None:
    """Log a release that failed in a cleanup path, where it is not raised."""
    log.warning(
        "releasing lock %r failed; it lapses by itself within %.1f s: %s", lock.name, lock.ttl, exc
    )
