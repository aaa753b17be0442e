"""The bound on a store's calls in flight: callers past it queue for a turn.

Every networked store sends each operation on one of a few connections (or,
on etcd, one multiplexed channel). Without a bound, a burst of callers opens
a connection each until the driver or the server refuses ("Too many
connections", PostgreSQL's ``max_connections``): a failed call for what is
only a moment of load. A :class:`Gate` lets ``limit`` calls through at once;
the others wait first come, first served, for at most ``timeout`` seconds
and then fail with :class:`~tenure.errors.StoreUnavailable` naming the bound
and the URL option that raises it.

Waiting here is waiting for a connection, never for a lock: ``acquire(wait=0)``
that queues for a turn still returns at once when the lock is held. Asyncio
callers (on any event loop) and blocking callers (any thread) share one gate
and one queue, so the blocking API's plain calls and the waits it runs on its
loop thread are bounded together.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from types import TracebackType

from ..errors import StoreUnavailable

__all__ = ("Gate",)


class _Turn:
    """One queued caller: woken with its turn already counted as taken."""

    __slots__ = ("event", "future", "given", "loop")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[None] | None,
        event: threading.Event | None,
    ) -> None:
        self.loop = loop
        self.future = future
        self.event = event
        self.given = False

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
        elif self.loop is not None and self.future is not None:
            self.loop.call_soon_threadsafe(_settle, self.future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Gate:
    """At most ``limit`` calls in flight; the rest queue in order for up to ``timeout`` s.

    ``async with gate:`` around an asyncio call, ``with gate.blocking():``
    around a blocking one. ``what`` names the store in the error (a URL with
    its password masked); ``option`` is the URL option that sets ``limit``.
    The counters (``peak``, ``queued``) let tests and benchmarks show that a
    load really queued.
    """

    __slots__ = (
        "_free",
        "_mutex",
        "_queue",
        "limit",
        "option",
        "peak",
        "queued",
        "timeout",
        "what",
    )

    def __init__(self, limit: int, timeout: float, *, what: str, option: str = "pool_max") -> None:
        self.limit = limit
        self.timeout = timeout
        self.what = what
        self.option = option
        self._free = limit
        self._queue: deque[_Turn] = deque()
        self._mutex = threading.Lock()
        self.peak = 0
        """The most calls that were in flight at once."""
        self.queued = 0
        """How many calls had to wait for a turn."""

    @property
    def in_flight(self) -> int:
        return self.limit - self._free

    def _take_now(self) -> bool:
        """Take a turn if one is free and nobody queues before us (under the mutex)."""
        if self._free > 0 and not self._queue:
            self._free -= 1
            in_flight = self.limit - self._free
            self.peak = max(self.peak, in_flight)
            return True
        return False

    def _full(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"{self.what}: all {self.limit} connections stayed busy for {self.timeout:g} s "
            f"({self.option}={self.limit}); raise {self.option} in the store's URL, "
            "or call it from fewer tasks or threads at once"
        )

    def _give_up(self, turn: _Turn) -> None:
        """A queued caller stops waiting: out of the queue, or its turn passed on."""
        with self._mutex:
            if turn.given:
                self._leave_locked()
            else:
                self._queue.remove(turn)

    def _leave_locked(self) -> None:
        if self._queue:
            turn = self._queue.popleft()
            turn.given = True  # the turn moves to it: _free stays as it is
            turn.wake()
        else:
            self._free += 1

    def leave(self) -> None:
        """Give a turn back: to the caller queued first, if any."""
        with self._mutex:
            self._leave_locked()

    async def __aenter__(self) -> None:
        with self._mutex:
            if self._take_now():
                return
            loop = asyncio.get_running_loop()
            turn = _Turn(loop, loop.create_future(), None)
            self._queue.append(turn)
            self.queued += 1
        assert turn.future is not None
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(turn.future)
        except BaseException as exc:
            self._give_up(turn)
            if isinstance(exc, TimeoutError):
                raise self._full() from None
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.leave()

    def enter_blocking(self) -> None:
        """Take a turn on a blocking caller's thread, waiting up to ``timeout``."""
        with self._mutex:
            if self._take_now():
                return
            turn = _Turn(None, None, threading.Event())
            self._queue.append(turn)
            self.queued += 1
        assert turn.event is not None
        if turn.event.wait(self.timeout):
            return
        with self._mutex:
            if not turn.given:
                self._queue.remove(turn)
                raise self._full()
        # Given just as the wait ran out: the turn is ours.

    def blocking(self) -> _Blocking:
        """``with gate.blocking():`` around a blocking call."""
        return _Blocking(self)


class _Blocking:
    __slots__ = ("_gate",)

    def __init__(self, gate: Gate) -> None:
        self._gate = gate

    def __enter__(self) -> None:
        self._gate.enter_blocking()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._gate.leave()
