"""Portal: an event loop on a thread of its own, for blocking callers to run
coroutines on (``tenure.sync``'s waits, and its calls on stores without
plain calls)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ("Portal",)

T = TypeVar("T")


class Portal:
    """An event loop on a thread of its own, started at first use."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._running())
        try:
            return future.result()
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt): the core's own
            # cancellation handling cleans up (an acquire that raced is released).
            future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop thread; its future, not waited for."""
        return asyncio.run_coroutine_threadsafe(coro, self._running())

    def _running(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._guard:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="tenure-sync", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def stop(self) -> None:
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
