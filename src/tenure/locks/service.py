"""LockService: acquires named locks from one store, keeps them renewed, and
releases what it still holds when it closes; no store-specific code."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .. import _validate
from .._aio import shielded
from .._threads import THREAD_QUEUE, THREADS, WorkerPool
from .._unanswered import Unanswered
from ..errors import StoreUnavailable, TenureError
from ..events import Event, EventKind, Hook, Hooks, RunWrapper, RunWrappers
from ..lease import LeaseState
from ..renewer import Renewer
from ..stores import from_url as store_from_url
from ..stores.base import Grant, Store
from . import forcing, many, running
from .direct import Direct
from .election import Election, Term
from .line import WAITERS, Line
from .lock import Lock, release_failed
from .semaphore import Semaphore
from .waiting import acquire_waiting

__all__ = ("LockService",)


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class LockService:
    """Acquires named locks from one store and keeps them renewed.

    ``async with LockService.from_url(url) as locks:`` starts the renewer and,
    on exit, releases every lock still held and closes the store. The renewer
    also starts by itself at the first acquire. A service made from a URL owns
    its store; a store passed to the constructor stays the caller's to close.
    """

    def __init__(
        self,
        store: Store,
        *,
        holder: str | None = None,
        threads: int = THREADS,
        thread_queue: int = THREAD_QUEUE,
        waiters: int = WAITERS,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(
                f"LockService needs a tenure Store, got {type(store).__name__}; "
                "use LockService.from_url(url) to open one from a URL"
            )
        self.threads = WorkerPool(threads, thread_queue)
        """The threads ``run_exclusively`` runs plain functions on: ``threads`` at
        once, ``thread_queue`` more waiting; past that it raises PoolFull."""
        self._line = Line(waiters)
        self._unanswered = Unanswered(self._give_back)
        self.store = store
        self.holder = holder if holder is not None else _holder_id()
        self._owns_store = False
        self._hooks = Hooks()
        self.run_wrappers = RunWrappers()
        """What ``wrap_runs`` added; the scheduler enters them around each run."""
        self._renewer = Renewer(store, self._renewal_failed)
        self._held: set[Lock] = set()
        self._closed = False
        self._start_guard = threading.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._forked = False
        _live.add(self)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        holder: str | None = None,
        threads: int = THREADS,
        thread_queue: int = THREAD_QUEUE,
        waiters: int = WAITERS,
    ) -> LockService:
        """A service on the store a URL names; see ``tenure.stores`` for the schemes."""
        # Bad numbers fail before the store opens.
        _validate.check_count(threads, "threads")
        _validate.check_count(thread_queue, "thread_queue")
        _validate.check_count(waiters, "waiters")
        service = cls(
            store_from_url(url),
            holder=holder,
            threads=threads,
            thread_queue=thread_queue,
            waiters=waiters,
        )
        service._owns_store = True
        return service

    @property
    def renewer(self) -> Renewer:
        return self._renewer

    def subscribe(self, hook: Hook) -> Callable[[], None]:
        """Call ``hook(event)`` for every event of this service (see ``tenure.events``);
        returns the function that unsubscribes it."""
        return self._hooks.add(hook)

    def wrap_runs(self, wrapper: RunWrapper) -> Callable[[], None]:
        """Enter ``wrapper(run)``, a context manager, around the function of
        every run of a scheduled task on this service (``run``: its
        ``CurrentRun``), in the run's own context: what it makes current (a
        tracing span) is current in the task function and in what that starts.
        The function's exception passes through it; a wrapper that fails is
        logged and left out. Returns the function that removes it."""
        return self.run_wrappers.add(wrapper)

    @property
    def observed(self) -> bool:
        """Whether any hook is subscribed: an event need not be made otherwise."""
        return bool(self._hooks.hooks)

    def emit(self, event: Event) -> None:
        """Give ``event`` to every subscribed hook: for what is built on this
        service (a scheduler's tasks, a forced release) to report through it."""
        self._hooks.emit(event)

    def _lease_lost(self, lease: LeaseState, reason: str) -> None:
        if self._hooks.hooks:
            self._hooks.emit(
                Event(EventKind.LOST, lease.name, self.holder, lease.fence, detail=reason)
            )

    def _renewal_failed(self, count: int, exc: Exception) -> None:
        if self._hooks.hooks:
            self._hooks.emit(
                Event(EventKind.RENEWAL_FAILED, "", self.holder, count=count, detail=repr(exc))
            )

    async def __aenter__(self) -> LockService:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await shielded(self.close())

    def start(self) -> None:
        """Start the renewer thread (idempotent)."""
        if self._closed:
            raise TenureError("this LockService is closed; make a new one")
        if self._forked:
            self._reconnect()
        with self._start_guard:
            self._renewer.start()

    def _after_fork(self) -> None:
        """In a forked child (no I/O here): forget the parent's grants and threads.

        The child neither renews nor releases the locks the parent holds, and
        its Lock objects say they are not held. Its store connections and
        renewer thread belong to the parent; the next use reconnects.
        """
        for lock in self._held:
            lock._lease.abandon_in_fork()
        # Kept, never freed: freeing the parent's tasks and futures here would
        # finalize what they hold, and a gRPC object finalized in a forked
        # child crashes it (a segfault, seen with etcd's give-backs).
        _INHERITED.extend((self._held, self._background, self._unanswered.clear()))
        self._held = set()
        self._background = set()
        self._start_guard = threading.Lock()
        self._forked = True

    def _reconnect(self) -> None:
        """After a fork: a store of the child's own, and a renewer of its own."""
        with self._start_guard:
            if not self._forked:
                return
            # The inherited store is the parent's; it is left alone, not closed.
            self.store = self.store.sibling()
            self._owns_store = True
            self._renewer = Renewer(self.store, self._renewal_failed)
            self._forked = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: nothing can be acquired any more."""
        return self._closed

    async def close(self) -> None:
        """Release every lock still held, stop the renewer, close an owned store."""
        if self._closed:
            return
        self._closed = True
        if self._forked:
            return  # a forked child that never used it: nothing held, nothing of its own open
        for lock in list(self._held):
            await self._release_quietly(lock)
        await self._unanswered.settle()
        await asyncio.gather(*self._background, return_exceptions=True)  # releases under way land
        await asyncio.to_thread(self._renewer.stop)
        self.threads.shutdown()
        if self._owns_store:
            await self.store.aclose()

    async def _release_quietly(self, lock: Lock) -> bool:
        """Release in a cleanup path: a store failure is logged, not raised."""
        try:
            return await lock.release()
        except TenureError as exc:
            release_failed(lock, exc)
            return False

    async def acquire(
        self, name: str, *, ttl: float = _validate.DEFAULT_TTL, wait: float = 0.0
    ) -> Lock | None:
        """The lock ``name``, or None when it is held elsewhere.

        Returns at once on contention unless ``wait`` is given: then it waits up
        to ``wait`` seconds (``math.inf``: without limit), woken by the release
        itself or by the holder's lease running out. Raises StoreUnavailable when
        the store cannot be reached; it never returns a lock it does not have.
        """
        ttl, wait = self._admit(name, ttl, wait)
        if self._hooks.hooks:
            return await self._acquire_observed(name, ttl, wait)
        if wait:
            return await acquire_waiting(self, name, ttl, wait)
        return await self._try_acquire(name, ttl)

    def semaphore(self, name: str, limit: int) -> Semaphore:
        """The semaphore ``name``: at most ``limit`` permits at once across every
        process on this store (see :class:`~tenure.locks.semaphore.Semaphore`).
        Makes no store call."""
        return Semaphore(self, name, limit)

    def election(
        self,
        name: str,
        *,
        on_elected: Callable[[Term], Any] | None = None,
        on_revoked: Callable[[str], Any] | None = None,
    ) -> Election:
        """The leader election ``name`` (see :class:`~tenure.locks.election.Election`).
        Makes no store call."""
        return Election(self, name, on_elected=on_elected, on_revoked=on_revoked)

    def direct(self) -> Direct | None:
        """The blocking seam: acquire and release on the calling thread, with
        no event loop (see :class:`Direct`); None when the store has no plain
        calls (``Store.blocking``)."""
        return None if self.store.blocking() is None else Direct(self)

    def _admit(self, name: str, ttl: float, wait: float) -> tuple[float, float]:
        """Check an acquire's arguments and the service's state; start the renewer."""
        _validate.check_name(name)
        ttl = _validate.check_ttl(ttl)
        if wait.__class__ is not float or wait != 0.0:  # the default needs no checking
            wait = _validate.check_wait(wait)
        if self._closed:
            raise TenureError("this LockService is closed; make a new one")
        if not self._renewer.started or self._forked:
            self.start()
        return ttl, wait

    def waiting(self, name: str) -> int:
        """Callers of this service (on the running event loop) waiting for ``name``.

        They wait in line, first come first served: only the first of them
        waits on the store, so a release wakes one of them, not all.
        """
        return self._line.waiting(_validate.check_name(name))

    async def _acquire_observed(self, name: str, ttl: float, wait: float) -> Lock | None:
        started = time.monotonic()
        try:
            lock = await acquire_waiting(self, name, ttl, wait)
        except StoreUnavailable as exc:
            self._hooks.emit(Event(EventKind.UNAVAILABLE, name, self.holder, detail=str(exc)))
            raise
        self._observed(name, lock, time.monotonic() - started)
        return lock

    def _observed(self, name: str, lock: Lock | None, took: float) -> None:
        if lock is None:
            self._hooks.emit(Event(EventKind.CONTENDED, name, self.holder, seconds=took))
        else:
            self._hooks.emit(
                Event(EventKind.ACQUIRED, name, self.holder, lock.fencing_token, seconds=took)
            )

    async def _try_acquire(self, name: str, ttl: float) -> Lock | None:
        token = await self._unanswered.token(name)
        sent = time.monotonic()
        try:
            grant = await self.store.acquire(name, token, ttl, self.holder)
        except (asyncio.CancelledError, StoreUnavailable):
            self._unanswered.add(name, token, sent + ttl)
            raise
        return self._granted(name, token, ttl, sent, grant)

    def _granted(
        self, name: str, token: str, ttl: float, sent: float, grant: Grant | None
    ) -> Lock | None:
        if grant is None:
            return None
        lock = Lock(self, name, token, ttl, sent=sent, fence=grant.fencing_token)
        self._held.add(lock)
        self._renewer.add(lock._lease)
        return lock

    async def _give_back(self, name: str, token: str) -> bool:
        # Through self.store each time: a forked child's service has a store of its own.
        return await self.store.release(name, token)

    def _release_in_background(self, lock: Lock) -> None:
        task = asyncio.ensure_future(self._release_quietly(lock))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Bound here, written beside their concern (their docstrings are there).
    acquire_each = many.acquire_each
    start_occurrences = many.start_occurrences
    release_each = many.release_each
    force_release = forcing.force_release
    run_exclusively = running.run_exclusively
    run_under = running.run_under


_live: weakref.WeakSet[LockService] = weakref.WeakSet()
"""Every LockService of this process, for the fork handler."""


_INHERITED: list[object] = []
"""What a forked child's services held for the parent (``LockService._after_fork``)."""


def _after_fork_in_child() -> None:
    for service in list(_live):
        service._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
