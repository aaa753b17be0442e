"""Scheduled tasks: the registry, one run under the task's own name, run records.

``ScheduledTaskStore.run`` is where a task gets cluster-wide exclusivity with
no change at its call site: it takes the task's name as the lock through
``run_exclusively``. Contention is skipped silently (DEBUG log, a counter):
another instance already holds the lock and is doing the work. An occurrence
passed by the timer loop is first claimed in the store (compare-and-advance of
the task's last claimed fire time), so an instance whose clock runs behind
cannot re-run an occurrence that already ran, however fast it finished.

A store that fails (``StoreUnavailable``: down, or every connection busy for
its timeout) does not lose an occurrence silently. The claim, the start
record and the lock's acquire are tried again, with a growing pause (50 ms to
1 s), for as long as the occurrence is within the misfire grace; one that
still cannot run ends ``missed``, with the reason in its record (when the
store takes it), an event, a count and one log line.

Occurrences that fall due together are one batch at each step: their
claims, start records, lock acquires, releases and end records each go to
the store as one call per ``Store.batch_max`` of them (``_batch``), so that a
tick of a thousand due tasks costs a few store calls, not thousands. The
timer loop hands a tick's occurrences to ``run_due``, which claims them
before any task exists (an instance's own preferred tasks first: see
``_spread``) and starts a run only for each occurrence it won.

Here: the registry, and the start of a run (claim, lock, start record). The
batched store calls are ``calls``; how a run goes once started, and its
counts, ``runs``; which instances serve, ``peers``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from .._threads import WorkerPool
from .._validate import check_name, check_ttl
from ..errors import InvalidArgument, TenureError
from ..locks import LockService, Outcome
from ..stores.runlog import PRESENCE_TTL, Claim, RunOutcome, RunRecord
from ._presence import presence_of
from ._spread import PEERS_RECHECK, SPREAD_DELAY, Spread
from .calls import Begun, RunCalls, Start
from .peers import Peers
from .runs import Missed, Runs
from .timing import Schedule, schedule_of

__all__ = ("RunOutcome", "ScheduledTask", "ScheduledTaskStore")

log = logging.getLogger("tenure.scheduler")

DEFAULT_KEEP_RUNS = 100
"""Run records kept per task."""


@dataclass(frozen=True)
class ScheduledTask:
    name: str
    fn: Callable[..., Any]
    schedule: Schedule
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
        misfire_grace: float = 30.0,
        threads: WorkerPool | None = None,
        presence_ttl: float = PRESENCE_TTL,
    ) -> None:
        if not isinstance(keep_runs, int) or keep_runs < 1:
            raise InvalidArgument(f"keep_runs must be a positive int, got {keep_runs!r}")
        presence_ttl = check_ttl(presence_ttl, "presence_ttl")
        self.locks = locks
        self.presence = presence_of(locks, presence_ttl)
        """This instance's presence lease: while it is live, its runs' records
        that say ``running`` are running; once it lapses they read ``abandoned``."""
        self.clock = clock
        self.keep_runs = keep_runs
        self._tasks: dict[str, ScheduledTask] = {}
        self.calls = RunCalls(locks, keep_runs=keep_runs, clock=clock)
        self.runs = Runs(
            locks,
            self.calls,
            clock=clock,
            misfire_grace=misfire_grace,
            listener=listener,
            threads=threads if threads is not None else WorkerPool(name="tenure-task"),
        )
        self.peers = Peers(locks)

    @property
    def counts(self) -> collections.Counter[str]:
        """Runs by outcome (``missed`` among them), plus ``claimed_elsewhere`` for
        occurrences another instance took, and ``missed_merged`` for missed
        occurrences whose record merged into an earlier one of the same task
        (while the store failed)."""
        return self.runs.counts

    @property
    def threads(self) -> WorkerPool:
        """The threads plain task functions run on; an occurrence that finds
        them all busy and their queue full ends ``missed`` ("thread pool full")."""
        return self.runs.threads

    @property
    def spread(self) -> Spread:
        """Which tasks this instance claims first (see ``_spread``)."""
        return self.peers.spread

    async def read_peers(self) -> None:
        """Read which instances serve now (their presence leases), for ``spread``."""
        await self.peers.read()

    @property
    def store_calls(self) -> collections.Counter[str]:
        """Store calls the runs made so far, by step (``start``: an
        occurrence's claim, lock and start record; ``claimed``: which of the
        other instances' occurrences they took; ``record``, ``acquire``,
        ``release``): what a test reads to see that a tick's occurrences went
        to the store in batches."""
        return self.calls.counted()

    def add(
        self,
        fn: Callable[..., Any],
        expr: str | None = None,
        *,
        every: float | None = None,
        name: str | None = None,
        ttl: float | None = None,
        tz: str | None = None,
        exclusive: bool = True,
    ) -> ScheduledTask:
        """Register ``fn`` to run on the cron expression ``expr``, or ``every``
        so many seconds (``interval``); returns the task."""
        schedule = schedule_of(expr, every, tz)
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
        task = ScheduledTask(name, fn, schedule, ttl, exclusive)
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

    async def run(
        self, name: str, *, occurrence: float | None = None, run_id: str | None = None
    ) -> Outcome:
        """Run the task ``name`` once under its own name as the lock.

        With ``occurrence`` (its fire time, as the timer loop passes it) the
        occurrence is claimed first; if another instance claimed it, nothing
        runs and nothing is recorded here. Returns RAN, or SKIPPED when the
        occurrence or the lock belongs to another run, or when the occurrence
        was missed (its store calls failed past the misfire grace: recorded as
        ``missed``). An exception from the task (or LockLost) is recorded and
        then raised. ``run_id`` names a manual run's record (a run asked for
        through ``tenure.control``); by default a random one.
        """
        task = self[name]
        await self.presence.taken()  # while it is live, this run's record reads running
        if occurrence is not None and task.exclusive:
            return await self.occurrence(task, self.new_start(task, occurrence))
        return await self.guarded(task, occurrence, run_id)

    def new_start(self, task: ScheduledTask, occurrence: float) -> Start:
        """An occurrence's claim, with a claimant of its own (its retries are
        "yours"; any other run of it, even from this instance, is "elsewhere"),
        and its start record."""
        holder = self.locks.holder
        claim = Claim(task.name, occurrence, f"{holder}/{secrets.token_hex(6)}")
        return claim, _running(task.name, occurrence, self.locks.holder, self.clock())

    async def run_due(
        self,
        due: Sequence[tuple[str, float]],
        start: Callable[[str, float, Callable[[], Coroutine[Any, Any, Outcome]]], None],
    ) -> None:
        """Start the occurrences that fell due in one tick, as batches (each
        one's claim, lock and start record in one store step where the store
        allows), then hand each one this instance won to ``start``: what
        ``run(name, occurrence=...)`` does for each, without a task per
        occurrence until it is won. ``start`` gets a function that makes the
        run, to call in a task of its own (a task cancelled before it began
        then leaves no coroutine unawaited). An occurrence whose start failed
        is handed over too: its run sends it again (the same claimant, token
        and record, so what the store took is still its own)."""
        self.presence.keep()
        began = time.monotonic()
        self.peers.at_tick(began)
        first: list[tuple[ScheduledTask, float]] = []
        later: list[tuple[ScheduledTask, float]] = []
        for name, occurrence in due:
            task = self[name]
            if not task.exclusive:
                start(name, occurrence, functools.partial(self.guarded, task, occurrence))
            elif self.spread.mine(name):
                first.append((task, occurrence))
            else:
                later.append((task, occurrence))
        if await self._start_each(first, start):
            # Another instance claimed one of this instance's own tasks first:
            # one that this instance does not know of yet (it just started),
            # or its peers see fewer instances than it does. Read them soon.
            self.peers.read_soon(time.monotonic(), PEERS_RECHECK)
        if later:
            # Their own instances claim them meanwhile (see _spread).
            await asyncio.sleep(max(0.0, began + SPREAD_DELAY - time.monotonic()))
            await self._start_each(await self._unclaimed(later), start)

    async def _start_each(
        self,
        group: list[tuple[ScheduledTask, float]],
        start: Callable[[str, float, Callable[[], Coroutine[Any, Any, Outcome]]], None],
    ) -> bool:
        """Start ``group``'s occurrences; whether any was claimed elsewhere."""
        elsewhere = False
        sent = []
        for task, occurrence in group:
            begin = self.new_start(task, occurrence)
            sent.append((task, begin, self.calls.begin(task.ttl, begin)))
        for i, (task, begin, answer) in enumerate(sent):
            begun: Begun | None = None  # not known: the run asks again, as the same claimant
            try:
                begun = await answer  # answered together: one wait for the lot
            except asyncio.CancelledError:
                for _, _, unread in sent[i:]:
                    unread.cancel()  # what they won is given back (_orphaned)
                raise
            except Exception:
                pass
            if begun is not None and not begun.claimed:
                self.runs.claimed_elsewhere(task.name, begin[0].fire_time)
                elsewhere = True
                continue
            run = functools.partial(self.occurrence, task, begin, begun, begun is None)
            start(task.name, begin[0].fire_time, run)
        return elsewhere

    async def _unclaimed(
        self, group: list[tuple[ScheduledTask, float]]
    ) -> list[tuple[ScheduledTask, float]]:
        """Those of ``group`` that no instance has claimed yet. The others are
        claimed elsewhere, known from one read per batch: no claim, lock and
        record is built and sent for them only to lose (when the instances
        are all up, that is each instance's other tasks, every tick)."""
        answers = [self.calls.claimed.soon((task.name, occurrence)) for task, occurrence in group]
        left = []
        for i, ((task, occurrence), answer) in enumerate(zip(group, answers, strict=True)):
            try:
                taken = await answer
            except asyncio.CancelledError:
                for unread in answers[i:]:
                    unread.cancel()
                raise
            except TenureError:
                taken = False  # not known: its start decides
            if taken:
                self.runs.claimed_elsewhere(task.name, occurrence)
            else:
                left.append((task, occurrence))
        return left

    async def store_abandoned(self) -> int:
        """Store ``abandoned`` as the outcome of every run record that reads so
        (its instance's presence lease is gone) among the newest ``keep_runs``
        of each registered task; returns how many were stored."""
        return await self.calls.store_abandoned(max(len(self._tasks), 1))

    async def flush_missed(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the records of missed occurrences."""
        await self.calls.missed_records.flush(timeout)

    async def guarded(
        self, task: ScheduledTask, occurrence: float | None, run_id: str | None = None
    ) -> Outcome:
        """A manual run, or an occurrence of a task that runs on every instance."""
        record = _running(task.name, occurrence, self.locks.holder, self.clock(), run_id)
        try:
            await self.runs.retried(
                occurrence, lambda: self.calls.records(record), "recording its start"
            )
        except Missed as missed:
            await self.runs.missed(task.name, occurrence, missed.reason)
            return Outcome.SKIPPED
        if task.exclusive:
            return await self.runs.ran(task, record, self.runs.exclusively(task, record))
        return await self.runs.ran(task, record, self.runs.everywhere(task, record))

    async def occurrence(
        self,
        task: ScheduledTask,
        start: Start,
        begun: Begun | None = None,
        resent: bool = False,
    ) -> Outcome:
        """One occurrence of an exclusive task: ``begun`` is what its start
        answered (None: not sent yet, or ``resent``: sent, and its answer lost)."""
        claim, record = start
        occurrence = claim.fire_time
        if begun is None:
            tries = 0

            def send() -> asyncio.Future[Begun]:
                nonlocal tries
                tries += 1
                return self.calls.begin(task.ttl, start)

            try:
                begun = await self.runs.retried(occurrence, send, "starting it")
            except Missed as missed:
                # A start whose answer was lost may have written the record:
                # the missed one replaces it.
                await self.runs.missed(task.name, occurrence, missed.reason, record.run_id)
                return Outcome.SKIPPED
            resent = resent or tries > 1
        if not begun.claimed:
            if resent:
                # An attempt whose answer was lost may have claimed it and
                # written the record before a later claim came: closed (where
                # it says running), or it would read running for ever.
                self.calls.in_background(self.runs.close_unconfirmed(record))
            self.runs.claimed_elsewhere(task.name, occurrence)
            return Outcome.SKIPPED
        return await self.runs.ran(task, record, self.runs.under(task, record, begun.lock))


def _running(
    name: str, occurrence: float | None, instance: str, started: float, run_id: str | None = None
) -> RunRecord:
    """A run's start record (a random run id unless given)."""
    return RunRecord(
        run_id=run_id or secrets.token_hex(8),
        task=name,
        fire_time=occurrence,
        instance=instance,
        started=started,
        ended=None,
        outcome=RunOutcome.RUNNING,
    )
