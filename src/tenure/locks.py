"""LockService, Lock, Outcome and current_lock: the lock API, with no store-specific code."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
import logging
import math
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from . import _validate
from ._aio import is_async, settle, woken_within
from ._aio import shielded as _shielded
from ._threads import THREAD_QUEUE, THREADS, PoolFull, WorkerPool
from ._tokens import new_token
from ._unanswered import Unanswered
from .errors import InvalidArgument, LockLost, StoreUnavailable, TenureError
from .events import Event, Hook, Hooks
from .renewer import LOST_BY_DEADLINE, LeaseState, Renewer, handover_lease, safety_margin
from .stores import from_url as store_from_url
from .stores._waiters import WAITERS, Line
from .stores.base import AcquireItem, BlockingLeases, Grant, HandsOver, ReleaseItem, Store
from .stores.runlog import Claim, RunRecord, StartItem

__all__ = ("Direct", "Lock", "LockService", "Outcome", "as_current", "current_lock")

log = logging.getLogger("tenure")

T = TypeVar("T")

_current: contextvars.ContextVar[Lock | None] = contextvars.ContextVar(
    "tenure_current_lock", default=None
)


class Outcome(enum.StrEnum):
    """What ``run_exclusively`` did."""

    RAN = "ran"
    SKIPPED = "skipped"


def current_lock() -> Lock:
    """The lock of the innermost ``run_exclusively`` running this code.

    Works in the function itself, in tasks it starts, and in the worker thread
    of a plain function. Raises TenureError anywhere else.
    """
    lock = _current.get()
    if lock is None:
        raise TenureError("current_lock() was called outside run_exclusively")
    return lock


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Lock:
    """One grant of a named lock. Obtained from ``LockService.acquire``.

    Read ``name``, ``ttl``, ``fencing_token`` and ``token``. ``token`` is the
    secret (128 random bits, hex) that proves ownership to the store; it never
    appears in ``repr`` or in logs. ``fencing_token`` strictly increases with
    every grant of the name: pass it to resources that can reject stale writers.
    """

    __slots__ = ("__weakref__", "_lease", "_service", "acquired_at")

    def __init__(
        self, service: LockService, name: str, token: str, ttl: float, *, sent: float, fence: int
    ) -> None:
        # What the renewer shares, in an object of its own: the renewer never
        # holds the Lock, and the Lock shows none of the renewer's fields.
        self._lease = LeaseState(
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
        if self._lease.released:
            return False
        was_held = self._leave()
        return self._left(was_held, await self._service.store.release(self.name, self.token))

    def _leave(self) -> bool:
        """The local half of a release: stop renewing; whether it was still held."""
        was_held = self._lease.mark_released()
        service = self._service
        service._held.discard(self)
        service._renewer.discard(self._lease)
        return was_held

    def _left(self, was_held: bool, in_store: bool) -> bool:
        """The store's half is done: the event, and release()'s answer."""
        service = self._service
        if service._hooks.hooks:
            service._hooks.emit(
                Event(
                    "released",
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
        await _shielded(self._service._release_quietly(self))

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost else "released")
        return f"<Lock {self.name!r} fencing_token={self.fencing_token} {state}>"


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

    def _lease_lost(self, lease: LeaseState, reason: str) -> None:
        if self._hooks.hooks:
            self._hooks.emit(Event("lost", lease.name, self.holder, lease.fence, detail=reason))

    def _renewal_failed(self, count: int, exc: Exception) -> None:
        if self._hooks.hooks:
            self._hooks.emit(
                Event("renewal_failed", "", self.holder, count=count, detail=repr(exc))
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
        await _shielded(self.close())

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
        await asyncio.to_thread(self._renewer.stop)
        self.threads.shutdown()
        if self._owns_store:
            await self.store.aclose()

    async def _release_quietly(self, lock: Lock) -> bool:
        """Release in a cleanup path: a store failure is logged, not raised."""
        try:
            return await lock.release()
        except TenureError as exc:
            _release_failed(lock, exc)
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
            return await self._acquire(name, ttl, wait)
        return await self._try_acquire(name, ttl)

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
        if self._renewer._thread is None or self._forked:
            self.start()
        return ttl, wait

    def waiting(self, name: str) -> int:
        """Callers of this service (on the running event loop) waiting for ``name``.

        They wait in line, first come first served: only the first of them
        waits on the store, so a release wakes one of them, not all.
        """
        return self._line.waiting(_validate.check_name(name))

    async def _acquire(self, name: str, ttl: float, wait: float) -> Lock | None:
        if wait == 0:
            return await self._try_acquire(name, ttl)
        line = self._line
        handed_over = isinstance(self.store, HandsOver)
        if not handed_over and not line.waiting(name):
            lock = await self._try_acquire(name, ttl)
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
                return await self._acquire_handed_over(name, ttl, deadline)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                line.store_waits += 1
                await self.store.wait_released(name, min(remaining, 3600.0))
                lock = await self._try_acquire(name, ttl)
                if lock is not None:
                    return lock
        finally:
            line.leave(name, turn)

    async def _acquire_handed_over(self, name: str, ttl: float, deadline: float) -> Lock | None:
        """Wait in the store's queue: a release hands the lock over in the same step."""
        while True:
            token = new_token()
            self._line.store_waits += 1
            assert isinstance(self.store, HandsOver)
            got = await self.store.acquire_waiting(
                name,
                token,
                ttl,
                self.holder,
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
                lock = self._granted(name, token, ttl, sent, got.grant)
                assert lock is not None
                lock.acquired_at = got.sent
                return lock
            # Handed over while this waiter could not run (a blocked loop, a
            # stopped process) for longer than the hand-over lease is trusted:
            # never return a lock that may be gone. Give it back; wait on.
            await _shielded(self.store.release(name, token))
            if time.monotonic() >= deadline:
                return None

    async def _acquire_observed(self, name: str, ttl: float, wait: float) -> Lock | None:
        started = time.monotonic()
        try:
            lock = await self._acquire(name, ttl, wait)
        except StoreUnavailable as exc:
            self._hooks.emit(Event("unavailable", name, self.holder, detail=str(exc)))
            raise
        self._observed(name, lock, time.monotonic() - started)
        return lock

    def _observed(self, name: str, lock: Lock | None, took: float) -> None:
        if lock is None:
            self._hooks.emit(Event("contended", name, self.holder, seconds=took))
        else:
            self._hooks.emit(Event("acquired", name, self.holder, lock.fencing_token, seconds=took))

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

    async def acquire_each(
        self, names: Sequence[str], *, ttl: float = _validate.DEFAULT_TTL
    ) -> list[Lock | None]:
        """Try to acquire each of ``names`` once, without waiting: one answer per
        name, in order, as ``acquire(name, ttl=ttl)`` would give it.

        Sent in as few store calls as the store allows (``Store.batch_max``
        names per call): what many locks at once (a scheduler's tick) costs.
        Each name is granted or not on its own. The names must be distinct.
        Raises StoreUnavailable when a call fails; the locks of that call
        (and of the calls before it) are then given back, not returned.
        """
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise InvalidArgument(f"acquire_each takes a list of names, got {names!r}")
        return await self._grant_each(
            names, ttl, lambda _begin, chunk: self.store.acquire_many(chunk)
        )

    async def start_occurrences(
        self,
        starts: Sequence[tuple[Claim, RunRecord]],
        *,
        keep: int,
        ttl: float = _validate.DEFAULT_TTL,
    ) -> list[tuple[bool, Lock | None]]:
        """Start occurrences that fell due together (the scheduler's tick): for
        each ``(claim, record)``, claim the occurrence; if claimed, acquire the
        lock named after its task, as ``acquire_each`` would; if granted, write
        ``record`` (its start record, ``running``), with at most ``keep``
        records kept per task. One ``(claimed, lock)`` per item, in order.

        One atomic step per occurrence where the store allows
        (``Store.start_runs``), in as few calls as it allows. Sent again with
        the same claims and records after a StoreUnavailable (or a cancel),
        each part answers as the first time did: the claim is still its
        maker's, the lock is acquired again (with the same token while the
        lost grant may live), the record is rewritten.
        """
        claimed: list[bool] = []

        async def send(begin: int, chunk: list[AcquireItem]) -> list[Grant | None]:
            items = [
                StartItem(claim, lock, record)
                for (claim, record), lock in zip(
                    starts[begin : begin + len(chunk)], chunk, strict=True
                )
            ]
            answers = await self.store.runlog.start_runs(items, keep=keep)
            claimed.extend(answer.claimed for answer in answers)
            return [answer.grant for answer in answers]

        locks = await self._grant_each([claim.task for claim, _ in starts], ttl, send)
        return list(zip(claimed, locks, strict=True))

    async def _grant_each(
        self,
        names: Sequence[str],
        ttl: float,
        send: Callable[[int, list[AcquireItem]], Awaitable[list[Grant | None]]],
    ) -> list[Lock | None]:
        """Acquire ``names`` (distinct), ``batch_max`` per ``send(begin, items)``."""
        seen: set[str] = set()
        for name in names:
            ttl, _ = self._admit(name, ttl, 0.0)
            if name in seen:
                raise InvalidArgument(f"acquire_each needs distinct names; {name!r} is given twice")
            seen.add(name)
        locks: list[Lock | None] = []
        size = self.store.batch_max
        for begin in range(0, len(names), size):
            chunk = [
                AcquireItem(n, await self._unanswered.token(n), ttl, self.holder)
                for n in names[begin : begin + size]
            ]
            sent = time.monotonic()
            try:
                grants = await send(begin, chunk)
            except (asyncio.CancelledError, StoreUnavailable) as exc:
                # The store may have granted some before the answer was lost:
                # the tokens are ours alone, so giving them back is safe (and
                # a retry reuses those it could not give back).
                for item in chunk:
                    self._unanswered.add(item.name, item.token, sent + ttl)
                for lock in locks:
                    if lock is not None:
                        self._release_in_background(lock)
                if isinstance(exc, StoreUnavailable) and self._hooks.hooks:
                    for item in chunk:
                        self._hooks.emit(
                            Event("unavailable", item.name, self.holder, detail=str(exc))
                        )
                raise
            took = time.monotonic() - sent
            for item, grant in zip(chunk, grants, strict=True):
                lock = self._granted(item.name, item.token, ttl, sent, grant)
                if self._hooks.hooks:
                    self._observed(item.name, lock, took)
                locks.append(lock)
        return locks

    async def release_each(self, locks: Sequence[Lock]) -> list[bool]:
        """``lock.release()`` for each of ``locks`` (distinct names), in as few
        store calls as the store allows; one answer per lock, in order.

        Raises StoreUnavailable when a call fails: the locks not yet released
        in the store lapse by themselves within their TTL.
        """
        for lock in locks:
            if not isinstance(lock, Lock) or lock._service is not self:
                raise InvalidArgument(f"release_each takes locks of this service, got {lock!r}")
        if len({lock.name for lock in locks}) != len(locks):
            raise InvalidArgument("release_each needs locks of distinct names")
        answers = [False] * len(locks)
        pending = [
            (i, lock, lock._leave()) for i, lock in enumerate(locks) if not lock._lease.released
        ]
        size = self.store.batch_max
        for begin in range(0, len(pending), size):
            chunk = pending[begin : begin + size]
            released = await self.store.release_many(
                [ReleaseItem(lock.name, lock.token) for _, lock, _ in chunk]
            )
            for (i, lock, was_held), in_store in zip(chunk, released, strict=True):
                answers[i] = lock._left(was_held, in_store)
        return answers

    def _release_in_background(self, lock: Lock) -> None:
        task = asyncio.ensure_future(self._release_quietly(lock))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run_exclusively(
        self,
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
            raise PoolFull(
                f"run_exclusively({name!r}): thread pool full: {self.threads.describe()}"
            )
        lock = await self.acquire(name, ttl=ttl)
        if lock is None:
            log.debug("run_exclusively(%r): held elsewhere, skipped", name)
            return Outcome.SKIPPED
        try:
            await self.run_under(lock, fn, *args, **kwargs)
        finally:
            await _shielded(self._release_quietly(lock))
        return Outcome.RAN

    async def run_under(
        self,
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
        reset = _current.set(lock)
        try:
            if is_async(fn):
                await self._run_async(lock, fn, args, kwargs)
            else:
                await self._run_sync(lock, fn, args, kwargs, threads or self.threads)
        finally:
            _current.reset(reset)

    async def _run_async(
        self, lock: Lock, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        work = asyncio.ensure_future(fn(*args, **kwargs))
        lost: asyncio.Future[None] = loop.create_future()
        # The loss cancels the work; our own cancellation reaches it through
        # the await (and waits for it to unwind). No asyncio.wait: its waiter
        # and callbacks cost a scheduler's tick a thousand times over.
        lost.add_done_callback(lambda _: work.cancel())
        watch = _LossWatch(lock, loop, lost)
        try:
            await work
        except asyncio.CancelledError:
            if lost.done() and (me is None or not me.cancelling()):
                raise lock.loss_error() from None
            raise
        finally:
            watch.stop()
        if lock.lost:
            raise lock.loss_error()

    async def _run_sync(
        self,
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
            await _shielded(threads.run(call))
        except Exception as exc:
            if lock.lost:
                raise lock.loss_error() from exc
            raise
        if lock.lost:
            raise lock.loss_error()


class Direct:
    """The one seam for callers without an event loop (``tenure.sync``):
    acquire and release made on the calling thread, through the store's plain
    calls (``Store.blocking``).

    Only the store call differs from :meth:`LockService.acquire` and
    :meth:`Lock.release`: the checks, the local deadline, the renewer, the
    events and the errors are theirs (the same private halves). Waiting is
    not here: a store's waiters live on an event loop. Any thread may call.
    """

    __slots__ = ("service",)

    def __init__(self, service: LockService) -> None:
        self.service = service

    def _calls(self) -> BlockingLeases:
        # Looked up each time: a forked child's service has a store of its own.
        calls = self.service.store.blocking()
        if calls is None:
            raise TenureError(f"{self.service.store.describe()} has no blocking calls")
        return calls

    def acquire(
        self, name: str, *, ttl: float = _validate.DEFAULT_TTL, wait: float = 0.0
    ) -> Lock | None:
        """:meth:`LockService.acquire`, on this thread. ``wait`` is checked as
        acquire checks it, and must be 0."""
        service = self.service
        ttl, wait = service._admit(name, ttl, wait)
        if wait:
            raise InvalidArgument(f"a direct acquire cannot wait (wait={wait!r}); use acquire")
        token = new_token()
        sent = time.monotonic()
        try:
            grant = self._calls().acquire(name, token, ttl, service.holder)
        except StoreUnavailable as exc:
            if service._hooks.hooks:
                service._hooks.emit(Event("unavailable", name, service.holder, detail=str(exc)))
            raise
        lock = service._granted(name, token, ttl, sent, grant)
        if service._hooks.hooks:
            service._observed(name, lock, time.monotonic() - sent)
        return lock

    def release(self, lock: Lock, *, quietly: bool = False) -> bool:
        """:meth:`Lock.release`, on this thread; ``quietly``: a store failure is
        logged, not raised (as leaving ``async with lock`` does)."""
        if lock._lease.released:
            return False
        was_held = lock._leave()
        try:
            in_store = self._calls().release(lock.name, lock.token)
        except TenureError as exc:
            if not quietly:
                raise
            _release_failed(lock, exc)
            in_store = False
        return lock._left(was_held, in_store)


@contextlib.contextmanager
def as_current(lock: Lock) -> Iterator[None]:
    """Within it, :func:`current_lock` answers ``lock``: for code that runs a
    function under a lock itself, outside ``run_exclusively`` (``tenure.sync``)."""
    reset = _current.set(lock)
    try:
        yield
    finally:
        _current.reset(reset)


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


_live: weakref.WeakSet[LockService] = weakref.WeakSet()
"""Every LockService of this process, for the fork handler."""


_INHERITED: list[object] = []
"""What a forked child's services held for the parent (``LockService._after_fork``)."""


def _after_fork_in_child() -> None:
    for service in list(_live):
        service._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _release_failed(lock: Lock, exc: TenureError) -> None:
    log.warning(
        "releasing lock %r failed; it lapses by itself within %.1f s: %s", lock.name, lock.ttl, exc
    )
