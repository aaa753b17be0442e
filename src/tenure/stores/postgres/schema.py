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
from .._schema import check_schema_version

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

SCHEMA_VERSION = 8
SEM_LOCK_CLASS = 0x74656E75  # "tenu": the first key of a semaphore's advisory lock
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
        self.board = pgsql.Identifier(schema, f"{prefix}_board")
        self.meta = pgsql.Identifier(schema, f"{prefix}_meta")
        self.semaphores = pgsql.Identifier(schema, f"{prefix}_semaphores")
        self.permits = pgsql.Identifier(schema, f"{prefix}_permits")
        self.sem_queue = pgsql.Identifier(schema, f"{prefix}_sem_queue")
        self.sem_acquire = pgsql.Identifier(schema, f"{prefix}_sem_acquire")
        self.sem_note = pgsql.Literal("\x1fsem\x1f")
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
                board=self.board,
                semaphores=self.semaphores,
                permits=self.permits,
                sem_queue=self.sem_queue,
                sem_acquire=self.sem_acquire,
                sem_note=self.sem_note,
                sem_lock_class=pgsql.Literal(SEM_LOCK_CLASS),
                channel_literal=pgsql.Literal(self.channel),
                schema=self.schema,
                lock_key=self.lock_key,
                **extra,
            )
            .as_string()
        )


