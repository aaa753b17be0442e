"""Many locks in few store calls: a scheduler's tick, or any batch of names.

These are ``LockService`` methods (bound there), kept here as one concern.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from .. import _validate
from ..errors import InvalidArgument, StoreUnavailable
from ..events import Event, EventKind
from ..stores.base import AcquireItem, Grant, ReleaseItem
from ..stores.runlog import Claim, RunRecord, StartItem
from .lock import Lock

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("acquire_each", "grant_each", "release_each", "start_occurrences")


async def acquire_each(
    self: LockService, names: Sequence[str], *, ttl: float = _validate.DEFAULT_TTL
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
    return await grant_each(self, names, ttl, lambda _begin, chunk: self.store.acquire_many(chunk))


async def start_occurrences(
    self: LockService,
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
            for (claim, record), lock in zip(starts[begin : begin + len(chunk)], chunk, strict=True)
        ]
        answers = await self.store.runlog.start_runs(items, keep=keep)
        claimed.extend(answer.claimed for answer in answers)
        return [answer.grant for answer in answers]

    locks = await grant_each(self, [claim.task for claim, _ in starts], ttl, send)
    return list(zip(claimed, locks, strict=True))


async def grant_each(
    self: LockService,
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
                        Event(EventKind.UNAVAILABLE, item.name, self.holder, detail=str(exc))
                    )
            raise
        took = time.monotonic() - sent
        for item, grant in zip(chunk, grants, strict=True):
            lock = self._granted(item.name, item.token, ttl, sent, grant)
            if self._hooks.hooks:
                self._observed(item.name, lock, took)
            locks.append(lock)
    return locks


async def release_each(self: LockService, locks: Sequence[Lock]) -> list[bool]:
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
    pending = [(i, lock, lock._leave()) for i, lock in enumerate(locks) if not lock._lease.released]
    size = self.store.batch_max
    for begin in range(0, len(pending), size):
        chunk = pending[begin : begin + size]
        released = await self.store.release_many(
            [ReleaseItem(lock.name, lock.token) for _, lock, _ in chunk]
        )
        for (i, lock, was_held), in_store in zip(chunk, released, strict=True):
            answers[i] = lock._left(was_held, in_store)
    return answers
