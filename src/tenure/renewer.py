"""The one renewer of a LockService: due times, batching, local deadlines, loss.

Every lock a service holds is a :class:`LeaseState` registered here. The
renewer runs on a thread of its own, with its own event loop and its own store
connection (``store.sibling()``), so a busy or blocked application loop cannot
starve it. An acquire only appends its lease to a queue of arrivals, which the
renewer's thread alone sorts into a heap ordered by next renewal time (most
short locks are released before that and never enter it). When the earliest
is due, it renews in one store call every lease due within
a third of that lease's renewal interval: leases acquired at different moments
fall into a few cohorts, so 10,000 locks cost a handful of round trips per
interval rather than 10,000.

A lease's local deadline (``tenure.lease``) moves on with each renewal this
confirms. A renewal the store refuses, or none confirmed before the deadline,
marks the lease lost, and the service reports it; ``Lock.held`` compares
against the deadline at each read, so nothing depends on this thread being
scheduled in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .lease import LOST_BY_STORE, LeaseState, renew_interval
from .stores.base import RenewItem, Store

__all__ = ("Renewer",)

log = logging.getLogger("tenure.renewer")

MAX_ARRIVALS = 2048
"""Leases acquired since the renewer last looked, past which it is woken to
sort them in: most are released by then, and their objects are let go."""

MAX_BATCH = 2500
"""Leases per store call: large enough that 10,000 locks take four calls, small
enough that one call's request and reply stay well under a megabyte."""


def retry_delay(ttl: float) -> float:
    """Pause before retrying a renewal that failed to reach the store."""
    return max(0.05, min(ttl / 12, 1.0))


def _dead(state: LeaseState) -> bool:
    return state.released or state.loss is not None


def _drop_answer(call: asyncio.Future[list[bool]]) -> None:
    if not call.cancelled() and call.exception() is not None:
        log.debug("a late renewal failed: %r", call.exception())


