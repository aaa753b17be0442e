"""Coalescing: the calls many coroutines make in one turn of the loop, as one batch.

The timer loop starts every occurrence that fell due in a tick at once; each
then claims, records and locks on its own. A ``Coalesced`` call collects
what they ask for until the loop has run each of them once, then sends it as
batches of at most ``size`` items: a thousand due tasks cost a few store
calls per step, not a thousand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ("Coalesced",)

T = TypeVar("T")
R = TypeVar("R")


class Coalesced(Generic[T, R]):
    """``await coalesced(item)``: the answer for ``item`` from a batch call.

    ``send`` takes a list of items and returns one answer per item, in order.
    Items with the same ``key`` go in different batches (a store batch takes
    distinct names). When the caller was cancelled before its answer came,
    ``orphaned`` gets the answer (a grant nobody will release otherwise).
    ``calls`` counts the batch calls made.
    """

    def __init__(
        self,
        send: Callable[[list[T]], Awaitable[Sequence[R]]],
        size: int,
        *,
        key: Callable[[T], Hashable] = id,
        orphaned: Callable[[R], None] | None = None,
    ) -> None:
        self._send = send
        self._size = size
        self._key = key
        self._orphaned = orphaned
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._flushing = False
        self._sending: set[asyncio.Task[None]] = set()
        self.calls = 0

    async def __call__(self, item: T) -> R:
        return await self.soon(item)

    def soon(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` now; the future of its answer. Sent even if nobody
        awaits it: ``await asyncio.shield(coalesced.soon(item))`` is a write
        that a cancellation cannot stop, without a task of its own."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if not self._flushing:
            # Queued behind every coroutine already ready to run: the others
            # of this tick add their items first.
            self._flushing = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flushing = False
        pending, self._pending = self._pending, []
        batch: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        for entry in pending:
            key = self._key(entry[0])
            if len(batch) == self._size or key in keys:
                self._start(batch)
                batch, keys = [], set()
            batch.append(entry)
            keys.add(key)
        if batch:
            self._start(batch)

    def _start(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        task = asyncio.ensure_future(self._deliver(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.calls += 1
        try:
            answers = await self._send([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # each caller gets it; nobody reads this task's result
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
            elif self._orphaned is not None:
                self._orphaned(answer)
