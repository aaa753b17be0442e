"""The SQLite store: the embedded default, for the processes of one host.

URL forms::

    sqlite:///var/lib/myapp/tenure.db     absolute path (three slashes, then the path)
    sqlite:tenure.db                      relative to the working directory
    sqlite:///tmp/x.db?prefix=myapp&busy_timeout=5&synchronous=full

Options: ``prefix`` names the tables (``<prefix>_leases`` ...; default
``tenure``), ``busy_timeout`` is how long, in seconds, a statement waits for
another process's write (default 2), ``synchronous`` is ``normal`` (default)
or ``full``, ``create`` (default true) whether a file that does not exist is
created: with ``create=false`` it is a ConfigurationError instead (what the
read-only commands open, so that a mistyped path is not read as empty).

How it stays correct
--------------------
* **One statement per operation.** Acquire of a name seen before is one
  ``UPDATE ... WHERE free or expired ... RETURNING fence``; a name without a
  row takes one ``INSERT ... ON CONFLICT DO NOTHING`` more. Release is one
  ``UPDATE ... WHERE token = ?`` (plus one that returns the waiters' addresses
  when the row's ``waiting`` flag, kept by triggers, says someone waits), and
  a whole renewal batch is one ``UPDATE ... FROM json_each(?)``. A single
  write statement in autocommit mode takes SQLite's write lock before it
  reads, so each is atomic across processes, like ``BEGIN IMMEDIATE``. The
  database runs in WAL mode.
* **Expiry by the host's monotonic clock.** Expiry times are
  ``CLOCK_MONOTONIC`` nanoseconds, which every process on a Linux host (and
  every container sharing its kernel) reads alike and which no wall-clock
  step (NTP, ``date -s``) moves; the boot id clears them after a reboot
  (``schema``). This is also why one database file must never be shared
  between hosts (over NFS, say): their clocks are unrelated. Use Redis or
  PostgreSQL there.
* **Fencing tokens** live in the lease row, which a release keeps; pruning a
  row first raises a database-wide floor above its fencing token, so a name
  never gets a token it had before, across releases, expiries, pruning and
  restarts of every process.
* **Durability.** ``synchronous=normal`` in WAL mode never corrupts the file,
  but a power loss or kernel crash may lose the last transactions, so fencing
  tokens handed out just before it can be handed out again after the reboot.
  Every process holding them died in the same crash; only a fenced resource on
  another machine that saw such a token could then reject the new holder's
  equal token. Use ``synchronous=full`` (one fsync per grant) when fenced
  resources live off this host.

Where the rest lives: ``schema`` (tables, PRAGMAs, boot id), ``database``
(connections per thread), ``checkpoint`` (WAL checkpoints off the callers'
threads), ``leases`` (the lease statements and plain calls), ``waiting``
(datagram wake-ups), ``runlog`` (claims and run records), ``doctor``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from ...errors import ConfigurationError
from .._options import options
from ..base import (
    AcquireItem,
    BlockingLeases,
    Finding,
    Grant,
    LeaseInfo,
    ReleaseItem,
    RenewItem,
    Store,
    evict,
)
from . import doctor, waiting
from .database import Database
from .leases import PlainCalls, Statements
from .runlog import SQLiteRunLog, keep_latest
from .schema import APPLICATION_ID, PAGE_SIZE, SCHEMA_VERSION
from .semaphores import SQLitePermits
from .waiting import Notifier

__all__ = ("APPLICATION_ID", "PAGE_SIZE", "SCHEMA_VERSION", "SQLiteStore")

_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")


class SQLiteStore(Store):
    """Leases in a SQLite database file. See the module docstring."""

    scheme: ClassVar[str] = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        prefix: str = "tenure",
        busy_timeout: float = 2.0,
        synchronous: str = "normal",
        create: bool = True,
    ) -> None:
        if not _PREFIX_RE.match(prefix):
            raise ConfigurationError(
                f"SQLite table prefix {prefix!r} is not a plain identifier "
                "(letters, digits and _, starting with a letter or _, at most 40 characters)"
            )
        if not (0 < busy_timeout <= 3600):
            raise ConfigurationError(
                f"busy_timeout must be between 0 and 3600 seconds, got {busy_timeout!r}"
            )
        if synchronous.lower() not in ("normal", "full"):
            raise ConfigurationError(f"synchronous must be 'normal' or 'full', got {synchronous!r}")
        self.path = Path(path)
        self.prefix = prefix
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.upper()
        self.db = Database(
            self.path,
            prefix=prefix,
            busy_timeout=busy_timeout,
            synchronous=self.synchronous,
            describe=self.describe(),
        )
        self.db.check_path()
        if not create and not self.path.exists():
            raise ConfigurationError(
                f"SQLite database {str(self.path)!r} does not exist; check the path (it is "
                "created by what writes to it: your application, tenure run or tenure demo)"
            )
        self.sql = Statements(prefix)
        self._notifier = Notifier()
        self._plain = PlainCalls(self.db, self.sql, self._notifier)
        self._runlog = SQLiteRunLog(self, self.db)
        self._semaphores = SQLitePermits(self.db, prefix, self.describe(), self._notifier)
        # Open once now, so that a bad path or a foreign file fails at
        # configuration time with a clear message rather than at first use.
        self.db.conn()

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        parts = urlsplit(url)
        if parts.netloc:
            raise ConfigurationError(
                f"SQLite URL {url!r} has a host part {parts.netloc!r}; write "
                "'sqlite:///absolute/path.db' (three slashes) or 'sqlite:relative/path.db'"
            )
        if not parts.path or parts.path == "/":
            raise ConfigurationError(
                f"SQLite URL {url!r} names no file; write 'sqlite:///absolute/path.db' "
                "or 'sqlite:relative/path.db'"
            )
        known = {"prefix": str, "busy_timeout": float, "synchronous": str, "create": bool}
        ours, _ = options("SQLite", parts.query, known, others=False)
        return cls(parts.path, **ours)

    @classmethod
    def for_reading(cls, url: str) -> str:
        base, mark, query = url.partition("?")
        # Last wins among repeated options: this one overrides a create=true.
        return f"{base}?{query}&create=false" if mark and query else f"{base}?create=false"

    def describe(self) -> str:
        return f"sqlite://{self.path}" if self.path.is_absolute() else f"sqlite:{self.path}"

    @property
    def runlog(self) -> SQLiteRunLog:
        return self._runlog

    @property
    def semaphores(self) -> SQLitePermits:
        return self._semaphores

    def sibling(self) -> SQLiteStore:
        return self.remade()

    def blocking(self) -> BlockingLeases:
        return self._plain

    async def aclose(self) -> None:
        # Joined, so that nothing of the store still runs once aclose returns
        # (the checkpoint thread may be mid-checkpoint, on a connection of its own).
        await asyncio.to_thread(self.db.close)
        self._notifier.close()

    # -- leases ------------------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        return self._plain.acquire(name, token, ttl, holder)

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        with self.db.transaction():
            return [self._plain.acquire(*item) for item in items]

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        payload = json.dumps([(name, token, int(ttl * 1e9)) for name, token, ttl in batch])
        rows = self.db.run(self.sql.renew, (time.monotonic_ns(), payload))
        self.db.wrote()
        renewed = set(map(tuple, rows))
        return [(name, token) in renewed for name, token, _ttl in batch]

    async def release(self, name: str, token: str) -> bool:
        return self._plain.release(name, token)

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        with self.db.transaction():
            return [self._plain.release(*item) for item in items]

    async def wait_released(self, name: str, timeout: float) -> None:
        await waiting.wait_released(self.db, self.sql, name, timeout)

    # -- what operators see and do -----------------------------------------------

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        now = time.monotonic_ns()
        rows = self.db.run(self.sql.holders, (now, prefix))
        return [
            LeaseInfo(name, holder or "", fence, (expires - now) / 1e9, acquired)
            for name, holder, fence, expires, acquired in rows
        ]

    async def force_release(self, name: str) -> LeaseInfo | None:
        return await evict(name, self._live_grant, self.release, self._bump_fence)

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        now = time.monotonic_ns()
        rows = self.db.run(
            f"SELECT token, holder, fence, expires, acquired FROM {self.prefix}_leases "
            "WHERE name = ?1 AND token IS NOT NULL AND expires > ?2",
            (name, now),
        )
        if not rows:
            return None
        token, holder, fence, expires, acquired = rows[0]
        return token, LeaseInfo(name, holder or "", fence, (expires - now) / 1e9, acquired)

    async def _bump_fence(self, name: str) -> None:
        self.db.run(
            f"UPDATE {self.prefix}_leases SET fence = fence + 1 WHERE name = ?1 AND token IS NULL",
            (name,),
        )

    async def diagnose(self) -> list[Finding]:
        return doctor.diagnose(self.path, self.synchronous)

    async def prune(self, *, keep_runs: int) -> int:
        p = self.prefix
        now = time.monotonic_ns()
        conn = self.db.conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                dead = f"(token IS NULL OR expires <= {now})"
                # Raise the floor first: a name pruned now and granted later
                # must still get a fencing token above every one it had.
                conn.execute(
                    f"UPDATE {p}_meta SET value = max(value, coalesce((SELECT max(fence)"
                    f" FROM {p}_leases WHERE {dead}), 0)) WHERE key = 'fence_floor'"
                )
                removed = conn.execute(f"DELETE FROM {p}_leases WHERE {dead}").rowcount
                removed += conn.execute(f"DELETE FROM {p}_waiters WHERE until < ?", (now,)).rowcount
                every_task = f"(SELECT DISTINCT task AS value FROM {p}_runs)"
                removed += conn.execute(keep_latest(p, every_task), {"keep": keep_runs}).rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self.db.failed(exc) from exc
        return removed
