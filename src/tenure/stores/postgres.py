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
* **Grant on release.** A waiter that finds the lock held queues itself on
  the lease row (``next_*`` columns: its id, token, holder, the hand-over
  lease, and an entry that lapses after ``QUEUE_LIFE`` unless it calls again,
  every third of that), in the one statement that would have granted it a free
  lock. One waiter per name is queued; the others wait their turn. The release
  statement hands the lease straight to the queued waiter (a fresh fence, the
  short hand-over lease its renewer extends at once) and NOTIFYs the channel
  ``<prefix>_released`` with a note naming that waiter; the waiter holds the
  lock when its store's LISTEN connection reads the note: one commit per
  handoff, not two. The note also wakes the other waiters of the name, one of
  which queues next. (``wait_released`` callers count themselves on the row
  instead and are woken by the bare name.) A release nobody waits for pays
  no NOTIFY. Each store
  keeps one LISTEN connection (opened at the first wait, a plain session
  connection: never a transaction pooler's); a waiter also wakes when the
  current lease expires. Behind a transaction pooler without ``listen_url``,
  waiters call again at the lease's expiry and at least every third of
  ``QUEUE_LIFE``, and a handed-over lease is found by that call.
* **Failures.** A statement that gets no answer within ``timeout`` has its
  connection shut down (so the pool replaces it) and raises StoreUnavailable;
  a pooled connection that the server closed (a restart) is replaced and the
  statement retried once.
* **Blocking callers** (``tenure.sync``, through ``blocking()``) acquire
  and release on their own thread with psycopg's blocking connections, the
  same statements under the same rules.
* **Schema.** Created on first use, idempotently, under a transaction-scoped
  advisory lock so that instances starting together do not collide; the
  version is recorded in ``<prefix>_meta``. ``tenure schema --url URL`` prints
  the SQL for databases where the application's user cannot create tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar, cast
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .._aio import shielded, woken_within
from .._tokens import new_token
from ..errors import ConfigurationError, StoreUnavailable
from . import _mask
from ._gate import Gate
from ._options import POOL_MAX, check_pool_max, number
from ._waiters import QUEUE_LIFE, Wakeups
from .base import (
    AcquireItem,
    BlockingLeases,
    Finding,
    Grant,
    HandedOver,
    LeaseInfo,
    ReleaseItem,
    RenewItem,
    Store,
)
from .runlog import Claim, RunLog, RunOutcome, RunRecord, Started, StartItem

__all__ = ("PostgresStore", "schema_sql")

T = TypeVar("T")

log = logging.getLogger("tenure.stores.postgres")

SCHEMA_VERSION = 4
PRUNE_AFTER = "10 minutes"
"""How long after its expiry a lease row may be pruned (see the module docstring)."""
_POLL_WITHOUT_LISTEN = 0.5
_MAX_PREFIX_BYTES = 40  # "<prefix>_released" must fit PostgreSQL's 63-byte identifiers
_MAX_IDENT_BYTES = 63


_Pool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]
_IDLE = psycopg.pq.TransactionStatus.IDLE


@dataclasses.dataclass(slots=True)
class _Lane:
    """A checked-out connection, the cursor to use on it, and the pool it returns to."""

    pool: _Pool
    conn: psycopg.AsyncConnection[Any]
    cursor: psycopg.AsyncCursor[Any]


class _InFlight:
    """Statements running on one connection, for the watchdog (see ``_deadline``)."""

    __slots__ = ("conn", "fired", "registry", "started")

    def __init__(self, registry: set[_InFlight], conn: psycopg.BaseConnection[Any]) -> None:
        self.registry = registry
        self.conn = conn
        self.started = time.monotonic()
        self.fired = False

    def __enter__(self) -> _InFlight:
        self.registry.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.registry.discard(self)


@dataclasses.dataclass
class _Shared:
    """What a store and its siblings (other threads' copies) share."""

    schema_ready: bool = False


def _check_ident(value: str, what: str, limit: int) -> str:
    if not value or "\x00" in value or len(value.encode()) > limit:
        raise ConfigurationError(
            f"PostgreSQL {what} {value!r} must be 1 to {limit} UTF-8 bytes without NUL"
        )
    return value


class _Names:
    """The SQL names of one (schema, prefix): every identifier quoted, once."""

    def __init__(self, schema: str, prefix: str) -> None:
        self.schema = sql.Identifier(schema)
        self.leases = sql.Identifier(schema, f"{prefix}_leases")
        self.fence = sql.Identifier(schema, f"{prefix}_fence")
        self.claims = sql.Identifier(schema, f"{prefix}_claims")
        self.runs = sql.Identifier(schema, f"{prefix}_runs")
        self.runs_index = sql.Identifier(f"{prefix}_runs_task")
        self.meta = sql.Identifier(schema, f"{prefix}_meta")
        self.channel = f"{prefix}_released"
        self.fence_literal = sql.Literal(self.fence.as_string())
        self.lock_key = sql.Literal(f"tenure-schema:{schema}.{prefix}")

    def render(self, template: str, **extra: sql.Composable) -> str:
        return (
            sql.SQL(template)
            .format(
                leases=self.leases,
                fence=self.fence,
                fence_literal=self.fence_literal,
                claims=self.claims,
                runs=self.runs,
                meta=self.meta,
                runs_index=self.runs_index,
                schema=self.schema,
                lock_key=self.lock_key,
                **extra,
            )
            .as_string()
        )


