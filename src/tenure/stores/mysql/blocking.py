"""The MySQL/MariaDB store's acquire and release as plain calls, for ``tenure.sync``.

They run on the caller's thread through PyMySQL (the pure-Python driver that
aiomysql is built on, so one dialect of errors and answers): the same
statements, answers and failure rules as the store's coroutines, without a
hop to the service's loop thread. Everything else (waiting, renewal, the
CLI's reads) stays on the store's coroutines.

* Connections: each call takes one off an idle list (``list.pop`` and
  ``append`` are atomic, so any thread may call), or opens one (autocommit,
  utf8mb4), and puts it back after its statement; at most ``pool_max`` are
  kept idle. The store's gate bounds the calls in flight, as for coroutines.
* Timeouts: PyMySQL's connect, read and write timeouts are the store's
  ``timeout``; a statement that times out is never sent again.
* Retry: the stores' one policy. An idle connection the server closed (a
  restart) drops every idle one, which died with it, and the statement is
  sent once more on a new connection.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pymysql

from ...errors import StoreUnavailable
from .._retry import once_more_now
from ..base import BlockingLeases, Grant
from .transport import BROKEN, Transport

__all__ = ("BlockingCalls",)

Answer = tuple[int, int]
"""A statement's affected rows and insert id."""


class _Closed(Exception):
    """A statement found its idle connection closed by the server: nothing ran."""

    def __init__(self, error: pymysql.err.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


class BlockingCalls(BlockingLeases):
    """Acquire and release on the caller's thread (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        statements: tuple[str, str],
        released: Callable[[str], None],
        ensure_schema: Callable[[], None],
        *,
        pool_max: int,
    ) -> None:
        self.transport = transport
        self._acquire, self._release = statements
        self._released = released
        """Wakes this process's waiters of a name (``Waiting.released``)."""
        self._ensure_schema = ensure_schema
        self._ready = False
        self._ready_guard = threading.Lock()  # the first calls of many threads: made once
        self._closed = False
        self._idle: list[pymysql.connections.Connection[Any]] = []
        self._idle_max = pool_max

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        params = {"name": name, "token": token, "holder": holder, "ttl": max(1, round(ttl * 1e6))}
        changed, fence = self._execute(self._acquire, params)
        return Grant(fence) if changed > 0 else None

    def release(self, name: str, token: str) -> bool:
        changed, _ = self._execute(self._release, (name, token))
        self._released(name)
        return changed > 0

    def close(self) -> None:
        self._closed = True
        self._drop_idle()

    def _execute(self, sql: str, params: Any) -> Answer:
        if not self._ready:
            with self._ready_guard:
                if not self._ready:
                    self._ensure_schema()
                    self._ready = True
        with self.transport.gate.blocking():
            try:
                try:  # the first attempt inline, the retry policy only after a failure
                    return self._attempt(sql, params)
                except _Closed as exc:
                    again = functools.partial(self._attempt, sql, params)
                    return once_more_now(exc, again, _closed, self._dropped)
            except _Closed as exc:
                raise self.transport.unavailable(exc.error) from exc.error

    def _attempt(self, sql: str, params: Any) -> Answer:
        conn, idle = self._take()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                answer = (int(cur.rowcount), int(cur.lastrowid or 0))
        except pymysql.err.OperationalError as exc:
            conn.close()
            if isinstance(exc.__context__, TimeoutError):
                late = f"did not answer within {self.transport.timeout:g} s"
                raise self.transport.unavailable(exc, late) from exc
            if idle and exc.args and exc.args[0] in BROKEN:  # a restart: nothing ran
                raise _Closed(exc) from exc
            raise self.transport.unavailable(exc) from exc
        except pymysql.err.MySQLError as exc:
            self._give_back(conn)
            raise self.transport.unavailable(exc) from exc
        except BaseException:
            conn.close()  # interrupted mid-statement: its reply may be unread
            raise
        self._give_back(conn)
        return answer

    def _take(self) -> tuple[pymysql.connections.Connection[Any], bool]:
        """A connection, and whether it was idle (it may have died since)."""
        try:
            return self._idle.pop(), True
        except IndexError:  # none idle (another thread may just have taken the last)
            pass
        if self._closed:
            raise StoreUnavailable(f"the store {self.transport.where} is closed")
        e, timeout = self.transport.endpoint, self.transport.timeout
        try:
            conn = pymysql.connect(
                host=e.host,
                port=e.port,
                user=e.user or "",
                password=e.password or "",
                database=e.database,
                unix_socket=e.unix_socket,
                charset="utf8mb4",
                autocommit=True,
                connect_timeout=timeout,
                read_timeout=timeout,
                write_timeout=timeout,
            )
        except (pymysql.err.MySQLError, OSError) as exc:
            raise self.transport.unavailable(exc, "refused a connection") from exc
        return conn, False

    def _give_back(self, conn: pymysql.connections.Connection[Any]) -> None:
        if self._closed or len(self._idle) >= self._idle_max:
            conn.close()
        else:
            self._idle.append(conn)

    def _dropped(self, failed: Exception) -> None:
        self._drop_idle()

    def _drop_idle(self) -> None:
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return
            conn.close()


def _closed(exc: BaseException) -> bool:
    return isinstance(exc, _Closed)
