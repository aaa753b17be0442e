"""Scheduled tasks: the registry, one run under the task's own name, run records.

``ScheduledTaskStore.run`` is where a task gets cluster-wide exclusivity with
no change at its call site: it takes the task's name as the lock through
``run_exclusively``. Contention is skipped silently (DEBUG log, a counter):
another instance already holds the lock and is doing the work. An occurrence
passed by the timer loop is first claimed in the store (compare-and-advance of
the task's last claimed fire time), so an instance whose clock runs behind
cannot re-run an occurrence that already ran, however fast it finished.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import secrets
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._validate import check_name, check_ttl
from ..errors import InvalidArgument, LockLost, TenureError
from ..events import Event
from ..locks import LockService, Outcome, _is_async
from ..stores.base import RunRecord
from .cron import CronSchedule

__all__ = ("RunOutcome", "ScheduledTask", "ScheduledTaskStore")

log = logging.getLogger("tenure.scheduler")

DEFAULT_KEEP_RUNS = 100
"""Run records kept per task."""


class RunOutcome(enum.StrEnum):
    """How one run ended, as its record says."""

    RUNNING = "running"
    RAN = "ran"
    SKIPPED = "skipped"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True)
class ScheduledTask:
    name: str
    fn: Callable[..., Any]
    schedule: CronSchedule
    ttl: float | None = None
    exclusive: bool = True
    """False: runs on every instance, without a lock or an occurrence claim."""


class ScheduledTaskStore:
    """The registry of a scheduler's tasks, and the one place a task is run."""

    def __init__(
        self,
        locks: LockService,
        *,
        clock: Callable[[], float],
        keep_runs: int = DEFAULT_KEEP_RUNS,
        listener: Callable[[str, float | None, str], None] | None = None,
    ) -> None:
        if not isinstance(keep_runs, int) or keep_runs < 1:
            raise InvalidArgument(f"keep_runs must be a positive int, got {keep_runs!r}")
        self.locks = locks
        self.clock = clock
        self.keep_runs = keep_runs
        self.listener = listener
        self._tasks: dict[str, ScheduledTask] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        """Runs by outcome, plus ``claimed_elsewhere`` for occurrences another instance took."""

    def add(
        self,
        fn: Callable[..., Any],
        expr: str,
        *,
        name: str | None = None,
        ttl: float | None = None,
        tz: str | None = None,
        exclusive: bool = True,
    ) -> ScheduledTask:
        """Register ``fn`` to run on the cron expression ``expr``; returns the task."""
        if not callable(fn):
            raise InvalidArgument(f"a scheduled task must be callable, got {fn!r}")
        if name is None:
            name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        check_name(name, "task name")
        if name in self._tasks:
            raise InvalidArgument(f"a task named {name!r} is already registered; give it a name=")
        if ttl is not None:
            ttl = check_ttl(ttl)
        if not isinstance(exclusive, bool):
            raise InvalidArgument(f"exclusive must be True or False, got {exclusive!r}")
        task = ScheduledTask(name, fn, CronSchedule(expr, tz), ttl, exclusive)
        self._tasks[name] = task
        return task

    def __getitem__(self, name: str) -> ScheduledTask:
        try:
            return self._tasks[name]
        except KeyError:
            raise InvalidArgument(
                f"no task named {name!r}; registered: {', '.join(sorted(self._tasks)) or 'none'}"
            ) from None

    def __iter__(self) -> Any:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    async def run(self, name: str, *, occurrence: float | None = None) -> Outcome:
        """Run the task ``name`` once under its own name as the lock.

        With ``occurrence`` (its fire time, as the timer loop passes it) the
        occurrence is claimed first; if another instance claimed it, nothing
        runs and nothing is recorded here. Returns RAN, or SKIPPED when the
        occurrence or the lock belongs to another run. An exception from the
        task (or LockLost) is recorded and then raised.
        """
        task = self[name]
        if occurrence is not None and task.exclusive:
            claimed = await self.locks.store.claim_occurrence(name, occurrence)
            if not claimed:
                log.debug("task %r: occurrence %s was claimed elsewhere", name, occurrence)
                self.counts["claimed_elsewhere"] += 1
                self._tell(name, occurrence, "claimed_elsewhere", None)
                return Outcome.SKIPPED
        record = RunRecord(
            run_id=secrets.token_hex(8),
            task=name,
            fire_time=occurrence,
            instance=self.locks.holder,
            started=self.clock(),
            ended=None,
            outcome=RunOutcome.RUNNING,
        )
        await self.locks.store.record_run(record, keep=self.keep_runs)
        began = time.monotonic()
        result: RunOutcome = RunOutcome.FAILED
        error: str | None = "interrupted"
        try:
            if task.exclusive:
                outcome = await self.locks.run_exclusively(
                    name, task.fn, **({} if task.ttl is None else {"ttl": task.ttl})
                )
            else:
                await _call(task.fn)
                outcome = Outcome.RAN
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
            finished = RunRecord(
                run_id=record.run_id,
                task=name,
                fire_time=occurrence,
                instance=record.instance,
                started=record.started,
                ended=self.clock(),
                outcome=result,
                error=error,
            )
            try:
                await asyncio.shield(self.locks.store.record_run(finished, keep=self.keep_runs))
            except Exception as exc:  # the run's own outcome matters more than its record
                log.warning("could not record the run of %r: %s", name, exc)

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
        self, name: str, occurrence: float | None, outcome: str, seconds: float | None
    ) -> None:
        hooks = self.locks._hooks
        if hooks.hooks:
            hooks.emit(Event("task", name, self.locks.holder, seconds=seconds, detail=str(outcome)))
        if self.listener is not None:
            try:
                self.listener(name, occurrence, outcome)
            except Exception:
                log.exception("the scheduler's listener failed")


async def _call(fn: Callable[..., Any]) -> None:
    if _is_async(fn):
        await fn()
    else:
        await asyncio.to_thread(fn)
