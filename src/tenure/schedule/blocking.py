"""``tenure.sync.Scheduler``: the cluster-safe scheduler for code without an
event loop (Django, Flask, gunicorn, scripts).

It is the asyncio ``Scheduler`` run on the loop thread of a ``tenure.sync``
service, not a second implementation: the same claims, records, misfire and
shutdown rules. Plain task functions run on its worker threads, coroutine
functions on that loop thread.

* ``start()`` serves in the background and returns at once; ``stop()`` stops
  firing, waits up to ``shutdown_timeout`` for running tasks (then cancels
  what is left), and returns when it has stopped; ``with scheduler:`` does both.
* ``serve()`` blocks until SIGINT or SIGTERM (on the main thread) or
  ``stop()`` from another thread: for a process of its own.
* A started scheduler is stopped at interpreter exit (``atexit``) in the
  process that started it, so a server's ordinary shutdown closes the records
  of runs in progress and releases their locks. Threads do not survive
  ``fork()``: under ``gunicorn --preload`` a scheduler started at import runs
  in the master process only, and the master's exit on SIGTERM stops it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import InvalidArgument
from .scheduler import Scheduler
from .tasks import ScheduledTask, ScheduledTaskStore

if TYPE_CHECKING:
    from ..sync import LockService

__all__ = ("BlockingScheduler",)

F = TypeVar("F", bound=Callable[..., Any])


class BlockingScheduler:
    """Cron for a cluster, for blocking code (see the module docstring).

    ``BlockingScheduler(locks, **options)`` takes a ``tenure.sync.LockService``
    and the options of ``tenure.Scheduler`` (``misfire_grace``,
    ``shutdown_timeout``, ``threads``, ...)."""

    def __init__(self, locks: LockService, **options: Any) -> None:
        from ..sync import LockService as BlockingService

        if not isinstance(locks, BlockingService):
            raise InvalidArgument(
                "tenure.sync.Scheduler needs a tenure.sync.LockService, got "
                f"{type(locks).__module__}.{type(locks).__name__} (for an asyncio "
                "LockService use tenure.Scheduler)"
            )
        self.locks = locks
        self.scheduler = Scheduler(locks.core, **options)
        """The asyncio scheduler this one runs, on the service's loop thread."""
        self._serving: concurrent.futures.Future[None] | None = None
        self._pid = 0
        self._guard = threading.Lock()

    @property
    def tasks(self) -> ScheduledTaskStore:
        return self.scheduler.tasks

    def cron(self, expr: str, **options: Any) -> Callable[[F], F]:
        """Decorator: run the function on the cron expression ``expr`` (the
        options of ``tenure.Scheduler.cron``)."""
        return self.scheduler.cron(expr, **options)

    def every(self, **options: Any) -> Callable[[F], F]:
        """Decorator: run the function once per interval (``seconds=``,
        ``minutes=``, ``hours=``; see ``tenure.Scheduler.every``)."""
        return self.scheduler.every(**options)

    def add(self, fn: Callable[..., Any], expr: str | None = None, **options: Any) -> ScheduledTask:
        """Register a task without a decorator (as ``tenure.Scheduler.add``)."""
        return self.scheduler.add(fn, expr, **options)

    def start(self) -> None:
        """Serve in the background (on the service's loop thread); returns at once."""
        with self._guard:
            if self._serving is not None and not self._serving.done():
                raise InvalidArgument("this Scheduler is already serving; start it once")
            self.locks.start()
            self._serving = self.locks.submit(self.scheduler.serve())
            if self._pid != os.getpid():  # once per process that starts it
                self._pid = os.getpid()
                atexit.register(self._at_exit, self._pid)

    def stop(self, timeout: float | None = None) -> None:
        """Stop firing, wait up to ``shutdown_timeout`` for running tasks, cancel
        the rest; return when serving has ended (or after ``timeout`` seconds).
        Any thread; a no-op when not serving."""
        with self._guard:
            serving = self._serving
        if serving is None:
            return
        self.scheduler.stop()
        try:
            serving.result(timeout)
        except concurrent.futures.CancelledError:
            pass  # the loop thread went away first (the service was closed)

    def serve(self) -> None:
        """Serve until ``stop()`` or, when called on the main thread, SIGINT or
        SIGTERM (each stops it gracefully; a second SIGINT interrupts)."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            serving = self._serving
            assert serving is not None
            serving.result()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        self.scheduler.stop()  # serve() returns when the runs have finished

    def _at_exit(self, pid: int) -> None:
        if pid == os.getpid():  # not in a forked child, which never ran it
            # Only stop: at this point of an interpreter's exit no executor
            # takes new work, which closing a store needs; what the service
            # still holds (this instance's presence lease) lapses in its TTL.
            self.stop()

    def __enter__(self) -> BlockingScheduler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
