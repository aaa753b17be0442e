"""What only the MySQL/MariaDB store has: its URL, its tables and procedures made
by hand or found of an older shape, the server's durability settings, a
restart, the fencing floor across pruning. (The contract, scheduler, load and
fault suites run on it too: ``mysql`` in tests/conftest.py's STORES.)"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tenure import ConfigurationError, LockService
from tenure.stores import from_url
from tenure.stores.mysql import MySQLStore
from tenure.stores.mysql.schema import check_server

from ..conftest import mariadb_server
from ..helpers.procs import ROOT
from ..mysql_server import DATABASE, MariaDBServer


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://u:p@127.0.0.1:3306", "name the database"),
        ("mysql://u:p@127.0.0.1:3306/", "name the database"),
        ("mysql://u:p@127.0.0.1:x/db", "bad MySQL URL"),
        ("mysql://u:p@127.0.0.1/db?ssl=yes", "unknown MySQL URL option 'ssl'"),
        ("mysql://u:p@127.0.0.1/db?prefix=no-dash", "table prefix 'no-dash'"),
        ("mysql://u:p@127.0.0.1/db?timeout=0", "timeout must be between"),
        ("mysql://u:p@127.0.0.1/db?pool_max=0", "pool_max must be"),
        ("mariadb:///db", "no host"),
    ],
)
def test_bad_mysql_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        from_url(url)
    assert says in str(raised.value)
    assert ":p@" not in str(raised.value), "the password is masked"


def test_both_schemes_open_the_store() -> None:
    for scheme in ("mysql", "mariadb"):
        store = from_url(f"{scheme}://app:s3cret@db.example:3307/jobs?prefix=x")
        assert isinstance(store, MySQLStore)
        assert store.endpoint.port == 3307 and store.endpoint.database == "jobs"
        assert "s3cret" not in store.describe()


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("10.11.19-MariaDB-0+deb12u1", False),
        ("10.6.0-MariaDB", False),
        ("10.5.23-MariaDB-0+deb11u1", True),
        ("8.0.36", False),
        ("5.7.44-log", True),
    ],
)
def test_a_server_too_old_is_named(version: str, refused: bool) -> None:
    if refused:
        with pytest.raises(ConfigurationError) as raised:
            check_server(version, "MySQL at here")
        assert f"{version}; tenure needs" in str(raised.value)
    else:
        check_server(version, "MySQL at here")


def _restricted_user(server: MariaDBServer) -> str:
    """A user with rights on the rows only (no CREATE, no CREATE ROUTINE); its URL."""
    user = f"app{uuid.uuid4().hex[:8]}"
    server.sql(
        f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw';"
        f" GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON {DATABASE}.* TO '{user}'@'127.0.0.1';"
    )
    return f"mysql://{user}:pw@127.0.0.1:{server.port}/{DATABASE}?prefix=p{uuid.uuid4().hex[:8]}"


async def test_tables_made_by_hand_serve_a_user_who_cannot_create_them() -> None:
    server = mariadb_server()
    url = _restricted_user(server)
    async with LockService.from_url(url) as locks:
        with pytest.raises(ConfigurationError, match="tenure schema --url URL"):
            await locks.acquire("job", ttl=5)
    printed = subprocess.run(
        [sys.executable, "-m", "tenure", "schema", "--url", url],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    assert "DELIMITER //" in printed.stdout and "CREATE PROCEDURE" in printed.stdout
    server.sql(printed.stdout)
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("job", ttl=5)
        assert lock is not None
        assert [info.name for info in await locks.store.holders()] == ["job"]
        assert await lock.release() is True


async def test_tables_of_an_older_shape_are_named_as_such() -> None:
    server = mariadb_server()
    prefix = f"old{uuid.uuid4().hex[:8]}"
    url = f"{server.url()}?prefix={prefix}"
    async with LockService.from_url(url) as locks:
        assert await locks.acquire("made", ttl=5) is not None
    server.sql(f"UPDATE {prefix}_meta SET v = '0' WHERE k = 'schema_version';")
    async with LockService.from_url(url) as locks:
        with pytest.raises(ConfigurationError, match=r"older shape \(schema version 0;"):
            await locks.acquire("made", ttl=5)


async def test_the_fencing_floor_outlives_pruned_rows() -> None:
    server = mariadb_server()
    prefix = f"fl{uuid.uuid4().hex[:8]}"
    async with LockService.from_url(f"{server.url()}?prefix={prefix}") as locks:
        fences = []
        for _ in range(3):
            lock = await locks.acquire("pruned", ttl=5)
            assert lock is not None
            fences.append(lock.fencing_token)
            await lock.release()
        # Age the released row past the prune delay, as ten minutes would.
        server.sql(f"UPDATE {prefix}_leases SET expires = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR;")
        assert await locks.store.prune(keep_runs=10) >= 1
        assert server.sql(f"SELECT COUNT(*) FROM {prefix}_leases;").strip() == "0"
        again = await locks.acquire("pruned", ttl=5)
        assert again is not None and again.fencing_token > max(fences)


async def test_a_killed_server_keeps_the_lease_and_the_store_reconnects() -> None:
    server = MariaDBServer()
    try:
        async with LockService.from_url(server.url()) as locks:
            held = await locks.acquire("kept", ttl=30)
            assert held is not None
            server.restart()  # SIGKILL: InnoDB recovers what was committed
            other = await locks.store.acquire("kept", "another-token", 30, "someone")
            assert other is None, "the lease survived the crash"
            assert held.held and await held.release() is True
    finally:
        server.stop()


async def test_doctor_names_what_a_crash_can_lose() -> None:
    async with LockService.from_url(mariadb_server().url()) as locks:
        found = {f.what.split(":")[0]: f.level for f in await locks.store.diagnose()}
    assert found["innodb_flush_log_at_trx_commit is 2"] == "unsafe", found
    durable = MariaDBServer(durable=True)
    try:
        async with LockService.from_url(durable.url()) as locks:
            levels = [(f.level, f.what) for f in await locks.store.diagnose()]
        assert ("ok", "innodb_flush_log_at_trx_commit is 1: every grant is durable") in levels
        assert all(level != "unsafe" for level, _ in levels), levels
    finally:
        durable.stop()
