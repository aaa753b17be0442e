"""The Scheduler: one timer loop for every task, misfires, graceful stop.

Defaults, on purpose:

* **Misfire grace: 30 s.** An occurrence is run only if the loop reaches it
  within ``misfire_grace`` seconds of its fire time (by this instance's
  clock). A loop that was blocked runs only the *latest* missed occurrence
  within the grace, never a backlog, and a starting instance begins with the
  next occurrence after its start: no backfill after downtime. The occurrence claim (see ``tasks``)
  still guarantees that an occurrence another instance already ran is not run
  again.
* **A failing store.** An occurrence whose claim, start record or lock
  acquire fails (the store is down, or every connection stayed busy for its
  timeout) is tried again within the same grace, then ends ``missed`` with
  the reason: one log line, a count, an event and a run record (see
  ``tasks``), never a traceback per occurrence.
* **Overlap: skip.** While a run of a task is still going anywhere in the
  cluster, later occurrences find its lock held and are recorded as skipped.
* **Plain functions: 8 threads, 100 waiting.** A task that is not async
  runs on the scheduler's own worker threads (``threads``), and at most
  ``thread_queue`` more occurrences wait for one; an occurrence past that ends
  ``missed`` ("thread pool full"), its lock untaken.
* **Stop: wait, then cancel.** ``stop()`` stops firing, waits up to
  ``shutdown_timeout`` seconds for running tasks, then cancels them; their
  locks are released as they unwind.
* **A dead instance's runs: abandoned after 15 s.** While it runs tasks, an
  instance holds a presence lease (``presence_ttl``); a record that still says
  ``running`` once that lease has run out reads ``abandoned``.
* **Spread over the instances.** Each task has a preferred instance among
  those serving (rendezvous hashing over their presence leases, read every
  5 s, and within a second when another instance takes this one's own
  occurrences); an instance claims its own tasks' occurrences at once and,
  50 ms later, those of the others that nobody has claimed yet, so a tick's
  runs spread evenly instead of all going to the instance whose claims
  arrived first. A dead or stalled instance's share is run by the others,
  50 ms late (see ``_spread``).
* **Maintenance.** The built-in task ``tenure.prune`` (every 10 minutes,
  ``prune=None`` turns it off) stores the ``abandoned`` outcomes it finds, and
  removes expired leases and old run records, through the same mechanism, so
  it too runs once per occurrence.

The loop sleeps until the earliest fire time of all tasks, at most a second
at a time so that a step of the injected clock is noticed promptly: a
thousand tasks are one loop, not a thousand.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import math
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from .._threads import THREAD_QUEUE, THREADS, WorkerPool
from ..control import ControlWatch, RunRequest
from ..errors import InvalidArgument, LockLost
from ..locks import LockService
from ..stores.runlog import PRESENCE_TTL
from ._presence import READY_WAIT
from .interval import interval_seconds
from .pausing import hold_paused
from .skew import SKEW_WARNING, SkewWatch
from .tasks import DEFAULT_KEEP_RUNS, ScheduledTask, ScheduledTaskStore

__all__ = ("Scheduler",)

log = logging.getLogger("tenure.scheduler")

F = TypeVar("F", bound=Callable[..., Any])

PRUNE_TASK = "tenure.prune"
MAX_SLEEP = 1.0


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidArgument(f"{what} must be a number of seconds, got {value!r}")
    if value < 0 or math.isinf(value):
        raise InvalidArgument(f"{what} must be finite and not negative, got {value!r}")
    return float(value)


class Scheduler:
    """Cron for a cluster: each occurrence of each task runs once, wherever it fires."""

    def __init__(
        self,
        locks: LockService,
        *,
        clock: Callable[[], float] = time.time,
        misfire_grace: float = 30.0,
        shutdown_timeout: float = 30.0,
        keep_runs: int = DEFAULT_KEEP_RUNS,
        prune: str | None = "*/10 * * * *",
        listener: Callable[[str, float | None, str], None] | None = None,
        skew_warning: float = SKEW_WARNING,
        threads: int = THREADS,
        thread_queue: int = THREAD_QUEUE,
        presence_ttl: float = PRESENCE_TTL,
    ) -> None:
        if not isinstance(locks, LockService):
            raise InvalidArgument(f"Scheduler needs a LockService, got {type(locks).__name__}")
        if not callable(clock):
            raise InvalidArgument(f"clock must be a function returning POSIX seconds: {clock!r}")
        self.locks = locks
        self.clock = clock
        self.misfire_grace = _seconds(misfire_grace, "misfire_grace")
        self.shutdown_timeout = _seconds(shutdown_timeout, "shutdown_timeout")
        self.skew_warning = _seconds(skew_warning, "skew_warning")
        self._skew = SkewWatch(locks, clock, self.skew_warning)
        self.tasks = ScheduledTaskStore(
            locks,
            clock=clock,
            keep_runs=keep_runs,
            listener=listener,
            misfire_grace=self.misfire_grace,
            threads=WorkerPool(threads, thread_queue, name="tenure-task"),
            presence_ttl=presence_ttl,
        )
        if prune is not None:
            self.tasks.add(self._prune, prune, name=PRUNE_TASK)
        self.control = ControlWatch(
            locks.store,
            locks.holder,
            lambda: {task.name: task.schedule.expr for task in self.tasks},
            self._requested,
            keep_runs=keep_runs,
            serving=lambda: not self._stopping,  # a stopping one leaves requests to others
        )
        """Its side of ``tenure.control``: its tasks registered, pauses, run requests."""
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._serving: asyncio.Future[None] | None = None
        """serve() in the background of ``async with`` (None: not serving so)."""
        self.cancelled = 0
        """Runs that ``serve()`` cancelled when it last stopped, because they were
        still going ``shutdown_timeout`` seconds after ``stop()``."""

    @property
    def skew(self) -> float | None:
        """This instance's clock minus the store's, in seconds, as last measured
        (None before the first measurement, or for a store without a clock)."""
        return self._skew.skew

    def cron(
        self,
        expr: str,
        *,
        name: str | None = None,
        ttl: float | None = None,
        tz: str | None = None,
        exclusive: bool = True,
    ) -> Callable[[F], F]:
        """Decorator: run the function on ``expr``; the function itself is returned unchanged."""

        def register(fn: F) -> F:
            self.add(fn, expr, name=name, ttl=ttl, tz=tz, exclusive=exclusive)
            return fn

        return register

    def every(
        self,
        *,
        seconds: float = 0,
        minutes: float = 0,
        hours: float = 0,
        name: str | None = None,
        ttl: float | None = None,
        exclusive: bool = True,
    ) -> Callable[[F], F]:
        """Decorator: run the function once per interval in the cluster, at
        whole multiples of the interval since the Unix epoch (``every(minutes=15)``:
        at :00, :15, :30 and :45, UTC; see ``interval``), claimed like a cron
        occurrence. The function itself is returned unchanged."""
        interval = interval_seconds(seconds, minutes, hours)

        def register(fn: F) -> F:
            self.add(fn, every=interval, name=name, ttl=ttl, exclusive=exclusive)
            return fn

        return register

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
        """Register a task without a decorator: on the cron expression ``expr``,
        or ``every`` so many seconds. Errors are raised here, not at the first tick."""
        return self.tasks.add(fn, expr, every=every, name=name, ttl=ttl, tz=tz, exclusive=exclusive)

    async def _prune(self) -> None:
        abandoned = await self.tasks.store_abandoned()
        removed = await self.locks.store.prune(keep_runs=self.tasks.keep_runs)
        log.debug("tenure.prune stored %d abandoned runs, removed %d entries", abandoned, removed)

    async def __aenter__(self) -> Scheduler:
        """Serve in the background of this event loop until the block ends:
        ``async with locks, scheduler:`` is an asyncio application's (a
        FastAPI/Starlette lifespan's) whole set-up."""
        if self._serving is not None:
            raise InvalidArgument("this Scheduler is already serving; enter it once")
        self._serving = asyncio.ensure_future(self.serve())
        self._serving.add_done_callback(self._served)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving in the background (``async with``'s exit): stop
        firing, wait up to ``shutdown_timeout`` for running tasks, cancel the
        rest, and return when ``serve()`` has. A no-op when not serving."""
        serving, self._serving = self._serving, None
        if serving is None:
            return
        self.stop()
        try:
            await asyncio.shield(serving)
        except asyncio.CancelledError:
            if not serving.done():  # our caller is cancelled: the stop still completes
                await asyncio.gather(serving, return_exceptions=True)
                raise
            # serve() itself was cancelled (its loop is closing): nothing to add

    def _served(self, serving: asyncio.Future[None]) -> None:
        """Say at once when background serving ended by an error (it would
        otherwise wait unseen for the block's end)."""
        if not serving.cancelled() and serving.exception() is not None:
            log.error("the scheduler stopped serving: %s", serving.exception())

    def stop(self) -> None:
        """Stop firing; ``serve()`` then waits for running tasks and returns. Any thread."""
        self._stopping = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

    async def serve(self) -> None:
        """Run the timer loop until ``stop()`` or cancellation."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopping = False
        self.locks.start()
        # Held before the first run's record is written, or soon after when the
        # store is out of reach now (the runs do not wait for it).
        await self.tasks.presence.taken()
        with contextlib.suppress(TimeoutError):  # the first tick is spread too
            async with asyncio.timeout(READY_WAIT):  # (wait_for may drop a cancel on 3.11)
                await self.tasks.read_peers()
        watching = [
            asyncio.ensure_future(self._skew.watch()),
            asyncio.ensure_future(self.control.watch()),
        ]
        try:
            await self._timer_loop()
        finally:
            for watch in watching:
                watch.cancel()
            await asyncio.gather(*watching, return_exceptions=True)
            self.cancelled = await self._drain()
            await self.tasks.flush_missed(self.shutdown_timeout)
            self.tasks.threads.shutdown()
            self._loop = self._wake = None

    async def _timer_loop(self) -> None:
        assert self._wake is not None
        heap: list[tuple[float, str]] = []
        start = self.clock()
        for task in self.tasks:
            # Start with the next occurrence: a starting instance does not
            # run what fell due before it was up (no backfill).
            heap.append((task.schedule.next_after(start), task.name))
        heapq.heapify(heap)
        if heap:
            fire, name = heap[0]
            log.info(
                "serving %d task(s) on %s as %s; first due: %r at %s UTC",
                len(heap),
                self.locks.store.describe(),
                self.locks.holder,
                name,
                datetime.fromtimestamp(fire, UTC).strftime("%Y-%m-%d %H:%M:%S"),
            )
        due: list[tuple[str, float]] = []
        while not self._stopping and heap:
            now = self.clock()
            fire, name = heap[0]
            if fire > now:
                if due:  # every occurrence due now is in: start them as one batch
                    self._spawn(self._start_due(due))
                    due = []
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    # asyncio.timeout: wait_for may drop a cancel of serve() on 3.11
                    async with asyncio.timeout(min(fire - now, MAX_SLEEP)):
                        await self._wake.wait()
                continue
            task = self.tasks[name]
            # One fire time computed per task and tick: the heap's entry is an
            # occurrence, the latest due unless the loop was held up past the next.
            latest, following = fire, task.schedule.next_after(fire)
            if following <= now:
                latest = task.schedule.latest_at_or_before(now)
                following = task.schedule.next_after(latest)
            if now - latest <= self.misfire_grace:
                due.append((name, latest))
            else:
                log.info(
                    "task %r: occurrence %s missed by %.1f s, beyond the misfire grace",
                    name,
                    latest,
                    now - latest,
                )
            heapq.heapreplace(heap, (following, name))
        if due:
            self._spawn(self._start_due(due))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        run = asyncio.ensure_future(work)
        self._running.add(run)
        run.add_done_callback(self._running.discard)

    async def _start_due(self, due: list[tuple[str, float]]) -> None:
        """Claim one tick's occurrences together; each one won runs as a task of its own."""
        try:
            due = await hold_paused(self.tasks, self.control, due, self._start_run)
            await self.tasks.run_due(due, self._start_run)
        except Exception:
            log.exception("%d occurrence(s) due at once could not be started", len(due))

    def _requested(self, request: RunRequest) -> None:
        """Run a task now, as an operator asked through the store."""
        run = functools.partial(self.tasks.run, request.task, run_id=request.request_id)
        self._spawn(self._fire(request.task, None, run))

    def _start_run(
        self, name: str, occurrence: float, run: Callable[[], Coroutine[Any, Any, Any]]
    ) -> None:
        self._spawn(self._fire(name, occurrence, run))

    async def _fire(
        self, name: str, occurrence: float | None, run: Callable[[], Coroutine[Any, Any, Any]]
    ) -> None:
        try:
            await run()
        except LockLost as exc:
            log.warning("task %r (occurrence %s): %s", name, occurrence, exc)
        except Exception:
            log.exception("task %r (occurrence %s) failed", name, occurrence)

    async def _drain(self) -> int:
        """Wait up to ``shutdown_timeout`` for the runs (and the runs that the
        ticks still starting start), then cancel what is left; how many."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while self._running:
            left = deadline - loop.time()
            if left > 0:
                await asyncio.wait(set(self._running), timeout=left)
                continue
            pending = set(self._running)
            for run in pending:
                run.cancel()
            log.warning(
                "cancelled %d task(s) still running after %.1f s",
                len(pending),
                self.shutdown_timeout,
            )
            await asyncio.gather(*pending, return_exceptions=True)
            return len(pending)
        return 0
