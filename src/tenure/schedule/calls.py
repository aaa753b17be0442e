"""The store calls of a scheduler's runs, coalesced: occurrences that fall due
together send their starts, acquires, end records and releases as one store
call per ``Store.batch_max`` of them (``_batch``). What a run leaves behind
when it is cancelled while its answer is on the way (a grant, a started
occurrence) is given back in the background."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple

from ..errors import TenureError
from ..locks import Lock, LockService
from ..stores.runlog import Claim, RunOutcome, RunRecord, abandoned, live_instances
from ._batch import Coalesced
from ._missed import MissedRecords

__all__ = ("RETRY_FIRST", "RETRY_MOST", "Begun", "RunCalls", "Start")

log = logging.getLogger("tenure.scheduler")

RETRY_FIRST = 0.05
RETRY_MOST = 1.0
"""Pauses between tries of a store call that failed (doubling from the first)."""

Start = tuple[Claim, RunRecord]
"""An occurrence's claim and its start record, as ``LockService.start_occurrences`` takes them."""


class Begun(NamedTuple):
    """What an occurrence's start answered."""

    claimed: bool
    lock: Lock | None
    """None: not claimed, or claimed with the task's lock held by an earlier run."""
    record: RunRecord
    """Its start record: written when ``lock`` is not None."""


class RunCalls:
    """The runs' store calls, each kind batched with the others of its moment."""

    def __init__(self, locks: LockService, *, keep_runs: int, clock: Callable[[], float]) -> None:
        self.locks = locks
        self.keep_runs = keep_runs
        self.clock = clock
        size = locks.store.batch_max
        self._begins: dict[float | None, Coalesced[Start, Begun]] = {}
        self.records: Coalesced[RunRecord, None] = Coalesced(
            self._record_batch, size, key=lambda record: record.run_id
        )
        """Writes run records (a start's, an end's)."""
        self._releases: Coalesced[Lock, bool] = Coalesced(
            locks.release_each, size, key=lambda lock: lock.name
        )
        self._acquires: dict[float | None, Coalesced[str, Lock | None]] = {}
        self.claimed: Coalesced[tuple[str, float], bool] = Coalesced(
            locks.store.runlog.claimed_already, size, key=lambda occurrence: occurrence[0]
        )
        """Whether an occurrence is claimed already (by any instance)."""
        self.missed_records = MissedRecords(
            self._record_batch,
            self._close_batch,
            first_pause=RETRY_FIRST,
            most_pause=RETRY_MOST,
        )
        self._orphans: set[asyncio.Task[None]] = set()

    def counted(self) -> collections.Counter[str]:
        """Store calls made so far, by step (see ``ScheduledTaskStore.store_calls``)."""
        return collections.Counter(
            start=sum(batch.calls for batch in self._begins.values()),
            claimed=self.claimed.calls,
            record=self.records.calls,
            acquire=sum(batch.calls for batch in self._acquires.values()),
            release=self._releases.calls,
        )

    async def store_abandoned(self, tasks: int) -> int:
        """Store ``abandoned`` as the outcome of every run record that reads so
        (its instance's presence lease is gone) among the newest ``keep_runs``
        of ``tasks`` tasks; returns how many were stored."""
        store = self.locks.store
        everything = await store.runlog.stored_runs(None, self.keep_runs * tasks)
        running = [r for r in everything if r.outcome == RunOutcome.RUNNING]
        if not running:
            return 0
        gone = [
            record
            for record in abandoned(running, await live_instances(store), seen=self.clock())
            if record.outcome == RunOutcome.ABANDONED
        ]
        return await store.runlog.store_abandoned(gone) if gone else 0

    async def _close_batch(self, records: list[RunRecord]) -> None:
        await self.locks.store.runlog.store_abandoned(records)

    async def _record_batch(self, records: list[RunRecord]) -> list[None]:
        await self.locks.store.runlog.record_runs(records, keep=self.keep_runs)
        return [None] * len(records)

    def acquire(self, name: str, ttl: float | None) -> Awaitable[Lock | None]:
        """The task's lock (None: held elsewhere), acquired with the others of this moment."""
        batch = self._acquires.get(ttl)
        if batch is None:
            options = {} if ttl is None else {"ttl": ttl}

            async def acquire_each(names: list[str]) -> list[Lock | None]:
                return await self.locks.acquire_each(names, **options)

            batch = self._acquires[ttl] = Coalesced(
                acquire_each,
                self.locks.store.batch_max,
                key=lambda n: n,
                orphaned=self._orphaned_grant,
            )
        return batch(name)

    def _orphaned_grant(self, lock: Lock | None) -> None:
        """A grant whose run was cancelled while it was on its way."""
        if lock is not None:
            self.in_background(self.release(lock))

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on, kept referenced until it ends."""
        task = asyncio.ensure_future(work)
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def release(self, lock: Lock) -> None:
        """Release ``lock`` with the others of this moment; a failure is logged."""
        try:
            await asyncio.shield(self._releases.soon(lock))
        except TenureError as exc:
            log.warning(
                "releasing lock %r failed; it lapses by itself within %.1f s: %s",
                lock.name,
                lock.ttl,
                exc,
            )

    def begin(self, ttl: float | None, start: Start) -> asyncio.Future[Begun]:
        """Send ``start`` (claim, lock, start record) with the tick's others of ``ttl``."""
        batch = self._begins.get(ttl)
        if batch is None:
            options = {} if ttl is None else {"ttl": ttl}

            async def begin_each(starts: list[Start]) -> list[Begun]:
                answers = await self.locks.start_occurrences(starts, keep=self.keep_runs, **options)
                return [
                    Begun(claimed, lock, record)
                    for (claimed, lock), (_, record) in zip(answers, starts, strict=True)
                ]

            batch = self._begins[ttl] = Coalesced(
                begin_each,
                self.locks.store.batch_max,
                key=lambda start: start[0].task,
                orphaned=self._orphaned,
            )
        return batch.soon(start)

    def _orphaned(self, begun: Begun) -> None:
        """A started occurrence whose run was cancelled before its answer came."""
        if begun.lock is not None:
            self.in_background(self._close(begun.lock, begun.record, "cancelled before it began"))

    async def _close(self, lock: Lock, record: RunRecord, error: str) -> None:
        await self.release(lock)
        ended = dataclasses.replace(
            record, ended=self.clock(), outcome=RunOutcome.FAILED, error=error
        )
        with contextlib.suppress(TenureError):
            await self.records(ended)
