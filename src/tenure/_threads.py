"""Worker threads for plain (non-async) functions, bounded.

``run_exclusively`` and the scheduler run a plain function on a thread of a
``WorkerPool``: at most ``threads`` at once, and at most ``queue`` more
waiting for one. Past that the pool is full and says so at once
(``PoolFull``), rather than letting work pile up without limit behind a slow
function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ._validate import check_count
from .errors import TenureError

__all__ = ("THREADS", "THREAD_QUEUE", "PoolFull", "WorkerPool")

T = TypeVar("T")

THREADS = 8
"""Plain functions run at once per pool, by default."""
THREAD_QUEUE = 100
"""Plain functions that may wait for a thread per pool, by default."""


class PoolFull(TenureError):
    """Every thread of a WorkerPool is busy and its queue is full."""


class WorkerPool:
    """At most ``threads`` plain functions at once, ``queue`` more waiting."""

    def __init__(
        self, threads: int = THREADS, queue: int = THREAD_QUEUE, *, name: str = "tenure-work"
    ) -> None:
        self.threads = check_count(threads, "threads")
        self.queue = check_count(queue, "thread_queue")
        self._name = name
        self._guard = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.pending = 0
        """Functions admitted and not yet finished (running or waiting)."""

    def full(self) -> bool:
        return self.pending >= self.threads + self.queue

    def describe(self) -> str:
        return (
            f"all {self.threads} worker threads are busy and {self.queue} more functions wait "
            f"for one (threads={self.threads}, thread_queue={self.queue}); raise them, or make "
            "the slow functions async"
        )

    async def run(self, call: Callable[[], T]) -> T:
        """``call()`` on a thread of the pool, with this context's variables
        (``current_lock()`` works there). PoolFull when the pool is full."""
        with self._guard:
            if self.pending >= self.threads + self.queue:
                raise PoolFull(f"thread pool full: {self.describe()}")
            self.pending += 1
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.threads, thread_name_prefix=self._name
                )
            executor = self._executor
        context = contextvars.copy_context()
        try:
            work = executor.submit(context.run, call)
        except BaseException:
            self._finished(None)
            raise
        # Counted until the thread is done (or the call is dropped before it
        # started), not until the caller stops waiting: a thread cannot be stopped.
        work.add_done_callback(self._finished)
        return await asyncio.wrap_future(work)

    def _finished(self, _work: Any) -> None:
        with self._guard:
            self.pending -= 1

    def shutdown(self) -> None:
        """Let running functions finish; start no new ones (threads end when idle)."""
        with self._guard:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=False)
