"""Semaphores: the third part of the store contract (``store.semaphores``).

A semaphore ``name`` grants at most ``limit`` permits at any instant, by the
store's clock. It lives in a namespace of its own: a lock and a semaphore may
share a name without meeting, and nothing here touches the lock's paths.

What a store keeps per semaphore: its ``limit``, its live permits (each a
token, a holder id, a fencing token and an expiry, exactly a lease's), its
queue of waiters in arrival order (each entry lapses unless its waiter calls
again) and a fencing counter that never goes back. The rules, which every
store implements as one atomic step per call:

* ``acquire(name, token, ttl, holder, limit, queue=q)``: expired permits and
  lapsed queue entries are dropped first. A live permit of ``token`` already
  (an acquire resent after its answer was lost) is granted again, its fence
  unchanged and its expiry renewed. A semaphore with no live permit and no
  other queued waiter is idle: it takes the caller's ``limit``. Otherwise a
  different ``limit`` raises :class:`~tenure.errors.LimitMismatch`, naming
  both. The caller is granted when the live permits plus the queued waiters
  ahead of it (all of them, if it is not queued) are fewer than the limit: a
  free permit goes to the longest-queued waiter first. The grant's fencing
  token is larger than every earlier permit's of the name. Not granted, with
  ``queue`` > 0 the caller is queued (or its entry kept) for ``queue`` seconds
  and :class:`Queued` says how many wait ahead; with ``queue`` == 0 nothing
  changes and None is returned.
* ``release(name, token)``: compare-and-set, as a lock's. Removes the permit of
  ``token`` (True when it was still live) and any queue entry of ``token`` (a
  waiter withdrawing); wakes the waiters.
* ``renew(batch)``: as :meth:`Store.renew`, for permits: one round trip, a
  lapsed permit is never revived.
* ``state(name)``: what an operator may see: the limit, the live permits
  (never their tokens) and how many wait.
* ``changes(name)``: an async context manager; inside it, ``wait(timeout)``
  returns when a permit of ``name`` may have freed (a release, an expiry) or
  after ``timeout`` seconds. Entered *before* the acquire it follows, so a
  release in between is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._aio import woken_within
from ..errors import LimitMismatch, StoreUnavailable
from ._waiters import Wakeups
from .base import Grant, LeaseInfo, RenewItem

__all__ = (
    "Changes",
    "Heard",
    "Ledger",
    "Permits",
    "Queued",
    "SemaphoreState",
    "Turns",
    "local_changes",
    "wake_local",
)


class Queued(NamedTuple):
    """An acquire that queued its caller: ``ahead`` waiters are served first."""

    ahead: int


@dataclass(frozen=True, slots=True)
class SemaphoreState:
    """What an operator may see of a semaphore: never a token."""

    name: str
    limit: int | None
    """None when the store has no live permit and no waiter for it."""
    permits: list[LeaseInfo]
    waiting: int


class Changes(ABC):
    """Wake-ups for the waiters of one semaphore (see ``Permits.changes``)."""

    @abstractmethod
    async def wait(self, timeout: float) -> bool:
        """Return when a permit may have freed (True), or after ``timeout`` seconds
        (False)."""

    def follow(self, token: str) -> None:  # noqa: B027 (a hint most feeds ignore)
        """The waiter's token: a feed that reads the semaphore's state may then
        return from ``wait`` only when this waiter could be granted, rather than
        at every change (which would have every waiter call the store at every
        release, though only the first in the queue can be granted)."""

    def queued(self, ahead: int) -> None:  # noqa: B027 (a hint most feeds ignore)
        """The waiter's last acquire queued it with ``ahead`` waiters in front
        (``Queued``): a feed that counts releases may then wait for ``ahead + 1``
        of them before it returns."""


class Turns(Changes):
    """A feed whose waiter counts the changes it hears against its place.

    ``look`` reads the store: whether the waiter could be granted now, and
    ``needs``, how many releases stand between it and a permit. Each change
    ``heard`` counts one down; the waiter reads again only when the count
    runs out, so a release costs the waiter it reaches one read and its
    acquire, not every waiter a call. Changes heard together may count as
    one: such a waiter calls at its next keep-alive. A feed that ``polls``
    also reads when a slice of the wait passes with nothing heard (slices
    longer the farther back the waiter stands); one that does not returns.
    """

    polls = False

    def __init__(self) -> None:
        self.token: str | None = None
        self.needs = 1
        """Releases this waiter needs before it can be granted, as last read."""

    def follow(self, token: str) -> None:
        self.token = token

    def queued(self, ahead: int) -> None:
        self.needs = ahead + 1

    @abstractmethod
    async def heard(self, timeout: float) -> bool:
        """Wait for a change, at most ``timeout`` seconds; whether one came."""

    @abstractmethod
    async def look(self) -> bool:
        """Read the store: whether to return from the wait (and set ``needs``)."""

    def slice(self, left: float) -> float:
        """How long to listen before reading anyway (a feed that ``polls``)."""
        return left

    async def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if await self.heard(self.slice(left)):
                if self.token is None:
                    return True
                self.needs -= 1
                if self.needs > 0:
                    continue  # not yet this waiter's turn: no read
            elif not self.polls:
                return False
            try:
                if await self.look():
                    return True
            except StoreUnavailable:
                return True  # the next acquire says so, if it lasts


class Heard(Turns):
    """Releases heard through the ``key`` of a ``Wakeups`` (a store's one
    subscription per process), each one (the waiter is ``counted`` there),
    and nothing read: the count comes from the place the waiter's last
    acquire answered (``queued``), and the acquire that follows the count's
    end does the reading. A release the feed does not hear (a permit that
    lapsed) leaves the waiter to its keep-alive call."""

    def __init__(self, wakeups: Wakeups[Any], key: Hashable) -> None:
        super().__init__()
        self.wakeups = wakeups
        self.key = key
        self.woken = wakeups.add(key, counted=True)

    async def heard(self, timeout: float) -> bool:
        try:
            return await woken_within(self.woken, timeout)
        finally:
            if self.woken.done():
                self.woken = self.wakeups.add(self.key, instead_of=self.woken, counted=True)

    async def look(self) -> bool:
        return True


class Permits(ABC):
    """A store's semaphores. See the module docstring for the rules."""

    @abstractmethod
    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        """Grant a permit of ``name`` to ``token``, or queue it, or neither."""

    @abstractmethod
    async def release(self, name: str, token: str) -> bool:
        """Remove the permit (and any queue entry) of ``token``; True when it was live."""

    @abstractmethod
    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        """Extend each live permit of the batch by its TTL from the store's now."""

    @abstractmethod
    async def state(self, name: str) -> SemaphoreState:
        """The limit, the live permits and the number of waiters of ``name``."""

    data_key: str = ""
    """Which data these semaphores are (the store's masked URL): the stores of
    one process on the same data share in-process wake-ups."""

    def changes(self, name: str) -> contextlib.AbstractAsyncContextManager[Changes]:
        """Wake-ups for ``name``'s waiters. The default: releases made in this
        process wake at once; others are seen by calling again, which waiters
        do at least every third of their queue entry's life."""
        return local_changes(self.data_key, name)


