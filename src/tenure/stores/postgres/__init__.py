"""The PostgreSQL store: leases as rows, expiry by the server's clock.

URL forms: ``postgresql://[user[:password]@]host[:port]/dbname`` (or
``postgres://``) with libpq's query parameters (``sslmode``,
``application_name``, ``connect_timeout`` ...), plus ours:

``schema``
    the schema of tenure's tables (default ``public``);
``prefix``
    the start of their names (default ``tenure``: ``tenure_leases`` ...);
``timeout``
    seconds a statement may take, and seconds a call may queue for a
    connection, before the call raises StoreUnavailable (default 2);
``pool_max``
    statements in flight at once, and so connections, per store (default 10;
    the renewer's thread has its own): further callers queue for a turn, first
    come, first served, instead of failing;
``pooler``
    ``transaction`` when the URL points at a transaction pooler (PgBouncer
    ``pool_mode = transaction``): no prepared statements, and no LISTEN on that
    URL (see waiters below);
``listen_url``
    a percent-encoded URL of a *session* connection for LISTEN, when the main
    URL goes through a transaction pooler.

How it stays correct
--------------------
* **One statement per operation.** Acquire is one ``INSERT ... ON CONFLICT DO
  UPDATE ... WHERE free or expired RETURNING fence``; release is one
  compare-and-set ``UPDATE`` on ``(name, token)`` that also notifies waiters; a
  whole renewal batch is one ``UPDATE ... FROM unnest(...)``. Each runs in
  autocommit mode: the statement is the transaction.
* **Expiry by the server's clock.** Expiry times are ``clock_timestamp()`` plus
  the TTL, compared with ``clock_timestamp()``; no client timestamp is ever
  written or compared. A step of the *database server's* wall clock moves
  every expiry with it (PostgreSQL has no monotonic clock in SQL): run the
  server with a slewing NTP client, as any database host should.
* **Fencing tokens** come from a sequence, taken when the row is inserted or,
  on a takeover, after the row is locked: strictly increasing per name, durable
  across server restarts (a sequence never hands out a value again after a
  crash), and independent of pruning. Prune removes a lease row only ten minutes
  after it expired, so no acquire still in flight can have drawn its token
  before an earlier grant of the same name.
* **No session state.** No advisory locks, no ``SET``; schema creation takes a
  transaction-scoped advisory lock only. Acquire, renew and release therefore
  work through PgBouncer in transaction pooling mode (``pooler=transaction``).

Where the rest lives: ``sql`` (the lease statements), ``schema`` (the tables,
created on first use), ``transport`` (the pool, timeouts, retry),
``deadline`` (the statement watchdog), ``listen`` (LISTEN/NOTIFY and the
hand-over queue), ``blocking`` (the plain calls of ``tenure.sync``),
``runlog`` (claims and run records).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import ClassVar
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...errors import ConfigurationError
from .._gate import Gate
from .._options import POOL_MAX, check_pool_max, check_timeout, mask, options
from .._schema import schema_on_a_thread
from ..base import (
    AcquireItem,
    Finding,
    Grant,
    HandedOver,
    HandsOver,
    LeaseInfo,
    PrintsSchema,
    ReleaseItem,
    RenewItem,
    Store,
    evict,
)
from .blocking import BlockingCalls
from .listen import Waiting
from .runlog import PostgresRunLog
from .schema import MAX_IDENT_BYTES, MAX_PREFIX_BYTES, SCHEMA_VERSION, check_ident, schema_sql
from .semaphores import PostgresPermits
from .sql import Statements
from .transport import Shared, Transport, connect_timeout

__all__ = ("SCHEMA_VERSION", "PostgresStore", "schema_sql")

_OPTIONS = {
    "schema": str,
    "prefix": str,
    "pooler": str,
    "listen_url": str,
    "timeout": float,
    "pool_max": int,
}


class PostgresStore(Store, HandsOver, PrintsSchema):
    """Leases in a PostgreSQL table. See the module docstring."""

    scheme: ClassVar[str] = "postgresql"
    gate: Gate

    def __init__(
        self,
        url: str,
        *,
        schema: str = "public",
        prefix: str = "tenure",
        timeout: float = 2.0,
        pool_max: int = POOL_MAX,
        pooler: str = "session",
        listen_url: str | None = None,
        _shared: Shared | None = None,
    ) -> None:
        check_ident(schema, "schema", MAX_IDENT_BYTES)
        check_ident(prefix, "table prefix", MAX_PREFIX_BYTES)
        check_timeout(timeout)
        check_pool_max(pool_max)
        if pooler not in ("session", "transaction"):
            raise ConfigurationError(f"pooler must be 'session' or 'transaction', got {pooler!r}")
        for what, value in (("URL", url), ("listen_url", listen_url)):
            if value is None:
                continue
            try:
                conninfo_to_dict(value)
            except psycopg.Error as exc:
                raise ConfigurationError(f"bad PostgreSQL {what} {mask(value)!r}: {exc}") from None
        self.url = url
        self.schema = schema
        self.prefix = prefix
        self.timeout = float(timeout)
        self.pool_max = pool_max
        self.pooler = pooler
        self.listen_url = (
            listen_url if listen_url is not None else (url if pooler == "session" else None)
        )
        self._shared = _shared if _shared is not None else Shared()
        """What this store and its siblings share: whether the tables are ready."""
        self.sql = Statements(schema, prefix)
        self.transport = Transport(
            url,
            self.sql,
            timeout=self.timeout,
            pool_max=pool_max,
            pooler=pooler,
            shared=self._shared,
        )
        self.gate = self.transport.gate
        self.waiting = Waiting(self.transport, self.listen_url, self.release)
        self._semaphores = PostgresPermits(self.transport, self.waiting, self.describe())
        self._runlog = PostgresRunLog(self, self.transport, self.sql.names)
        self._blocking: BlockingCalls | None = None
        self._blocking_guard = threading.Lock()
        self._schema_guard = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        parts = urlsplit(url)
        ours, rest = options("PostgreSQL", parts.query, _OPTIONS, others=True)
        if not any(key == "connect_timeout" for key, _ in rest):
            rest.append(("connect_timeout", str(connect_timeout(ours.get("timeout", 2.0)))))
        clean = urlunsplit(
            parts._replace(scheme="postgresql", query=urlencode(rest, quote_via=quote))
        )
        return cls(clean, **ours)

    @property
    def runlog(self) -> PostgresRunLog:
        return self._runlog

    def schema_sql(self) -> str:
        """The SQL that creates this store's tables (``tenure schema --url URL``)."""
        return self.sql.schema

    @property
    def semaphores(self) -> PostgresPermits:
        return self._semaphores

    def describe(self) -> str:
        return mask(self.url)

    def sibling(self) -> PostgresStore:
        # A psycopg pool belongs to the event loop that opened it.
        return self.remade(_shared=self._shared)

    def blocking(self) -> BlockingCalls:
        with self._blocking_guard:  # callers on many threads: one set of connections
            if self._blocking is None:
                self._blocking = BlockingCalls(self.transport, self._ensure_schema_now)
            return self._blocking

    def _ensure_schema_now(self) -> None:
        with self._schema_guard:  # once, whichever thread asks first
            if not self._shared.schema_ready:
                schema_on_a_thread(lambda: self.sibling().transport, "postgres")

    async def warm_up(self) -> None:
        await self.transport.warm_up()

    async def aclose(self) -> None:
        if self._blocking is not None:
            self._blocking.close()
        await self.waiting.aclose()  # its withdrawals use the pool: before it closes
        await self.transport.aclose()

    # -- leases ------------------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        rows = await self.transport.query(self.sql.acquire, (name, token, holder, ttl))
        return Grant(rows[0][0]) if rows else None

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        answers = await self.transport.query_each(
            self.sql.acquire, [(i.name, i.token, i.holder, i.ttl) for i in items]
        )
        return [Grant(rows[0][0]) if rows else None for rows in answers]

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        rows = await self.transport.query(
            self.sql.renew,
            (
                [item.name for item in batch],
                [item.token for item in batch],
                [item.ttl for item in batch],
            ),
        )
        results = [False] * len(batch)
        for (i,) in rows:
            results[i - 1] = True
        return results

    async def release(self, name: str, token: str) -> bool:
        channel = self.sql.names.channel
        rows = await self.transport.query(self.sql.release, (name, token, channel, channel))
        return bool(rows and rows[0][0])

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        channel = self.sql.names.channel
        answers = await self.transport.query_each(
            self.sql.release, [(name, token, channel, channel) for name, token in items]
        )
        return [bool(rows and rows[0][0]) for rows in answers]

    async def wait_released(self, name: str, timeout: float) -> None:
        await self.waiting.wait_released(name, timeout)

    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        return await self.waiting.acquire_waiting(
            name, token, ttl, holder, timeout=timeout, handover=handover
        )

    # -- what operators see and do -----------------------------------------------

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        rows = await self.transport.query(self.sql.holders, (prefix,))
        return [
            LeaseInfo(name, holder or "", fence, expires_in, acquired)
            for name, holder, fence, expires_in, acquired in rows
        ]

    async def force_release(self, name: str) -> LeaseInfo | None:
        # No fence to advance: tokens come from one sequence, so every later
        # grant's is larger already.
        return await evict(name, self._live_grant, self.release)

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        rows = await self.transport.query(self.sql.live_grant, (name,))
        if not rows:
            return None
        token, holder, fence, expires_in, acquired = rows[0]
        return token, LeaseInfo(name, holder or "", fence, expires_in, acquired)

    async def server_time(self) -> float | None:
        rows = await self.transport.query(
            "SELECT extract(epoch FROM clock_timestamp())::float8", ()
        )
        return float(rows[0][0])

    async def diagnose(self) -> list[Finding]:
        rows = await self.transport.query("SELECT current_setting('synchronous_commit')", ())
        setting = rows[0][0]
        if setting in ("off", "local"):
            return [
                Finding(
                    "warn",
                    f"synchronous_commit is {setting}: a server crash (or, with 'local', a "
                    "failover to a replica) can lose the last grants, and their fencing tokens "
                    "can be handed out again",
                    "set synchronous_commit = on (or remote_apply with replicas) for tenure's "
                    "user: ALTER ROLE ... SET synchronous_commit = on",
                )
            ]
        return [
            Finding("ok", f"synchronous_commit is {setting}: a committed grant survives a crash")
        ]

    async def prune(self, *, keep_runs: int) -> int:
        rows = await self.transport.query(self.sql.prune, (keep_runs,))
        return int(rows[0][0])
