"""The blocking API: tenure's locks for code without an event loop.

Django and Flask under gunicorn, Celery workers and plain scripts use the same
names as the asyncio API, minus ``await``::

    from tenure.sync import LockService

    locks = LockService.from_url("sqlite:///var/lib/myapp/tenure.db")
    with locks:
        outcome = locks.run_exclusively("reindex-catalog", reindex)   # 'ran' | 'skipped'
        lock = locks.acquire("export:report-42")                       # Lock | None
        if lock is not None:
            with lock:
                generate(fence=lock.fencing_token)

One source of truth: no lock logic here. Every call goes to the asyncio core
(``tenure.LockService``), on the calling thread through its one seam for it,
``LockService.direct()`` (a lock's acquire and release on every store with
plain calls, ``Store.blocking()``: no thread hop), or through one event-loop
thread per service (waits, etcd, semaphores, elections, everything else).
The core's renewer thread keeps every held lock alive whatever the calling
thread does, CPU-bound work included.

* **Threads.** A service may be used from any number of threads at once; a
  lock acquired in one thread may be released from another.
* **Loss.** A thread cannot be cancelled safely, so ``run_exclusively`` runs
  ``fn`` to its end on the calling thread and then raises ``LockLost`` if the
  lock was lost meanwhile; ``lock.held`` / ``current_lock().held`` let long
  work check as it goes, from any thread.
* **Fork.** After ``os.fork()`` (gunicorn ``--preload``, Celery prefork) the
  child neither renews nor releases the parent's locks (its Lock objects say
  ``lost``, with the reason); it opens connections of its own at its next call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from . import _validate
from . import locks as _core
from ._aio import is_async
from ._portal import Portal
from .errors import (
    ConfigurationError,
    InvalidArgument,
    LimitMismatch,
    LockLost,
    StoreUnavailable,
    TenureError,
    WaitQueueFull,
)
from .events import Hook, RunWrapper
from .locks import WAITERS, Outcome
from .stores.audit import ForcedRelease
from .stores.base import Store

__all__ = (
    "ConfigurationError",
    "Election",
    "InvalidArgument",
    "LimitMismatch",
    "Lock",
    "LockLost",
    "LockService",
    "Outcome",
    "Scheduler",
    "Semaphore",
    "StoreUnavailable",
    "TenureError",
    "Term",
    "WaitQueueFull",
    "current_lock",
    "current_run",
)

T = TypeVar("T")

log = logging.getLogger("tenure")


_current: contextvars.ContextVar[Lock | None] = contextvars.ContextVar(
    "tenure_sync_current_lock", default=None
)


def current_lock() -> Lock:
    """The lock of the innermost blocking ``run_exclusively`` running this code."""
    lock = _current.get()
    if lock is None:
        raise TenureError("current_lock() was called outside run_exclusively")
    return lock


class Lock:
    """One grant of a named lock, for blocking code. From ``LockService.acquire``.

    The same attributes as the asyncio ``tenure.Lock``: ``name``, ``ttl``,
    ``token`` (the secret, never shown), ``fencing_token``, ``held``, ``lost``,
    ``lost_reason``; ``release()`` and ``with lock:`` block instead of awaiting.
    """

    __slots__ = ("_lock", "_service")

    def __init__(self, service: LockService, lock: _core.Lock) -> None:
        self._service = service
        self._lock = lock

    @property
    def name(self) -> str:
        return self._lock.name

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def token(self) -> str:
        return self._lock.token

    @property
    def fencing_token(self) -> int:
        return self._lock.fencing_token

    @property
    def held(self) -> bool:
        """True while the grant is valid by its local deadline; safe from any thread."""
        return self._lock.held

    @property
    def held_until(self) -> float:
        """The ``time.monotonic()`` until which the grant is sure (see ``tenure.Lock``)."""
        return self._lock.held_until

    @property
    def lost(self) -> bool:
        return self._lock.lost

    @property
    def lost_reason(self) -> str | None:
        return self._lock.lost_reason

    def release(self) -> bool:
        """Give the lock back: True only when it was still valid, locally and in the store."""
        direct = self._service._direct
        if direct is not None:
            return direct.release(self._lock)
        return self._service._portal.call(self._lock.release())

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lock is no longer held (lost or released), or ``timeout``.

        Returns True when it is no longer held.
        """

        async def wait() -> None:
            await asyncio.wait_for(self._lock.wait_lost(), timeout)

        try:
            self._service._portal.call(wait())
        except TimeoutError:
            return False
        return True

    def __enter__(self) -> Lock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        direct = self._service._direct
        if direct is not None:
            direct.release(self._lock, quietly=True)
        else:
            self._service._portal.call(self._lock.__aexit__(None, None, None))

    def __repr__(self) -> str:
        return repr(self._lock)


