"""The SQLite store's database file: its connections, one per thread, and their statements.

Every thread gets a connection (and a reused cursor) of its own, in
autocommit mode: a single write statement takes SQLite's write lock before it
reads, so each is atomic across processes, like ``BEGIN IMMEDIATE``. A batch
runs in one write transaction (one commit). SQLite errors become
StoreUnavailable; a file that is not tenure's, or not a database, is a
ConfigurationError at first use.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigurationError, StoreUnavailable
from .checkpoint import CHECKPOINT_EVERY, Checkpointer
from .schema import prepare

__all__ = ("Database",)


class Database:
    """One database file as a store sees it (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        prefix: str,
        busy_timeout: float,
        synchronous: str,
        describe: str,
    ) -> None:
        self.path = path
        self.prefix = prefix
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous
        self.describe = describe
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_guard = threading.Lock()
        self._closed = False
        self._writes = 0
        self.checkpointer = Checkpointer(self, path)

    def check_path(self) -> None:
        directory = self.path.parent if str(self.path.parent) else Path(".")
        if not directory.is_dir():
            raise ConfigurationError(
                f"SQLite database {str(self.path)!r}: directory {str(directory)!r} does not exist;"
                " create it first"
            )
        if self.path.is_dir():
            raise ConfigurationError(f"SQLite database path {str(self.path)!r} is a directory")
        # SQLite needs to create the -wal and -shm files beside the database.
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigurationError(
                f"SQLite database {str(self.path)!r}: directory {str(directory)!r} is not "
                "writable; SQLite needs to create its -wal and -shm files there"
            )

    def conn(self) -> sqlite3.Connection:
        try:
            conn: sqlite3.Connection = self._local.conn
            return conn
        except AttributeError:  # this thread's first statement
            pass
        if self._closed:
            raise StoreUnavailable(f"the store {self.describe} is closed")
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"cannot open SQLite database {str(self.path)!r}: {exc}"
            ) from exc
        try:
            prepare(conn, self.path, self.prefix, self.busy_timeout, self.synchronous)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise StoreUnavailable(
                    f"SQLite database {str(self.path)!r} stayed locked by another process "
                    f"for over {self.busy_timeout} s"
                ) from exc
            raise ConfigurationError(
                f"SQLite database {str(self.path)!r} is corrupt or not a database: {exc}"
            ) from exc
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn
        with self._all_guard:
            self._all.append(conn)
        return conn

    def cursor(self) -> sqlite3.Cursor:
        """This thread's cursor, reused: every statement is fetched to its end at once."""
        try:
            cur: sqlite3.Cursor = self._local.cur
            return cur
        except AttributeError:  # this thread's first statement
            cur = self._local.cur = self.conn().cursor()
            return cur

    def wrote(self) -> None:
        # Counted without a guard: a count lost between threads only delays a
        # checkpoint by one write.
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY:
            self._writes = 0
            self.checkpointer.request()

    def failed(self, exc: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"SQLite database {str(self.path)!r} failed: {exc}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction around a batch: its items are committed, or
        rolled back, together (and cost one commit, not one each)."""
        conn = self.conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self.failed(exc) from exc
        try:
            yield
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self.failed(exc) from exc
            raise

    def run(self, sql: str, params: Sequence[object] | Mapping[str, object]) -> list[Any]:
        try:
            return self.cursor().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self.failed(exc) from exc

    def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """One statement for each of ``rows`` (``executemany``: bound in C, no
        JSON to parse per row)."""
        try:
            self.cursor().executemany(sql, rows)
        except sqlite3.Error as exc:
            raise self.failed(exc) from exc

    def close(self) -> None:
        """Close every thread's connection (the checkpointer is stopped first)."""
        self._closed = True
        self.checkpointer.stop()
        with self._all_guard:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
