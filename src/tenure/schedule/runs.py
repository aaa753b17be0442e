"""How one run of a scheduled task goes: its function under the task's lock
(or without one), how it ended counted, told and recorded; a store call tried
again while the occurrence is within the misfire grace; an occurrence that
could not run recorded ``missed``."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import logging
import secrets
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._aio import is_async
from .._threads import PoolFull, WorkerPool
from ..errors import LockLost, StoreUnavailable, TenureError
from ..events import Event, EventKind
from ..locks import Lock, LockService, Outcome
from ..stores.runlog import RunOutcome, RunRecord
from .calls import RETRY_FIRST, RETRY_MOST, RunCalls

if TYPE_CHECKING:
    from .tasks import ScheduledTask

__all__ = ("CurrentRun", "Missed", "Runs", "current_run")

log = logging.getLogger("tenure.scheduler")


@dataclass(frozen=True, slots=True)
class CurrentRun:
    """The run of a scheduled task that is executing this code (``current_run()``)."""

    task: str
    fire_time: float | None
    """The occurrence (POSIX seconds); None for a manual run. Within the
    cluster it names the occurrence: a good idempotency key for what the
    task writes."""
    run_id: str
    """The id of this run's record (``RunRecord.run_id``)."""
    lock: Lock | None
    """The task's lock, held for this run; None for a task with ``exclusive=False``."""


_current_run: contextvars.ContextVar[CurrentRun | None] = contextvars.ContextVar(
    "tenure_current_run", default=None
)


def current_run() -> CurrentRun:
    """The scheduled run executing this code: its task, occurrence, run id and lock.

    Works in the task function, in tasks it starts, and in the worker thread
    of a plain function. Raises TenureError anywhere else.
    """
    run = _current_run.get()
    if run is None:
        raise TenureError("current_run() was called outside a scheduled task's run")
    return run


