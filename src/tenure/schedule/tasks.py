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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._aio import is_async
from .._threads import PoolFull, WorkerPool
from .._validate import check_name, check_ttl
from ..errors import InvalidArgument, LockLost, StoreUnavailable, TenureError
from ..events import Event, EventKind
from ..locks import Lock, LockService, Outcome
from ..stores.runlog import PRESENCE_TTL, Claim, RunOutcome, RunRecord, abandoned, live_instances
from ._batch import Coalesced
from ._missed import MissedRecords
from ._presence import presence_of
from ._spread import PEERS_RECHECK, PEERS_REFRESH, SPREAD_DELAY, Spread
from .cron import CronSchedule

__all__ = ("CurrentRun", "RunOutcome", "ScheduledTask", "ScheduledTaskStore", "current_run")

log = logging.getLogger("tenure.scheduler")

DEFAULT_KEEP_RUNS = 100
"""Run records kept per task."""


_RETRY_FIRST = 0.05
_RETRY_MOST = 1.0
"""Pauses between tries of a store call that failed (doubling from the first)."""


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
        self.misfire_grace = misfire_grace
        """How long after its fire time a failing store call of an occurrence is tried again."""
        self.listener = listener
        self.threads = threads if threads is not None else WorkerPool(name="tenure-task")
        """The threads plain task functions run on; an occurrence that finds
        them all busy and their queue full ends ``missed`` ("thread pool full")."""
        self._tasks: dict[str, ScheduledTask] = {}
        self._orphans: set[asyncio.Task[None]] = set()
        self._fences: dict[str, int] = {}
        """The fencing token each run going on holds, by run id (``_under``), for its end record."""
        self.counts: collections.Counter[str] = collections.Counter()
        """Runs by outcome (``missed`` among them), plus ``claimed_elsewhere`` for
        occurrences another instance took, and ``missed_merged`` for missed
        occurrences whose record merged into an earlier one of the same task
        (while the store failed)."""
        size = locks.store.batch_max
        self._begins: dict[float | None, Coalesced[_Start, _Begun]] = {}
        self._records: Coalesced[RunRecord, None] = Coalesced(
            self._record_batch, size, key=lambda record: record.run_id
        )
        self._releases: Coalesced[Lock, bool] = Coalesced(
            self.locks.release_each, size, key=lambda lock: lock.name
        )
        self._acquires: dict[float | None, Coalesced[str, Lock | None]] = {}
        self._claimed: Coalesced[tuple[str, float], bool] = Coalesced(
            locks.store.runlog.claimed_already, size, key=lambda occurrence: occurrence[0]
        )
        self.spread = Spread(locks.holder)
        """Which tasks this instance claims first (see ``_spread``)."""
        self._peers_read = -math.inf
        self._first_tick: float | None = None
        self._reading_peers: asyncio.Future[None] | None = None
        """The background read of the instances in flight (``_read_peers``), if any."""
        self._missed_records = MissedRecords(
            self._record_batch,
            self._close_batch,
            first_pause=_RETRY_FIRST,
            most_pause=_RETRY_MOST,
        )

    @property
    def store_calls(self) -> collections.Counter[str]:
        """Store calls the runs made so far, by step (``start``: an
        occurrence's claim, lock and start record; ``claimed``: which of the
        other instances' occurrences they took; ``record``, ``acquire``,
        ``release``): what a test reads to see that a tick's occurrences went
        to the store in batches."""
        return collections.Counter(
            start=sum(batch.calls for batch in self._begins.values()),
            claimed=self._claimed.calls,
            record=self._records.calls,
            acquire=sum(batch.calls for batch in self._acquires.values()),
            release=self._releases.calls,
        )

    async def _close_batch(self, records: list[RunRecord]) -> None:
        await self.locks.store.runlog.store_abandoned(records)

    async def _record_batch(self, records: list[RunRecord]) -> list[None]:
        await self.locks.store.runlog.record_runs(records, keep=self.keep_runs)
        return [None] * len(records)

    def _acquire(self, name: str, ttl: float | None) -> Awaitable[Lock | None]:
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
            self._in_background(self._release(lock))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def _release(self, lock: Lock) -> None:
        try:
            await asyncio.shield(self._releases.soon(lock))
        except TenureError as exc:
            log.warning(
                "releasing lock %r failed; it lapses by itself within %.1f s: %s",
                lock.name,
                lock.ttl,
                exc,
            )

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
        occurrence or the lock belongs to another run, or when the occurrence
        was missed (its store calls failed past the misfire grace: recorded as
        ``missed``). An exception from the task (or LockLost) is recorded and
        then raised.
        """
        task = self[name]
        self.presence.keep()  # while it is live, this run's record reads running
        if occurrence is not None and task.exclusive:
            return await self._occurrence(task, self._new_start(task, occurrence))
        return await self._guarded(task, occurrence)

    def _new_start(self, task: ScheduledTask, occurrence: float) -> _Start:
        """An occurrence's claim, with a claimant of its own (its retries are
        "yours"; any other run of it, even from this instance, is "elsewhere"),
        and its start record."""
        holder = self.locks.holder
        claim = Claim(task.name, occurrence, f"{holder}/{secrets.token_hex(6)}")
        return claim, self._start_record(task.name, occurrence)

    def _start_record(self, name: str, occurrence: float | None) -> RunRecord:
        return RunRecord(
            run_id=secrets.token_hex(8),
            task=name,
            fire_time=occurrence,
            instance=self.locks.holder,
            started=self.clock(),
            ended=None,
            outcome=RunOutcome.RUNNING,
        )

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
        if self._first_tick is None:
            self._first_tick = began
        # Instances that start together may each miss the others' presence at
        # their first read: read again every second while starting.
        starting = began - self._first_tick < PEERS_REFRESH
        self._read_peers(began, PEERS_RECHECK if starting else PEERS_REFRESH)
        first: list[tuple[ScheduledTask, float]] = []
        later: list[tuple[ScheduledTask, float]] = []
        for name, occurrence in due:
            task = self[name]
            if not task.exclusive:
                start(name, occurrence, functools.partial(self._guarded, task, occurrence))
            elif self.spread.mine(name):
                first.append((task, occurrence))
            else:
                later.append((task, occurrence))
        if await self._start_each(first, start):
            # Another instance claimed one of this instance's own tasks first:
            # one that this instance does not know of yet (it just started),
            # or its peers see fewer instances than it does. Read them soon.
            self._read_peers(time.monotonic(), PEERS_RECHECK)
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
            begin = self._new_start(task, occurrence)
            sent.append((task, begin, self._begin(task.ttl, begin)))
        for i, (task, begin, answer) in enumerate(sent):
            begun: _Begun | None = None  # not known: the run asks again, as the same claimant
            try:
                begun = await answer  # answered together: one wait for the lot
            except asyncio.CancelledError:
                for _, _, unread in sent[i:]:
                    unread.cancel()  # what they won is given back (_orphaned)
                raise
            except Exception:
                pass
            if begun is not None and not begun.claimed:
                self._claimed_elsewhere(task.name, begin[0].fire_time)
                elsewhere = True
                continue
            run = functools.partial(self._occurrence, task, begin, begun, begun is None)
            start(task.name, begin[0].fire_time, run)
        return elsewhere

    async def _unclaimed(
        self, group: list[tuple[ScheduledTask, float]]
    ) -> list[tuple[ScheduledTask, float]]:
        """Those of ``group`` that no instance has claimed yet. The others are
        claimed elsewhere, known from one read per batch: no claim, lock and
        record is built and sent for them only to lose (when the instances
        are all up, that is each instance's other tasks, every tick)."""
        answers = [self._claimed.soon((task.name, occurrence)) for task, occurrence in group]
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
                self._claimed_elsewhere(task.name, occurrence)
            else:
                left.append((task, occurrence))
        return left

    async def read_peers(self) -> None:
        """Read which instances serve now (their presence leases), for ``spread``."""
        self._peers_read = time.monotonic()
        try:
            self.spread.update(await live_instances(self.locks.store), self.locks.holder)
        except TenureError as exc:
            log.debug("could not read which instances serve: %s", exc)

    def _read_peers(self, now: float, every: float = PEERS_REFRESH) -> None:
        """``read_peers`` in the background, unless it was read less than ``every`` seconds ago."""
        if now - self._peers_read < every or self._reading_peers is not None:
            return
        self._peers_read = now
        reading = self._reading_peers = asyncio.ensure_future(self.read_peers())

        def done(_: object) -> None:
            self._reading_peers = None

        reading.add_done_callback(done)

    async def _retried(
        self,
        occurrence: float | None,
        call: Callable[[], Any],
        what: str,
    ) -> Any:
        """``await call()``, tried again on StoreUnavailable while ``occurrence`` is
        within the misfire grace; then _Missed. A manual run (no occurrence) is
        not retried: its caller sees the error."""
        window = self.misfire_grace
        pause = _RETRY_FIRST
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                if occurrence is None:
                    raise
                if self.clock() + pause - occurrence > window:
                    raise _Missed(f"{what} failed until past the misfire grace: {exc}") from exc
                log.debug("task occurrence %s: %s failed, trying again: %s", occurrence, what, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RETRY_MOST)

    async def store_abandoned(self) -> int:
        """Store ``abandoned`` as the outcome of every run record that reads so
        (its instance's presence lease is gone) among the newest ``keep_runs``
        of each registered task; returns how many were stored."""
        store = self.locks.store
        everything = await store.runlog.stored_runs(None, self.keep_runs * max(len(self._tasks), 1))
        running = [r for r in everything if r.outcome == RunOutcome.RUNNING]
        if not running:
            return 0
        gone = [
            record
            for record in abandoned(running, await live_instances(store), seen=self.clock())
            if record.outcome == RunOutcome.ABANDONED
        ]
        return await store.runlog.store_abandoned(gone) if gone else 0

    async def flush_missed(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the records of missed occurrences."""
        await self._missed_records.flush(timeout)

    async def _missed(
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
        merged = self._missed_records.merged
        attempt = self._missed_records.add(record, maybe_started=run_id is not None)
        self.counts["missed_merged"] += self._missed_records.merged - merged
        await asyncio.shield(attempt)

    def _claimed_elsewhere(self, name: str, occurrence: float) -> None:
        log.debug("task %r: occurrence %s was claimed elsewhere", name, occurrence)
        self.counts[RunOutcome.CLAIMED_ELSEWHERE] += 1
        self._tell(name, occurrence, RunOutcome.CLAIMED_ELSEWHERE, None)

    def _begin(self, ttl: float | None, start: _Start) -> asyncio.Future[_Begun]:
        """Send ``start`` (claim, lock, start record) with the tick's others of ``ttl``."""
        batch = self._begins.get(ttl)
        if batch is None:
            options = {} if ttl is None else {"ttl": ttl}

            async def begin_each(starts: list[_Start]) -> list[_Begun]:
                answers = await self.locks.start_occurrences(starts, keep=self.keep_runs, **options)
                return [
                    _Begun(claimed, lock, record)
                    for (claimed, lock), (_, record) in zip(answers, starts, strict=True)
                ]

            batch = self._begins[ttl] = Coalesced(
                begin_each,
                self.locks.store.batch_max,
                key=lambda start: start[0].task,
                orphaned=self._orphaned,
            )
        return batch.soon(start)

    def _orphaned(self, begun: _Begun) -> None:
        """A started occurrence whose run was cancelled before its answer came."""
        if begun.lock is not None:
            self._in_background(self._close(begun.lock, begun.record, "cancelled before it began"))

    async def _close(self, lock: Lock, record: RunRecord, error: str) -> None:
        await self._release(lock)
        ended = dataclasses.replace(
            record, ended=self.clock(), outcome=RunOutcome.FAILED, error=error
        )
        with contextlib.suppress(TenureError):
            await self._records(ended)

    async def _guarded(self, task: ScheduledTask, occurrence: float | None) -> Outcome:
        """A manual run, or an occurrence of a task that runs on every instance."""
        record = self._start_record(task.name, occurrence)
        try:
            await self._retried(occurrence, lambda: self._records(record), "recording its start")
        except _Missed as missed:
            await self._missed(task.name, occurrence, missed.reason)
            return Outcome.SKIPPED
        if task.exclusive:
            return await self._ran(task, record, self._exclusively(task, record))
        return await self._ran(task, record, self._everywhere(task, record))

    async def _occurrence(
        self,
        task: ScheduledTask,
        start: _Start,
        begun: _Begun | None = None,
        resent: bool = False,
    ) -> Outcome:
        """One occurrence of an exclusive task: ``begun`` is what its start
        answered (None: not sent yet, or ``resent``: sent, and its answer lost)."""
        claim, record = start
        occurrence = claim.fire_time
        if begun is None:
            tries = 0

            def send() -> asyncio.Future[_Begun]:
                nonlocal tries
                tries += 1
                return self._begin(task.ttl, start)

            try:
                begun = await self._retried(occurrence, send, "starting it")
            except _Missed as missed:
                # A start whose answer was lost may have written the record:
                # the missed one replaces it.
                await self._missed(task.name, occurrence, missed.reason, record.run_id)
                return Outcome.SKIPPED
            resent = resent or tries > 1
        if not begun.claimed:
            if resent:
                # An attempt whose answer was lost may have claimed it and
                # written the record before a later claim came: closed (where
                # it says running), or it would read running for ever.
                self._in_background(self._close_unconfirmed(record))
            self._claimed_elsewhere(task.name, occurrence)
            return Outcome.SKIPPED
        return await self._ran(task, record, self._under(task, record, begun.lock))

    async def _close_unconfirmed(self, record: RunRecord) -> None:
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

    async def _ran(
        self, task: ScheduledTask, record: RunRecord, work: Coroutine[Any, Any, Outcome]
    ) -> Outcome:
        """Await ``work``, the run of ``record``; count, tell and record how it ended."""
        name, occurrence = task.name, record.fire_time
        began = time.monotonic()
        result: RunOutcome = RunOutcome.FAILED
        error: str | None = "interrupted"
        try:
            outcome = await work
        except _Missed as exc:  # its start record is closed as missed below
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
                await asyncio.shield(self._records.soon(finished))
            except Exception as exc:  # the run's own outcome matters more than its record
                log.warning("could not record the run of %r: %s", name, exc)

    async def _everywhere(self, task: ScheduledTask, record: RunRecord) -> Outcome:
        """A run without the task's lock (``exclusive=False``)."""
        reset = _current_run.set(CurrentRun(task.name, record.fire_time, record.run_id, None))
        try:
            await _call(task.fn, self.threads)
        except PoolFull as exc:
            raise _Missed(str(exc)) from exc
        finally:
            _current_run.reset(reset)
        return Outcome.RAN

    async def _exclusively(self, task: ScheduledTask, record: RunRecord) -> Outcome:
        """A manual run: its lock acquired now (batched with others of its
        moment), then ``_under`` it."""
        if not is_async(task.fn) and self.threads.full():
            raise _Missed(f"thread pool full: {self.threads.describe()}")
        lock = await self._acquire(task.name, task.ttl)
        return await self._under(task, record, lock)

    async def _under(self, task: ScheduledTask, record: RunRecord, lock: Lock | None) -> Outcome:
        """The task's function under ``lock`` (None: held elsewhere, skipped),
        released after it."""
        if lock is None:
            return Outcome.SKIPPED
        self._fences[record.run_id] = lock.fencing_token
        reset = _current_run.set(CurrentRun(task.name, record.fire_time, record.run_id, lock))
        try:
            if not is_async(task.fn) and self.threads.full():
                raise _Missed(f"thread pool full: {self.threads.describe()}")
            await self.locks.run_under(lock, task.fn, threads=self.threads)
        except PoolFull as exc:  # filled up while the lock was acquired
            raise _Missed(str(exc)) from exc
        finally:
            _current_run.reset(reset)
            await self._release(lock)
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


_Start = tuple[Claim, RunRecord]
"""An occurrence's claim and its start record, as ``LockService.start_occurrences`` takes them."""


class _Begun(NamedTuple):
    """What an occurrence's start answered."""

    claimed: bool
    lock: Lock | None
    """None: not claimed, or claimed with the task's lock held by an earlier run."""
    record: RunRecord
    """Its start record: written when ``lock`` is not None."""


class _Missed(Exception):
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
