"""The PostgreSQL store's acquire and release as plain calls, for ``tenure.sync``.

They run on the caller's thread through psycopg's blocking connections: the
same statements, answers and failure rules as the store's coroutines, without
a hop to the service's loop thread. Everything else (waiters, the CLI's
reads) stays on the store's coroutines; the renewer has its own ``sibling()``.

* Connections: each call takes one off an idle list (``list.pop`` and
  ``append`` are atomic, so any thread may call), or opens one, and puts it
  back after the statement; at most ``pool_max`` are kept idle.
* Timeouts: a watchdog thread severs the connection of a statement that
  outlasts ``timeout`` (``deadline``).
* Retry: the stores' one policy. A connection the server closed (a restart)
  drops every idle one, which died with it, and the statement is sent once
  more on a new connection.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...errors import StoreUnavailable
from .._retry import once_more_now
from ..base import BlockingLeases, Grant
from .deadline import InFlight, watch_statements
from .transport import IDLE, Transport, connect_timeout

__all__ = ("BlockingCalls",)

_Idle = tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]


class _Closed(Exception):
    """A statement found its idle connection closed by the server: nothing ran."""

    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


class BlockingCalls(BlockingLeases):
    """Acquire and release on the caller's thread (see the module docstring)."""

    def __init__(self, transport: Transport, ensure_schema: Callable[[], None]) -> None:
        self.transport = transport
        self._ensure_schema = ensure_schema
        """Creates or checks the tables once, off this thread (see ``PostgresStore``)."""
        self._closed = False
        self._idle: list[_Idle] = []
        self._statements: set[InFlight] = set()
        self._watchdog_thread: threading.Thread | None = None
        self._watchdog_guard = threading.Lock()
        self._stop_watching = threading.Event()
        # The thread holds no reference to this object: dropping it stops the thread.
        weakref.finalize(self, self._stop_watching.set)
        self._connect_options = transport.connection_options()
        if "connect_timeout" not in conninfo_to_dict(transport.url):
            self._connect_options["connect_timeout"] = connect_timeout(transport.timeout)

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        rows = self._query(self.transport.sql.acquire, (name, token, holder, ttl))
        return Grant(rows[0][0]) if rows else None

    def release(self, name: str, token: str) -> bool:
        channel = self.transport.sql.names.channel
        rows = self._query(self.transport.sql.release, (name, token, channel, channel))
        return bool(rows and rows[0][0])

    def close(self) -> None:
        self._closed = True  # first: a statement that ends now closes its connection
        self._stop_watching.set()
        self._drop_idle()

    def _query(self, query: str, params: Sequence[Any]) -> list[Any]:
        if not self.transport.shared.schema_ready:
            self._ensure_schema()
        with self.transport.gate.blocking():
            try:
                # The first attempt inline, the retry policy only after a failure.
                try:
                    return self._attempt(query, params)
                except _Closed as exc:
                    again = functools.partial(self._attempt, query, params)
                    return once_more_now(exc, again, _closed, self._dropped)
            except _Closed as exc:
                raise self.transport.unavailable(exc.error) from exc.error

    def _attempt(self, query: str, params: Sequence[Any]) -> list[Any]:
        conn, cur = self._take()
        statement = self._watched(conn)
        try:
            with statement:
                cur.execute(query, params)
                rows = cur.fetchall() if cur.rownumber is not None else []
        except psycopg.OperationalError as exc:
            closed_by_server = conn.closed
            conn.close()
            if statement.fired:
                late = f"did not answer within {self.transport.timeout} s"
                raise self.transport.unavailable(exc, late) from exc
            if closed_by_server:  # a restart: the idle ones died with it
                raise _Closed(exc) from exc
            raise self.transport.unavailable(exc) from exc
        except psycopg.Error as exc:
            self._give_back(conn, cur)
            raise self.transport.unavailable(exc) from exc
        except BaseException:
            conn.close()  # interrupted mid-statement: its reply may be unread
            raise
        self._give_back(conn, cur)
        return rows

    def _take(self) -> _Idle:
        try:
            return self._idle.pop()
        except IndexError:  # none idle (another thread may just have taken the last)
            pass
        if self._closed:
            raise StoreUnavailable(f"the store {self.transport.where} is closed")
        try:
            conn = psycopg.Connection.connect(self.transport.url, **self._connect_options)
        except psycopg.Error as exc:
            raise self.transport.unavailable(exc, "refused a connection") from exc
        return conn, conn.cursor()

    def _give_back(self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any]) -> None:
        if (
            not conn.closed
            and conn.pgconn.transaction_status == IDLE
            and len(self._idle) < self.transport.pool_max
            and not self._closed
        ):
            self._idle.append((conn, cur))
        else:
            conn.close()

    def _dropped(self, closed: Exception) -> None:
        """A connection was found closed by the server: the idle ones died with it."""
        self._drop_idle()

    def _drop_idle(self) -> None:
        while True:
            try:
                conn, _ = self._idle.pop()
            except IndexError:
                return
            conn.close()

    def _watched(self, conn: psycopg.Connection[Any]) -> InFlight:
        """Enter around a statement on ``conn``: severed if it outlasts ``timeout``."""
        if self._watchdog_thread is None:
            with self._watchdog_guard:
                if self._watchdog_thread is None:
                    thread = threading.Thread(
                        target=watch_statements,
                        args=(self._statements, self.transport.timeout, self._stop_watching),
                        name="tenure-postgres-watchdog",
                        daemon=True,
                    )
                    thread.start()
                    self._watchdog_thread = thread
        return InFlight(self._statements, conn)


def _closed(exc: BaseException) -> bool:
    return isinstance(exc, _Closed)