class LockService:
    """Acquires named locks and keeps them renewed, for blocking code.

    ``with LockService.from_url(url) as locks:`` starts the renewer and, on
    exit, releases every lock still held and closes the store. See the module
    docstring for threads, loss and fork.
    """

    def __init__(self, store: Store, *, holder: str | None = None, waiters: int = WAITERS) -> None:
        _validate.check_count(waiters, "waiters")
        self._serve(_core.LockService(store, holder=holder, waiters=waiters))

    def _serve(self, core: _core.LockService) -> None:
        self._core = core
        self._direct = core.direct()
        self._portal = Portal()
        _live.add(self)

    @classmethod
    def from_url(
        cls, url: str, *, holder: str | None = None, waiters: int = WAITERS
    ) -> LockService:
        """A service on the store a URL names (the same URLs as the asyncio API),
        which it closes when it closes."""
        service = cls.__new__(cls)
        service._serve(_core.LockService.from_url(url, holder=holder, waiters=waiters))
        return service

    @property
    def store(self) -> Store:
        return self._core.store

    @property
    def core(self) -> _core.LockService:
        """The asyncio service this one drives (one core for both APIs): what
        ``tenure.sync.Scheduler`` schedules on, on this service's loop thread."""
        return self._core

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on this service's loop thread (where ``core`` lives)
        and return at once; its future says how it ended."""
        return self._portal.submit(coro)

    @property
    def holder(self) -> str:
        return self._core.holder

    def subscribe(self, hook: Hook) -> Callable[[], None]:
        """Call ``hook(event)`` for every event of this service (see ``tenure.events``);
        returns the function that unsubscribes it."""
        return self._core.subscribe(hook)

    def wrap_runs(self, wrapper: RunWrapper) -> Callable[[], None]:
        """``tenure.LockService.wrap_runs``: ``wrapper(run)`` around each scheduled run."""
        return self._core.wrap_runs(wrapper)

    def __enter__(self) -> LockService:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the renewer thread (idempotent); the first acquire also does."""
        self._core.start()

    def close(self) -> None:
        """Release every lock still held, stop the renewer and the loop thread."""
        try:
            self._portal.call(self._core.close())
        finally:
            self._portal.stop()

    def waiting(self, name: str) -> int:
        """Callers of this service waiting for ``name``, in line (as the asyncio one)."""

        return self._portal.call(_answer(self._core.waiting, name))  # on the loop thread

    def force_release(
        self, name: str, *, operator: str | None = None, reason: str | None = None
    ) -> ForcedRelease | None:
        """Free ``name`` whoever holds it and leave an audit record (as the asyncio one)."""
        return self._portal.call(self._core.force_release(name, operator=operator, reason=reason))

    def acquire(
        self, name: str, *, ttl: float = _validate.DEFAULT_TTL, wait: float = 0.0
    ) -> Lock | None:
        """The lock ``name``, or None when it is held elsewhere.

        As the asyncio ``acquire``: returns at once on contention unless
        ``wait`` seconds are given, woken by the release itself.
        """
        if wait == 0 and self._direct is not None:
            # On this thread, no coroutine; the seam checks wait as acquire does
            # (False equals 0, and is refused there).
            lock = self._direct.acquire(name, ttl=ttl, wait=wait)
        else:
            # Waiting needs the store's waiters, which live on the loop thread.
            lock = self._portal.call(self._core.acquire(name, ttl=ttl, wait=wait))
        return None if lock is None else Lock(self, lock)

    def semaphore(self, name: str, limit: int) -> Semaphore:  # see tenure.Semaphore
        return Semaphore(self, self._core.semaphore(name, limit))

    def election(self, name: str, **callbacks: Callable[..., Any] | None) -> Election:
        """The election ``name`` (``on_elected=``, ``on_revoked=``: see tenure.Election);
        ``serve()`` calls them on the thread that called it."""
        return Election(self, name, **callbacks)

    def run_exclusively(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        ttl: float = _validate.DEFAULT_TTL,
        **kwargs: Any,
    ) -> Outcome:
        """Run ``fn(*args, **kwargs)`` on this thread under the lock ``name``, or skip.

        Returns Outcome.RAN after ``fn`` returned (an exception from ``fn``
        propagates after the release) and Outcome.SKIPPED, without calling
        ``fn``, on contention. If the lock was lost while ``fn`` ran, LockLost
        is raised once it returns.
        """
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, got {fn!r}")
        if is_async(fn):
            raise InvalidArgument(
                f"{fn!r} is an async function; run it with tenure.LockService (asyncio)"
            )
        lock = self.acquire(name, ttl=ttl)
        if lock is None:
            log.debug("run_exclusively(%r): held elsewhere, skipped", name)
            return Outcome.SKIPPED
        return self.run_holding(lock, fn, args, kwargs)

    def run_holding(
        self, lock: Lock, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Outcome:
        """Run ``fn`` on this thread under ``lock`` (held), release it, raise
        LockLost if it was lost meanwhile: ``run_exclusively``'s second half."""
        # Both current_lock()s answer inside fn: this module's gives the blocking
        # Lock, tenure.current_lock() the asyncio one behind it.
        reset = _current.set(lock)
        try:
            with _core.as_current(lock._lock):
                fn(*args, **kwargs)
        except Exception as exc:
            if lock.lost:
                raise lock._lock.loss_error() from exc
            raise
        finally:
            _current.reset(reset)
            lock.__exit__(None, None, None)
        if lock.lost:
            raise lock._lock.loss_error()
        return Outcome.RAN

    def exclusive(
        self, name: str | None = None, *, ttl: float = _validate.DEFAULT_TTL
    ) -> Callable[[Callable[..., Any]], Callable[..., Outcome]]:
        """Decorate a function so that each call runs it through ``run_exclusively``.

        The decorated function returns the Outcome (``'ran'`` or
        ``'skipped'``), not ``fn``'s own result: a call that was skipped has
        none. ``name`` defaults to the function's ``module.qualname``.
        """
        ttl = _validate.check_ttl(ttl)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Outcome]:
            lock_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
            _validate.check_name(lock_name)

            @functools.wraps(fn)
            def exclusively(*args: Any, **kwargs: Any) -> Outcome:
                return self.run_exclusively(lock_name, fn, *args, ttl=ttl, **kwargs)

            return exclusively

        return decorate


async def _answer(fn: Callable[[str], T], name: str) -> T:
    return fn(name)


_live: weakref.WeakSet[LockService] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The loop thread is the parent's; the child starts its own when needed.
    for service in list(_live):
        service._portal = Portal()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# The scheduler for blocking code lives with the asyncio one; it only needs
# this module at run time, so it is imported last.
from .locks.blocking import Election, Semaphore, Term  # noqa: E402
from .schedule.blocking import BlockingScheduler as Scheduler  # noqa: E402
from .schedule.runs import current_run  # noqa: E402
