"""The PostgreSQL store's SQL: its names, its schema, and the lease statements.

Every statement is rendered once per store, with every identifier quoted
(``Names``). Each is one atomic step in autocommit mode: the statement is the
transaction. The run log's statements live with the run log (``runlog``);
the acquire's conflict rule (``ACQUIRE_OR_NOT``) is shared with its start.
"""

from __future__ import annotations

from .schema import Names, schema_sql

__all__ = (
    "ACQUIRE_OR_NOT",
    "PRUNE_AFTER",
    "Statements",
)

PRUNE_AFTER = "10 minutes"
"""How long after its expiry a lease row may be pruned (see the store's docstring)."""


# The acquire's conflict rule, shared by the plain acquire and the occurrence
# start (the run log's start statement).
ACQUIRE_OR_NOT = (
    "ON CONFLICT (name) DO UPDATE SET token = excluded.token, holder = excluded.holder,"
    # A live lease of this very token (an acquire resent after its
    # answer was lost) is granted again: the same fence, renewed.
    " fence = CASE WHEN l.token = excluded.token AND l.expires > clock_timestamp()"
    " THEN l.fence ELSE nextval({fence_literal}) END, expires = excluded.expires,"
    " acquired = CASE WHEN l.token = excluded.token AND l.expires > clock_timestamp()"
    " THEN l.acquired ELSE excluded.acquired END "
    "WHERE l.token IS NULL OR l.expires <= clock_timestamp() OR l.token = excluded.token "
)


class Statements:
    """The lease statements of one (schema, prefix), rendered once."""

    def __init__(self, schema: str, prefix: str) -> None:
        self.names = names = Names(schema, prefix)
        self.acquire = names.render(
            "INSERT INTO {leases} AS l (name, token, holder, fence, expires, acquired) "
            "VALUES (%s, %s, %s, nextval({fence_literal}),"
            " clock_timestamp() + make_interval(secs => %s), clock_timestamp()) "
            + ACQUIRE_OR_NOT
            + "RETURNING l.fence"
        )
        self.renew = names.render(
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
        self.release = names.render(
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

        self.enlist = names.render(
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
        self.withdraw = names.render(
            "UPDATE {leases} AS l SET"
            " next_waiter = CASE WHEN l.next_waiter = %(waiter)s THEN NULL ELSE l.next_waiter END,"
            " next_until = CASE WHEN l.next_waiter = %(waiter)s THEN NULL ELSE l.next_until END "
            "WHERE l.name = %(name)s "
            "RETURNING CASE WHEN l.token = %(token)s AND l.expires > clock_timestamp()"
            " THEN l.fence END,"
            " (extract(epoch FROM l.expires - clock_timestamp()) * 1000)::bigint"
        )
        self.live_grant = names.render(
            "SELECT token, holder, fence, extract(epoch FROM expires - clock_timestamp())::float8,"
            " extract(epoch FROM acquired)::float8 FROM {leases}"
            " WHERE name = %s AND token IS NOT NULL AND expires > clock_timestamp()"
        )
        self.remaining = names.render(
            "SELECT extract(epoch FROM expires - clock_timestamp())::float8 FROM {leases} "
            "WHERE name = %s AND token IS NOT NULL AND expires > clock_timestamp()"
        )
        # A waiter counts itself on the row in the statement that reads the
        # lease's remaining time: a release either came first (the lease is
        # free) or sees the count and notifies.
        self.wait = names.render(
            "UPDATE {leases} SET waiters = waiters + 1 "
            "WHERE name = %s AND token IS NOT NULL AND expires > clock_timestamp() "
            "RETURNING extract(epoch FROM expires - clock_timestamp())::float8"
        )
        self.unwait = names.render(
            "UPDATE {leases} SET waiters = greatest(waiters - 1, 0) WHERE name = %s"
        )
        self.holders = names.render(
            "SELECT name, holder, fence, extract(epoch FROM expires - clock_timestamp())::float8,"
            " extract(epoch FROM acquired)::float8 "
            "FROM {leases} WHERE token IS NOT NULL AND expires > clock_timestamp()"
            ' AND starts_with(name, %s) ORDER BY name COLLATE "C"'
        )
        self.prune = names.render(
            "WITH gone AS (DELETE FROM {leases}"
            f" WHERE expires < clock_timestamp() - interval '{PRUNE_AFTER}'"
            " AND (next_until IS NULL OR next_until < clock_timestamp()) RETURNING 1),"
            " old AS (DELETE FROM {runs} WHERE run_id IN (SELECT run_id FROM (SELECT run_id,"
            " row_number() OVER (PARTITION BY task ORDER BY started DESC) AS n FROM {runs}) AS x"
            " WHERE n > %s) RETURNING 1) "
            "SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM old)"
        )
        self.version = names.render("SELECT value FROM {meta} WHERE key = 'schema_version'")
        self.schema_lock = names.render("SELECT pg_advisory_xact_lock(hashtext({lock_key}))")
        self.schema = schema_sql(schema, prefix)
        self.schema_name = schema
        self.prefix = prefix