def schema_sql(schema: str = "public", prefix: str = "tenure") -> str:
    """The SQL that creates tenure's tables (what ``tenure schema`` prints)."""
    names = _Names(
        _check_ident(schema, "schema", _MAX_IDENT_BYTES),
        _check_ident(prefix, "table prefix", _MAX_PREFIX_BYTES),
    )
    create_schema = "CREATE SCHEMA IF NOT EXISTS {schema};\n" if schema != "public" else ""
    return names.render(
        create_schema + "CREATE SEQUENCE IF NOT EXISTS {fence} AS bigint;\n"
        "CREATE TABLE IF NOT EXISTS {leases} (\n"
        "    name text PRIMARY KEY,\n"
        "    token text,\n"
        "    holder text,\n"
        "    fence bigint NOT NULL,\n"
        "    expires timestamptz NOT NULL,\n"
        "    acquired timestamptz NOT NULL,\n"
        "    waiters integer NOT NULL DEFAULT 0,\n"
        # The waiter a release hands the lease to (see acquire_waiting).
        "    next_waiter text,\n"
        "    next_token text,\n"
        "    next_holder text,\n"
        "    next_lease double precision,\n"
        "    next_since timestamptz,\n"
        "    next_until timestamptz\n"
        ");\n"
        "CREATE TABLE IF NOT EXISTS {claims} (\n"
        "    task text PRIMARY KEY,\n"
        "    fire_time double precision NOT NULL,\n"
        "    claimant text NOT NULL\n"
        ");\n"
        "CREATE TABLE IF NOT EXISTS {runs} (\n"
        "    run_id text PRIMARY KEY,\n"
        "    task text NOT NULL,\n"
        "    fire_time double precision,\n"
        "    instance text NOT NULL,\n"
        "    started double precision NOT NULL,\n"
        "    ended double precision,\n"
        "    outcome text NOT NULL,\n"
        "    error text,\n"
        "    fence bigint\n"
        ");\n"
        "CREATE INDEX IF NOT EXISTS {runs_index} ON {runs} (task, started);\n"
        "CREATE TABLE IF NOT EXISTS {meta} (\n"
        "    key text PRIMARY KEY,\n"
        "    value text NOT NULL\n"
        ");\n"
        f"INSERT INTO {{meta}} (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')\n"
        "    ON CONFLICT (key) DO NOTHING;\n"
        "-- The application's database user then needs (replace app_user):\n"
        "-- GRANT USAGE ON SCHEMA {schema} TO app_user;\n"
        "-- GRANT SELECT, INSERT, UPDATE, DELETE ON {leases}, {claims}, {runs}, {meta}"
        " TO app_user;\n"
        "-- GRANT USAGE ON SEQUENCE {fence} TO app_user;\n"
    )


class _Fetch(Generic[T]):
    """One statement and its parameters, run on a checked-out cursor."""

    __slots__ = ("params", "query")

    def __init__(self, query: str, params: Any) -> None:
        self.query = query
        self.params = params

    async def run(self, cur: psycopg.AsyncCursor[Any]) -> T:
        await cur.execute(self.query, self.params)
        # rownumber is None when the statement returned no rows to fetch.
        rows: Any = await cur.fetchall() if cur.rownumber is not None else []
        return cast(T, rows)


class _FetchEach(_Fetch[list[list[Any]]]):
    """One statement per parameter set, pipelined; the rows of each."""

    async def run(self, cur: psycopg.AsyncCursor[Any]) -> list[list[Any]]:
        await cur.executemany(self.query, self.params, returning=True)
        results: list[list[Any]] = []
        while True:
            results.append(await cur.fetchall() if cur.rownumber is not None else [])
            if not cur.nextset():
                return results


