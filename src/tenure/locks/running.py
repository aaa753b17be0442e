"""Running a function under a lock: run_exclusively and run_under, the loss
that cancels async work, and the worker thread that runs plain functions.

These are ``LockService`` methods (bound there), kept here as one concern.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _validate
from .._aio import is_async, settle, shielded
from .._threads import PoolFull, WorkerPool
from ..errors import InvalidArgument
from .lock import Lock, as_current

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("Outcome", "run_exclusively", "run_under")

log = logging.getLogger("tenure")


class Outcome(enum.StrEnum):
    """What ``run_exclusively`` did."""

    RAN = "ran"
    SKIPPED = "skipped"


async def run_exclusively(
    self: LockService,
    name: str,
    fn: Callable[..., Any],
    *args: Any,
    ttl: float = _validate.DEFAULT_TTL,
    **kwargs: Any,
) -> Outcome:
    """Run ``fn(*args, **kwargs)`` under the lock ``name``, or skip if it is held.

    Returns Outcome.RAN after ``fn`` completed (an exception from ``fn``
    propagates after the release) and Outcome.SKIPPED, without calling
    ``fn``, on contention. If the lock is lost while an async ``fn`` runs,
    ``fn`` is cancelled and LockLost is raised. A plain function runs in a
    worker thread, which cannot be cancelled: LockLost is raised when it
    returns, and ``current_lock().held`` lets it check as it goes.
    """
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {fn!r}")
    if not is_async(fn) and self.threads.full():
        raise PoolFull(f"run_exclusively({name!r}): thread pool full: {self.threads.describe()}")
    lock = await self.acquire(name, ttl=ttl)
    if lock is None:
        log.debug("run_exclusively(%r): held elsewhere, skipped", name)
        return Outcome.SKIPPED
    try:
        await self.run_under(lock, fn, *args, **kwargs)
    finally:
        await shielded(self._release_quietly(lock))
    return Outcome.RAN


async def run_under(
    self: LockService,
    lock: Lock,
    fn: Callable[..., Any],
    *args: Any,
    threads: WorkerPool | None = None,
    **kwargs: Any,
) -> None:
    """Run ``fn(*args, **kwargs)`` under ``lock``, already held, as
    ``run_exclusively`` does (``current_lock()`` is ``lock``; a loss
    cancels an async ``fn`` and raises LockLost), without releasing it.
    A plain ``fn`` runs on ``threads`` (default: this service's pool)."""
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {fn!r}")
    if not isinstance(lock, Lock) or lock._service is not self:
        raise InvalidArgument(f"run_under takes a lock of this service, got {lock!r}")
    with as_current(lock):
        if is_async(fn):
            await _run_async(lock, fn, args, kwargs)
        else:
            await _run_sync(lock, fn, args, kwargs, threads or self.threads)


async def _run_async(
    lock: Lock, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    # In this task, not a task of its own: a scheduler's tick starts hundreds
    # of runs, and each function then starts as soon as its run is set up,
    # not after every other run's set-up. A loss cancels this task, as
    # asyncio.timeout does, and the cancellation is told from one of ours by
    # the task's cancel count.
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    cancels = me.cancelling()
    lost: asyncio.Future[None] = loop.create_future()
    running, cancelled = True, False

    def cancel_the_work(_: object) -> None:
        nonlocal cancelled
        if running:
            cancelled = True
            me.cancel()

    lost.add_done_callback(cancel_the_work)
    watch = _LossWatch(lock, loop, lost)
    try:
        await fn(*args, **kwargs)
    except asyncio.CancelledError:
        running = False
        if cancelled and me.uncancel() <= cancels:  # ours alone
            raise lock.loss_error() from None
        raise
    finally:
        running = False
        watch.stop()
    if cancelled:  # the function caught our cancellation and returned
        me.uncancel()
    if lock.lost:
        raise lock.loss_error()


async def _run_sync(
    lock: Lock,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    threads: WorkerPool,
) -> None:
    # The thread cannot be stopped, so the lock stays held (and renewed)
    # until it returns, even if this coroutine is cancelled meanwhile.
    call = functools.partial(fn, *args, **kwargs)
    try:
        await shielded(threads.run(call))
    except Exception as exc:
        if lock.lost:
            raise lock.loss_error() from exc
        raise
    if lock.lost:
        raise lock.loss_error()


class _LossWatch:
    """Settles ``lost`` when ``lock`` is lost: told by the renewer, or found at
    its local deadline (a timer, moved on while renewals extend it). A future
    and a timer, not a task: a scheduler's tick runs a thousand of these."""

    __slots__ = ("lease", "loop", "timer", "waiter")

    def __init__(self, lock: Lock, loop: asyncio.AbstractEventLoop, lost: asyncio.Future[None]):
        self.lease = lock._lease
        self.loop = loop
        self.waiter = (loop, lost)
        self.timer: asyncio.TimerHandle | None = None
        remaining = self.lease.add_waiter(self.waiter)
        if remaining is None:
            settle(lost)
        else:
            self.timer = loop.call_later(max(remaining, 0.0), self._check)

    def _check(self) -> None:
        if self.lease.alive():
            remaining = self.lease.deadline - time.monotonic()
            self.timer = self.loop.call_later(max(remaining, 0.0), self._check)
        else:
            settle(self.waiter[1])

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.lease.remove_waiter(self.waiter)
