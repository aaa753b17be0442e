"""How the PostgreSQL store's statements reach the server: the pool, the lane, timeouts, retry.

* Connections: a psycopg pool per store (``pool_max``), in autocommit mode; the
  first connection borrowed stays with the store as its *lane* (see
  ``_checkout``). At most ``pool_max`` statements run at once (the ``gate``).
* Timeouts: a statement that gets no answer within ``timeout`` has its
  connection shut down by a watchdog (so the pool replaces it) and raises
  StoreUnavailable.
* Retry: the stores' one policy (``stores._retry``): a statement whose pooled
  connection the server closed (a restart) runs once more on a new one; never
  one that timed out.
* Schema: created on first use, idempotently, under a transaction-scoped
  advisory lock so that instances starting together do not collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..._aio import Background
from ...errors import StoreUnavailable
from .._errors import Translated
from .._gate import Gate
from .._options import mask
from .._retry import once_more
from . import schema
from .deadline import InFlight, sever_overdue
from .sql import Statements

__all__ = ("IDLE", "Shared", "Transport", "connect_timeout")


log = logging.getLogger("tenure.stores.postgres")

_Pool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]
IDLE = psycopg.pq.TransactionStatus.IDLE


@dataclasses.dataclass(slots=True)
class _Checkout:
    """A checked-out connection, the cursor to use on it, and the pool it returns to."""

    pool: _Pool
    conn: psycopg.AsyncConnection[Any]
    cursor: psycopg.AsyncCursor[Any]


@dataclasses.dataclass
class Shared:
    """What a store and its siblings (other threads' copies) share."""

    schema_ready: bool = False


async def _fetch_each(
    cur: psycopg.AsyncCursor[Any], query: str, params: Sequence[Any]
) -> list[list[Any]]:
    """One statement per parameter set, pipelined; the rows of each."""
    await cur.executemany(query, params, returning=True)
    results: list[list[Any]] = []
    while True:
        results.append(await cur.fetchall() if cur.rownumber is not None else [])
        if not cur.nextset():
            return results


def connect_timeout(timeout: float) -> int:
    """libpq's connect_timeout for a store's ``timeout``: libpq waits forever by
    default, and its minimum is 2 seconds."""
    return max(2, math.ceil(timeout))


class _Closed(Exception):
    """A statement found its pooled connection closed by the server: nothing ran."""

    def __init__(self, error: psycopg.OperationalError, pool: _Pool) -> None:
        super().__init__(str(error))
        self.error = error
        self.pool = pool


class Transport:
    """The asyncio connection paths of one store (see the module docstring)."""

    def __init__(
        self,
        url: str,
        sql: Statements,
        *,
        timeout: float,
        pool_max: int,
        pooler: str,
        shared: Shared,
    ) -> None:
        self.url = url
        self.sql = sql
        self.timeout = timeout
        self.pool_max = pool_max
        self.pooler = pooler
        self.shared = shared
        self.where = f"PostgreSQL at {mask(url)}"
        self.translated = Translated((psycopg.Error,), self.where)
        self.gate = Gate(pool_max, timeout, what=self.where)
        """The bound on this store's statements in flight (see ``stores._gate``)."""
        self._pool: _Pool | None = None
        self._background = Background()
        """Replaced pools, closing."""
        self._lane: _Checkout | None = None
        self._lane_busy = False
        self._outage = False  # a connection was lost: the next borrow asks the server first
        self._in_flight: set[InFlight] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._pool_guard: asyncio.Lock | None = None
        self.closed = False

    async def warm_up(self) -> None:
        with contextlib.suppress(psycopg.Error, StoreUnavailable):
            await self.current_pool()  # starts connecting in the background

    async def aclose(self) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._lane is not None:
            lane, self._lane = self._lane, None
            await lane.pool.putconn(lane.conn)
        if self._pool is not None:
            await self._pool.close()
        await self._background.finish()

    def unavailable(self, exc: BaseException, what: str = "failed") -> StoreUnavailable:
        return self.translated.unavailable(exc, what)

    async def current_pool(self) -> _Pool:
        if self._pool is not None:
            return self._pool
        if self.closed:
            raise StoreUnavailable(f"the store {self.where} is closed")
        if self._pool_guard is None:
            self._pool_guard = asyncio.Lock()
        async with self._pool_guard:
            if self._pool is None:
                pool: _Pool = AsyncConnectionPool(
                    self.url,
                    kwargs=self.connection_options(),
                    min_size=1,
                    max_size=self.pool_max,
                    timeout=self.timeout,
                    open=False,
                    name=f"tenure-{self.sql.prefix}",
                )
                await pool.open(wait=False)
                self._pool = pool
            return self._pool

    def connection_options(self) -> dict[str, Any]:
        """How every connection of the store's statements is opened (pooled or blocking)."""
        return {
            "autocommit": True,
            # A transaction pooler may hand each statement to another server
            # connection, where a prepared statement is unknown.
            "prepare_threshold": None if self.pooler == "transaction" else 0,
        }

    async def _replace_pool(self, stale: _Pool) -> _Pool:
        """A fresh pool instead of ``stale``, which is closed in the background."""
        if self._pool is stale:
            self._pool = None
            lane = self._lane
            if lane is not None and lane.pool is stale:
                # Given back to (and closed with) the stale pool: now if it is
                # free, else by _checkin, which no longer knows it as the lane.
                self._lane = None
                if not self._lane_busy:
                    await stale.putconn(lane.conn)
            self._background.start(stale.close())
        return await self.current_pool()

    async def _checkout(self) -> _Checkout:
        """A connection (with a cursor) for one statement, and its pool.

        The first connection borrowed stays with the store as its *lane*, with
        one cursor reused for every statement: the next statement that finds it
        free runs on it without a trip through the pool's queue or a new cursor
        (together a third of an uncontended acquire+release's overhead).
        Statements that find it busy borrow from the pool as usual.
        """
        lane = self._lane
        if lane is not None and not self._lane_busy:
            self._lane_busy = True
            return lane
        pool, conn = await self._borrow()
        checkout = _Checkout(pool, conn, conn.cursor())
        if self._lane is None:
            self._lane = checkout
            self._lane_busy = True
        return checkout

    async def _checkin(self, checkout: _Checkout) -> None:
        if checkout is self._lane:
            self._lane_busy = False
            conn = checkout.conn
            if not conn.closed and conn.pgconn.transaction_status == IDLE:
                return
            self._lane = None  # broken: the pool discards it and a new lane is borrowed
        await checkout.pool.putconn(checkout.conn)

    async def _borrow(self) -> tuple[_Pool, psycopg.AsyncConnection[Any]]:
        """A pooled connection (and its pool, to give it back to).

        psycopg's pool retries a failed connection with a growing backoff
        (from one second), so after an outage it may go on waiting long after
        the server is back: past a short TTL's deadline, or minutes later.
        After a connection was lost, and whenever the pool gives none in time,
        one direct attempt tells at once how things stand: the server's refusal
        (down, starting, a wrong password) is raised; a server that answers
        means the pool is stale, and it is replaced by one that connects now.
        """
        pool = await self.current_pool()
        if self._outage:
            await self._server_answers()
            self._outage = False
            pool = await self._replace_pool(pool)
        try:
            return pool, await pool.getconn()
        except PoolTimeout as exc:
            await self._server_answers()
            log.debug("the PostgreSQL pool gave no connection but the server answers: %s", exc)
        pool = await self._replace_pool(pool)
        try:
            return pool, await pool.getconn()
        except PoolTimeout as exc:
            raise self.unavailable(exc, f"gave no connection within {self.timeout} s") from exc

    async def _server_answers(self) -> None:
        """Connect once, directly; StoreUnavailable with the server's reason if it will not."""
        try:
            async with asyncio.timeout(self.timeout):  # not wait_for: see _ensure_listening
                direct = await psycopg.AsyncConnection.connect(self.url)
        except (psycopg.Error, TimeoutError) as refused:
            raise self.unavailable(refused, "refused a connection") from refused
        await direct.close()

    def _deadline(self, conn: psycopg.AsyncConnection[Any]) -> InFlight:
        """Enter around statements on ``conn``: severed if they outlast ``timeout``.

        Cancelling a psycopg query instead would wait up to ten more seconds
        for a server that does not answer; shutting the socket fails it at
        once. One watchdog per store checks every in-flight statement four
        times per ``timeout``, instead of a timer per statement (a loop timer
        costs as much as the rest of the Python of a statement).
        """
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._watch())
        return InFlight(self._in_flight, conn)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.timeout / 4)
            sever_overdue(self._in_flight, self.timeout)

    async def ensure_schema(self) -> None:
        """Create the tables unless they exist; check their version. Once per store family."""
        checkout = await self._checkout()
        try:
            with self._deadline(checkout.conn):
                await schema.ensure(checkout.conn, self.sql, self.where)
        except psycopg.Error as exc:
            raise self.unavailable(exc) from exc
        finally:
            await self._checkin(checkout)
        self.shared.schema_ready = True

    async def query(
        self, query: str, params: Sequence[Any] | dict[str, Any], *, each: bool = False
    ) -> list[Any]:
        """Run one statement; its rows ([] when it returns none). Retried once on a
        connection the server closed; never on a timeout. At most ``pool_max``
        run at once; the rest queue for a turn (``gate``), so the pool never
        has to refuse one. ``each``: see :meth:`query_each`.

        The first attempt is made right here (every lock call takes this path,
        and each coroutine level under it costs on every step of the statement);
        a connection found closed goes to the retry policy's second half."""
        async with self.gate:
            if not self.shared.schema_ready:
                await self.ensure_schema()
            try:
                try:
                    return await self._attempt(query, params, each)
                except _Closed as exc:
                    again = functools.partial(self._attempt, query, params, each)
                    return await once_more(exc, again, _closed, self._drop_dead)
            except _Closed as exc:
                raise self.unavailable(exc.error) from exc.error

    async def query_each(
        self, query: str, params: Sequence[Sequence[Any] | dict[str, Any]]
    ) -> list[list[Any]]:
        """Run one statement once per parameter set, sent together on one
        connection (psycopg's pipeline mode: one round trip for the lot), each
        in its own transaction; the rows of each, in order. Retried like
        ``query``: only when the server had closed the connection, so nothing
        of it ran."""
        if not params:
            return []
        return await self.query(query, params, each=True)

    async def _attempt(self, query: str, params: Any, each: bool) -> list[Any]:
        checkout = await self._checkout()
        conn, cur = checkout.conn, checkout.cursor
        statement = self._deadline(conn)
        try:
            with statement:
                if each:
                    return await _fetch_each(cur, query, params)
                await cur.execute(query, params)
                # rownumber is None when the statement returned no rows to fetch.
                return await cur.fetchall() if cur.rownumber is not None else []
        except psycopg.OperationalError as exc:
            if statement.fired:
                raise self.unavailable(exc, f"did not answer within {self.timeout} s") from exc
            if not conn.closed:
                raise self.unavailable(exc) from exc
            # The pool's own reconnection would start with a second of
            # backoff: _borrow asks the server directly instead.
            self._outage = True
            raise _Closed(exc, checkout.pool) from exc
        except psycopg.Error as exc:
            raise self.unavailable(exc) from exc
        finally:
            await self._checkin(checkout)  # a broken connection is discarded

    async def _drop_dead(self, exc: Exception) -> None:
        """The server closed a pooled connection (it restarted): the pool drops
        the other dead ones before the statement is sent once more."""
        assert isinstance(exc, _Closed)
        with contextlib.suppress(psycopg.Error):
            await exc.pool.check()


def _closed(exc: BaseException) -> bool:
    return isinstance(exc, _Closed)
