"""What only the PostgreSQL store has to show: schema, restarts, poolers, auth, hostile input."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tenure import ConfigurationError, Lock, LockService, StoreUnavailable, sync
from tenure.stores.base import RenewItem
from tenure.stores.postgres import SCHEMA_VERSION, PostgresStore
from tenure.stores.postgres.blocking import BlockingCalls

from ..conftest import postgres_server
from ..helpers.procs import ROOT
from ..helpers.until import until
from ..servers import PgBouncer, PostgresServer


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    """A cluster of the test's own, which it may kill and restart."""
    own = PostgresServer()
    yield own
    own.stop()


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


async def test_instances_starting_together_create_the_schema_once() -> None:
    url = f"{postgres_server().url()}?prefix={_prefix()}"
    services = [LockService.from_url(url) for _ in range(8)]
    try:
        # Eight stores, eight connections, one fresh prefix: every first use
        # races to create the tables at the same moment.
        grants = await asyncio.gather(*(s.acquire("first", ttl=5) for s in services))
        assert sum(g is not None for g in grants) == 1
        prefix = url.rsplit("=", 1)[1]
        version = postgres_server().psql(
            f"SELECT value FROM {prefix}_meta WHERE key = 'schema_version'"
        )
        assert version.strip() == str(SCHEMA_VERSION)
    finally:
        for service in services:
            await service.close()


