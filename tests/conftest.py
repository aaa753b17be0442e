"""Shared fixtures: one store fixture parametrized over every store.

A store joins the whole contract suite by adding an entry to STORES: a
function that makes a fresh URL for one test, and an outage context manager
that makes the store unreachable for as long as it is entered (a real fault:
a lock the store's own connections wait on, not a mock).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tenure import LockService
from tenure.stores import Store
from tenure.stores.memory import MemoryStore
from tenure.stores.sqlite import SQLiteStore

from .mysql_server import MariaDBServer
from .sentinel_servers import RedisSentinels
from .servers import EtcdCluster, PostgresServer, RedisClusterServers, RedisServer


@dataclass(frozen=True)
class StoreKind:
    name: str
    make_url: Callable[[Path], str]
    outage: Callable[[Store], AbstractContextManager[None]]
    cross_process: bool


@contextlib.contextmanager
def _memory_outage(store: Store) -> Iterator[None]:
    """Hold the memory store's mutex on another thread: every call blocks."""
    assert isinstance(store, MemoryStore)
    taken = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with store._mutex:
            taken.set()
            done.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    taken.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def _sqlite_outage(store: Store) -> Iterator[None]:
    """Hold an exclusive lock on the database from another connection."""
    assert isinstance(store, SQLiteStore)
    conn = sqlite3.connect(store.path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


_sessions: dict[type[Any], Any] = {}
"""Servers started once for the whole session, at first use; tests use their own prefix."""

S = TypeVar(
    "S",
    RedisServer,
    RedisClusterServers,
    PostgresServer,
    EtcdCluster,
    RedisSentinels,
    MariaDBServer,
)


def _session_server(kind: type[S]) -> S:
    server: S | None = _sessions.get(kind)
    if server is None:
        server = _sessions[kind] = kind()
    return server


def redis_server() -> RedisServer:
    return _session_server(RedisServer)


def redis_cluster() -> RedisClusterServers:
    """A three-master Redis Cluster."""
    return _session_server(RedisClusterServers)


def redis_sentinels() -> RedisSentinels:
    """A Redis master, its replica and three sentinels."""
    return _session_server(RedisSentinels)


def mariadb_server() -> MariaDBServer:
    return _session_server(MariaDBServer)


def postgres_server() -> PostgresServer:
    return _session_server(PostgresServer)


def etcd_cluster() -> EtcdCluster:
    """A three-member etcd cluster."""
    return _session_server(EtcdCluster)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        type=int,
        default=1,
        metavar="N",
        help="fault suite: run each scenario N times and the contention runs N times longer",
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    for server in _sessions.values():
        server.stop()


@contextlib.contextmanager
def _paused(
    servers: RedisServer
    | RedisClusterServers
    | PostgresServer
    | EtcdCluster
    | RedisSentinels
    | MariaDBServer,
) -> Iterator[None]:
    """SIGSTOP the server(s): connections stay open and nothing answers."""
    servers.pause()
    try:
        yield
    finally:
        servers.resume()


def _redis_outage(store: Store) -> AbstractContextManager[None]:
    return _paused(redis_server())


def _cluster_outage(store: Store) -> AbstractContextManager[None]:
    return _paused(redis_cluster())


def _sentinel_outage(store: Store) -> AbstractContextManager[None]:
    return _paused(redis_sentinels())


def _postgres_outage(store: Store) -> AbstractContextManager[None]:
    return _paused(postgres_server())


def _mariadb_outage(store: Store) -> AbstractContextManager[None]:
    return _paused(mariadb_server())


def _etcd_outage(store: Store) -> AbstractContextManager[None]:
    return _paused(etcd_cluster())


STORES: dict[str, StoreKind] = {
    "memory": StoreKind(
        "memory", lambda tmp: f"memory://test-{uuid.uuid4().hex}", _memory_outage, False
    ),
    "sqlite": StoreKind(
        "sqlite", lambda tmp: f"sqlite://{tmp}/locks.db?busy_timeout=0.1", _sqlite_outage, True
    ),
    "redis": StoreKind(
        "redis",
        lambda tmp: f"{redis_server().url}?prefix=t{uuid.uuid4().hex[:12]}",
        _redis_outage,
        True,
    ),
    "redis-cluster": StoreKind(
        "redis-cluster",
        lambda tmp: f"{redis_cluster().url}&prefix=t{uuid.uuid4().hex[:12]}",
        _cluster_outage,
        True,
    ),
    "postgres": StoreKind(
        "postgres",
        lambda tmp: f"{postgres_server().url()}?prefix=t{uuid.uuid4().hex[:12]}",
        _postgres_outage,
        True,
    ),
    "mysql": StoreKind(
        "mysql",
        lambda tmp: f"{mariadb_server().url()}?prefix=t{uuid.uuid4().hex[:12]}",
        _mariadb_outage,
        True,
    ),
    "etcd": StoreKind(
        "etcd",
        lambda tmp: f"{etcd_cluster().url}?prefix=t{uuid.uuid4().hex[:12]}",
        _etcd_outage,
        True,
    ),
}


CONTRACT_ONLY: dict[str, StoreKind] = {
    # The contract suite's (tests/contract/conftest.py) only: the rest runs on
    # a single Redis, the same store code.
    "redis-sentinel": StoreKind(
        "redis-sentinel",
        lambda tmp: f"{redis_sentinels().url}?prefix=t{uuid.uuid4().hex[:12]}",
        _sentinel_outage,
        True,
    ),
}


def store_fixtures(table: dict[str, StoreKind]) -> tuple[Any, Any]:
    """The ``kind`` and ``shared_kind`` fixtures over ``table``'s stores (a
    conftest below this one may serve other stores with its own)."""

    @pytest.fixture(params=sorted(table))
    def kind(request: pytest.FixtureRequest) -> StoreKind:
        return table[request.param]

    @pytest.fixture(params=sorted(k for k, v in table.items() if v.cross_process))
    def shared_kind(request: pytest.FixtureRequest) -> StoreKind:
        """Only the stores that several processes can share."""
        return table[request.param]

    return kind, shared_kind


kind, shared_kind = store_fixtures(STORES)


@pytest.fixture
def url(kind: StoreKind, tmp_path: Path) -> str:
    return kind.make_url(tmp_path)


@pytest.fixture
def shared_url(shared_kind: StoreKind, tmp_path: Path) -> str:
    return shared_kind.make_url(tmp_path)


@pytest.fixture
async def locks(url: str) -> AsyncIterator[LockService]:
    async with LockService.from_url(url) as service:
        yield service


@pytest.fixture
async def other(url: str) -> AsyncIterator[LockService]:
    """A second service on the same store: another instance of the application."""
    async with LockService.from_url(url) as service:
        yield service
