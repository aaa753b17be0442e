"""The MySQL/MariaDB store's tables and procedures: their SQL, their creation, their version.

Tables (``<prefix>_*`` in the URL's database, InnoDB): ``meta`` (the schema
version), ``leases`` (a row per lock name, kept on
release; expiry ``DATETIME(6)`` in UTC by the server's clock), ``claims`` and
``runs`` (the scheduler's), ``forced`` (audit records), ``semaphores`` (a row
per semaphore, its ledger as JSON), ``board`` (the control board's entries,
their values ``LONGBLOB`` so that a compare-and-set compares bytes). Names
are ``VARBINARY``: compared byte for byte, sorted as PostgreSQL's "C"
collation sorts them.

A renewal batch is a stored procedure (``<prefix>_renew``), one transaction
in one call: MySQL has no ``RETURNING`` to say which rows an UPDATE changed.

Created at first use: ``CREATE TABLE IF NOT EXISTS`` and an upsert of the
version are safe when instances start together, and a procedure another instance
created first (error 1304) is taken as made. ``tenure schema --url URL``
prints the SQL for databases where the application's user may not create
them. Tables of an older shape are named as such, never used.
"""

from __future__ import annotations

import re
from typing import Any

import pymysql

from ...errors import ConfigurationError
from .._schema import check_schema_version

__all__ = (
    "MAX_PREFIX",
    "SCHEMA_VERSION",
    "Names",
    "check_prefix",
    "check_server",
    "ensure",
    "procedures",
    "schema_sql",
    "tables",
)

SCHEMA_VERSION = 2
MAX_PREFIX = 40
"""Characters: ``<prefix>_semaphores`` must fit MySQL's 64-character identifiers."""

_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix) or len(prefix) > MAX_PREFIX:
        raise ConfigurationError(
            f"MySQL table prefix {prefix!r} must be letters, digits and _, starting with a "
            f"letter or _, at most {MAX_PREFIX} characters"
        )
    return prefix


class Names:
    """The table and procedure names of one prefix, quoted."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.meta = f"`{prefix}_meta`"
        self.leases = f"`{prefix}_leases`"
        self.claims = f"`{prefix}_claims`"
        self.runs = f"`{prefix}_runs`"
        self.forced = f"`{prefix}_forced`"
        self.semaphores = f"`{prefix}_semaphores`"
        self.board = f"`{prefix}_board`"
        self.renew = f"`{prefix}_renew`"


def tables(names: Names) -> list[str]:
    """The statements that create the tables (idempotent)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {names.meta} ("
        " k VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,"
        " v VARCHAR(255) CHARACTER SET ascii NOT NULL) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {names.leases} ("
        " name VARBINARY(320) NOT NULL PRIMARY KEY,"
        " token VARBINARY(64) NULL,"
        " holder VARBINARY(1024) NULL,"
        " fence BIGINT NOT NULL,"
        " expires DATETIME(6) NOT NULL,"
        " acquired DATETIME(6) NULL) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {names.claims} ("
        " task VARBINARY(320) NOT NULL PRIMARY KEY,"
        " fire_time DOUBLE NOT NULL,"
        " claimant VARBINARY(1024) NOT NULL) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {names.runs} ("
        " run_id VARBINARY(64) NOT NULL PRIMARY KEY,"
        " task VARBINARY(320) NOT NULL,"
        " fire_time DOUBLE NULL,"
        " instance VARBINARY(1024) NOT NULL,"
        " started DOUBLE NOT NULL,"
        " ended DOUBLE NULL,"
        " outcome VARCHAR(32) CHARACTER SET ascii NOT NULL,"
        " error TEXT CHARACTER SET utf8mb4 NULL,"
        " fence BIGINT NULL,"
        " KEY task_started (task, started)) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {names.forced} ("
        " id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
        " record JSON NOT NULL,"
        " name VARBINARY(320) NOT NULL,"
        " at DOUBLE NOT NULL,"
        " KEY name_at (name, at)) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {names.semaphores} ("
        " name VARBINARY(320) NOT NULL PRIMARY KEY,"
        " ledger JSON NOT NULL) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {names.board} ("
        " kind VARCHAR(32) CHARACTER SET ascii NOT NULL,"
        " k VARBINARY(320) NOT NULL,"
        " value LONGBLOB NOT NULL,"
        " PRIMARY KEY (kind, k)) ENGINE=InnoDB",
    ]


MARK_READY = (
    "INSERT INTO {meta} (k, v) VALUES"
    f" ('schema_version', '{SCHEMA_VERSION}')"
    " ON DUPLICATE KEY UPDATE k = k"
)
"""Written after the tables and procedures: the version says they are all there."""


