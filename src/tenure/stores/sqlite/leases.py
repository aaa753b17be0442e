"""The SQLite store's lease statements, and acquire and release as plain calls.

Acquire of a name seen before is one ``UPDATE ... WHERE free or expired ...
RETURNING fence``; a name without a row takes one ``INSERT ... ON CONFLICT DO
NOTHING`` more. Release is one ``UPDATE ... WHERE token = ?`` (plus one that
returns the waiters' addresses when the row's ``waiting`` flag, kept by
triggers, says someone waits); a whole renewal batch is one ``UPDATE ... FROM
json_each(?)``. Fencing tokens live in the lease row, which a release keeps
(only its token is cleared). SQLite never suspends a statement, so the
store's coroutines make these same plain calls, which ``tenure.sync`` makes
on its callers' threads (``Store.blocking``).
"""

from __future__ import annotations

import sqlite3
import time

from ..base import BlockingLeases, Grant
from .database import Database
from .waiting import Notifier

__all__ = ("PlainCalls", "Statements")


class Statements:
    """The lease statements of one table prefix."""

    def __init__(self, prefix: str) -> None:
        p = prefix
        # Acquire: a name seen before is one UPDATE of its row (the common
        # case); only a name without a row needs the INSERT, which reads the
        # fencing floor. Each is a single atomic statement; a contended name
        # costs both, and both change nothing.
        # A live lease of this very token (an acquire resent after its answer
        # was lost) is granted again: the same fence, its expiry renewed.
        self.acquire = (
            f"UPDATE {p}_leases SET fence = fence + (token IS NOT ?2 OR expires <= ?4),"
            " acquired = CASE WHEN token IS ?2 AND expires > ?4 THEN acquired ELSE ?6 END,"
            " token = ?2, holder = ?3, expires = ?4 + ?5 "
            "WHERE name = ?1 AND (token IS NULL OR expires <= ?4 OR token = ?2) RETURNING fence"
        )
        self.acquire_new = (
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
        self.release_alone = (
            f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0 "
            "WHERE name = ?1 AND token = ?2 AND expires > ?3 AND waiting = 0"
        )
        self.release = (
            f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0 "
            f"WHERE name = ?1 AND token = ?2 AND expires > ?3 RETURNING {waiters}"
        )
        self.release_lapsed = (
            f"UPDATE {p}_leases SET token = NULL, holder = NULL, expires = 0 "
            f"WHERE name = ?1 AND token = ?2 RETURNING {waiters}"
        )
        self.renew = (
            f"UPDATE {p}_leases SET expires = ?1 + b.ttl FROM "
            "(SELECT value ->> 0 AS n, value ->> 1 AS t, value ->> 2 AS ttl"
            " FROM json_each(?2)) AS b "
            f"WHERE {p}_leases.name = b.n AND {p}_leases.token = b.t"
            f" AND {p}_leases.expires > ?1 "
            f"RETURNING {p}_leases.name, {p}_leases.token"
        )
        self.wait = (
            f"INSERT INTO {p}_waiters (addr, name, until) VALUES (?1, ?2, ?3) "
            f"RETURNING (SELECT expires FROM {p}_leases WHERE name = ?2 AND token IS NOT NULL)"
        )
        self.unwait = f"DELETE FROM {p}_waiters WHERE addr = ?1"
        self.holders = (
            f"SELECT name, holder, fence, expires, acquired FROM {p}_leases "
            "WHERE token IS NOT NULL AND expires > ?1 AND substr(name, 1, length(?2)) = ?2 "
            "ORDER BY name"
        )


class PlainCalls(BlockingLeases):
    """Acquire and release: plain calls on the calling thread's connection,
    which the store's coroutines make too (SQLite never suspends them)."""

    def __init__(self, db: Database, sql: Statements, notifier: Notifier) -> None:
        self.db = db
        self.sql = sql
        self.notifier = notifier

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        db, sql = self.db, self.sql
        params = (name, token, holder, time.monotonic_ns(), int(ttl * 1e9), time.time())
        cur = db.cursor()
        try:
            rows = cur.execute(sql.acquire, params).fetchall()
            if not rows:
                rows = cur.execute(sql.acquire_new, params).fetchall()
        except sqlite3.Error as exc:
            raise db.failed(exc) from exc
        if not rows:
            return None
        db.wrote()
        return Grant(rows[0][0])

    def release(self, name: str, token: str) -> bool:
        db, sql = self.db, self.sql
        now = time.monotonic_ns()
        try:
            alone = db.cursor().execute(sql.release_alone, (name, token, now)).rowcount
        except sqlite3.Error as exc:
            raise db.failed(exc) from exc
        if alone:
            db.wrote()
            return True
        rows = db.run(sql.release, (name, token, now))
        db.wrote()
        valid = bool(rows)
        if not valid:
            rows = db.run(sql.release_lapsed, (name, token))
        if rows and rows[0][0]:
            self.notifier.notify(rows[0][0].split(" "))
        return valid