class Renewer:
    """Renews every lease of one service from a thread of its own."""

    def __init__(
        self, store: Store, on_failure: Callable[[int, Exception], None] | None = None
    ) -> None:
        self._store = store
        self._on_failure = on_failure
        self.lease_guard = threading.Lock()
        """The guard of every LeaseState renewed here (LeaseState.guard)."""
        self._arrivals: deque[LeaseState] = deque()
        """Appended to by any thread; emptied by the renewer's thread only."""
        self._heap: list[tuple[float, int, LeaseState]] = []
        """The renewer's thread's alone: no guard."""
        self._seq = itertools.count()
        self._next_wake = math.inf
        self._drain_asked = False
        self._released = 0
        self._phantom = math.inf
        """When the earliest lease released unseen would have been due: a wake-up kept."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._late: set[asyncio.Future[list[bool]]] = set()
        """Renewals left running past their budget: ended before the store is closed."""
        self._thread: threading.Thread | None = None
        self.started = False
        """Its thread was started (and not stopped since): read on every acquire."""
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.round_trips = 0
        """Store calls made so far (for benchmarks and diagnostics)."""

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._thread_main, name="tenure-renewer", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            error, self._startup_error = self._startup_error, None
            self._thread.join()
            self._thread = None
            raise error
        self.started = True

    def stop(self) -> None:
        """Stop the thread and wait for it; leases still registered stop being renewed."""
        thread = self._thread
        if thread is None:
            return
        loop = self._loop
        self._stopping = True
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._poke)
            except RuntimeError:
                pass
        thread.join()
        self._thread = None
        self.started = False

    def add(self, state: LeaseState) -> None:
        """Start renewing ``state``; safe from any thread, and takes no lock.

        The append comes before the read of ``_next_wake``: either the renewer
        sees this lease when it settles on a wake-up time (``_settle`` looks at
        the arrivals after publishing it), or this read sees that time.
        """
        arrivals = self._arrivals
        arrivals.append(state)
        if state.renew_at < self._next_wake:
            # Until the renewer looks, later adds need not poke it again (it
            # only gets the GIL back every few milliseconds). Its own next
            # wake-up, once published, overwrites this.
            self._next_wake = state.renew_at
            self._poke_from_outside()
        elif len(arrivals) > MAX_ARRIVALS and not self._drain_asked:
            self._drain_asked = True
            self._poke_from_outside()

    def discard(self, state: LeaseState) -> None:
        """Note that ``state`` was released: its entry is dropped when next seen."""
        # Only a hint of when to compact the heap: an update lost between
        # threads costs nothing.
        self._released += 1

    def _poke_from_outside(self) -> None:
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._poke)
            except RuntimeError:  # the renewer's loop is closed: it is stopping
                pass

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # pragma: no cover - only a bug ends up here
            if not self._ready.is_set():
                self._startup_error = exc
                self._ready.set()
            else:
                log.exception("the tenure renewer stopped unexpectedly")

    async def _main(self) -> None:
        try:
            store = self._store.sibling()
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._ready.set()
        # Connect while nothing is due yet, beside the loop rather than before
        # it: the first renewal then does not pay for connection set-up (a
        # cluster's slot map, a pool), which a thread starved of the GIL by
        # CPU-bound work could stretch past a short TTL.
        warming = asyncio.ensure_future(store.warm_up())
        try:
            await self._run(store)
        finally:
            # A call still running when its store closes would open a
            # connection after the pool was emptied, and leak it.
            left: list[asyncio.Future[Any]] = [warming, *self._late]
            for call in left:
                call.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            if store is not self._store:
                await store.aclose()

    def _sort_in(self, now: float) -> None:
        """Move the arrivals into the heap, leaving out those already released."""
        arrivals, heap, seq = self._arrivals, self._heap, self._seq
        self._drain_asked = False
        if self._phantom <= now:
            self._phantom = math.inf
        for _ in range(len(arrivals)):  # adds may go on meanwhile: take what was there
            state = arrivals.popleft()
            if not _dead(state):
                heapq.heappush(heap, (state.renew_at, next(seq), state))
            elif now < state.renew_at < self._phantom:
                # A released lease still sets the timer it would have set: the
                # next acquire then finds a wake-up before its own renewal and
                # need not wake this thread (which costs more than a grant).
                self._phantom = state.renew_at
        if self._released > 1024 and self._released * 2 > len(heap):
            self._heap = [entry for entry in heap if not _dead(entry[2])]
            heapq.heapify(self._heap)
            self._released = 0

    def _settle(self, now: float) -> tuple[list[LeaseState], float]:
        """Pop the batch that is due, or return none and the time to wake up."""
        self._sort_in(now)
        heap = self._heap
        # Dead entries in the heap are dropped only once due (or by a
        # compaction), for the same reason as the phantom timer above.
        while heap and heap[0][0] <= now and _dead(heap[0][2]):
            heapq.heappop(heap)
        if not heap or heap[0][0] > now:
            wake_at = min(heap[0][0] if heap else math.inf, self._phantom)
            self._next_wake = wake_at
            assert self._wake is not None
            self._wake.clear()
            # An add that appended before _next_wake was published compared
            # against the old value: look for one due sooner than this wake-up.
            if any(state.renew_at < wake_at for state in list(self._arrivals)):
                return [], now
            return [], wake_at
        horizon = now + renew_interval(heap[0][2].ttl) / 3
        batch: list[LeaseState] = []
        while heap and heap[0][0] <= horizon and len(batch) < MAX_BATCH:
            state = heapq.heappop(heap)[2]
            if not _dead(state):
                batch.append(state)
        # Busy with this batch: no need to be poked; we look again right after.
        self._next_wake = -math.inf
        return batch, now

    def _push(self, states: list[LeaseState]) -> None:
        for state in states:
            if not _dead(state):
                heapq.heappush(self._heap, (state.renew_at, next(self._seq), state))

    async def _run(self, store: Store) -> None:
        assert self._wake is not None
        while not self._stopping:
            now = time.monotonic()
            batch, wake_at = self._settle(now)
            if not batch:
                timeout = None if math.isinf(wake_at) else max(0.0, wake_at - now)
                # asyncio.timeout: wait_for may drop the stopping cancel on 3.11
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                continue
            await self._renew(store, batch)
            self._push(batch)

    async def _renew_mixed(
        self, store: Store, batch: list[LeaseState], items: list[RenewItem]
    ) -> list[bool]:
        """Locks and semaphore permits (a subclass of LeaseState) due together:
        one call each, sent together; the answers in the batch's order."""
        locks = [i for i, state in enumerate(batch) if state.__class__ is LeaseState]
        permits = [i for i, state in enumerate(batch) if state.__class__ is not LeaseState]
        calls = []
        if locks:
            calls.append(store.renew([items[i] for i in locks]))
        calls.append(store.semaphores.renew([items[i] for i in permits]))
        self.round_trips += len(calls)
        answers = await asyncio.gather(*calls)
        results = [False] * len(batch)
        for indices, answer in zip((locks, permits) if locks else (permits,), answers, strict=True):
            for i, ok in zip(indices, answer, strict=True):
                results[i] = ok
        return results

    async def _renew(self, store: Store, batch: list[LeaseState]) -> None:
        sent = time.monotonic()
        # Never wait on the store past the earliest deadline in the batch: by
        # then that lease is lost whatever the answer.
        budget = max(0.05, min(state.deadline for state in batch) - sent)
        items = [RenewItem(state.name, state.token, state.ttl) for state in batch]
        if all(state.__class__ is LeaseState for state in batch):
            self.round_trips += 1
            call = asyncio.ensure_future(store.renew(items))
        else:
            call = asyncio.ensure_future(self._renew_mixed(store, batch, items))
        try:
            # Waited for, never cancelled: cancelling a driver mid-call can cost
            # more than the call (psycopg then sends a cancel request and waits
            # for it). A call past its budget is left to the store's own
            # timeout, and its answer, which no longer matters, is dropped.
            await asyncio.wait((call,), timeout=budget)
            if not call.done():
                call.add_done_callback(_drop_answer)
                self._late.add(call)
                call.add_done_callback(self._late.discard)
                raise TimeoutError(f"no answer within {budget:.2f} s")
            results = call.result()
        except Exception as exc:  # every failure is retried the same way, until the deadline
            log.warning("renewing %d lock(s) failed, retrying: %r", len(batch), exc)
            if self._on_failure is not None:
                self._on_failure(len(batch), exc)
            now = time.monotonic()
            for state in batch:
                if not state.alive():
                    continue
                state.renew_at = min(now + retry_delay(state.ttl), state.deadline)
            return
        for state, ok in zip(batch, results, strict=True):
            if ok:
                state.extend(sent)
            else:
                state.lose(LOST_BY_STORE)
