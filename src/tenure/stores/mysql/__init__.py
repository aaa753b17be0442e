"""The MySQL/MariaDB store: leases as rows, expiry by the server's clock.

URL forms: ``mysql://[user[:password]@]host[:port]/database`` (or
``mariadb://``), with ``?unix_socket=/path`` for a socket, plus ours:
``prefix`` (of the tables' names, default ``tenure``), ``timeout`` (seconds a
statement may take, and a call may queue for a connection; default 2) and
``pool_max`` (statements in flight at once per store, default 10).

How it stays correct
--------------------
* **One statement per operation.** Acquire is one ``INSERT ... ON DUPLICATE
  KEY UPDATE`` that takes a free or expired row and returns the fencing token
  in its answer (``LAST_INSERT_ID(expr)``); release is one compare-and-set
  ``UPDATE`` on ``(name, token)``; a renewal batch is one call of a stored
  procedure (one transaction); no isolation level is relied on for
  correctness, only row locks (Jepsen found MySQL's REPEATABLE READ allows
  lost updates).
* **Expiry by the server's clock, in microseconds.** ``UTC_TIMESTAMP(6)``
  plus the TTL, compared with ``UTC_TIMESTAMP(6)``; no client time is written
  or compared, and session time zones play no part. (ShedLock granted twice
  where timestamps had millisecond precision.) A step of the database host's
  wall clock moves every expiry with it: slew, never step.
* **Fencing tokens** rise per name in the lease row, which a release keeps;
  a name without a row starts at the server's clock in microseconds since
  the epoch, and ``prune`` deletes only rows whose token is below that clock
  ten minutes ago, so a name pruned and acquired again starts above every
  token it had unless the database host's clock steps back more than ten
  minutes in between (as on Redis, whose floor is its ``TIME``). No floor is
  read per acquire: a row of its own read in every acquire cost about a
  fifth of the cycle (``bench/mysql_cycle.py``). Durable across restarts
  (InnoDB).
* **No session state.** No ``GET_LOCK`` (session state that breaks behind
  proxies and on reconnect), no user variables: every call works through a
  transaction pooler such as ProxySQL.
* **Waiters** poll (MySQL has no LISTEN/NOTIFY): see ``waiting``.

Where the rest lives: ``schema`` (tables and procedures, made at first use),
``transport`` (connections, turns, errors), ``blocking`` (acquire and release
as plain calls, through PyMySQL, for ``tenure.sync``), ``waiting``,
``runlog`` (claims, run records, audit records, the control board),
``semaphores``, ``doctor`` (``tenure doctor``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from ...errors import ConfigurationError
from .._gate import Gate
from .._options import POOL_MAX, check_pool_max, check_timeout, mask, options
from .._schema import schema_on_a_thread
from ..base import Finding, Grant, LeaseInfo, PrintsSchema, RenewItem, Store, evict
from . import doctor
from .blocking import BlockingCalls
from .runlog import MySQLRunLog
from .schema import Names, check_prefix, ensure, schema_sql
from .semaphores import MySQLPermits
from .transport import Endpoint, Transport, text
from .waiting import Waiting

__all__ = ("MySQLStore",)

PRUNE_AFTER_S = 600
"""Seconds after its expiry a lease row may be pruned."""

EPOCH_US = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {})"
"""A UTC ``DATETIME(6)`` as microseconds since the epoch, whatever the session's time zone."""


