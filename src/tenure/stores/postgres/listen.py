"""Waiting for a PostgreSQL lease: LISTEN/NOTIFY, and the hand-over queue.

A waiter that finds the lock held queues itself on the lease row (``next_*``
columns: its id, token, holder, the hand-over lease, and an entry that lapses
after ``QUEUE_LIFE`` unless it calls again, every third of that), in the one
statement that would have granted it a free lock. One waiter per name is
queued; the others wait their turn. The release statement hands the lease
straight to the queued waiter and NOTIFYs the channel ``<prefix>_released``
with a note naming that waiter; the waiter holds the lock when its store's
LISTEN connection reads the note: one commit per handoff, not two. The note
also wakes the other waiters of the name. (``wait_released`` callers count
themselves on the row instead and are woken by the bare name.) A release
nobody waits for pays no NOTIFY.

Each store keeps one LISTEN connection (opened at the first wait, a plain
session connection: never a transaction pooler's); a waiter also wakes when
the current lease expires. Behind a transaction pooler without
``listen_url``, waiters call again at the lease's expiry and at least every
third of ``QUEUE_LIFE``, and a handed-over lease is found by that call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql as pgsql

from ..._aio import Background, shielded, woken_within
from ..._tokens import new_token
from ...errors import StoreUnavailable
from .._waiters import QUEUE_LIFE, Wakeups
from ..base import Grant, HandedOver
from ..semaphores import Changes, Heard, local_changes
from .sql import Statements
from .transport import Transport

__all__ = ("Waiting",)

log = logging.getLogger("tenure.stores.postgres")

_POLL_WITHOUT_LISTEN = 0.5


class Waiting:
    """``wait_released`` and ``acquire_waiting`` of one store (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        listen_url: str | None,
        release: Callable[[str, str], Awaitable[bool]],
    ) -> None:
        self.transport = transport
        self.sql: Statements = transport.sql
        self.listen_url = listen_url
        self.release = release
        self._listener: asyncio.Task[None] | None = None
        self._listen_guard: asyncio.Lock | None = None
        self._waiting: Wakeups[str] = Wakeups()
        self._handed: dict[str, asyncio.Future[tuple[int, int]]] = {}
        """The queued waiters of this store, by waiter id: set by a hand-over note."""
        self._withdrawing = Background()
        """Waiters that gave up abnormally, leaving the queue (``_abandon``)."""

    async def aclose(self) -> None:
        """Before the transport closes: the withdrawals run on its pool."""
        await self._withdrawing.finish()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener

    async def _remaining(self, name: str) -> float | None:
        rows = await self.transport.query(self.sql.remaining, (name,))
        return float(rows[0][0]) if rows else None

    async def wait_released(self, name: str, timeout: float) -> None:
        if self.listen_url is None:
            # Behind a transaction pooler LISTEN cannot work: re-check at the
            # lease's expiry, and every half second for a release.
            remaining = await self._remaining(name)
            if remaining is not None:
                await asyncio.sleep(min(timeout, remaining, _POLL_WITHOUT_LISTEN))
            return
        woken = self._waiting.add(name)
        try:
            # Listening (LISTEN confirmed by the server) first, then register
            # and look at the lease: a release in between cannot be missed.
            await self._ensure_listening()
            rows = await self.transport.query(self.sql.wait, (name,))
            if not rows:
                return
            try:
                await woken_within(woken, min(timeout, float(rows[0][0])))
            finally:
                # Shielded: a cancelled waiter still takes its count back (one
                # left behind only costs later releases a needless NOTIFY).
                with contextlib.suppress(StoreUnavailable):
                    await shielded(self.transport.query(self.sql.unwait, (name,)))
        finally:
            self._waiting.remove(name, woken)

    @contextlib.asynccontextmanager
    async def notes(self, key: str, data_key: str) -> AsyncIterator[Changes]:
        """Wake-ups for the notes whose payload is ``key`` (a semaphore's
        release): listening (confirmed) once entered. Without a LISTEN
        connection (behind a transaction pooler), only this process's own
        releases wake (``wake_local(data_key, key)``); waiters call again at
        least every third of QUEUE_LIFE."""
        if self.listen_url is None:
            async with local_changes(data_key, key) as changes:
                yield changes
            return
        heard = Heard(self._waiting, key)
        try:
            await self._ensure_listening()
            yield heard
        finally:
            self._waiting.remove(key, heard.woken)

    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        waiter = new_token()[:16]  # public: it names this waiter in the hand-over note
        params = {
            "name": name,
            "token": token,
            "holder": holder,
            "ttl": ttl,
            "waiter": waiter,
            "life": QUEUE_LIFE,
            "handover": handover,
        }
        deadline = time.monotonic() + timeout
        handed: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._handed[waiter] = handed
        woken: asyncio.Future[None] | None = None
        queued_at: float | None = None
        """When the last call that left this waiter queued was sent."""
        called = False
        relistened = False
        try:
            while not handed.done():
                woken = self._waiting.add(name, instead_of=woken)
                sent = time.monotonic()
                called = True
                code, fence, left_ms = (await self.transport.query(self.sql.enlist, params))[0]
                if code == 1:  # free, or handed over already (its note may be on the way)
                    return HandedOver(Grant(fence), sent, max(left_ms, 0) / 1000)
                if code == 0:
                    queued_at = sent
                if self.listen_url is not None and not self._listening():
                    # LISTEN (the first wait here, or the connection failed),
                    # then call again once: a release before the LISTEN took
                    # effect is found by that call (later, within QUEUE_LIFE/3).
                    # A LISTEN that cannot be opened now (or that ran out of
                    # time while this process was stopped) does not fail the
                    # wait: it polls, as behind a transaction pooler, and tries
                    # again at its next call.
                    try:
                        await self._ensure_listening()
                    except StoreUnavailable as exc:
                        log.debug("waiting without LISTEN for now: %s", exc)
                    if not relistened:
                        relistened = True
                        continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # Woken by any release of the name, by the lease's expiry (a
                # crashed holder), and in time to keep the queue entry alive
                # (or, not queued, to queue once the entry before has lapsed).
                wake = min(left, max(left_ms, 1) / 1000, QUEUE_LIFE / 3)
                if not self._listening():
                    wake = min(wake, _POLL_WITHOUT_LISTEN)
                await woken_within(woken, wake)
            if handed.done() and queued_at is not None:
                # The note's since counts from our last call that kept us
                # queued or later, so queued_at + since is no later than the grant.
                fence, since = handed.result()
                return HandedOver(Grant(fence), queued_at + since / 1000, handover)
            if queued_at is None:
                return None
            # Out of time: leave the queue; a lease handed over meanwhile is kept.
            sent = time.monotonic()
            [(fence, left_ms)] = await self.transport.query(self.sql.withdraw, params)
            return None if fence is None else HandedOver(Grant(fence), sent, left_ms / 1000)
        except BaseException:
            if called:
                # Cancelled or failed with a call in flight or an entry queued:
                # the store may have queued us or handed us the lease.
                self._withdrawing.start(self._abandon(params))
            raise
        finally:
            del self._handed[waiter]
            if woken is not None:
                self._waiting.remove(name, woken)

    async def _abandon(self, params: dict[str, Any]) -> None:
        """Withdraw a waiter that gave up abnormally, and release what it may have been handed."""
        try:
            rows = await self.transport.query(self.sql.withdraw, params)
            if rows and rows[0][0] is not None:
                await self.release(params["name"], params["token"])
        except StoreUnavailable as exc:
            # Lapses by itself: the queue entry within QUEUE_LIFE, a
            # handed-over lease within its short hand-over lease.
            log.debug("could not withdraw an abandoned waiter of %r: %s", params["name"], exc)

    def _listening(self) -> bool:
        return self._listener is not None and not self._listener.done()

    async def _ensure_listening(self) -> None:
        if self._listening():
            return
        if self._listen_guard is None:
            self._listen_guard = asyncio.Lock()
        async with self._listen_guard:
            if self._listener is not None and not self._listener.done():
                return
            assert self.listen_url is not None
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a
            # cancellation that arrives as the connection completes, and the
            # cancelled waiter would wait on.
            try:
                async with asyncio.timeout(self.transport.timeout):
                    conn = await psycopg.AsyncConnection.connect(self.listen_url, autocommit=True)
            except (psycopg.Error, TimeoutError) as exc:
                raise self.transport.unavailable(exc, "refused a LISTEN connection") from exc
            try:
                listen = pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.sql.names.channel))
                async with asyncio.timeout(self.transport.timeout):
                    await conn.execute(listen)
            except BaseException as exc:
                await conn.close()
                if isinstance(exc, psycopg.Error | TimeoutError):
                    raise self.transport.unavailable(exc, "failed to LISTEN") from exc
                raise
            self._listener = asyncio.ensure_future(self._listen(conn))

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Read the LISTEN connection and wake the waiters of each released name;
        a hand-over note also tells its waiter the grant (see ``_sql_release``).

        The notes are read in the event loop's own reader callback, through
        libpq (``pgconn``), rather than with ``conn.notifies()``: that waits
        for each note through a task of its own and hands it over several
        loop turns after it arrived, which a handoff would wait for too."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        pgconn = conn.pgconn
        encoding = conn.info.encoding
        fd = conn.fileno()

        def readable() -> None:
            try:
                pgconn.consume_input()
                while (note := pgconn.notifies()) is not None:
                    self._heard(note.extra.decode(encoding))
            except psycopg.Error as exc:  # the connection failed or was closed
                loop.remove_reader(fd)
                if not ended.done():
                    ended.set_exception(exc)

        try:
            # Notes psycopg read while it ran the LISTEN, then ours.
            async for note in conn.notifies(timeout=0):
                self._heard(note.payload)
            loop.add_reader(fd, readable)
            readable()  # what libpq holds already, unread
            await ended
        except psycopg.Error as exc:
            log.debug("the PostgreSQL LISTEN connection failed, waiters re-check: %s", exc)
        finally:
            loop.remove_reader(fd)
            # Whatever ended it, every waiter wakes to re-check; the next wait
            # opens a new connection.
            self._waiting.wake_all()
            with contextlib.suppress(psycopg.Error):
                await asyncio.shield(conn.close())

    def _heard(self, payload: str) -> None:
        """One note: the released name, and for a hand-over its waiter, fence
        and the ms since the waiter queued. A note of another shape (someone
        else's NOTIFY on the channel) only wakes the name's waiters, who look."""
        name, *handed = payload.split("\t")
        if len(handed) == 3:
            waiter, fence, since = handed
            granted = self._handed.get(waiter)
            if granted is not None and not granted.done():
                with contextlib.suppress(ValueError):
                    granted.set_result((int(fence), int(since)))
        self._waiting.wake(name)
