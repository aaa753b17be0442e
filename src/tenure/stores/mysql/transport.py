"""How the MySQL/MariaDB store's statements reach the server: connections, turns, errors.

The driver is aiomysql (the asyncio face of PyMySQL). The store keeps its own
idle connections rather than aiomysql's pool, whose every release starts a
task: at most ``pool_max`` statements are in flight (the store's ``gate``),
each on an idle connection or a new one, given back after its answer was
read. A connection is never reused after a timeout, a cancellation or an
error: its protocol state is unknown, so it is closed.

* Timeouts are the event loop's (``timeout``, 2 s unless the URL says).
* Retry: the stores' one policy. A connection the server had closed (it
  restarted) fails the statement before anything ran (errors 2006, 2013);
  the statement is sent once more on a new connection. Never after a
  timeout.
* No session state is relied on between statements (no ``GET_LOCK``, no user
  variables, no temporary tables): every call works through a transaction
  pooler such as ProxySQL.
* The tables and procedures are made, or checked, before the first statement
  (``schema.ensure``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiomysql
import pymysql

from ...errors import StoreUnavailable
from .._gate import Gate

__all__ = ("BROKEN", "Endpoint", "Transport", "decoded", "text")

T = TypeVar("T")

BROKEN = (2006, 2013, 2055)
"""Client errors of a connection the server closed: gone away, lost, lost while reading."""


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect."""

    host: str
    port: int
    user: str | None
    password: str | None
    database: str
    unix_socket: str | None = None


def decoded(value: Any) -> Any:
    """A VARBINARY column's bytes as text; any other value as it is."""
    return value.decode() if isinstance(value, bytes | bytearray) else value


def text(value: Any) -> str:
    """A column's value as text (VARBINARY bytes decoded)."""
    return str(decoded(value))


class _Broken(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Transport:
    """The connections of one store, on one event loop (see the module docstring)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        where: str,
        timeout: float,
        pool_max: int,
        ensure: Callable[[Any], Awaitable[None]],
    ) -> None:
        self.endpoint = endpoint
        self.where = where
        self.timeout = timeout
        self.gate = Gate(pool_max, timeout, what=where, option="pool_max")
        self._ensure = ensure
        self._idle: list[Any] = []
        self._closed = False
        self._ready = False
        self._ready_guard: asyncio.Lock | None = None

    def unavailable(self, exc: BaseException, what: str = "failed") -> StoreUnavailable:
        return StoreUnavailable(f"{self.where} {what}: {exc}")

    async def connect(self) -> Any:
        """A new connection (autocommit, utf8mb4), or StoreUnavailable."""
        e = self.endpoint
        # Made here and connected under the loop's timeout, not by
        # aiomysql.connect: a handshake cut short by a cancellation (the
        # timeout's, when the server accepts but does not answer) would leave
        # its socket open there, since aiomysql closes it only on an error.
        conn = aiomysql.Connection(
            host=e.host,
            port=e.port,
            user=e.user,
            password=e.password or "",
            db=e.database,
            unix_socket=e.unix_socket,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=self.timeout,
        )
        try:
            async with asyncio.timeout(self.timeout):
                await conn._connect()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, TimeoutError):
                raise self.unavailable(
                    exc, f"did not accept a connection within {self.timeout:g} s"
                ) from exc
            if isinstance(exc, pymysql.err.MySQLError | OSError):
                raise self.unavailable(exc, "refused a connection") from exc
            raise
        return conn

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``await work(cursor)`` on a connection, in a turn of the gate, within
        the timeout; once more on a new connection if the server had closed
        the one it took."""
        async with self.gate:
            if not self._ready:
                await self._make_ready()
            try:
                return await self._attempt(work)
            except _Broken:
                try:
                    return await self._attempt(work)
                except _Broken as again:
                    raise self.unavailable(again.error) from again.error

    async def query(self, sql: str, args: Sequence[Any] | None = None) -> list[Any]:
        """One statement; its rows."""

        async def work(cur: Any) -> list[Any]:
            await cur.execute(sql, args)
            return list(await cur.fetchall())

        return await self.run(work)

    async def changed(self, sql: str, args: Sequence[Any] | None = None) -> int:
        """One statement; how many rows it changed."""

        async def work(cur: Any) -> int:
            await cur.execute(sql, args)
            return int(cur.rowcount)

        return await self.run(work)

    async def granted(self, sql: str, args: dict[str, Any]) -> int | None:
        """One upsert that reports what it granted in its answer: the insert id
        it set (``LAST_INSERT_ID(expr)``) when it changed a row, else None."""

        async def work(cur: Any) -> int | None:
            await cur.execute(sql, args)
            return int(cur.lastrowid) if cur.rowcount > 0 else None

        return await self.run(work)

    async def call(self, procedure: str, args: Sequence[Any]) -> list[Any]:
        """``CALL procedure(args)``: the rows of its last result set."""
        marks = ", ".join(["%s"] * len(args))

        async def work(cur: Any) -> list[Any]:
            await cur.execute(f"CALL {procedure}({marks})", args)
            rows = list(await cur.fetchall())
            while await cur.nextset():  # every result set read, the call's status last
                more = list(await cur.fetchall())
                if more:
                    rows = more
            return rows

        return await self.run(work)

    async def in_transaction(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``await work(cursor)`` between START TRANSACTION and COMMIT (READ COMMITTED)."""

        async def transaction(cur: Any) -> T:
            await cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            await cur.execute("START TRANSACTION")
            result = await work(cur)
            await cur.execute("COMMIT")
            return result

        return await self.run(transaction)

    async def _attempt(self, work: Callable[[Any], Awaitable[T]]) -> T:
        conn = self._idle.pop() if self._idle else await self.connect()
        reusable = False
        try:
            async with asyncio.timeout(self.timeout):
                cur = await conn.cursor()
                try:
                    result = await work(cur)
                finally:
                    await cur.close()
            reusable = True
            return result
        except TimeoutError as exc:
            raise self.unavailable(exc, f"did not answer within {self.timeout:g} s") from exc
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in BROKEN:
                raise _Broken(exc) from exc
            raise self.unavailable(exc) from exc
        except (pymysql.err.MySQLError, OSError) as exc:
            raise self.unavailable(exc) from exc
        finally:
            # A call that outlived close() (a renewal left to finish) must not
            # park its connection where nothing will close it.
            if reusable and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()

    async def ensure_schema(self) -> None:
        """Create or check the tables now, unless done already."""
        if not self._ready:
            await self._make_ready()

    async def _make_ready(self) -> None:
        if self._ready_guard is None:
            self._ready_guard = asyncio.Lock()
        async with self._ready_guard:
            if self._ready:
                return
            conn = await self.connect()
            try:
                async with asyncio.timeout(max(self.timeout, 10.0)):
                    await self._ensure(conn)
            except TimeoutError as exc:
                raise self.unavailable(
                    exc, "did not create or check tenure's tables in time"
                ) from exc
            except (pymysql.err.MySQLError, OSError) as exc:
                raise self.unavailable(exc) from exc
            finally:
                conn.close()
            self._ready = True

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def aclose(self) -> None:
        self.close()
