"""What only the MySQL/MariaDB store has: its URL, its tables and procedures made
by hand or found of an older shape, the server's durability settings, a
restart, fencing tokens across pruning. (The contract, scheduler, load and
fault suites run on it too: ``mysql`` in tests/conftest.py's STORES.)"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest

from tenure import ConfigurationError, LockService, StoreUnavailable, sync
from tenure.stores import from_url
from tenure.stores.mysql import MySQLStore
from tenure.stores.mysql.blocking import BlockingCalls
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


async def test_a_pruned_name_starts_above_every_token_it_had() -> None:
    server = mariadb_server()
    prefix = f"fl{uuid.uuid4().hex[:8]}"
    async with LockService.from_url(f"{server.url()}?prefix={prefix}") as locks:
        fences = []
        for _ in range(3):
            lock = await locks.acquire("pruned", ttl=5)
            assert lock is not None
            fences.append(lock.fencing_token)
            await lock.release()
        assert fences == sorted(set(fences))
        # Age the released row past the prune delay, as an hour would: its
        # grants an hour back, its tokens the clock's then.
        hour = 3600 * 10**6
        server.sql(
            f"UPDATE {prefix}_leases SET expires = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR,"
            f" fence = fence - {hour};"
        )
        assert await locks.store.prune(keep_runs=10) >= 1
        assert server.sql(f"SELECT COUNT(*) FROM {prefix}_leases;").strip() == "0"
        again = await locks.acquire("pruned", ttl=5)
        assert again is not None and again.fencing_token > max(fences)


async def test_a_new_name_starts_at_the_servers_clock_and_prune_keeps_a_row_ahead_of_it() -> None:
    """No floor is read per acquire: a name without a row starts at the
    server's clock in µs, and a row whose token is ahead of that clock (the
    clock stepped back) is not pruned, so its name's tokens keep rising."""
    server = mariadb_server()
    prefix = f"ck{uuid.uuid4().hex[:8]}"
    async with LockService.from_url(f"{server.url()}?prefix={prefix}") as locks:
        before = await locks.store.server_time()
        assert before is not None
        lock = await locks.acquire("clocked", ttl=5)
        assert lock is not None
        assert lock.fencing_token >= int(before * 1e6)
        await lock.release()
        # As if the clock had been an hour ahead when the row was last granted.
        ahead = lock.fencing_token + 3600 * 10**6
        server.sql(
            f"UPDATE {prefix}_leases SET fence = {ahead},"
            " expires = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR;"
        )
        assert await locks.store.prune(keep_runs=10) == 0
        again = await locks.acquire("clocked", ttl=5)
        assert again is not None and again.fencing_token == ahead + 1


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


def test_the_blocking_api_acquires_and_releases_on_the_callers_thread() -> None:
    url = f"{mariadb_server().url()}?prefix=bl{uuid.uuid4().hex[:8]}&pool_max=2"
    with sync.LockService.from_url(url) as locks:
        calls = locks.store.blocking()
        assert isinstance(calls, BlockingCalls)
        lock = locks.acquire("plain", ttl=1)  # the tables made first, from this plain call
        assert lock is not None and lock.release() is True
        assert locks._portal._loop is None, "acquire and release made no hop to a loop thread"
        # Threads share the idle connections; at most pool_max stay open.
        grants: dict[int, list[int]] = {i: [] for i in range(6)}

        def work(i: int) -> None:
            for _ in range(20):
                got = locks.acquire(f"thread-{i}", ttl=1)
                assert got is not None
                grants[i].append(got.fencing_token)
                assert got.release() is True

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for fences in grants.values():  # fencing tokens rise per name
            assert len(fences) == 20 and fences == sorted(set(fences))
        assert 1 <= len(calls._idle) <= 2
        # A waiting acquire goes through the loop thread's waiters, woken by
        # a plain release in this process.
        held = locks.acquire("waited-for", ttl=5)
        assert held is not None
        threading.Timer(0.3, held.release).start()
        began = time.monotonic()
        waited = locks.acquire("waited-for", ttl=1, wait=5)
        assert waited is not None and waited.fencing_token > held.fencing_token
        assert time.monotonic() - began < 2, "woken by the release, not by the expiry"
        assert waited.release() is True


def test_the_blocking_calls_fail_closed_on_a_stopped_server_and_ride_a_restart() -> None:
    server = MariaDBServer()
    try:
        with sync.LockService.from_url(f"{server.url()}?timeout=0.5") as locks:
            calls = locks.store.blocking()
            assert isinstance(calls, BlockingCalls)
            first = locks.acquire("paused", ttl=1)
            assert first is not None and first.release() is True
            server.pause()
            try:
                with pytest.raises(
                    StoreUnavailable, match=r"did not answer within 0\.5 s"
                ) as caught:
                    locks.acquire("paused", ttl=1)
                assert caught.value.__cause__ is not None
            finally:
                server.resume()
            # The timed-out acquire was not sent again; it may still have run
            # once the server resumed: a grant nobody holds, which lapses.
            again = locks.acquire("paused", ttl=1, wait=3)
            assert again is not None and again.fencing_token > first.fencing_token
            assert again.release() is True
            # Every idle connection dies with the server; the first statement
            # after the restart drops them all and is sent once more.
            lock = locks.acquire("restart", ttl=30)
            assert lock is not None
            taken = [calls._take()[0] for _ in range(3)]
            for conn in taken:
                calls._give_back(conn)
            server.restart()  # SIGKILL, then start on the same data
            assert lock.release() is True
            assert all(not conn.open for conn in taken), "the restart bit: they were dropped"
            after = locks.acquire("restart", ttl=5)
            assert after is not None and after.fencing_token > lock.fencing_token
            assert after.release() is True
    finally:
        server.stop()