def _tenure_schema(url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-m", "tenure", "schema", "--url", url],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


async def test_tables_made_by_hand_serve_a_user_who_cannot_create_them() -> None:
    server = postgres_server()
    role = f"app_{uuid.uuid4().hex[:8]}"
    schema = f"s_{uuid.uuid4().hex[:8]}"
    server.psql(f"CREATE ROLE {role} LOGIN; CREATE SCHEMA {schema}")
    url = f"{server.url(user=role)}?schema={schema}"
    locks = LockService.from_url(url)
    try:
        with pytest.raises(ConfigurationError, match="tenure schema --url URL"):
            await locks.acquire("job", ttl=5)
        assert server.psql(f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'") == "0\n"

        printed = _tenure_schema(url)
        assert printed.returncode == 0, printed.stderr
        assert "CREATE TABLE IF NOT EXISTS" in printed.stdout
        server.psql(printed.stdout.replace("-- GRANT", "GRANT").replace("app_user", role))

        lock = await locks.acquire("job", ttl=5)
        assert lock is not None
        assert [info.name for info in await locks.store.holders()] == ["job"]
        assert await lock.release() is True
    finally:
        await locks.close()


def test_tenure_schema_refuses_other_stores(tmp_path: Path) -> None:
    out = _tenure_schema(f"sqlite://{tmp_path}/x.db")
    assert out.returncode == 2
    assert "PostgreSQL and MySQL/MariaDB URLs only" in out.stderr
    assert not (tmp_path / "x.db").exists(), "nothing was created"


async def test_tables_of_another_schema_version_are_refused() -> None:
    server = postgres_server()
    prefix = _prefix()
    server.psql(
        f"CREATE TABLE {prefix}_meta (key text PRIMARY KEY, value text NOT NULL);"
        f"INSERT INTO {prefix}_meta VALUES ('schema_version', '99')"
    )
    async with LockService.from_url(f"{server.url()}?prefix={prefix}") as locks:
        with pytest.raises(ConfigurationError, match="schema version '99'"):
            await locks.acquire("job", ttl=5)


@pytest.mark.parametrize("old", [1, SCHEMA_VERSION - 1])  # the first; the last before
async def test_tables_of_an_older_shape_are_named_as_such(old: int) -> None:
    server = postgres_server()
    prefix = _prefix()
    server.psql(
        f"CREATE TABLE {prefix}_meta (key text PRIMARY KEY, value text NOT NULL);"
        f"INSERT INTO {prefix}_meta VALUES ('schema_version', '{old}')"
    )
    async with LockService.from_url(f"{server.url()}?prefix={prefix}") as locks:
        with pytest.raises(
            ConfigurationError,
            match=rf"older shape \(schema version {old}; this tenure uses {SCHEMA_VERSION}\)",
        ):
            await locks.acquire("job", ttl=5)


async def test_a_restart_loses_no_lease_and_fencing_keeps_increasing(
    server: PostgresServer,
) -> None:
    async with LockService.from_url(server.url()) as locks:
        lock = await locks.acquire("restart", ttl=3)
        assert lock is not None
        other = await locks.acquire("other-name", ttl=3)
        assert other is not None
        pid_before = server.proc.pid if server.proc else None
        server.restart()  # SIGKILL of every server process, then start on the same data
        assert server.proc is not None and server.proc.pid != pid_before
        # The row survived: the lease is still there, still ours, same fencing token.
        [info] = await locks.store.holders("restart")
        assert info.fencing_token == lock.fencing_token
        # The renewer's pool recovers by itself: the lock stays held past its TTL.
        await asyncio.sleep(3.5)
        assert lock.held
        assert await locks.acquire("restart", ttl=3) is None
        assert await lock.release() is True
        again = await locks.acquire("restart", ttl=3)
        assert again is not None
        assert again.fencing_token > max(lock.fencing_token, other.fencing_token)


async def test_a_dead_server_fails_closed_and_the_pool_recovers(server: PostgresServer) -> None:
    async with LockService.from_url(f"{server.url()}?timeout=1") as locks:
        first = await locks.acquire("down", ttl=1)
        assert first is not None
        await first.release()
        server._kill()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            await locks.acquire("down", ttl=1)
        assert time.monotonic() - started < 10
        assert caught.value.__cause__ is not None
        assert "Connection refused" in str(caught.value)
        # Long enough for the pool's reconnection backoff to grow past 2 s.
        await asyncio.sleep(3)
        server.start()
        # Same service: no restart of the application needed, and no waiting
        # out the pool's backoff either.
        started = time.monotonic()
        lock = await locks.acquire("down", ttl=1)
        assert time.monotonic() - started < 2.5
        assert lock is not None
        assert lock.fencing_token > first.fencing_token


async def test_renewals_right_after_a_restart_do_not_wait_out_the_pools_backoff(
    server: PostgresServer,
) -> None:
    """psycopg's pool, once its reconnections failed, waits a second and more
    before the next: a lease renewed right after the server is back would wait
    that out, and a short one expire. The store asks the server directly."""
    store = PostgresStore.from_url(server.url())
    try:
        assert await store.acquire("restart-quick", "q" * 32, 30, "me") is not None
        item = RenewItem("restart-quick", "q" * 32, 30)
        server._kill()
        (server.data / "postmaster.pid").unlink(missing_ok=True)
        killed = time.monotonic()
        # Down for 3.8 s, renewed as a renewer retries: the pool's own attempts
        # (at about 0, 1 and 3 s, then 7 s) have all failed by the time it is back.
        while time.monotonic() - killed < 3.8:
            with pytest.raises(StoreUnavailable):
                await store.renew([item])
            await asyncio.sleep(0.1)
        server.start()
        started = time.monotonic()
        assert await store.renew([item]) == [True], "the lease survived the restart"
        took = time.monotonic() - started
        assert took < 0.8, f"{took:.2f} s: waited for the pool's reconnection backoff"
    finally:
        await store.aclose()


def test_the_blocking_api_acquires_and_releases_on_the_callers_thread() -> None:
    url = f"{postgres_server().url()}?prefix={_prefix()}&pool_max=2"
    with sync.LockService.from_url(url) as locks:
        store = locks.store.blocking()
        assert isinstance(store, BlockingCalls)
        lock = locks.acquire("plain", ttl=1)
        assert lock is not None and lock.release() is True
        assert locks._portal._loop is None, "acquire and release made no hop to a loop thread"
        # Threads share the idle connections; at most pool_max stay open.
        grants: list[int] = []

        def work(i: int) -> None:
            for _ in range(20):
                got = locks.acquire(f"thread-{i}", ttl=1)
                assert got is not None
                grants.append(got.fencing_token)
                assert got.release() is True

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(grants) == 120 and len(set(grants)) == 120
        assert 1 <= len(store._idle) <= 2
        # A waiting acquire still goes through the loop thread's waiters.
        held = locks.acquire("waited-for", ttl=1)
        assert held is not None
        threading.Timer(0.3, held.release).start()
        waited = locks.acquire("waited-for", ttl=1, wait=5)
        assert waited is not None and waited.fencing_token > held.fencing_token
        assert waited.release() is True


def test_the_blocking_store_fails_closed_on_a_stopped_server(server: PostgresServer) -> None:
    """psycopg's blocking calls wait for ever on a server that stopped answering:
    the blocking store's watchdog thread severs the statement at ``timeout``."""
    with sync.LockService.from_url(f"{server.url()}?timeout=0.5") as locks:
        first = locks.acquire("paused", ttl=1)
        assert first is not None and first.release() is True
        server.pause()
        try:
            with pytest.raises(StoreUnavailable, match=r"did not answer within 0\.5 s") as caught:
                locks.acquire("paused", ttl=1)
            assert caught.value.__cause__ is not None
        finally:
            server.resume()
        # The severed acquire may still run once the server resumes (it was in
        # the server's socket buffer): a grant nobody holds, which lapses by
        # itself within its TTL.
        again = locks.acquire("paused", ttl=1, wait=3)
        assert again is not None and again.fencing_token > first.fencing_token
        assert again.release() is True


def test_the_blocking_store_rides_through_a_restart(server: PostgresServer) -> None:
    """Every idle connection dies with the server; the first statement after the
    restart drops them all and is sent once more on a new connection."""
    with sync.LockService.from_url(server.url()) as locks:
        store = locks.store.blocking()
        assert isinstance(store, BlockingCalls)
        lock = locks.acquire("restart", ttl=5)
        assert lock is not None
        taken = [store._take() for _ in range(3)]
        for conn, cur in taken:
            store._give_back(conn, cur)
        server.restart()  # SIGKILL of every server process, then start on the same data
        assert lock.release() is True
        assert all(conn.closed for conn, _ in taken), "the restart bit: they were dropped"
        again = locks.acquire("restart", ttl=5)
        assert again is not None and again.fencing_token > lock.fencing_token
        assert again.release() is True


async def test_scram_password_authentication() -> None:
    secured = PostgresServer(password="s3cret-pw")
    try:
        url = secured.url(password="s3cret-pw")
        async with LockService.from_url(url) as locks:
            assert "s3cret-pw" not in locks.store.describe()
            lock = await locks.acquire("auth", ttl=1)
            assert lock is not None
            await asyncio.sleep(0.5)  # a renewal, over the renewer's own pool
            assert lock.held
            assert await lock.release() is True
        wrong = LockService.from_url(secured.url(password="wrong-pw"))
        with pytest.raises(StoreUnavailable, match="password authentication failed") as caught:
            await wrong.acquire("auth", ttl=1)
        assert "wrong-pw" not in str(caught.value)
        await wrong.close()
    finally:
        secured.stop()


async def test_through_pgbouncer_in_transaction_pooling_mode() -> None:
    server = postgres_server()
    bouncer = PgBouncer(server)
    prefix = _prefix()
    url = f"{bouncer.url}?pooler=transaction&prefix={prefix}"
    try:
        services = [LockService.from_url(url) for _ in range(3)]
        try:
            # 3 services x up to 10 connections share pgbouncer's 2 server
            # connections: statements of one client land on several backends.
            names = [f"job-{i}" for i in range(30)]
            grants = await asyncio.gather(*(s.acquire(n, ttl=1) for s in services for n in names))
            assert sum(g is not None for g in grants) == len(names)
            held = [g for g in grants if g is not None]
            await asyncio.sleep(1.5)  # renewals, through the pooler
            assert all(lock.held for lock in held)
            backends = server.psql(
                "SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE backend_type ="
                " 'client backend' AND application_name = ''"
            )
            assert 1 <= int(backends) <= 3, "pgbouncer multiplexed the clients"
            # A waiter without LISTEN re-checks at least every half second.
            first = held[0]
            waiting = asyncio.ensure_future(services[1].acquire(first.name, ttl=1, wait=5))
            await asyncio.sleep(0.2)
            released = time.monotonic()
            assert await first.release() is True
            got = await waiting
            assert got is not None
            assert time.monotonic() - released < 1.5
            assert all(await asyncio.gather(*(lock.release() for lock in held[1:])))
            # tenure.sync's blocking connections through the pooler, from
            # threads at once so that their statements land on both backends:
            # no prepared statements there either.
            with sync.LockService.from_url(url) as blocking:

                def cycles(i: int) -> None:
                    for _ in range(25):
                        plain = blocking.acquire(f"blocking-{i}", ttl=1)
                        assert plain is not None and plain.release() is True

                await asyncio.gather(*(asyncio.to_thread(cycles, i) for i in range(4)))
        finally:
            for service in services:
                await service.close()
        # With a direct session connection for LISTEN, waiters are notified.
        listen = quote(f"{server.url()}", safe="")
        async with (
            LockService.from_url(f"{url}&listen_url={listen}") as one,
            LockService.from_url(f"{url}&listen_url={listen}") as two,
        ):
            lock = await one.acquire("notified", ttl=30)
            assert lock is not None
            waiting = asyncio.ensure_future(two.acquire("notified", ttl=30, wait=10))
            await asyncio.sleep(0.3)
            released = time.monotonic()
            await lock.release()
            assert await waiting is not None
            assert time.monotonic() - released < 0.4
    finally:
        bouncer.stop()


def _listeners(server: PostgresServer, prefix: str) -> list[str]:
    """The backends that LISTEN on a store's channel (pids)."""
    return server.psql(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
        f" AND query = 'LISTEN \"{prefix}_released\"'"
    ).split()


@contextlib.asynccontextmanager
async def _held_and_awaited(
    name: str,
) -> AsyncIterator[tuple[PostgresServer, str, Lock, asyncio.Future[Lock | None]]]:
    """One service holds ``name``, another's waiter is queued for it and
    listening; on leaving, the release hands it over."""
    server = postgres_server()
    prefix = _prefix()
    url = f"{server.url()}?prefix={prefix}"
    async with LockService.from_url(url) as one, LockService.from_url(url) as two:
        lock = await one.acquire(name, ttl=30)
        assert lock is not None
        waiting = asyncio.ensure_future(two.acquire(name, ttl=30, wait=20))
        queued = f"SELECT next_waiter FROM {prefix}_leases WHERE name = '{name}'"
        await until(
            lambda: bool(_listeners(server, prefix) and server.psql(queued).strip()),
            "the waiter listens and is queued",
            timeout=5.0,
        )
        assert len(_listeners(server, prefix)) == 1, "the waiter listens"
        assert server.psql(queued).strip(), "the waiter is queued"
        yield server, prefix, lock, waiting
        assert not waiting.done()
        await lock.release()
        handed = await waiting
        assert handed is not None and handed.fencing_token > lock.fencing_token
        await handed.release()


async def test_a_waiter_whose_listen_connection_is_cut_listens_again_and_is_handed_the_lock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG", logger="tenure.stores.postgres")
    async with _held_and_awaited("cut") as (server, prefix, _, _):
        first = _listeners(server, prefix)
        ended = server.psql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = {first[0]}"
        )
        assert ended.strip() == "t"
        # The cut wakes the waiter, which listens again on a new connection.
        await until(
            lambda: _listeners(server, prefix) not in ([], first),
            "a new LISTEN connection",
            timeout=5.0,
        )
        assert _listeners(server, prefix) not in ([], first), "a new LISTEN connection"
        assert "LISTEN connection failed" in caplog.text


async def test_notes_of_another_shape_on_the_channel_do_not_stop_the_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _held_and_awaited("odd") as (server, prefix, _, _):
        listener = _listeners(server, prefix)
        waiter = server.psql(f"SELECT next_waiter FROM {prefix}_leases WHERE name = 'odd'")
        # Someone else's NOTIFYs on tenure's channel: a grant's shape for this
        # very waiter with words for numbers, too few fields, too many, none.
        for payload in (f"odd\\t{waiter.strip()}\\tx\\ty", "odd\\tw", "odd\\ta\\tb\\tc\\td", ""):
            server.psql(f"NOTIFY \"{prefix}_released\", E'{payload}'")
        await asyncio.sleep(0.3)
        assert _listeners(server, prefix) == listener, "the same LISTEN connection"
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert not errors, "nothing failed reading them"


HOSTILE_NAMES = [
    "it's",
    'say "hi"',
    "a; DROP TABLE tenure_leases; --",
    "$1 %s %(x)s {}",
    "ünïcødé ✓ 名前",
    "x" * 255,
    "é" * 127,  # 254 bytes
]


async def test_hostile_names_are_only_ever_parameters() -> None:
    async with LockService.from_url(f"{postgres_server().url()}?prefix={_prefix()}") as locks:
        held = []
        for name in HOSTILE_NAMES:
            lock = await locks.acquire(name, ttl=5)
            assert lock is not None, name
            assert await locks.acquire(name, ttl=5) is None
            held.append(lock)
        infos = await locks.store.holders()
        assert [info.name for info in infos] == sorted(HOSTILE_NAMES)
        assert [info.name for info in await locks.store.holders("it'")] == ["it's"]
        assert all([await lock.release() for lock in held])


@pytest.mark.parametrize(
    ("schema", "prefix"),
    [
        ('we"ird', "p'; DROP TABLE x; --"),
        ("ünï cødé", "名前"),
        ("public", "a" * 40),
    ],
)
async def test_hostile_schema_and_prefix_are_quoted_identifiers(schema: str, prefix: str) -> None:
    server = postgres_server()
    tag = uuid.uuid4().hex[:6]
    schema = f"{schema}{tag}" if schema != "public" else schema
    prefix = f"{prefix[:34]}{tag}"
    url = f"{server.url()}?schema={quote(schema)}&prefix={quote(prefix)}"
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("job", ttl=5)
        assert lock is not None
        assert await lock.release() is True
    escaped = schema.replace("'", "''")
    tables = server.psql(
        f"SELECT tablename FROM pg_tables WHERE schemaname = '{escaped}' ORDER BY 1"
    ).splitlines()
    assert {f"{prefix}_{t}" for t in ("leases", "claims", "runs", "meta")} <= set(tables)


async def test_pruned_rows_never_let_a_fencing_token_repeat() -> None:
    server = postgres_server()
    prefix = _prefix()
    async with LockService.from_url(f"{server.url()}?prefix={prefix}") as locks:
        lock = await locks.acquire("pruned", ttl=1)
        assert lock is not None
        await lock.release()
        assert await locks.store.prune(keep_runs=10) == 0, "a fresh row is kept a while"
        server.psql(f"UPDATE {prefix}_leases SET expires = expires - interval '1 hour'")
        assert await locks.store.prune(keep_runs=10) == 1
        assert server.psql(f"SELECT count(*) FROM {prefix}_leases") == "0\n"
        again = await locks.acquire("pruned", ttl=1)
        assert again is not None
        assert again.fencing_token > lock.fencing_token


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://127.0.0.1/db?pooler=statement", "pooler must be"),
        ("postgresql://127.0.0.1/db?timeout=soon", "timeout must be a number"),
        ("postgresql://127.0.0.1/db?timeout=0", "timeout must be between"),
        ("postgresql://127.0.0.1/db?pool_max=0", "pool_max must be a whole number from 1"),
        ("postgresql://127.0.0.1/db?pool_max=1001", "pool_max must be a whole number from 1"),
        ("postgresql://127.0.0.1/db?pool_max=2.5", "pool_max must be a whole number"),
        ("postgresql://127.0.0.1/db?prefix=", "table prefix"),
        ("postgresql://127.0.0.1/db?prefix=" + "a" * 41, "table prefix"),
        ("postgresql://127.0.0.1/db?schema=", "schema"),
        ("postgresql://u:hunter2@127.0.0.1/db?color=blue", "color"),
    ],
)
def test_bad_postgres_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        LockService.from_url(url)
    assert "hunter2" not in str(caught.value)


def test_both_schemes_and_the_url_the_store_keeps() -> None:
    store = PostgresStore.from_url("postgres://u:pw@127.0.0.1:5/db?sslmode=disable&prefix=app")
    assert isinstance(store, PostgresStore)
    assert store.prefix == "app"
    assert store.describe() == (
        "postgresql://u:***@127.0.0.1:5/db?sslmode=disable&connect_timeout=2"
    )
