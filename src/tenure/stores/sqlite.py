"""The SQLite store: the embedded default, for the processes of one host.

URL forms::

    sqlite:///var/lib/myapp/tenure.db     absolute path (three slashes, then the path)
    sqlite:tenure.db                      relative to the working directory
    sqlite:///tmp/x.db?prefix=myapp&busy_timeout=5&synchronous=full

Options: ``prefix`` names the tables (``<prefix>_leases`` ...; default
``tenure``), ``busy_timeout`` is how long, in seconds, a statement waits for
another process's write (default 2), ``synchronous`` is ``normal`` (default)
or ``full``.

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
  step (NTP, ``date -s``) moves. Monotonic time restarts at boot, so the
  database records the kernel's boot id; the first process to open it after a
  reboot clears the leases of the previous boot, whose holders are all gone.
  This is also why one database file must never be shared between hosts
  (over NFS, say): their clocks are unrelated. Use Redis or PostgreSQL there.
* **Fencing tokens** live in the lease row, which a release keeps (only its
  token is cleared); pruning a row first raises a database-wide floor above its
  fencing token, so a name never gets a token it had before, across releases,
  expiries, pruning and restarts of every process.
* **Durability.** ``synchronous=normal`` in WAL mode never corrupts the file,
  but a power loss or kernel crash may lose the last transactions, so fencing
  tokens handed out just before it can be handed out again after the reboot.
  Every process holding them died in the same crash; only a fenced resource on
  another machine that saw such a token could then reject the new holder's
  equal token. Use ``synchronous=full`` (one fsync per grant) when fenced
  resources live off this host.
* **Small pages.** A new database file gets 1 KB pages (``PAGE_SIZE``), not
  SQLite's default 4 KB: each commit appends its changed pages to the WAL,
  and a lease row is far smaller than either.
* **Checkpoints off the callers' threads.** In WAL mode every commit appends
  to the ``-wal`` file, and by default the commit that takes it past 1000
  pages copies it back into the database and fsyncs both: a stall of
  milliseconds on every few hundredth acquire. Here a thread of the store
  runs that checkpoint (``PASSIVE``: it never blocks a writer) after every
  few hundred writes, on a connection of its own; the callers' connections
  checkpoint by themselves only as a backstop, once the WAL passes
  ``_INLINE_CHECKPOINT_PAGES`` (should that thread fall behind). Checkpoints
  move committed pages; they change no transaction's outcome.
* **Waiters are notified.** A waiter binds a unix datagram socket in Linux's
  abstract namespace and registers it in ``<prefix>_waiters``; the release
  statement returns the registered addresses and the releaser sends each one a
  datagram. A waiter also wakes when the current lease expires. On systems
  without abstract sockets, waiters poll every 10 ms instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import socket
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

from ..errors import ConfigurationError, StoreUnavailable
from .base import (
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
from .runlog import Claim, RunLog, RunOutcome, RunRecord, Started, StartItem

__all__ = ("SQLiteStore",)

log = logging.getLogger("tenure.sqlite")

SCHEMA_VERSION = 3
PAGE_SIZE = 1024
"""Of a database file tenure creates. A grant or release rewrites one small
row, and every commit appends the pages it changed to the WAL: at a quarter
of SQLite's default 4 KB, each cycle writes and checksums a quarter of the
bytes (about a fifth less time per acquire+release; see bench/sqlite_cycle.py)."""
APPLICATION_ID = 0x74656E75  # "tenu": marks a database file that tenure created
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")
_ABSTRACT_SOCKETS = sys.platform.startswith("linux")
_POLL_FALLBACK = 0.010
_FAR_FUTURE_NS = 2**62
_CHECKPOINT_EVERY = 200
"""Writes between two background checkpoints: about 200 KB of WAL at 1 KB pages."""
_INLINE_CHECKPOINT_PAGES = 4000
"""WAL size (pages) at which a caller's commit checkpoints by itself: only when the
background checkpoint cannot keep up, or its thread is gone (a forked child)."""


_NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "fuse.s3fs",
        "fuse.rclone",
        "virtiofs",
    }
)


def _filesystem(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem that holds ``path`` (Linux: from /proc/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = str(path.resolve())
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        # Without a kernel boot id, the wall-clock time of boot identifies it;
        # rounded to a minute so that ordinary clock adjustments do not change it.
        return f"boot@{round((time.time() - time.monotonic()) / 60)}"


class _Checkpointer:
    """A thread that checkpoints a WAL when asked, on a connection of its own.

    It holds no reference to its store: a store dropped without ``aclose``
    lets the thread notice within ``_IDLE_EXIT`` seconds and end.
    """

    _IDLE_EXIT = 60.0

    def __init__(self, store: SQLiteStore) -> None:
        self._store = weakref.ref(store)
        self._path = store.path
        self._wanted = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.done = 0
        """Checkpoints run so far (for tests and diagnostics)."""
        self.copied = 0
        """WAL frames those checkpoints copied into the database, as SQLite counts them."""

    def request(self) -> None:
        thread = self._thread
        # Not alive: never started, idle long enough to end, or this is a
        # forked child (the thread was the parent's).
        if thread is None or not thread.is_alive():
            if self._stopping:
                return
            thread = self._thread = threading.Thread(
                target=self._main, name="tenure-sqlite-checkpoint", daemon=True
            )
            thread.start()
        self._wanted.set()

    def stop(self) -> None:
        self._stopping = True
        self._wanted.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()

    def _main(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:  # the callers' own statements report why
            log.debug("the SQLite checkpoint thread could not connect: %r", exc)
            return
        try:
            while True:
                if not self._wanted.wait(self._IDLE_EXIT):
                    if self._store() is None:
                        return
                    continue
                if self._stopping:
                    return
                self._wanted.clear()
                try:
                    _busy, _frames, copied = conn.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)"
                    ).fetchone()
                    self.done += 1
                    self.copied += max(copied, 0)
                except sqlite3.Error as exc:
                    # Harmless: the next request tries again, and past
                    # _INLINE_CHECKPOINT_PAGES the callers checkpoint by themselves.
                    log.debug("background WAL checkpoint failed: %r", exc)
        finally:
            conn.close()


class SQLiteStore(Store, RunLog):
    """Leases in a SQLite database file. See the module docstring."""

    scheme: ClassVar[str] = "sqlite"

    @property
    def runlog(self) -> RunLog:
        return self

    @property
    def leases(self) -> Store:
        return self

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        prefix: str = "tenure",
        busy_timeout: float = 2.0,
        synchronous: str = "normal",
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
        self._check_path()
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_guard = threading.Lock()
        self._sender: socket.socket | None = None
        self._closed = False
        self._writes = 0
        self._checkpointer = _Checkpointer(self)
        self._plain = _PlainCalls(self)
        p = prefix
        # Acquire: a name seen before is one UPDATE of its row (the common
        # case); only a name without a row needs the INSERT, which reads the
        # fencing floor. Each is a single atomic statement; a contended name
        # costs both, and both change nothing.
        # A live lease of this very token (an acquire resent after its answer
        # was lost) is granted again: the same fence, its expiry renewed.
        self._sql_acquire = (
            f"UPDATE {p}_leases SET fence = fence + (token IS NOT ?2 OR expires <= ?4),"
            " acquired = CASE WHEN token IS ?2 AND expires > ?4 THEN acquired ELSE ?6 END,"
            " token = ?2, holder = ?3, expires = ?4 + ?5 "
            "WHERE name = ?1 AND (token IS NULL OR expires <= ?4 OR token = ?2) RETURNING fence"
        )
        self._sql_acquire_new = (
            f"INSERT INTO {p}_leases (name, token, holder, fence, expires, acquired, waiting) "
            f"VALUES (?1, ?2, ?3, (SELECT value FROM {p}_meta WHERE key = 'fence_floor') + 1,"
            f" ?4 + ?5, ?6, EXISTS (SELECT 1 FROM {p}_waiters WHERE name = ?1))"
            " ON CONFLICT (name) DO NOTHING RETURNING fence"
        )
        # Release: with nobody waiting (the row's ``waiting`` flag, kept by
        # triggers on the waiters table) one UPDATE whose row count says it
        # all. Otherwise the statement returns the waiters' addresses, and our
        # own lapsed row is cleaned up by a last, separate statement.
        waiters = f"(SELECT group_concat(addr, ' ') FROM {p}_waiters WHERE name = ?1)"
        self._sql_release_alone = (
            f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0 "
            "WHERE name = ?1 AND token = ?2 AND expires > ?3 AND waiting = 0"
        )
        self._sql_release = (
            f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0 "
            f"WHERE name = ?1 AND token = ?2 AND expires > ?3 RETURNING {waiters}"
        )
        self._sql_release_lapsed = (
            f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0 "
            f"WHERE name = ?1 AND token = ?2 RETURNING {waiters}"
        )
        self._sql_renew = (
            f"UPDATE {p}_leases SET expires = ?1 + b.ttl FROM "
            "(SELECT value ->> 0 AS n, value ->> 1 AS t, value ->> 2 AS ttl"
            " FROM json_each(?2)) AS b "
            f"WHERE {p}_leases.name = b.n AND {p}_leases.token = b.t"
            f" AND {p}_leases.expires > ?1 "
            f"RETURNING {p}_leases.name, {p}_leases.token"
        )
        self._sql_wait = (
            f"INSERT INTO {p}_waiters (addr, name, until) VALUES (?1, ?2, ?3) "
            f"RETURNING (SELECT expires FROM {p}_leases WHERE name = ?2 AND token IS NOT NULL)"
        )
        self._sql_unwait = f"DELETE FROM {p}_waiters WHERE addr = ?1"
        self._sql_holders = (
            f"SELECT name, holder, fence, expires, acquired FROM {p}_leases "
            "WHERE token IS NOT NULL AND expires > ?1 AND substr(name, 1, length(?2)) = ?2 "
            "ORDER BY name"
        )
        # Open once now, so that a bad path or a foreign file fails at
        # configuration time with a clear message rather than at first use.
        self._conn()

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
        options: dict[str, Any] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key == "prefix":
                options["prefix"] = value
            elif key == "busy_timeout":
                try:
                    options["busy_timeout"] = float(value)
                except ValueError:
                    raise ConfigurationError(
                        f"busy_timeout must be a number of seconds, got {value!r}"
                    ) from None
            elif key == "synchronous":
                options["synchronous"] = value
            else:
                raise ConfigurationError(
                    f"unknown SQLite URL option {key!r}; known: busy_timeout, prefix, synchronous"
                )
        return cls(parts.path, **options)

    def describe(self) -> str:
        return f"sqlite://{self.path}" if self.path.is_absolute() else f"sqlite:{self.path}"

    def sibling(self) -> SQLiteStore:
        return SQLiteStore(
            self.path,
            prefix=self.prefix,
            busy_timeout=self.busy_timeout,
            synchronous=self.synchronous,
        )

    # -- connections ---------------------------------------------------------

    def _check_path(self) -> None:
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

    def _conn(self) -> sqlite3.Connection:
        try:
            conn: sqlite3.Connection = self._local.conn
            return conn
        except AttributeError:  # this thread's first statement
            pass
        if self._closed:
            raise StoreUnavailable(f"the store {self.describe()} is closed")
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
            self._prepare(conn)
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

    def _prepare(self, conn: sqlite3.Connection) -> None:
        p = self.prefix
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        # Only a file not yet created takes it (before WAL mode is set); an
        # existing file keeps its page size, which works as well, if slower.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id not in (0, APPLICATION_ID):
            raise ConfigurationError(
                f"SQLite database {str(self.path)!r} belongs to another application "
                f"(application_id {app_id:#x}); give tenure a file of its own"
            )
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise ConfigurationError(
                f"SQLite database {str(self.path)!r} cannot use WAL mode (got {mode!r}); "
                "it must be on a local filesystem"
            )
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {_INLINE_CHECKPOINT_PAGES}")
        boot = _boot_id()
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if not tables:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            if f"{p}_meta" in tables:
                row = conn.execute(
                    f"SELECT value FROM {p}_meta WHERE key = 'schema_version'"
                ).fetchone()
                if row is not None and isinstance(row[0], int) and row[0] < SCHEMA_VERSION:
                    raise ConfigurationError(
                        f"SQLite database {str(self.path)!r} has tenure's tables (prefix {p!r}) "
                        f"of an older shape (schema version {row[0]}; this tenure uses "
                        f"{SCHEMA_VERSION}): tenure has no release yet that migrates them. Stop "
                        "every instance, then use a new file or another prefix (the old one "
                        "holds only leases and run records)"
                    )
                if row is None or row[0] != SCHEMA_VERSION:
                    raise ConfigurationError(
                        f"SQLite database {str(self.path)!r} has tables named {p}_* that tenure "
                        f"did not create (schema version {row and row[0]!r}, expected "
                        f"{SCHEMA_VERSION}); use another file or another prefix"
                    )
            else:
                conn.execute(f"CREATE TABLE {p}_meta (key TEXT PRIMARY KEY, value ANY) STRICT")
                conn.execute(
                    f"CREATE TABLE {p}_leases (name TEXT PRIMARY KEY, token TEXT, holder TEXT,"
                    " fence INTEGER NOT NULL, expires INTEGER NOT NULL, acquired REAL,"
                    " waiting INTEGER NOT NULL DEFAULT 0) STRICT"
                )
                conn.execute(
                    f"CREATE TABLE {p}_waiters (addr TEXT PRIMARY KEY, name TEXT NOT NULL,"
                    " until INTEGER NOT NULL) STRICT"
                )
                conn.execute(f"CREATE INDEX {p}_waiters_name ON {p}_waiters (name)")
                conn.execute(
                    f"CREATE TRIGGER {p}_waiter_in AFTER INSERT ON {p}_waiters BEGIN"
                    f" UPDATE {p}_leases SET waiting = 1 WHERE name = NEW.name; END"
                )
                conn.execute(
                    f"CREATE TRIGGER {p}_waiter_out AFTER DELETE ON {p}_waiters BEGIN"
                    f" UPDATE {p}_leases SET waiting = EXISTS (SELECT 1 FROM {p}_waiters"
                    " WHERE name = OLD.name) WHERE name = OLD.name; END"
                )
                conn.execute(
                    f"CREATE TABLE {p}_claims (task TEXT PRIMARY KEY, fire_time REAL NOT NULL,"
                    " claimant TEXT NOT NULL)"
                    " STRICT"
                )
                conn.execute(
                    f"CREATE TABLE {p}_runs (run_id TEXT PRIMARY KEY, task TEXT NOT NULL,"
                    " fire_time REAL, instance TEXT NOT NULL, started REAL NOT NULL, ended REAL,"
                    " outcome TEXT NOT NULL, error TEXT, fence INTEGER) STRICT"
                )
                conn.execute(f"CREATE INDEX {p}_runs_task ON {p}_runs (task, started)")
                conn.executemany(
                    f"INSERT INTO {p}_meta (key, value) VALUES (?, ?)",
                    [("schema_version", SCHEMA_VERSION), ("fence_floor", 0), ("boot_id", boot)],
                )
            row = conn.execute(f"SELECT value FROM {p}_meta WHERE key = 'boot_id'").fetchone()
            if row is None or row[0] != boot:
                # Every holder of the previous boot is gone, and its monotonic
                # expiry times mean nothing on this boot's clock.
                conn.execute(
                    f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0"
                    " WHERE token IS NOT NULL"
                )
                conn.execute(f"DELETE FROM {p}_waiters")
                conn.execute(
                    f"INSERT OR REPLACE INTO {p}_meta (key, value) VALUES ('boot_id', ?)", (boot,)
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _cursor(self) -> sqlite3.Cursor:
        """This thread's cursor, reused: every statement is fetched to its end at once."""
        try:
            cur: sqlite3.Cursor = self._local.cur
            return cur
        except AttributeError:  # this thread's first statement
            cur = self._local.cur = self._conn().cursor()
            return cur

    def _wrote(self) -> None:
        # Counted without a guard: a count lost between threads only delays a
        # checkpoint by one write.
        self._writes += 1
        if self._writes >= _CHECKPOINT_EVERY:
            self._writes = 0
            self._checkpointer.request()

    def _failed(self, exc: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"SQLite database {str(self.path)!r} failed: {exc}")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction around a batch: its items are committed, or
        rolled back, together (and cost one commit, not one each)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        try:
            yield
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._failed(exc) from exc
            raise

    def _run(self, sql: str, params: Sequence[object]) -> list[Any]:
        try:
            return self._cursor().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc

    # -- the contract --------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        return self._plain.acquire(name, token, ttl, holder)

    def blocking(self) -> BlockingLeases:
        return self._plain

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        payload = json.dumps([(name, token, int(ttl * 1e9)) for name, token, ttl in batch])
        rows = self._run(self._sql_renew, (time.monotonic_ns(), payload))
        self._wrote()
        renewed = set(map(tuple, rows))
        return [(name, token) in renewed for name, token, _ttl in batch]

    async def release(self, name: str, token: str) -> bool:
        return self._plain.release(name, token)

    async def diagnose(self) -> list[Finding]:
        found = []
        kind = _filesystem(self.path)
        if kind in _NETWORK_FILESYSTEMS:
            found.append(
                Finding(
                    "unsafe",
                    f"{self.path} is on a network filesystem ({kind}): SQLite's locking is not "
                    "reliable there, and expiry uses each host's own clock",
                    "keep the database on a local disk of the one host whose processes share "
                    "it; across hosts use Redis, PostgreSQL or etcd",
                )
            )
        else:
            found.append(
                Finding("ok", f"{self.path} is on a local filesystem ({kind or 'unknown'})")
            )
        if self.synchronous == "NORMAL":
            found.append(
                Finding(
                    "warn",
                    "synchronous=normal: a power loss can lose the last grants, and their fencing "
                    "tokens can be handed out again (every holder on the host died with it)",
                    "add ?synchronous=full when fenced resources live on other hosts",
                )
            )
        return found

    async def force_release(self, name: str) -> LeaseInfo | None:
        return await evict(name, self._live_grant, self.release, self._bump_fence)

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        now = time.monotonic_ns()
        rows = self._run(
            f"SELECT token, holder, fence, expires, acquired FROM {self.prefix}_leases "
            "WHERE name = ?1 AND token IS NOT NULL AND expires > ?2",
            (name, now),
        )
        if not rows:
            return None
        token, holder, fence, expires, acquired = rows[0]
        return token, LeaseInfo(name, holder or "", fence, (expires - now) / 1e9, acquired)

    async def _bump_fence(self, name: str) -> None:
        self._run(
            f"UPDATE {self.prefix}_leases SET fence = fence + 1 WHERE name = ?1 AND token IS NULL",
            (name,),
        )

    def _notify(self, addresses: list[str]) -> None:
        sender = self._sender
        if sender is None:
            sender = self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sender.setblocking(False)
        for address in addresses:
            try:
                sender.sendto(b"r", "\0" + address)
            except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
                # A full buffer already holds a wake-up; a missing socket is a
                # waiter that died, whose row pruning removes.
                pass
            except OSError:
                pass

    async def wait_released(self, name: str, timeout: float) -> None:
        if not _ABSTRACT_SOCKETS:
            await asyncio.sleep(min(timeout, _POLL_FALLBACK))
            return
        address = f"tenure-{os.getpid()}-{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.bind("\0" + address)
            now = time.monotonic_ns()
            until = now + int(timeout * 1e9) if timeout < 1e9 else _FAR_FUTURE_NS
            rows = self._run(self._sql_wait, (address, name, until))
            try:
                expires = rows[0][0] if rows else None
                if expires is None or expires <= now:
                    return
                timeout = min(timeout, (expires - now) / 1e9)
                loop = asyncio.get_running_loop()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):  # (wait_for may drop a cancel on 3.11)
                        await loop.sock_recv(sock, 16)
            finally:
                self._run(self._sql_unwait, (address,))
        finally:
            sock.close()

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        now = time.monotonic_ns()
        rows = self._run(self._sql_holders, (now, prefix))
        return [
            LeaseInfo(name, holder or "", fence, (expires - now) / 1e9, acquired)
            for name, holder, fence, expires, acquired in rows
        ]

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return self._claim_now(task, fire_time, claimant)

    def _claim_now(self, task: str, fire_time: float, claimant: str) -> bool:
        p = self.prefix
        rows = self._run(
            f"INSERT INTO {p}_claims (task, fire_time, claimant) VALUES (?1, ?2, ?3) "
            "ON CONFLICT (task) DO UPDATE SET fire_time = excluded.fire_time,"
            f" claimant = excluded.claimant WHERE {p}_claims.fire_time < excluded.fire_time"
            f" OR ({p}_claims.fire_time = excluded.fire_time"
            f" AND {p}_claims.claimant = excluded.claimant) RETURNING 1",
            (task, fire_time, claimant),
        )
        return bool(rows)

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        marks = ", ".join("?" * len(occurrences))
        last = dict(
            self._run(
                f"SELECT task, fire_time FROM {self.prefix}_claims WHERE task IN ({marks})",
                [task for task, _ in occurrences],
            )
        )
        return [task in last and last[task] >= fire for task, fire in occurrences]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        with self._transaction():
            return [self._claim_now(*claim) for claim in claims]

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        with self._transaction():
            return [self._plain.acquire(*item) for item in items]

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        answers: list[Started] = []
        with self._transaction():
            for claim, lock, record in items:
                if not self._claim_now(*claim):
                    answers.append(Started(False, None))
                    continue
                grant = self._plain.acquire(*lock)
                if grant is not None:
                    self._record_now(dataclasses.replace(record, fence=grant.fencing_token), keep)
                answers.append(Started(True, grant))
        return answers

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        with self._transaction():
            return [self._plain.release(*item) for item in items]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        with self._transaction():
            for record in records:
                self._record_now(record, keep)

    def _record_now(self, record: RunRecord, keep: int) -> None:
        p = self.prefix
        self._run(
            f"INSERT OR REPLACE INTO {p}_runs (run_id, task, fire_time, instance, started,"
            " ended, outcome, error, fence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            # The columns are RunRecord's fields, in order; runs() reads them back the same way.
            record.row(),
        )
        if record.ended is not None:
            self._run(
                f"DELETE FROM {p}_runs WHERE task = ?1 AND started < (SELECT started FROM"
                f" {p}_runs WHERE task = ?1 ORDER BY started DESC LIMIT 1 OFFSET ?2)",
                (record.task, keep - 1),
            )

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        sql = (
            f"UPDATE {self.prefix}_runs SET ended = ?, outcome = ?, error = ?"
            " WHERE run_id = ? AND outcome = ?"
        )
        written = 0
        with self._transaction():
            cur = self._cursor()
            for record in records:
                params = (
                    record.ended,
                    record.outcome,
                    record.error,
                    record.run_id,
                    RunOutcome.RUNNING,
                )
                try:
                    written += cur.execute(sql, params).rowcount
                except sqlite3.Error as exc:
                    raise self._failed(exc) from exc
        return written

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        p = self.prefix
        columns = "run_id, task, fire_time, instance, started, ended, outcome, error, fence"
        if task is None:
            rows = self._run(
                f"SELECT {columns} FROM {p}_runs ORDER BY started DESC LIMIT ?", (limit,)
            )
        else:
            rows = self._run(
                f"SELECT {columns} FROM {p}_runs WHERE task = ? ORDER BY started DESC LIMIT ?",
                (task, limit),
            )
        return [RunRecord.from_row(row) for row in rows]

    async def prune(self, *, keep_runs: int) -> int:
        p = self.prefix
        now = time.monotonic_ns()
        conn = self._conn()
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
                removed += conn.execute(
                    f"DELETE FROM {p}_runs WHERE run_id IN (SELECT run_id FROM (SELECT run_id,"
                    " row_number() OVER (PARTITION BY task ORDER BY started DESC) AS n"
                    f" FROM {p}_runs) WHERE n > ?)",
                    (keep_runs,),
                ).rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        return removed

    async def aclose(self) -> None:
        self._closed = True
        # Joined, so that nothing of the store still runs once aclose returns
        # (the thread may be mid-checkpoint, on a connection of its own).
        await asyncio.to_thread(self._checkpointer.stop)
        with self._all_guard:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
        if self._sender is not None:
            self._sender.close()
            self._sender = None


class _PlainCalls(BlockingLeases):
    """Acquire and release: plain calls on the calling thread's connection,
    which the store's coroutines make too (SQLite never suspends them)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        store = self.store
        params = (name, token, holder, time.monotonic_ns(), int(ttl * 1e9), time.time())
        cur = store._cursor()
        try:
            rows = cur.execute(store._sql_acquire, params).fetchall()
            if not rows:
                rows = cur.execute(store._sql_acquire_new, params).fetchall()
        except sqlite3.Error as exc:
            raise store._failed(exc) from exc
        if not rows:
            return None
        store._wrote()
        return Grant(rows[0][0])

    def release(self, name: str, token: str) -> bool:
        store = self.store
        now = time.monotonic_ns()
        try:
            alone = store._cursor().execute(store._sql_release_alone, (name, token, now)).rowcount
        except sqlite3.Error as exc:
            raise store._failed(exc) from exc
        if alone:
            store._wrote()
            return True
        rows = store._run(store._sql_release, (name, token, now))
        store._wrote()
        valid = bool(rows)
        if not valid:
            rows = store._run(store._sql_release_lapsed, (name, token))
        if rows and rows[0][0]:
            store._notify(rows[0][0].split(" "))
        return valid