def _sever(conn: psycopg.BaseConnection[Any]) -> None:
    """Shut the connection's socket down so that a statement waiting on it fails now.

    shutdown() acts on the socket whatever family the duplicate is given, so
    this serves TCP and unix-socket connections alike.
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return
    with contextlib.suppress(OSError), socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
        s.shutdown(socket.SHUT_RDWR)


def _sever_overdue(in_flight: set[_InFlight], timeout: float) -> None:
    """Sever the connection of every statement in ``in_flight`` older than ``timeout``."""
    overdue = time.monotonic() - timeout
    # list(): a copy made in one step, while other threads add and discard.
    for statement in list(in_flight):
        if statement.started < overdue and not statement.fired:
            statement.fired = True
            _sever(statement.conn)


class PostgresStore(Store, RunLog):
    """Leases in a PostgreSQL table. See the module docstring."""

    gate: Gate

    scheme: ClassVar[str] = "postgresql"

    @property
    def runlog(self) -> RunLog:
        return self

    @property
    def leases(self) -> Store:
        return self

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
        _shared: _Shared | None = None,
    ) -> None:
        _check_ident(schema, "schema", _MAX_IDENT_BYTES)
        _check_ident(prefix, "table prefix", _MAX_PREFIX_BYTES)
        if not (isinstance(timeout, int | float) and 0 < timeout <= 3600):
            raise ConfigurationError(f"timeout must be between 0 and 3600 seconds, got {timeout!r}")
        check_pool_max(pool_max)
        if pooler not in ("session", "transaction"):
            raise ConfigurationError(f"pooler must be 'session' or 'transaction', got {pooler!r}")
        for what, value in (("URL", url), ("listen_url", listen_url)):
            if value is None:
                continue
            try:
                conninfo_to_dict(value)
            except psycopg.Error as exc:
                raise ConfigurationError(f"bad PostgreSQL {what} {_mask(value)!r}: {exc}") from None
        self.url = url
        self.schema = schema
        self.prefix = prefix
        self.timeout = float(timeout)
        self.pool_max = pool_max
        self.gate = Gate(pool_max, self.timeout, what=f"PostgreSQL at {_mask(url)}")
        """The bound on this store's statements in flight (see ``stores._gate``)."""
        self.pooler = pooler
        self.listen_url = (
            listen_url if listen_url is not None else (url if pooler == "session" else None)
        )
        self._shared = _shared if _shared is not None else _Shared()
        self._names = names = _Names(schema, prefix)
        self._pool: _Pool | None = None
        self._background: set[asyncio.Future[None]] = set()
        self._withdrawing: set[asyncio.Future[None]] = set()
        """Waiters that gave up abnormally, leaving the queue (``_abandon``)."""
        self._lane: _Lane | None = None
        self._lane_busy = False
        self._outage = False  # a connection was lost: the next borrow asks the server first
        self._in_flight: set[_InFlight] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._pool_guard: asyncio.Lock | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listen_guard: asyncio.Lock | None = None
        self._waiting: Wakeups[str] = Wakeups()
        self._handed: dict[str, asyncio.Future[tuple[int, int]]] = {}
        """The queued waiters of this store, by waiter id: set by a hand-over note."""
        self._closed = False
        self._blocking_calls: _BlockingCalls | None = None
        self._blocking_guard = threading.Lock()

        # The acquire's conflict rule, shared by the plain acquire and the
        # occurrence start (_sql_start).
        acquire_or_not = (
            "ON CONFLICT (name) DO UPDATE SET token = excluded.token, holder = excluded.holder,"
            # A live lease of this very token (an acquire resent after its
            # answer was lost) is granted again: the same fence, renewed.
            " fence = CASE WHEN l.token = excluded.token AND l.expires > clock_timestamp()"
            " THEN l.fence ELSE nextval({fence_literal}) END, expires = excluded.expires,"
            " acquired = CASE WHEN l.token = excluded.token AND l.expires > clock_timestamp()"
            " THEN l.acquired ELSE excluded.acquired END "
            "WHERE l.token IS NULL OR l.expires <= clock_timestamp() OR l.token = excluded.token "
        )
        self._sql_acquire = names.render(
            "INSERT INTO {leases} AS l (name, token, holder, fence, expires, acquired) "
            "VALUES (%s, %s, %s, nextval({fence_literal}),"
            " clock_timestamp() + make_interval(secs => %s), clock_timestamp()) "
            + acquire_or_not
            + "RETURNING l.fence"
        )
        self._sql_renew = names.render(
            "UPDATE {leases} AS l SET expires = clock_timestamp() + make_interval(secs => b.ttl) "
            "FROM unnest(%s::text[], %s::text[], %s::float8[]) WITH ORDINALITY"
            " AS b(name, token, ttl, i) "
            "WHERE l.name = b.name AND l.token = b.token AND l.expires > clock_timestamp() "
            "RETURNING b.i"
        )
        # Frees the lease, or hands it to the waiter queued next (a fresh fence,
        # the short hand-over lease), in one statement. The queue is read from
        # the row being updated (``l``): PostgreSQL re-evaluates the SET on
        # the row's latest version when a concurrent update came first, but
        # not a CTE's columns. The CTE, locked first, only says whether the
        # lease was live and whether waiters counted themselves. The row keeps
        # the waiter's id and call time (next_until NULL: no longer queued) for
        # the hand-over note "<name>\t<waiter>\t<fence>\t<ms since the waiter
        # last called>"; the bare name wakes waiters counted on the row. NOTIFY
        # (a queue write and a global lock at commit) only when someone waits.
        handing = "(l.next_until > statement_timestamp())"
        self._sql_release = names.render(
            "WITH old AS (SELECT name, expires > clock_timestamp() AS live,"
            " waiters > 0 AS watched"
            " FROM {leases} WHERE name = %s AND token = %s FOR UPDATE) "
            f"UPDATE {{leases}} AS l SET token = CASE WHEN {handing} THEN l.next_token END,"
            f" holder = CASE WHEN {handing} THEN l.next_holder END,"
            f" fence = CASE WHEN {handing} THEN nextval({{fence_literal}}) ELSE l.fence END,"
            f" expires = CASE WHEN {handing}"
            " THEN statement_timestamp() + make_interval(secs => l.next_lease) ELSE l.expires END,"
            f" acquired = CASE WHEN {handing} THEN statement_timestamp() ELSE l.acquired END,"
            f" next_waiter = CASE WHEN {handing} THEN l.next_waiter END,"
            f" next_since = CASE WHEN {handing} THEN l.next_since END,"
            " next_token = NULL, next_holder = NULL, next_lease = NULL, next_until = NULL "
            "FROM old WHERE l.name = old.name "
            "RETURNING old.live, CASE"
            " WHEN l.next_waiter IS NOT NULL THEN pg_notify(%s, concat_ws(E'\\t', l.name,"
            " l.next_waiter, l.fence,"
            " (extract(epoch FROM statement_timestamp() - l.next_since) * 1000)::bigint))::text"
            " WHEN old.watched THEN pg_notify(%s, l.name)::text END"
        )
        # A waiter's acquire: granted when the lease is free (as _sql_acquire),
        # already its own when a release handed it over; else the waiter is
        # queued next unless another live waiter is (its entry lives for
        # ``life`` seconds; the waiter calls again before then). One time
        # (statement_timestamp) for every test of the row, so that they agree.
        free = "(l.token IS NULL OR l.expires <= statement_timestamp())"
        mine = "(l.token = excluded.token)"
        open_ = (
            "(l.next_until IS NULL OR l.next_until <= statement_timestamp()"
            " OR l.next_waiter = %(waiter)s)"
        )

        def queue(column: str, value: str) -> str:
            return (
                f" {column} = CASE WHEN {free} THEN CASE WHEN l.next_waiter = %(waiter)s"
                f" THEN NULL ELSE l.{column} END WHEN {mine} THEN l.{column}"
                f" WHEN {open_} THEN {value} ELSE l.{column} END"
            )

        def grant(column: str, value: str) -> str:
            return f" {column} = CASE WHEN {free} THEN {value} ELSE l.{column} END"

        self._sql_enlist = names.render(
            "INSERT INTO {leases} AS l (name, token, holder, fence, expires, acquired) "
            "VALUES (%(name)s, %(token)s, %(holder)s, nextval({fence_literal}),"
            " statement_timestamp() + make_interval(secs => %(ttl)s), statement_timestamp()) "
            "ON CONFLICT (name) DO UPDATE SET"
            + grant("token", "excluded.token")
            + ","
            + grant("holder", "excluded.holder")
            + ","
            + grant("fence", "nextval({fence_literal})")
            + ","
            + grant("expires", "excluded.expires")
            + ","
            + grant("acquired", "excluded.acquired")
            + ","
            + queue("next_waiter", "%(waiter)s")
            + ","
            + queue("next_token", "excluded.token")
            + ","
            + queue("next_holder", "excluded.holder")
            + ","
            + queue("next_lease", "%(handover)s")
            + ","
            + queue("next_since", "statement_timestamp()")
            + ","
            + queue("next_until", "statement_timestamp() + make_interval(secs => %(life)s)")
            + " RETURNING CASE WHEN l.token = %(token)s THEN 1"
            " WHEN l.next_waiter = %(waiter)s AND l.next_until IS NOT NULL THEN 0 ELSE -1 END,"
            " l.fence,"
            " (extract(epoch FROM l.expires - clock_timestamp()) * 1000)::bigint"
        )
        # A waiter gives up: out of the queue; the lease, if a release handed
        # it over meanwhile (RETURNING sees the row's latest version).
        self._sql_withdraw = names.render(
            "UPDATE {leases} AS l SET"
            " next_waiter = CASE WHEN l.next_waiter = %(waiter)s THEN NULL ELSE l.next_waiter END,"
            " next_until = CASE WHEN l.next_waiter = %(waiter)s THEN NULL ELSE l.next_until END "
            "WHERE l.name = %(name)s "
            "RETURNING CASE WHEN l.token = %(token)s AND l.expires > clock_timestamp()"
            " THEN l.fence END,"
            " (extract(epoch FROM l.expires - clock_timestamp()) * 1000)::bigint"
        )
        self._sql_live_grant = names.render(
            "SELECT token, holder, fence, extract(epoch FROM expires - clock_timestamp())::float8,"
            " extract(epoch FROM acquired)::float8 FROM {leases}"
            " WHERE name = %s AND token IS NOT NULL AND expires > clock_timestamp()"
        )
        self._sql_remaining = names.render(
            "SELECT extract(epoch FROM expires - clock_timestamp())::float8 FROM {leases} "
            "WHERE name = %s AND token IS NOT NULL AND expires > clock_timestamp()"
        )
        # A waiter counts itself on the row in the statement that reads the
        # lease's remaining time: a release either came first (the lease is
        # free) or sees the count and notifies.
        self._sql_wait = names.render(
            "UPDATE {leases} SET waiters = waiters + 1 "
            "WHERE name = %s AND token IS NOT NULL AND expires > clock_timestamp() "
            "RETURNING extract(epoch FROM expires - clock_timestamp())::float8"
        )
        self._sql_unwait = names.render(
            "UPDATE {leases} SET waiters = greatest(waiters - 1, 0) WHERE name = %s"
        )
        self._sql_holders = names.render(
            "SELECT name, holder, fence, extract(epoch FROM expires - clock_timestamp())::float8,"
            " extract(epoch FROM acquired)::float8 "
            "FROM {leases} WHERE token IS NOT NULL AND expires > clock_timestamp()"
            ' AND starts_with(name, %s) ORDER BY name COLLATE "C"'
        )
        claim_or_not = (
            "ON CONFLICT (task) DO UPDATE SET fire_time = excluded.fire_time,"
            " claimant = excluded.claimant WHERE c.fire_time < excluded.fire_time"
            " OR (c.fire_time = excluded.fire_time AND c.claimant = excluded.claimant) "
        )
        self._sql_claim = names.render(
            "INSERT INTO {claims} AS c (task, fire_time, claimant) VALUES (%s, %s, %s) "
            + claim_or_not
            + "RETURNING 1"
        )
        self._sql_claimed = names.render(
            "SELECT task, fire_time FROM {claims} WHERE task = ANY(%s)"
        )
        record_or_replace = (
            "ON CONFLICT (run_id) DO UPDATE SET fire_time = excluded.fire_time,"
            " instance = excluded.instance, started = excluded.started, ended = excluded.ended,"
            " outcome = excluded.outcome, error = excluded.error, fence = excluded.fence"
        )
        # A batch of occurrence starts in one statement, one transaction (one
        # commit, not one per occurrence): the claims; for each claim won, the
        # acquire; for each grant, the start record. Each step reads the one
        # before through its RETURNING (data-modifying CTEs see no other effect
        # of the same statement; the tables differ). Rows are written in task
        # order, so two batches that share tasks lock them in the same order.
        self._sql_start = names.render(
            "WITH i AS (SELECT * FROM unnest(%(task)s::text[], %(fire)s::float8[],"
            " %(claimant)s::text[], %(token)s::text[], %(holder)s::text[], %(ttl)s::float8[],"
            " %(run_id)s::text[], %(run_fire)s::float8[], %(instance)s::text[],"
            " %(started)s::float8[], %(outcome)s::text[]) WITH ORDINALITY"
            " AS i(task, fire, claimant, token, holder, ttl, run_id, run_fire, instance, started,"
            " outcome, n)), "
            "c AS (INSERT INTO {claims} AS c (task, fire_time, claimant)"
            " SELECT task, fire, claimant FROM i ORDER BY task "
            + claim_or_not
            + "RETURNING c.task), "
            "g AS (INSERT INTO {leases} AS l (name, token, holder, fence, expires, acquired)"
            " SELECT i.task, i.token, i.holder, nextval({fence_literal}),"
            " clock_timestamp() + make_interval(secs => i.ttl), clock_timestamp()"
            " FROM i JOIN c USING (task) ORDER BY i.task "
            + acquire_or_not
            + "RETURNING l.name, l.fence), "
            "r AS (INSERT INTO {runs} (run_id, task, fire_time, instance, started, ended,"
            " outcome, error, fence) SELECT i.run_id, i.task, i.run_fire, i.instance, i.started,"
            " NULL, i.outcome, NULL, g.fence FROM i JOIN g ON g.name = i.task "
            + record_or_replace
            + ") "
            "SELECT c.task IS NOT NULL, g.fence FROM i LEFT JOIN c USING (task)"
            " LEFT JOIN g ON g.name = i.task ORDER BY i.n"
        )
        # A batch of run records in one statement; then the tasks of the ended
        # ones trimmed in one more (a statement does not see its own inserts).
        self._sql_records = names.render(
            "INSERT INTO {runs} (run_id, task, fire_time, instance, started, ended, outcome,"
            " error, fence) SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[],"
            " %s::text[], %s::float8[], %s::float8[], %s::text[], %s::text[], %s::int8[]) "
            + record_or_replace
        )
        self._sql_trim_each = names.render(
            "DELETE FROM {runs} r USING unnest(%(tasks)s::text[]) AS t(task)"
            " WHERE r.task = t.task AND r.started < (SELECT x.started FROM {runs} x"
            " WHERE x.task = t.task ORDER BY x.started DESC LIMIT 1 OFFSET %(skip)s)"
        )
        self._sql_abandon = names.render(
            "UPDATE {runs} SET ended = %s, outcome = %s, error = %s"
            f" WHERE run_id = %s AND outcome = '{RunOutcome.RUNNING}' RETURNING 1"
        )
        columns = "run_id, task, fire_time, instance, started, ended, outcome, error, fence"
        self._sql_runs_all = names.render(
            f"SELECT {columns} FROM {{runs}} ORDER BY started DESC LIMIT %s"
        )
        self._sql_runs_task = names.render(
            f"SELECT {columns} FROM {{runs}} WHERE task = %s ORDER BY started DESC LIMIT %s"
        )
        self._sql_prune = names.render(
            "WITH gone AS (DELETE FROM {leases}"
            f" WHERE expires < clock_timestamp() - interval '{PRUNE_AFTER}'"
            " AND (next_until IS NULL OR next_until < clock_timestamp()) RETURNING 1),"
            " old AS (DELETE FROM {runs} WHERE run_id IN (SELECT run_id FROM (SELECT run_id,"
            " row_number() OVER (PARTITION BY task ORDER BY started DESC) AS n FROM {runs}) AS x"
            " WHERE n > %s) RETURNING 1) "
            "SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM old)"
        )
        self._sql_version = names.render("SELECT value FROM {meta} WHERE key = 'schema_version'")
        self._sql_schema_lock = names.render("SELECT pg_advisory_xact_lock(hashtext({lock_key}))")
        self._sql_schema = schema_sql(schema, prefix)

    def schema_sql(self) -> str:
        """The SQL that creates this store's tables (``tenure schema --url URL``)."""
        return self._sql_schema

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        parts = urlsplit(url)
        options: dict[str, Any] = {}
        rest = []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in ("schema", "prefix", "pooler", "listen_url"):
                options[key] = value
            elif key == "timeout":
                options[key] = number("PostgreSQL", key, value, float)
            elif key == "pool_max":
                options[key] = number("PostgreSQL", key, value, int)
            else:
                rest.append((key, value))
        if not any(key == "connect_timeout" for key, _ in rest):
            rest.append(("connect_timeout", str(_connect_timeout(options.get("timeout", 2.0)))))
        clean = urlunsplit(
            parts._replace(scheme="postgresql", query=urlencode(rest, quote_via=quote))
        )
        return cls(clean, **options)

    def describe(self) -> str:
        return _mask(self.url)

    def sibling(self) -> PostgresStore:
        # A psycopg pool belongs to the event loop that opened it.
        return PostgresStore(
            self.url,
            schema=self.schema,
            prefix=self.prefix,
            timeout=self.timeout,
            pool_max=self.pool_max,
            pooler=self.pooler,
            listen_url=self.listen_url,
            _shared=self._shared,
        )

    async def warm_up(self) -> None:
        with contextlib.suppress(psycopg.Error, StoreUnavailable):
            await self._current_pool()  # starts connecting in the background

    def blocking(self) -> BlockingLeases:
        with self._blocking_guard:  # callers on many threads: one set of connections
            if self._blocking_calls is None:
                self._blocking_calls = _BlockingCalls(self)
            return self._blocking_calls

    async def aclose(self) -> None:
        if self._blocking_calls is not None:
            self._blocking_calls.close()
        if self._withdrawing:  # on the pool, so before it closes
            await asyncio.gather(*self._withdrawing, return_exceptions=True)
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        if self._lane is not None:
            lane, self._lane = self._lane, None
            await lane.pool.putconn(lane.conn)
        if self._pool is not None:
            await self._pool.close()
        await asyncio.gather(*self._background, return_exceptions=True)  # replaced pools

    # -- connections -----------------------------------------------------------

    def _unavailable(self, exc: BaseException, what: str = "failed") -> StoreUnavailable:
        return StoreUnavailable(f"PostgreSQL at {self.describe()} {what}: {exc}")

    async def _current_pool(self) -> _Pool:
        if self._pool is not None:
            return self._pool
        if self._closed:
            raise StoreUnavailable(f"the store {self.describe()} is closed")
        if self._pool_guard is None:
            self._pool_guard = asyncio.Lock()
        async with self._pool_guard:
            if self._pool is None:
                pool: _Pool = AsyncConnectionPool(
                    self.url,
                    kwargs=self._connection_options(),
                    min_size=1,
                    max_size=self.pool_max,
                    timeout=self.timeout,
                    open=False,
                    name=f"tenure-{self.prefix}",
                )
                await pool.open(wait=False)
                self._pool = pool
            return self._pool

    def _connection_options(self) -> dict[str, Any]:
        """How every connection of the store's statements is opened (pooled or blocking)."""
        return {
            "autocommit": True,
            # A transaction pooler may hand each statement to another server
            # connection, where a prepared statement is unknown.
            "prepare_threshold": None if self.pooler == "transaction" else 0,
        }

    async def _replace_pool(self, stale: _Pool) -> _Pool:
        """A fresh pool instead of ``stale``, which is closed in the background."""
        if self._pool is stale:
            self._pool = None
            lane = self._lane
            if lane is not None and lane.pool is stale:
                # Given back to (and closed with) the stale pool: now if it is
                # free, else by _checkin, which no longer knows it as the lane.
                self._lane = None
                if not self._lane_busy:
                    await stale.putconn(lane.conn)
            closing = asyncio.ensure_future(stale.close())
            self._background.add(closing)
            closing.add_done_callback(self._background.discard)
        return await self._current_pool()

    async def _checkout(self) -> _Lane:
        """A connection (with a cursor) for one statement, and its pool.

        The first connection borrowed stays with the store as its *lane*, with
        one cursor reused for every statement: the next statement that finds it
        free runs on it without a trip through the pool's queue or a new cursor
        (together a third of an uncontended acquire+release's overhead).
        Statements that find it busy borrow from the pool as usual.
        """
        lane = self._lane
        if lane is not None and not self._lane_busy:
            self._lane_busy = True
            return lane
        pool, conn = await self._borrow()
        checkout = _Lane(pool, conn, conn.cursor())
        if self._lane is None:
            self._lane = checkout
            self._lane_busy = True
        return checkout

    async def _checkin(self, checkout: _Lane) -> None:
        if checkout is self._lane:
            self._lane_busy = False
            conn = checkout.conn
            if not conn.closed and conn.pgconn.transaction_status == _IDLE:
                return
            self._lane = None  # broken: the pool discards it and a new lane is borrowed
        await checkout.pool.putconn(checkout.conn)

    async def _borrow(self) -> tuple[_Pool, psycopg.AsyncConnection[Any]]:
        """A pooled connection (and its pool, to give it back to).

        psycopg's pool retries a failed connection with a growing backoff
        (from one second), so after an outage it may go on waiting long after
        the server is back: past a short TTL's deadline, or minutes later.
        After a connection was lost, and whenever the pool gives none in time,
        one direct attempt tells at once how things stand: the server's refusal
        (down, starting, a wrong password) is raised; a server that answers
        means the pool is stale, and it is replaced by one that connects now.
        """
        pool = await self._current_pool()
        if self._outage:
            await self._server_answers()
            self._outage = False
            pool = await self._replace_pool(pool)
        try:
            return pool, await pool.getconn()
        except PoolTimeout as exc:
            await self._server_answers()
            log.debug("the PostgreSQL pool gave no connection but the server answers: %s", exc)
        pool = await self._replace_pool(pool)
        try:
            return pool, await pool.getconn()
        except PoolTimeout as exc:
            raise self._unavailable(exc, f"gave no connection within {self.timeout} s") from exc

    async def _server_answers(self) -> None:
        """Connect once, directly; StoreUnavailable with the server's reason if it will not."""
        try:
            async with asyncio.timeout(self.timeout):  # not wait_for: see _ensure_listening
                direct = await psycopg.AsyncConnection.connect(self.url)
        except (psycopg.Error, TimeoutError) as refused:
            raise self._unavailable(refused, "refused a connection") from refused
        await direct.close()

    def _deadline(self, conn: psycopg.AsyncConnection[Any]) -> _InFlight:
        """Enter around statements on ``conn``: severed if they outlast ``timeout``.

        Cancelling a psycopg query instead would wait up to ten more seconds
        for a server that does not answer; shutting the socket fails it at
        once. One watchdog per store checks every in-flight statement four
        times per ``timeout``, instead of a timer per statement (a loop timer
        costs as much as the rest of the Python of a statement).
        """
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._watch())
        return _InFlight(self._in_flight, conn)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.timeout / 4)
            _sever_overdue(self._in_flight, self.timeout)

    async def _ensure_schema(self) -> None:
        """Create the tables unless they exist; check their version. Once per store family."""
        checkout = await self._checkout()
        conn = checkout.conn
        try:
            with self._deadline(conn):
                version = await self._schema_version(conn)
                if version is None:
                    async with conn.transaction():
                        await conn.execute(self._sql_schema_lock, prepare=False)
                        await conn.execute(self._sql_schema, prepare=False)
                    version = await self._schema_version(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigurationError(
                f"PostgreSQL at {self.describe()}: this user cannot create or use tenure's tables"
                f" in schema {self.schema!r} ({exc}); have an administrator run the SQL that"
                " `tenure schema --url URL` prints, with its GRANTs"
            ) from exc
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc
        finally:
            await self._checkin(checkout)
        if version is not None and version.isdigit() and int(version) < SCHEMA_VERSION:
            raise ConfigurationError(
                f"PostgreSQL at {self.describe()}: the tables {self.prefix}_* in schema "
                f"{self.schema!r} are of an older shape (schema version {version}; this "
                f"tenure uses {SCHEMA_VERSION}): tenure has no release yet that migrates them. "
                "Stop every instance, drop them (they hold only leases, claims and run records) "
                "or use another prefix; `tenure schema` prints the current shape"
            )
        if version != str(SCHEMA_VERSION):
            raise ConfigurationError(
                f"PostgreSQL at {self.describe()}: the tables {self.prefix}_* in schema "
                f"{self.schema!r} have schema version {version!r}, this tenure expects "
                f"{SCHEMA_VERSION}; use another prefix or schema"
            )
        self._shared.schema_ready = True

    async def _schema_version(self, conn: psycopg.AsyncConnection[Any]) -> str | None:
        """The recorded schema version; None when the tables do not exist yet."""
        try:
            async with conn.transaction():
                row = await (await conn.execute(self._sql_version, prepare=False)).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        return None if row is None else str(row[0])

    async def _query(self, query: str, params: Sequence[Any] | dict[str, Any]) -> list[Any]:
        """Run one statement; its rows ([] when it returns none). Retried once on a
        connection the server closed; never on a timeout. At most ``pool_max``
        run at once; the rest queue for a turn (``gate``), so the pool never
        has to refuse one."""
        async with self.gate:
            return await self._in_turn(_Fetch[list[Any]](query, params))

    async def _query_each(
        self, query: str, params: Sequence[Sequence[Any] | dict[str, Any]]
    ) -> list[list[Any]]:
        """Run one statement once per parameter set, sent together on one
        connection (psycopg's pipeline mode: one round trip for the lot), each
        in its own transaction; the rows of each, in order. Retried like
        ``_query``: only when the server had closed the connection, so nothing
        of it ran."""
        if not params:
            return []
        async with self.gate:
            return await self._in_turn(_FetchEach(query, params))

    async def _in_turn(self, fetch: _Fetch[T]) -> T:
        if not self._shared.schema_ready:
            await self._ensure_schema()
        for attempt in (1, 2):
            checkout = await self._checkout()
            conn, cur = checkout.conn, checkout.cursor
            statement = self._deadline(conn)
            try:
                with statement:
                    return await fetch.run(cur)
            except psycopg.OperationalError as exc:
                if statement.fired:
                    raise self._unavailable(exc, f"did not answer within {self.timeout} s") from exc
                if conn.closed:
                    # The pool's own reconnection would start with a second of
                    # backoff: _borrow asks the server directly instead.
                    self._outage = True
                if attempt == 2 or not conn.closed:
                    raise self._unavailable(exc) from exc
                # The server closed a pooled connection (it restarted): below, drop
                # the other dead ones, then try once more on a fresh connection.
                log.debug("a pooled PostgreSQL connection was closed, retrying: %s", exc)
            except psycopg.Error as exc:
                raise self._unavailable(exc) from exc
            finally:
                await self._checkin(checkout)  # a broken connection is discarded
            with contextlib.suppress(psycopg.Error):
                await checkout.pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the contract ----------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        rows = await self._query(self._sql_acquire, (name, token, holder, ttl))
        return Grant(rows[0][0]) if rows else None

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        rows = await self._query(
            self._sql_renew,
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
        channel = self._names.channel
        rows = await self._query(self._sql_release, (name, token, channel, channel))
        return bool(rows and rows[0][0])

    async def server_time(self) -> float | None:
        rows = await self._query("SELECT extract(epoch FROM clock_timestamp())::float8", ())
        return float(rows[0][0])

    async def diagnose(self) -> list[Finding]:
        rows = await self._query("SELECT current_setting('synchronous_commit')", ())
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

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        rows = await self._query(self._sql_live_grant, (name,))
        if not rows:
            return None
        token, holder, fence, expires_in, acquired = rows[0]
        return token, LeaseInfo(name, holder or "", fence, expires_in, acquired)

    # _bump_fence: nothing to do. Fencing tokens come from one sequence, so
    # every later grant's is larger already.

    async def _remaining(self, name: str) -> float | None:
        rows = await self._query(self._sql_remaining, (name,))
        return float(rows[0][0]) if rows else None

    async def wait_released(self, name: str, timeout: float) -> None:
        if self.listen_url is None:
            # Behind a transaction pooler LISTEN cannot work: re-check at the
            # lease's expiry, and every half second for a release.
            remaining = await self._remaining(name)
            if remaining is not None:
                await asyncio.sleep(min(timeout, remaining, _POLL_WITHOUT_LISTEN))
            return
        woken = self._waiting.add(name)
        try:
            # Listening (LISTEN confirmed by the server) first, then register
            # and look at the lease: a release in between cannot be missed.
            await self._ensure_listening()
            rows = await self._query(self._sql_wait, (name,))
            if not rows:
                return
            try:
                await woken_within(woken, min(timeout, float(rows[0][0])))
            finally:
                # Shielded: a cancelled waiter still takes its count back (one
                # left behind only costs later releases a needless NOTIFY).
                with contextlib.suppress(StoreUnavailable):
                    await shielded(self._query(self._sql_unwait, (name,)))
        finally:
            self._waiting.remove(name, woken)

    grants_on_release: ClassVar[bool] = True

    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        waiter = new_token()[:16]  # public: it names this waiter in the hand-over note
        params = {
            "name": name,
            "token": token,
            "holder": holder,
            "ttl": ttl,
            "waiter": waiter,
            "life": QUEUE_LIFE,
            "handover": handover,
        }
        deadline = time.monotonic() + timeout
        handed: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._handed[waiter] = handed
        woken: asyncio.Future[None] | None = None
        queued_at: float | None = None
        """When the last call that left this waiter queued was sent."""
        called = False
        relistened = False
        try:
            while not handed.done():
                woken = self._waiting.add(name, instead_of=woken)
                sent = time.monotonic()
                called = True
                code, fence, left_ms = (await self._query(self._sql_enlist, params))[0]
                if code == 1:  # free, or handed over already (its note may be on the way)
                    return HandedOver(Grant(fence), sent, max(left_ms, 0) / 1000)
                if code == 0:
                    queued_at = sent
                if self.listen_url is not None and not self._listening():
                    # LISTEN (the first wait here, or the connection failed),
                    # then call again once: a release before the LISTEN took
                    # effect is found by that call (later, within QUEUE_LIFE/3).
                    # A LISTEN that cannot be opened now (or that ran out of
                    # time while this process was stopped) does not fail the
                    # wait: it polls, as behind a transaction pooler, and tries
                    # again at its next call.
                    try:
                        await self._ensure_listening()
                    except StoreUnavailable as exc:
                        log.debug("waiting without LISTEN for now: %s", exc)
                    if not relistened:
                        relistened = True
                        continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # Woken by any release of the name, by the lease's expiry (a
                # crashed holder), and in time to keep the queue entry alive
                # (or, not queued, to queue once the entry before has lapsed).
                wake = min(left, max(left_ms, 1) / 1000, QUEUE_LIFE / 3)
                if not self._listening():
                    wake = min(wake, _POLL_WITHOUT_LISTEN)
                await woken_within(woken, wake)
            if handed.done() and queued_at is not None:
                # The note's since counts from our last call that kept us
                # queued or later, so queued_at + since is no later than the grant.
                fence, since = handed.result()
                return HandedOver(Grant(fence), queued_at + since / 1000, handover)
            if queued_at is None:
                return None
            # Out of time: leave the queue; a lease handed over meanwhile is kept.
            sent = time.monotonic()
            [(fence, left_ms)] = await self._query(self._sql_withdraw, params)
            return None if fence is None else HandedOver(Grant(fence), sent, left_ms / 1000)
        except BaseException:
            if called:
                # Cancelled or failed with a call in flight or an entry queued:
                # the store may have queued us or handed us the lease.
                task = asyncio.ensure_future(self._abandon(params))
                self._withdrawing.add(task)
                task.add_done_callback(self._withdrawing.discard)
            raise
        finally:
            del self._handed[waiter]
            if woken is not None:
                self._waiting.remove(name, woken)

    async def _abandon(self, params: dict[str, Any]) -> None:
        """Withdraw a waiter that gave up abnormally, and release what it may have been handed."""
        try:
            rows = await self._query(self._sql_withdraw, params)
            if rows and rows[0][0] is not None:
                await self.release(params["name"], params["token"])
        except StoreUnavailable as exc:
            # Lapses by itself: the queue entry within QUEUE_LIFE, a
            # handed-over lease within its short hand-over lease.
            log.debug("could not withdraw an abandoned waiter of %r: %s", params["name"], exc)

    def _listening(self) -> bool:
        return self._listener is not None and not self._listener.done()

    async def _ensure_listening(self) -> None:
        if self._listening():
            return
        if self._listen_guard is None:
            self._listen_guard = asyncio.Lock()
        async with self._listen_guard:
            if self._listener is not None and not self._listener.done():
                return
            assert self.listen_url is not None
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a
            # cancellation that arrives as the connection completes, and the
            # cancelled waiter would wait on.
            try:
                async with asyncio.timeout(self.timeout):
                    conn = await psycopg.AsyncConnection.connect(self.listen_url, autocommit=True)
            except (psycopg.Error, TimeoutError) as exc:
                raise self._unavailable(exc, "refused a LISTEN connection") from exc
            try:
                listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._names.channel))
                async with asyncio.timeout(self.timeout):
                    await conn.execute(listen)
            except BaseException as exc:
                await conn.close()
                if isinstance(exc, psycopg.Error | TimeoutError):
                    raise self._unavailable(exc, "failed to LISTEN") from exc
                raise
            self._listener = asyncio.ensure_future(self._listen(conn))

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Read the LISTEN connection and wake the waiters of each released name;
        a hand-over note also tells its waiter the grant (see ``_sql_release``)."""
        try:
            async for note in conn.notifies():
                name, *handed = note.payload.split("\t")
                if handed:
                    waiter, fence, since = handed
                    granted = self._handed.get(waiter)
                    if granted is not None and not granted.done():
                        granted.set_result((int(fence), int(since)))
                self._waiting.wake(name)
        except psycopg.Error as exc:
            log.debug("the PostgreSQL LISTEN connection failed, waiters re-check: %s", exc)
        finally:
            # Whatever ended it, every waiter wakes to re-check; the next wait
            # opens a new connection.
            self._waiting.wake_all()
            with contextlib.suppress(psycopg.Error):
                await asyncio.shield(conn.close())

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        rows = await self._query(self._sql_holders, (prefix,))
        return [
            LeaseInfo(name, holder or "", fence, expires_in, acquired)
            for name, holder, fence, expires_in, acquired in rows
        ]

    # -- the scheduler's records -------------------------------------------------

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return bool(await self._query(self._sql_claim, (task, fire_time, claimant)))

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        rows = await self._query(self._sql_claimed, ([task for task, _ in occurrences],))
        last = dict(rows)
        return [task in last and last[task] >= fire for task, fire in occurrences]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        return [bool(rows) for rows in await self._query_each(self._sql_claim, claims)]

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        answers = await self._query_each(
            self._sql_acquire, [(i.name, i.token, i.holder, i.ttl) for i in items]
        )
        return [Grant(rows[0][0]) if rows else None for rows in answers]

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        if not items:
            return []
        # One array per column (a lock's name and a record's task are its claim's task).
        rows = await self._query(
            self._sql_start,
            {
                "task": [claim.task for claim, _, _ in items],
                "fire": [claim.fire_time for claim, _, _ in items],
                "claimant": [claim.claimant for claim, _, _ in items],
                "token": [lock.token for _, lock, _ in items],
                "holder": [lock.holder for _, lock, _ in items],
                "ttl": [lock.ttl for _, lock, _ in items],
                "run_id": [record.run_id for _, _, record in items],
                "run_fire": [record.fire_time for _, _, record in items],
                "instance": [record.instance for _, _, record in items],
                "started": [record.started for _, _, record in items],
                "outcome": [str(record.outcome) for _, _, record in items],
            },
        )
        return [
            Started(claimed, None if fence is None else Grant(fence)) for claimed, fence in rows
        ]

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        channel = self._names.channel
        answers = await self._query_each(
            self._sql_release, [(name, token, channel, channel) for name, token in items]
        )
        return [bool(rows and rows[0][0]) for rows in answers]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        if not records:
            return
        # One array per column, in RunRecord's field order.
        await self._query(
            self._sql_records,
            [list(column) for column in zip(*map(RunRecord.row, records), strict=True)],
        )
        ended = sorted({r.task for r in records if r.ended is not None})
        if ended:
            await self._query(self._sql_trim_each, {"tasks": ended, "skip": keep - 1})

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        answers = await self._query_each(
            self._sql_abandon, [(r.ended, r.outcome, r.error, r.run_id) for r in records]
        )
        return sum(len(rows) for rows in answers)

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        if task is None:
            rows = await self._query(self._sql_runs_all, (limit,))
        else:
            rows = await self._query(self._sql_runs_task, (task, limit))
        return [RunRecord.from_row(row) for row in rows]

    async def prune(self, *, keep_runs: int) -> int:
        rows = await self._query(self._sql_prune, (keep_runs,))
        return int(rows[0][0])


_Idle = tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]


class _BlockingCalls(BlockingLeases):
    """The PostgreSQL store's acquire and release for blocking callers (``tenure.sync``).

    Acquire and release run on the caller's thread through psycopg's blocking
    connections: the same statements, results and failure rules as
    ``PostgresStore._query``, without the hop to the service's loop thread
    (which cost a blocking acquire+release about 240 µs, most of what a
    hand-written blocking cycle costs in all). Everything else (waiters, the
    CLI's reads, close) stays on the asyncio methods, on that loop thread;
    the renewer has its own ``sibling()``.

    * Connections: each call takes one off an idle list (``list.pop`` and
      ``append`` are atomic, so any thread may call), or opens one, and puts
      it back after the statement; at most ``pool_max`` are kept idle.
    * Timeouts: a watchdog thread severs the connection of a statement that
      outlasts ``timeout``, as the asyncio store's watchdog task does; psycopg's
      blocking calls cannot be interrupted any other way.
    * A connection the server closed (a restart) drops every idle one, which
      died with it, and the statement is sent once more on a new connection.
    """

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._closed = False
        self._idle: list[_Idle] = []
        self._statements: set[_InFlight] = set()
        self._watchdog_thread: threading.Thread | None = None
        self._watchdog_guard = threading.Lock()
        self._stop_watching = threading.Event()
        # The thread holds no reference to the store: dropping it stops the thread.
        weakref.finalize(self, self._stop_watching.set)
        self._schema_guard = threading.Lock()
        self._connect_options = store._connection_options()
        if "connect_timeout" not in conninfo_to_dict(store.url):
            self._connect_options["connect_timeout"] = _connect_timeout(store.timeout)

    def close(self) -> None:
        self._closed = True  # first: a statement that ends now closes its connection
        self._stop_watching.set()
        self._drop_idle()

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        rows = self._query(self.store._sql_acquire, (name, token, holder, ttl))
        return Grant(rows[0][0]) if rows else None

    def release(self, name: str, token: str) -> bool:
        channel = self.store._names.channel
        rows = self._query(self.store._sql_release, (name, token, channel, channel))
        return bool(rows and rows[0][0])

    def _query(self, query: str, params: Sequence[Any]) -> list[Any]:
        """``PostgresStore._query`` as a plain call on the caller's thread (see
        the class docstring)."""
        if not self.store._shared.schema_ready:
            self._ensure_schema()
        with self.store.gate.blocking():
            return self._query_in_turn(query, params)

    def _query_in_turn(self, query: str, params: Sequence[Any]) -> list[Any]:
        for attempt in (1, 2):
            conn, cur = self._take()
            statement = self._watched(conn)
            try:
                with statement:
                    cur.execute(query, params)
                    rows = cur.fetchall() if cur.rownumber is not None else []
            except psycopg.OperationalError as exc:
                lost = conn.closed
                conn.close()
                if statement.fired:
                    late = f"did not answer within {self.store.timeout} s"
                    raise self.store._unavailable(exc, late) from exc
                if attempt == 2 or not lost:
                    raise self.store._unavailable(exc) from exc
                # The server closed it (a restart), and the idle ones with it.
                log.debug("a PostgreSQL connection was closed, retrying: %s", exc)
                self._drop_idle()
                continue
            except psycopg.Error as exc:
                self._give_back(conn, cur)
                raise self.store._unavailable(exc) from exc
            except BaseException:
                conn.close()  # interrupted mid-statement: its reply may be unread
                raise
            self._give_back(conn, cur)
            return rows
        raise AssertionError("unreachable")  # pragma: no cover

    def _take(self) -> _Idle:
        try:
            return self._idle.pop()
        except IndexError:  # none idle (another thread may just have taken the last)
            pass
        conn = self._connect()
        return conn, conn.cursor()

    def _connect(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreUnavailable(f"the store {self.store.describe()} is closed")
        try:
            return psycopg.Connection.connect(self.store.url, **self._connect_options)
        except psycopg.Error as exc:
            raise self.store._unavailable(exc, "refused a connection") from exc

    def _give_back(self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any]) -> None:
        if (
            not conn.closed
            and conn.pgconn.transaction_status == _IDLE
            and len(self._idle) < self.store.pool_max
            and not self._closed
        ):
            self._idle.append((conn, cur))
        else:
            conn.close()

    def _drop_idle(self) -> None:
        while True:
            try:
                conn, _ = self._idle.pop()
            except IndexError:
                return
            conn.close()

    def _watched(self, conn: psycopg.Connection[Any]) -> _InFlight:
        """Enter around a statement on ``conn``: severed if it outlasts ``timeout``."""
        if self._watchdog_thread is None:
            with self._watchdog_guard:
                if self._watchdog_thread is None:
                    thread = threading.Thread(
                        target=_watch_statements,
                        args=(self._statements, self.store.timeout, self._stop_watching),
                        name="tenure-postgres-watchdog",
                        daemon=True,
                    )
                    thread.start()
                    self._watchdog_thread = thread
        return _InFlight(self._statements, conn)

    def _ensure_schema(self) -> None:
        """Create or check the tables before the first plain call, once per store family.

        Through the asyncio store's own ``_ensure_schema`` (one definition of
        the schema steps and their errors), on a store and an event loop of
        its own on a short-lived thread: the caller's thread may be running a
        loop already.
        """
        with self._schema_guard:
            if self.store._shared.schema_ready:
                return
            failed: list[BaseException] = []

            async def ensure() -> None:
                store = self.store.sibling()
                try:
                    await store._ensure_schema()
                finally:
                    await store.aclose()

            def run() -> None:
                try:
                    asyncio.run(ensure())
                except BaseException as exc:
                    failed.append(exc)

            thread = threading.Thread(target=run, name="tenure-postgres-schema")
            thread.start()
            thread.join()
            if failed:
                raise failed[0]


def _watch_statements(in_flight: set[_InFlight], timeout: float, stop: threading.Event) -> None:
    """The blocking store's watchdog thread (see ``PostgresStore._deadline``)."""
    while not stop.wait(timeout / 4):
        _sever_overdue(in_flight, timeout)


def _connect_timeout(timeout: float) -> int:
    """libpq's connect_timeout for a store's ``timeout``: libpq waits forever by
    default, and its minimum is 2 seconds."""
    return max(2, math.ceil(timeout))
