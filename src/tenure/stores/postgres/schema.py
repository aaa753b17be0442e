"""The PostgreSQL store's tables: their SQL, their creation on first use, their version.

Created idempotently under a transaction-scoped advisory lock, so that
instances starting together do not collide; the version is recorded in
``<prefix>_meta``. ``tenure schema --url URL`` prints the SQL for databases
where the application's user cannot create tables. Tables of an older shape
are named as such, never used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql as pgsql

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from .sql import Statements

__all__ = (
    "MAX_IDENT_BYTES",
    "MAX_PREFIX_BYTES",
    "SCHEMA_VERSION",
    "Names",
    "check_ident",
    "ensure",
    "schema_sql",
)

SCHEMA_VERSION = 5
MAX_PREFIX_BYTES = 40  # "<prefix>_released" must fit PostgreSQL's 63-byte identifiers
MAX_IDENT_BYTES = 63


def check_ident(value: str, what: str, limit: int) -> str:
    if not value or "\x00" in value or len(value.encode()) > limit:
        raise ConfigurationError(
            f"PostgreSQL {what} {value!r} must be 1 to {limit} UTF-8 bytes without NUL"
        )
    return value


class Names:
    """The SQL names of one (schema, prefix): every identifier quoted, once."""

    def __init__(self, schema: str, prefix: str) -> None:
        self.schema = pgsql.Identifier(schema)
        self.leases = pgsql.Identifier(schema, f"{prefix}_leases")
        self.fence = pgsql.Identifier(schema, f"{prefix}_fence")
        self.claims = pgsql.Identifier(schema, f"{prefix}_claims")
        self.runs = pgsql.Identifier(schema, f"{prefix}_runs")
        self.runs_index = pgsql.Identifier(f"{prefix}_runs_task")
        self.forced = pgsql.Identifier(schema, f"{prefix}_forced")
        self.forced_index = pgsql.Identifier(f"{prefix}_forced_name")
        self.meta = pgsql.Identifier(schema, f"{prefix}_meta")
        self.channel = f"{prefix}_released"
        self.fence_literal = pgsql.Literal(self.fence.as_string())
        self.lock_key = pgsql.Literal(f"tenure-schema:{schema}.{prefix}")

    def render(self, template: str, **extra: pgsql.Composable) -> str:
        return (
            pgsql.SQL(template)
            .format(
                leases=self.leases,
                fence=self.fence,
                fence_literal=self.fence_literal,
                claims=self.claims,
                runs=self.runs,
                meta=self.meta,
                runs_index=self.runs_index,
                forced=self.forced,
                forced_index=self.forced_index,
                schema=self.schema,
                lock_key=self.lock_key,
                **extra,
            )
            .as_string()
        )


def schema_sql(schema: str = "public", prefix: str = "tenure") -> str:
    """The SQL that creates tenure's tables (what ``tenure schema`` prints)."""
    names = Names(
        check_ident(schema, "schema", MAX_IDENT_BYTES),
        check_ident(prefix, "table prefix", MAX_PREFIX_BYTES),
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
        "CREATE TABLE IF NOT EXISTS {forced} (\n"
        "    record_id text PRIMARY KEY,\n"
        "    name text NOT NULL,\n"
        "    at double precision NOT NULL,\n"
        "    operator text NOT NULL,\n"
        "    evicted text NOT NULL,\n"
        "    fencing_token bigint NOT NULL,\n"
        "    reason text\n"
        ");\n"
        "CREATE INDEX IF NOT EXISTS {forced_index} ON {forced} (name, at);\n"
        "CREATE TABLE IF NOT EXISTS {meta} (\n"
        "    key text PRIMARY KEY,\n"
        "    value text NOT NULL\n"
        ");\n"
        f"INSERT INTO {{meta}} (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')\n"
        "    ON CONFLICT (key) DO NOTHING;\n"
        "-- The application's database user then needs (replace app_user):\n"
        "-- GRANT USAGE ON SCHEMA {schema} TO app_user;\n"
        "-- GRANT SELECT, INSERT, UPDATE, DELETE ON {leases}, {claims}, {runs}, {forced}, {meta}"
        " TO app_user;\n"
        "-- GRANT USAGE ON SEQUENCE {fence} TO app_user;\n"
    )


async def ensure(conn: psycopg.AsyncConnection[Any], sql: Statements, where: str) -> None:
    """Create the tables on ``conn`` unless they exist, then check their version."""
    try:
        version = await _version(conn, sql)
        if version is None:
            async with conn.transaction():
                await conn.execute(sql.schema_lock, prepare=False)
                await conn.execute(sql.schema, prepare=False)
            version = await _version(conn, sql)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigurationError(
            f"{where}: this user cannot create or use tenure's tables"
            f" in schema {sql.schema_name!r} ({exc}); have an administrator run the SQL that"
            " `tenure schema --url URL` prints, with its GRANTs"
        ) from exc
    tables = f"the tables {sql.prefix}_* in schema {sql.schema_name!r}"
    if version is not None and version.isdigit() and int(version) < SCHEMA_VERSION:
        raise ConfigurationError(
            f"{where}: {tables} are of an older shape (schema version {version}; this "
            f"tenure uses {SCHEMA_VERSION}): tenure has no release yet that migrates them. "
            "Stop every instance, drop them (they hold only leases, claims, run records and "
            "forced-release records) or use another prefix; `tenure schema` prints the "
            "current shape"
        )
    if version != str(SCHEMA_VERSION):
        raise ConfigurationError(
            f"{where}: {tables} have schema version {version!r}, this tenure expects "
            f"{SCHEMA_VERSION}; use another prefix or schema"
        )


async def _version(conn: psycopg.AsyncConnection[Any], sql: Statements) -> str | None:
    """The recorded schema version; None when the tables do not exist yet."""
    try:
        async with conn.transaction():
            row = await (await conn.execute(sql.version, prepare=False)).fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return None if row is None else str(row[0])
