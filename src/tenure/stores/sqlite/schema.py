"""The SQLite store's tables and connection set-up: PRAGMAs, WAL mode, schema, boot id.

* A new database file gets 1 KB pages (``PAGE_SIZE``) and tenure's
  ``application_id``; a file of another application is refused.
* WAL mode, ``synchronous`` as configured; callers' connections checkpoint by
  themselves only past ``INLINE_CHECKPOINT_PAGES`` (the checkpoint thread
  does it otherwise: ``checkpoint``).
* Expiry times are ``CLOCK_MONOTONIC`` nanoseconds, which restart at boot, so
  the database records the kernel's boot id: the first process to open it
  after a reboot clears the leases of the previous boot, whose holders are
  all gone.
* Tables of an older shape are named as such, never used.
"""

from __future__ import annotations

import marshal
import sqlite3
import time
from pathlib import Path

from ...errors import ConfigurationError
from ..semaphores import Ledger

__all__ = (
    "APPLICATION_ID",
    "INLINE_CHECKPOINT_PAGES",
    "PAGE_SIZE",
    "SCHEMA_VERSION",
    "boot_id",
    "prepare",
)

SCHEMA_VERSION = 6
PAGE_SIZE = 1024
"""Of a database file tenure creates. A grant or release rewrites one small
row, and every commit appends the pages it changed to the WAL: at a quarter
of SQLite's default 4 KB, each cycle writes and checksums a quarter of the
bytes (see bench/sqlite_cycle.py)."""
APPLICATION_ID = 0x74656E75  # "tenu": marks a database file that tenure created
INLINE_CHECKPOINT_PAGES = 4000
"""WAL size (pages) at which a caller's commit checkpoints by itself: only when the
background checkpoint cannot keep up, or its thread is gone (a forked child)."""


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        # Without a kernel boot id, the wall-clock time of boot identifies it;
        # rounded to a minute so that ordinary clock adjustments do not change it.
        return f"boot@{round((time.time() - time.monotonic()) / 60)}"


SETUP_WAIT = 5.0
"""Seconds a connection waits, at least, for another process that is turning a
new file to WAL mode (a one-time step that takes an exclusive lock and syncs):
processes started together on a new file must not fail for it."""


def _wal_mode(conn: sqlite3.Connection, busy_timeout: float) -> str:
    """``PRAGMA journal_mode = WAL``; the mode the file is in."""
    give_up = time.monotonic() + max(busy_timeout, SETUP_WAIT)
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= give_up:
                raise
        time.sleep(0.01)


def _clear_semaphores(conn: sqlite3.Connection, prefix: str) -> None:
    """Drop every semaphore's permits and waiters (their monotonic expiries
    belong to the boot before), keeping its limit and fencing counter."""
    rows = conn.execute(f"SELECT name, ledger FROM {prefix}_semaphores").fetchall()
    for name, blob in rows:
        ledger = Ledger.load(marshal.loads(blob))
        ledger.permits, ledger.queue = {}, []
        conn.execute(
            f"UPDATE {prefix}_semaphores SET ledger = ? WHERE name = ?",
            (marshal.dumps(ledger.dump()), name),
        )


def prepare(
    conn: sqlite3.Connection,
    path: Path,
    prefix: str,
    busy_timeout: float,
    synchronous: str,
) -> None:
    """Set a new connection up (PRAGMAs, WAL mode) and create or check the
    tables; after a reboot, clear the leases of the boot before."""
    p = prefix
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    # Only a file not yet created takes it (before WAL mode is set); an
    # existing file keeps its page size, which works as well, if slower.
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if app_id not in (0, APPLICATION_ID):
        raise ConfigurationError(
            f"SQLite database {str(path)!r} belongs to another application "
            f"(application_id {app_id:#x}); give tenure a file of its own"
        )
    mode = _wal_mode(conn, busy_timeout)
    if str(mode).lower() != "wal":
        raise ConfigurationError(
            f"SQLite database {str(path)!r} cannot use WAL mode (got {mode!r}); "
            "it must be on a local filesystem"
        )
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {INLINE_CHECKPOINT_PAGES}")
    boot = boot_id()
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
                    f"SQLite database {str(path)!r} has tenure's tables (prefix {p!r}) "
                    f"of an older shape (schema version {row[0]}; this tenure uses "
                    f"{SCHEMA_VERSION}): tenure has no release yet that migrates them. Stop "
                    "every instance, then use a new file or another prefix (the old one "
                    "holds only leases, run records, audit records and the control board)"
                )
            if row is None or row[0] != SCHEMA_VERSION:
                raise ConfigurationError(
                    f"SQLite database {str(path)!r} has tables named {p}_* that tenure "
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
            conn.execute(
                f"CREATE TABLE {p}_semaphores (name TEXT PRIMARY KEY, ledger BLOB NOT NULL) STRICT"
            )
            conn.execute(
                f"CREATE TABLE {p}_forced (record_id TEXT PRIMARY KEY, name TEXT NOT NULL,"
                " at REAL NOT NULL, operator TEXT NOT NULL, evicted TEXT NOT NULL,"
                " fencing_token INTEGER NOT NULL, reason TEXT) STRICT"
            )
            conn.execute(f"CREATE INDEX {p}_forced_at ON {p}_forced (at)")
            conn.execute(f"CREATE INDEX {p}_forced_name ON {p}_forced (name, at)")
            conn.execute(
                f"CREATE TABLE {p}_board (kind TEXT NOT NULL, key TEXT NOT NULL,"
                " value TEXT NOT NULL, PRIMARY KEY (kind, key)) STRICT"
            )
            conn.executemany(
                f"INSERT INTO {p}_meta (key, value) VALUES (?, ?)",
                [
                    ("schema_version", SCHEMA_VERSION),
                    ("fence_floor", 0),
                    ("boot_id", boot),
                ],
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
            _clear_semaphores(conn, p)
            conn.execute(
                f"INSERT OR REPLACE INTO {p}_meta (key, value) VALUES ('boot_id', ?)",
                (boot,),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