# -- wake-ups within one process ----------------------------------------------

_Entry = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]
_local: dict[tuple[str, str], set[_Entry]] = {}
_local_guard = threading.Lock()  # waiters and releases on any thread's loop


class _Local(Changes):
    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.future: asyncio.Future[None] | None = None

    def arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.future = loop.create_future()
        with _local_guard:
            _local.setdefault(self.key, set()).add((loop, self.future))

    def disarm(self) -> None:
        with _local_guard:
            entries = _local.get(self.key)
            if entries is not None and self.future is not None:
                entries.discard((asyncio.get_running_loop(), self.future))
                if not entries:
                    del _local[self.key]

    async def wait(self, timeout: float) -> bool:
        assert self.future is not None
        try:
            return await woken_within(self.future, timeout)
        finally:
            self.disarm()
            self.arm()


@contextlib.asynccontextmanager
async def local_changes(data_key: str, name: str) -> AsyncIterator[Changes]:
    """:meth:`Permits.changes` from this process's releases alone."""
    changes = _Local((data_key, name))
    changes.arm()
    try:
        yield changes
    finally:
        changes.disarm()


def wake_local(data_key: str, name: str) -> None:
    """A permit of ``name`` was released in this process: wake its waiters here."""
    with _local_guard:
        entries = list(_local.get((data_key, name), ()))
    for loop, future in entries:
        with contextlib.suppress(RuntimeError):  # that waiter's loop has closed
            loop.call_soon_threadsafe(_settle, future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- the rules, in Python: the memory and SQLite stores run them as they are ---


@dataclass(slots=True)
class Ledger:
    """One semaphore's state, and the rules of the module docstring applied
    to it. ``now`` is the store's clock, in whatever unit its expiries use;
    durations are given in that unit too."""

    limit: int = 0
    fence: int = 0
    permits: dict[str, list[Any]] = field(default_factory=dict)
    """token -> [holder, expires, fence, acquired (POSIX seconds)]"""
    queue: list[list[Any]] = field(default_factory=list)
    """[token, until], in arrival order"""

    def drop_lapsed(self, now: float) -> None:
        # Changed in place, and only when something lapsed: this runs on every call.
        permits = self.permits
        for token in [t for t, p in permits.items() if p[1] <= now]:
            del permits[token]
        if any(entry[1] <= now for entry in self.queue):
            self.queue = [entry for entry in self.queue if entry[1] > now]

    def acquire(
        self,
        name: str,
        token: str,
        ttl: float,
        holder: str,
        limit: int,
        *,
        queue: float,
        now: float,
    ) -> Grant | Queued | None:
        self.drop_lapsed(now)
        permits, waiting = self.permits, self.queue
        mine = permits.get(token)
        if mine is not None:
            mine[1] = now + ttl
            return Grant(mine[2])
        position = len(waiting)
        for i, entry in enumerate(waiting):
            if entry[0] == token:
                position = i
                break
        others = len(waiting) - (position < len(waiting))
        if not permits and not others:
            self.limit = limit
        elif self.limit != limit:
            raise LimitMismatch(name, self.limit, limit)
        if len(permits) + position < self.limit:
            self.fence += 1
            permits[token] = [holder, now + ttl, self.fence, time.time()]
            if position < len(waiting):
                del waiting[position]
            return Grant(self.fence)
        if queue <= 0:
            return None
        if position < len(waiting):
            waiting[position][1] = now + queue
        else:
            waiting.append([token, now + queue])
        return Queued(position)

    def release(self, token: str, now: float) -> bool:
        if self.queue:
            self.queue = [entry for entry in self.queue if entry[0] != token]
        permit = self.permits.pop(token, None)
        return permit is not None and permit[1] > now

    def needs(self, token: str, now: float) -> int:
        """Releases between ``token``'s waiter and a permit (0 or less: granted now)."""
        if token in self.permits:
            return 0
        live = sum(p[1] > now for p in self.permits.values())
        mine = next((i for i, e in enumerate(self.queue) if e[0] == token), len(self.queue))
        ahead = sum(e[1] > now for e in self.queue[:mine])
        return live + ahead - self.limit + 1 if live + ahead else 0  # idle: takes its limit

    def reached(self, now: float) -> list[str]:
        """The tokens of the waiters the free permits reach now: the first
        ``limit`` minus the live permits, in queue order (a release wakes
        these, not the ones behind)."""
        free = self.limit - sum(p[1] > now for p in self.permits.values())
        if free <= 0:
            return []
        return [entry[0] for entry in self.queue if entry[1] > now][:free]

    def renew(self, token: str, ttl: float, now: float) -> bool:
        permit = self.permits.get(token)
        if permit is None or permit[1] <= now:
            return False
        permit[1] = now + ttl
        return True

    def state(self, name: str, now: float, seconds: float) -> SemaphoreState:
        """``seconds``: how many of the clock's units make a second."""
        self.drop_lapsed(now)
        idle = not self.permits and not self.queue
        return SemaphoreState(
            name,
            None if idle else self.limit,
            sorted(
                (
                    LeaseInfo(name, p[0], p[2], (p[1] - now) / seconds, p[3])
                    for p in self.permits.values()
                ),
                key=lambda info: info.fencing_token,
            ),
            len(self.queue),
        )

    def dump(self) -> list[Any]:
        return [self.limit, self.fence, self.permits, self.queue]

    @classmethod
    def load(cls, stored: list[Any]) -> Ledger:
        limit, fence, permits, queue = stored
        return cls(limit, fence, permits, queue)