class Runs:
    """The runs of one scheduler's tasks: what each does, and the counts."""

    def __init__(
        self,
        locks: LockService,
        calls: RunCalls,
        *,
        clock: Callable[[], float],
        misfire_grace: float,
        listener: Callable[[str, float | None, str], None] | None,
        threads: WorkerPool,
    ) -> None:
        self.locks = locks
        self.calls = calls
        self.clock = clock
        self.misfire_grace = misfire_grace
        self.listener = listener
        self.threads = threads
        self.counts: collections.Counter[str] = collections.Counter()
        self._fences: dict[str, int] = {}
        """The fencing token each run going on holds, by run id (``under``), for its end record."""

    async def retried(
        self,
        occurrence: float | None,
        call: Callable[[], Any],
        what: str,
    ) -> Any:
        """``await call()``, tried again on StoreUnavailable while ``occurrence`` is
        within the misfire grace; then Missed. A manual run (no occurrence) is
        not retried: its caller sees the error."""
        window = self.misfire_grace
        pause = RETRY_FIRST
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                if occurrence is None:
                    raise
                if self.clock() + pause - occurrence > window:
                    raise Missed(f"{what} failed until past the misfire grace: {exc}") from exc
                log.debug("task occurrence %s: %s failed, trying again: %s", occurrence, what, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MOST)

    async def missed(
        self, name: str, occurrence: float | None, reason: str, run_id: str | None = None
    ) -> None:
        """An occurrence that could not run: counted, told, logged once, recorded
        if possible. ``run_id``: the ``running`` record its start may have
        written, which this one replaces, or closes if it merges into the
        task's pending missed record (``MissedRecords.add``)."""
        self.counts[RunOutcome.MISSED] += 1
        self._tell(name, occurrence, RunOutcome.MISSED, None)
        _log_missed(name, occurrence, reason)
        now = self.clock()
        record = RunRecord(
            run_id=run_id or secrets.token_hex(8),
            task=name,
            fire_time=occurrence,
            instance=self.locks.holder,
            started=now,
            ended=now,
            outcome=RunOutcome.MISSED,
            error=reason,
        )
        # Written by one writer, merged with the task's later misses while the
        # store fails; this occurrence waits for one attempt, not for success.
        merged = self.calls.missed_records.merged
        attempt = self.calls.missed_records.add(record, maybe_started=run_id is not None)
        self.counts["missed_merged"] += self.calls.missed_records.merged - merged
        await asyncio.shield(attempt)

    def claimed_elsewhere(self, name: str, occurrence: float) -> None:
        log.debug("task %r: occurrence %s was claimed elsewhere", name, occurrence)
        self.counts[RunOutcome.CLAIMED_ELSEWHERE] += 1
        self._tell(name, occurrence, RunOutcome.CLAIMED_ELSEWHERE, None)

    def paused(self, name: str, occurrence: float) -> None:
        """An occurrence that its task's pause skipped (``tenure.control``)."""
        log.debug("task %r: occurrence %s skipped: the task is paused", name, occurrence)
        self.counts[RunOutcome.PAUSED] += 1
        self._tell(name, occurrence, RunOutcome.PAUSED, None)

    async def close_unconfirmed(self, record: RunRecord) -> None:
        closed = dataclasses.replace(
            record,
            ended=self.clock(),
            outcome=RunOutcome.MISSED,
            error="its start's answer was lost, and a later claim came before it was sent again",
        )
        try:
            await self.locks.store.runlog.store_abandoned([closed])
        except TenureError as exc:
            log.debug("could not close the record of run %s: %s", record.run_id, exc)

    async def ran(
        self, task: ScheduledTask, record: RunRecord, work: Coroutine[Any, Any, Outcome]
    ) -> Outcome:
        """Await ``work``, the run of ``record``; count, tell and record how it ended."""
        name, occurrence = task.name, record.fire_time
        began = time.monotonic()
        result: RunOutcome = RunOutcome.FAILED
        error: str | None = "interrupted"
        try:
            outcome = await work
        except Missed as exc:  # its start record is closed as missed below
            result, error = RunOutcome.MISSED, exc.reason
            _log_missed(name, occurrence, exc.reason)
            return Outcome.SKIPPED
        except LockLost as exc:
            result, error = RunOutcome.LOST, str(exc)
            raise
        except asyncio.CancelledError:
            result, error = RunOutcome.FAILED, "cancelled (the scheduler was stopping)"
            raise
        except Exception as exc:
            result = RunOutcome.FAILED
            error = "".join(traceback.format_exception_only(exc)).strip()
            raise
        else:
            error = None
            result = RunOutcome.RAN if outcome is Outcome.RAN else RunOutcome.SKIPPED
            if outcome is Outcome.SKIPPED:
                error = await self._held_by(name)
                log.debug("task %r skipped: %s", name, error)
            return outcome
        finally:
            self.counts[result] += 1
            self._tell(name, occurrence, result, time.monotonic() - began)
            fence = self._fences.pop(record.run_id, record.fence)
            finished = dataclasses.replace(
                record, ended=self.clock(), outcome=result, error=error, fence=fence
            )
            try:
                await asyncio.shield(self.calls.records.soon(finished))
            except Exception as exc:  # the run's own outcome matters more than its record
                log.warning("could not record the run of %r: %s", name, exc)

    async def everywhere(self, task: ScheduledTask, record: RunRecord) -> Outcome:
        """A run without the task's lock (``exclusive=False``)."""
        run = CurrentRun(task.name, record.fire_time, record.run_id, None)
        reset = _current_run.set(run)
        try:
            with self.locks.run_wrappers.around(run):
                await _call(task.fn, self.threads)
        except PoolFull as exc:
            raise Missed(str(exc)) from exc
        finally:
            _current_run.reset(reset)
        return Outcome.RAN

    async def exclusively(self, task: ScheduledTask, record: RunRecord) -> Outcome:
        """A manual run: its lock acquired now (batched with others of its
        moment), then ``under`` it."""
        if not is_async(task.fn) and self.threads.full():
            raise Missed(f"thread pool full: {self.threads.describe()}")
        lock = await self.calls.acquire(task.name, task.ttl)
        return await self.under(task, record, lock)

    async def under(self, task: ScheduledTask, record: RunRecord, lock: Lock | None) -> Outcome:
        """The task's function under ``lock`` (None: held elsewhere, skipped),
        released after it."""
        if lock is None:
            return Outcome.SKIPPED
        self._fences[record.run_id] = lock.fencing_token
        run = CurrentRun(task.name, record.fire_time, record.run_id, lock)
        reset = _current_run.set(run)
        try:
            if not is_async(task.fn) and self.threads.full():
                raise Missed(f"thread pool full: {self.threads.describe()}")
            with self.locks.run_wrappers.around(run):
                await self.locks.run_under(lock, task.fn, threads=self.threads)
        except PoolFull as exc:  # filled up while the lock was acquired
            raise Missed(str(exc)) from exc
        finally:
            _current_run.reset(reset)
            await self.calls.release(lock)
        return Outcome.RAN

    async def _held_by(self, name: str) -> str:
        """Why a run was skipped, for its record: who held the task's lock."""
        try:
            held = await self.locks.store.holder_of(name)
        except TenureError:
            held = None
        if held is None:
            return "its lock was held by another run (released since)"
        return (
            f"its lock was held by {held.holder} (fencing token {held.fencing_token}), "
            "an earlier run still going"
        )

    def _tell(
        self, name: str, occurrence: float | None, outcome: RunOutcome, seconds: float | None
    ) -> None:
        if self.locks.observed:
            self.locks.emit(
                Event(EventKind.TASK, name, self.locks.holder, seconds=seconds, detail=str(outcome))
            )
        if self.listener is not None:
            try:
                self.listener(name, occurrence, outcome)
            except Exception:
                log.exception("the scheduler's listener failed")


class Missed(Exception):
    """An occurrence's store calls failed until past the misfire grace."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _log_missed(name: str, occurrence: float | None, reason: str) -> None:
    log.warning("task %r: occurrence %s missed: %s", name, occurrence, reason)


async def _call(fn: Callable[..., Any], threads: WorkerPool) -> None:
    if is_async(fn):
        await fn()
    else:
        await threads.run(fn)