class MySQLStore(Store, PrintsSchema):
    """Leases in a MySQL or MariaDB table. See the module docstring."""

    scheme: ClassVar[str] = "mysql"
    gate: Gate

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "tenure",
        timeout: float = 2.0,
        pool_max: int = POOL_MAX,
        unix_socket: str | None = None,
    ) -> None:
        check_prefix(prefix)
        check_timeout(timeout)
        check_pool_max(pool_max)
        self.url = url
        self.prefix = prefix
        self.timeout = float(timeout)
        self.pool_max = pool_max
        self.endpoint = _endpoint(url, unix_socket)
        self.names = names = Names(prefix)
        where = f"MySQL at {mask(url)}"
        self.transport = Transport(
            self.endpoint,
            where=where,
            timeout=self.timeout,
            pool_max=pool_max,
            ensure=lambda conn: ensure(conn, names, where),
        )
        self.gate = self.transport.gate
        now = "UTC_TIMESTAMP(6)"
        # Acquire: one statement, one commit. The fencing token comes back in
        # the answer's insert id (LAST_INSERT_ID(expr): this statement's own,
        # no state kept between statements); its affected rows say whether it
        # was granted (0: held by another, nothing changed). The assignments
        # run left to right, so every test reads the row as it was, except
        # the expiry's, which reads the token just set: it is the caller's
        # exactly when the lease was taken. A name without a row starts at the
        # server's clock in µs (see the module docstring). A live lease of the
        # very token (an acquire resent after its answer was lost) is granted
        # again: the same fence, renewed.
        # The caller's values are passed twice (MySQL 8 deprecates VALUES()).
        free = f"(token IS NULL OR expires <= {now})"
        take = f"({free} OR token = %(token)s)"
        self._acquire = (
            f"INSERT INTO {names.leases} (name, token, holder, fence, expires, acquired)"
            " VALUES (%(name)s, %(token)s, %(holder)s,"
            f" LAST_INSERT_ID({EPOCH_US.format(now)}),"
            f" TIMESTAMPADD(MICROSECOND, %(ttl)s, {now}), {now}) "
            "ON DUPLICATE KEY UPDATE"
            f" fence = IF({free}, LAST_INSERT_ID(fence + 1),"
            " IF(token = %(token)s, LAST_INSERT_ID(fence), fence)),"
            f" acquired = IF({free}, {now}, acquired),"
            f" holder = IF({take}, %(holder)s, holder),"
            f" token = IF({take}, %(token)s, token),"
            f" expires = IF(token = %(token)s, TIMESTAMPADD(MICROSECOND, %(ttl)s, {now}),"
            " expires)"
        )
        # Only the token goes: the row (its fence) stays for the next grant, and
        # a commit that writes less is a faster one.
        self._release = (
            f"UPDATE {names.leases} SET token = NULL"
            f" WHERE name = %s AND token = %s AND expires > {now}"
        )
        self._remaining = (
            f"SELECT TIMESTAMPDIFF(MICROSECOND, {now}, expires) / 1e6 FROM {names.leases}"
            f" WHERE name = %s AND token IS NOT NULL AND expires > {now}"
        )
        columns = (
            f"name, holder, fence, TIMESTAMPDIFF(MICROSECOND, {now}, expires) / 1e6,"
            f" {EPOCH_US.format('acquired')} / 1e6"
        )
        self._holders = (
            f"SELECT {columns} FROM {names.leases} WHERE token IS NOT NULL"
            f" AND expires > {now} AND LEFT(name, LENGTH(%s)) = %s ORDER BY name"
        )
        self._live_grant = (
            f"SELECT token, {columns} FROM {names.leases}"
            f" WHERE name = %s AND token IS NOT NULL AND expires > {now}"
        )
        self.waiting = Waiting(self.transport, self._remaining, self.describe())
        self._runlog = MySQLRunLog(self, self.transport, names)
        self._semaphores = MySQLPermits(self.transport, names, self.describe())
        self._blocking: BlockingCalls | None = None
        self._blocking_guard = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> MySQLStore:
        query = url.partition("?")[2].partition("#")[0]
        ours, _ = options(
            "MySQL",
            query,
            {"prefix": str, "timeout": float, "pool_max": int, "unix_socket": str},
            others=False,
        )
        return cls(url.partition("?")[0].partition("#")[0], **ours)

    @property
    def runlog(self) -> MySQLRunLog:
        return self._runlog

    @property
    def semaphores(self) -> MySQLPermits:
        return self._semaphores

    def describe(self) -> str:
        return mask(self.url)

    def schema_sql(self) -> str:
        return schema_sql(self.prefix)

    def sibling(self) -> MySQLStore:
        # aiomysql connections belong to the loop that opened them.
        return self.remade()

    def blocking(self) -> BlockingCalls:
        with self._blocking_guard:  # callers on many threads: one set of connections
            if self._blocking is None:
                self._blocking = BlockingCalls(
                    self.transport,
                    (self._acquire, self._release),
                    self.waiting.released,
                    lambda: schema_on_a_thread(lambda: self.remade().transport, "mysql"),
                    pool_max=self.pool_max,
                )
            return self._blocking

    async def aclose(self) -> None:
        if self._blocking is not None:
            self._blocking.close()
        self.transport.close()

    # -- leases ------------------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        params = {"name": name, "token": token, "holder": holder, "ttl": max(1, round(ttl * 1e6))}
        fence = await self.transport.granted(self._acquire, params)
        return None if fence is None else Grant(fence)

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        items = [
            [i, item.name, item.token, max(1, round(item.ttl * 1e6))]
            for i, item in enumerate(batch)
        ]
        rows = await self.transport.call(self.names.renew, (_json(items),))
        renewed = {int(row[0]) for row in rows}
        return [i in renewed for i in range(len(batch))]

    async def release(self, name: str, token: str) -> bool:
        released = await self.transport.changed(self._release, (name, token)) > 0
        self.waiting.released(name)
        return released

    async def wait_released(self, name: str, timeout: float) -> None:
        await self.waiting.wait_released(name, timeout)

    # -- what operators see and do -----------------------------------------------

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        rows = await self.transport.query(self._holders, (prefix, prefix))
        return [_info(*row) for row in rows]

    async def holder_of(self, name: str) -> LeaseInfo | None:
        found = await self._grant_of(name)
        return None if found is None else found[1]

    async def _grant_of(self, name: str) -> tuple[str, LeaseInfo] | None:
        rows = await self.transport.query(self._live_grant, (name,))
        if not rows:
            return None
        token, *info = rows[0]
        return text(token), _info(*info)

    async def force_release(self, name: str) -> LeaseInfo | None:
        return await evict(name, self._grant_of, self.release, self._bump_fence)

    async def _bump_fence(self, name: str) -> None:
        await self.transport.changed(
            f"UPDATE {self.names.leases} SET fence = fence + 1 WHERE name = %s", (name,)
        )

    async def server_time(self) -> float | None:
        rows = await self.transport.query(f"SELECT {EPOCH_US.format('UTC_TIMESTAMP(6)')} / 1e6")
        return float(rows[0][0])

    async def diagnose(self) -> list[Finding]:
        return await doctor.diagnose(self.transport)

    async def prune(self, *, keep_runs: int) -> int:
        names = self.names
        cutoff = f"UTC_TIMESTAMP(6) - INTERVAL {PRUNE_AFTER_S} SECOND"

        # Only rows whose token a name acquired again would start above: a
        # row whose token is ahead of the clock (it stepped back) stays
        # until the clock has passed it by the same ten minutes.
        gone = await self.transport.changed(
            f"DELETE FROM {names.leases} WHERE expires < {cutoff}"
            f" AND fence < {EPOCH_US.format(cutoff)}"
        )
        return gone + await self._runlog.trim_all(keep_runs)


def _endpoint(url: str, unix_socket: str | None) -> Endpoint:
    where = mask(url)
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigurationError(f"bad MySQL URL {where!r}: {exc}") from None
    if parts.scheme.lower() not in ("mysql", "mariadb"):
        raise ConfigurationError(f"bad MySQL URL {where!r}: the scheme is mysql:// or mariadb://")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigurationError(
            f"bad MySQL URL {where!r}: name the database, mysql://user:password@host:3306/DATABASE"
        )
    if not parts.hostname and unix_socket is None:
        raise ConfigurationError(f"bad MySQL URL {where!r}: no host (or ?unix_socket=/path)")
    return Endpoint(
        parts.hostname or "localhost",
        port,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password is not None else None,
        database,
        unix_socket,
    )


def _info(name: Any, holder: Any, fence: Any, left: Any, acquired: Any) -> LeaseInfo:
    return LeaseInfo(
        text(name),
        text(holder),
        int(fence),
        float(left),
        None if acquired is None else float(acquired),
    )


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