# A semaphore (tenure.stores.semaphores): its limit in one row; its permits in
# slot rows, updated in place as a lock's row is (a released slot keeps its
# row; slots are made as needed, up to the limit, so no permit adds or removes
# a row and no dead row piles up under a busy semaphore); its queued waiters
# in a third table, in ``since`` order. The acquire is a function: it first
# takes a transaction-scoped advisory lock on the semaphore's name (in memory,
# no WAL write, released at commit; through a transaction pooler too), so
# that acquires of one semaphore take turns and each counts the permits the
# one before granted (READ COMMITTED gives each statement of the function a
# fresh snapshot). Advisory keys of two ints never meet the one-bigint key of
# the schema's lock.
SEMAPHORES = (
    "CREATE TABLE IF NOT EXISTS {semaphores} (\n"
    "    name text PRIMARY KEY,\n"
    "    lim integer NOT NULL\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS {permits} (\n"
    "    name text NOT NULL,\n"
    "    slot integer NOT NULL,\n"
    "    token text,\n"
    "    holder text,\n"
    "    fence bigint,\n"
    "    expires timestamptz NOT NULL,\n"
    "    acquired timestamptz,\n"
    "    PRIMARY KEY (name, slot)\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS {sem_queue} (\n"
    "    name text NOT NULL,\n"
    "    token text NOT NULL,\n"
    "    since bigint NOT NULL,\n"
    "    until timestamptz NOT NULL,\n"
    "    PRIMARY KEY (name, token)\n"
    ");\n"
    "CREATE OR REPLACE FUNCTION {sem_acquire}(p_name text, p_token text, p_holder text,"
    " p_ttl float8, p_limit integer, p_queue float8, OUT code integer, OUT val bigint)\n"
    "LANGUAGE plpgsql AS $$\n"
    "DECLARE\n"
    "    v_now timestamptz := clock_timestamp();\n"
    "    v_lim integer; v_count integer; v_others integer := 0; v_ahead integer := 0;\n"
    "    v_fence bigint; v_since bigint; v_slot integer;\n"
    "BEGIN\n"
    "    PERFORM pg_advisory_xact_lock({sem_lock_class}, hashtext(p_name));\n"
    "    SELECT lim INTO v_lim FROM {semaphores} WHERE name = p_name;\n"
    "    IF NOT FOUND THEN\n"
    "        INSERT INTO {semaphores} (name, lim) VALUES (p_name, p_limit)\n"
    "            ON CONFLICT (name) DO NOTHING;\n"
    "        v_lim := p_limit;\n"
    "    END IF;\n"
    # One look at the slot rows: how many are live, the caller's own (an
    # acquire resent after its answer was lost), the first free slot.
    "    SELECT count(*) FILTER (WHERE token IS NOT NULL AND expires > v_now),\n"
    "           max(fence) FILTER (WHERE token = p_token AND expires > v_now),\n"
    "           min(slot) FILTER (WHERE token IS NULL OR expires <= v_now)\n"
    "        INTO v_count, v_fence, v_slot FROM {permits} WHERE name = p_name;\n"
    "    IF v_fence IS NOT NULL THEN\n"
    "        UPDATE {permits} SET expires = v_now + make_interval(secs => p_ttl)\n"
    "            WHERE name = p_name AND token = p_token;\n"
    "        code := 1; val := v_fence; RETURN;\n"
    "    END IF;\n"
    "    IF EXISTS (SELECT 1 FROM {sem_queue} WHERE name = p_name) THEN\n"
    "        DELETE FROM {sem_queue} WHERE name = p_name AND until <= v_now;\n"
    "        SELECT since INTO v_since FROM {sem_queue}\n"
    "            WHERE name = p_name AND token = p_token;\n"
    "        SELECT count(*), count(*) FILTER (WHERE since < coalesce(v_since,"
    " 9223372036854775807))\n"
    "            INTO v_others, v_ahead FROM {sem_queue}\n"
    "            WHERE name = p_name AND token <> p_token;\n"
    "    END IF;\n"
    "    IF v_count = 0 AND v_others = 0 THEN\n"
    "        IF v_lim <> p_limit THEN\n"
    "            UPDATE {semaphores} SET lim = p_limit WHERE name = p_name;\n"
    # Idle: every slot is free, and slot 0 (the first free one) stays.
    "            DELETE FROM {permits} WHERE name = p_name AND slot >= p_limit;\n"
    "            v_lim := p_limit;\n"
    "        END IF;\n"
    "    ELSIF v_lim <> p_limit THEN\n"
    "        code := -1; val := v_lim; RETURN;\n"
    "    END IF;\n"
    "    IF v_count + v_ahead < v_lim THEN\n"
    "        IF v_slot IS NOT NULL THEN\n"
    "            UPDATE {permits} SET token = p_token, holder = p_holder,\n"
    "                fence = nextval({fence_literal}),\n"
    "                expires = v_now + make_interval(secs => p_ttl), acquired = v_now\n"
    "                WHERE name = p_name AND slot = v_slot RETURNING fence INTO v_fence;\n"
    "        ELSE\n"
    "            INSERT INTO {permits} (name, slot, token, holder, fence, expires, acquired)\n"
    "                SELECT p_name, coalesce(max(slot) + 1, 0), p_token, p_holder,\n"
    "                       nextval({fence_literal}), v_now + make_interval(secs => p_ttl), v_now\n"
    "                FROM {permits} WHERE name = p_name RETURNING fence INTO v_fence;\n"
    "        END IF;\n"
    "        IF v_since IS NOT NULL THEN\n"
    "            DELETE FROM {sem_queue} WHERE name = p_name AND token = p_token;\n"
    "        END IF;\n"
    "        code := 1; val := v_fence; RETURN;\n"
    "    END IF;\n"
    "    IF p_queue <= 0 THEN\n"
    "        code := 0; val := 0; RETURN;\n"
    "    END IF;\n"
    "    INSERT INTO {sem_queue} (name, token, since, until)\n"
    "        VALUES (p_name, p_token, nextval({fence_literal}),\n"
    "                v_now + make_interval(secs => p_queue))\n"
    "        ON CONFLICT (name, token) DO UPDATE SET until = excluded.until;\n"
    "    code := 2; val := v_ahead; RETURN;\n"
    "END\n"
    "$$;\n"
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
        "CREATE TABLE IF NOT EXISTS {board} (\n"
        "    kind text NOT NULL,\n"
        "    key text NOT NULL,\n"
        "    value text NOT NULL,\n"
        "    PRIMARY KEY (kind, key)\n"
        ");\n" + SEMAPHORES + "CREATE TABLE IF NOT EXISTS {meta} (\n"
        "    key text PRIMARY KEY,\n"
        "    value text NOT NULL\n"
        ");\n"
        f"INSERT INTO {{meta}} (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')\n"
        "    ON CONFLICT (key) DO NOTHING;\n"
        "-- The application's database user then needs (replace app_user):\n"
        "-- GRANT USAGE ON SCHEMA {schema} TO app_user;\n"
        "-- GRANT SELECT, INSERT, UPDATE, DELETE ON {leases}, {claims}, {runs}, {forced}, {board},"
        " {meta}, {semaphores}, {permits}, {sem_queue} TO app_user;\n"
        "-- GRANT EXECUTE ON FUNCTION {sem_acquire} TO app_user;\n"
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
    check_schema_version(version, SCHEMA_VERSION, where, tables)


async def _version(conn: psycopg.AsyncConnection[Any], sql: Statements) -> str | None:
    """The recorded schema version; None when the tables do not exist yet."""
    try:
        async with conn.transaction():
            row = await (await conn.execute(sql.version, prepare=False)).fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return None if row is None else str(row[0])