def procedures(names: Names) -> list[str]:
    """The statements that create the procedures (error 1304 when one exists).

    ``<prefix>_renew(items)``: items a JSON array of ``[index, name, token,
    ttl µs]``; the result rows are the indices of the leases extended, in one
    transaction (MySQL has no ``RETURNING`` to say which rows an UPDATE changed).
    """
    now = "UTC_TIMESTAMP(6)"
    return [
        f"CREATE PROCEDURE {names.renew}(IN p_items LONGTEXT)"
        " MODIFIES SQL DATA BEGIN"
        f" DECLARE v_now DATETIME(6) DEFAULT {now};"
        " DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;"
        " SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"
        " START TRANSACTION;"
        f" UPDATE {names.leases} AS l JOIN JSON_TABLE(p_items, '$[*]' COLUMNS ("
        " i INT PATH '$[0]', n VARCHAR(320) CHARACTER SET utf8mb4 PATH '$[1]',"
        " t VARCHAR(64) CHARACTER SET ascii PATH '$[2]', ttl BIGINT PATH '$[3]')) AS b"
        " ON l.name = CAST(b.n AS BINARY) AND l.token = CAST(b.t AS BINARY)"
        " SET l.expires = TIMESTAMPADD(MICROSECOND, b.ttl, v_now)"
        " WHERE l.expires > v_now;"
        f" SELECT b.i FROM {names.leases} AS l JOIN JSON_TABLE(p_items, '$[*]' COLUMNS ("
        " i INT PATH '$[0]', n VARCHAR(320) CHARACTER SET utf8mb4 PATH '$[1]',"
        " t VARCHAR(64) CHARACTER SET ascii PATH '$[2]')) AS b"
        " ON l.name = CAST(b.n AS BINARY) AND l.token = CAST(b.t AS BINARY)"
        " WHERE l.expires > v_now;"
        " COMMIT;"
        " END",
    ]


def schema_sql(prefix: str) -> str:
    """Everything, as a script for the ``mysql`` client (procedures between
    ``DELIMITER`` lines), with the grants the application's user needs."""
    names = Names(prefix)
    parts = [
        f"-- tenure's tables and procedures, prefix {prefix!r}, schema version {SCHEMA_VERSION}"
    ]
    parts += [f"{statement};" for statement in tables(names)]
    parts.append("DELIMITER //")
    parts += [f"{statement} //" for statement in procedures(names)]
    parts.append("DELIMITER ;")
    parts.append(MARK_READY.format(meta=names.meta) + ";")
    parts.append(
        "-- The application's user needs SELECT, INSERT, UPDATE, DELETE on these tables"
        " and EXECUTE on the procedures, e.g.:\n"
        "-- GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON yourdb.* TO 'app'@'%';"
    )
    return "\n".join(parts) + "\n"


MARIADB_NEEDS = (10, 6)
MYSQL_NEEDS = (8, 0)
"""The oldest servers with ``JSON_TABLE``, which the batch statements read their rows from."""

_DENIED = (1044, 1142, 1227, 1370)
"""Access denied to the database, a command, a privilege, a routine."""


def check_server(version: str, where: str) -> None:
    """ConfigurationError when the server is older than tenure needs."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", version.split("-", maxsplit=1)[0])[:2])
    mariadb = "mariadb" in version.lower()
    needs = MARIADB_NEEDS if mariadb else MYSQL_NEEDS
    if numbers < needs:
        kind = "MariaDB" if mariadb else "MySQL"
        raise ConfigurationError(
            f"{where} runs {kind} {version}; tenure needs {kind} "
            f"{'.'.join(map(str, needs))} or newer (for JSON_TABLE)"
        )


async def ensure(conn: Any, names: Names, where: str) -> None:
    """Make the tables and procedures on ``conn`` unless they exist; check their version."""
    async with conn.cursor() as cur:
        await cur.execute("SELECT VERSION()")
        (server,) = await cur.fetchone()
        check_server(str(server), where)
        version = await _version(cur, names)
        if version is None:
            # Tables another instance made first are a note, not news (this
            # connection is closed after).
            await cur.execute("SET SESSION sql_notes = 0")
            try:
                for statement in tables(names):
                    await cur.execute(statement)
                for statement in procedures(names):
                    try:
                        await cur.execute(statement)
                    except pymysql.err.MySQLError as exc:
                        if exc.args[0] != 1304:  # made by an instance that started alongside
                            raise
                # Last: an instance that finds the version finds everything else.
                await cur.execute(MARK_READY.format(meta=names.meta))
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] in _DENIED:
                    raise ConfigurationError(
                        f"{where}: this user cannot create tenure's tables and procedures "
                        f"({exc.args[1]}); have an administrator run the SQL that "
                        "`tenure schema --url URL` prints, with its GRANT"
                    ) from exc
                raise
            version = await _version(cur, names)
    check_schema_version(
        version, SCHEMA_VERSION, where, f"the tables {names.prefix}_*", " and their procedures"
    )


async def _version(cur: Any, names: Names) -> str | None:
    """The recorded schema version; None when the tables do not exist yet."""
    try:
        await cur.execute(f"SELECT v FROM {names.meta} WHERE k = 'schema_version'")
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] == 1146:  # no such table
            return None
        raise
    row = await cur.fetchone()
    return None if row is None else str(row[0])
