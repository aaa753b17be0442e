"""What only the Redis store has to show: ACLs, restarts, scripts, hash tags, its URLs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import hiredis
import pytest
import redis
from redis.asyncio import Redis
from redis.crc import key_slot

from tenure import ConfigurationError, LockService, StoreUnavailable, sync
from tenure.lease import LOST_BY_STORE
from tenure.stores.redis import RedisStore, version_numbers
from tenure.stores.redis.blocking import BlockingCalls
from tenure.stores.redis.scripts import packed_here
from tenure.stores.semaphores import Queued

from ..conftest import STORES
from ..helpers.procs import ROOT
from ..servers import RedisClusterServers, RedisServer, self_signed_cert


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A server of the test's own, which it may restart."""
    own = RedisServer()
    yield own
    own.stop()


async def test_acl_user_with_password() -> None:
    acl = RedisServer(
        *("--user", "default", "off"),
        *("--user", "app", "on", ">s3cret-pass", "~*", "&*", "+@all"),
    )
    try:
        url = f"redis://app:s3cret-pass@127.0.0.1:{acl.port}/0"
        async with LockService.from_url(url) as locks:
            lock = await locks.acquire("acl", ttl=1)
            assert lock is not None
            assert await lock.release() is True
            assert "s3cret-pass" not in locks.store.describe()
        wrong = LockService.from_url(f"redis://app:wrong-pass@127.0.0.1:{acl.port}/0")
        with pytest.raises(StoreUnavailable) as caught:
            await wrong.acquire("acl", ttl=1)
        assert "wrong-pass" not in str(caught.value)
        await wrong.close()
    finally:
        acl.stop()


async def test_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    tls = RedisServer(tls=self_signed_cert(tmp_path))
    try:
        assert tls.url.startswith("rediss://")
        async with LockService.from_url(tls.url) as locks:
            lock = await locks.acquire("tls", ttl=1)
            assert lock is not None
            await asyncio.sleep(0.5)  # a renewal, on the renewer's own TLS connection
            assert lock.held
            assert await lock.release() is True
        # Without the CA the handshake fails: the connection really is TLS.
        plain_ca = tls.url.split("?")[0] + "?ssl_cert_reqs=required"
        async with LockService.from_url(plain_ca) as strict:
            with pytest.raises(StoreUnavailable):
                await strict.acquire("tls", ttl=1)
    finally:
        tls.stop()


def test_a_unix_socket_with_a_database_number_and_query_options(tmp_path: Path) -> None:
    """``unix://`` with ``?db=`` and redis-py's own options, on both APIs: the
    keys land in that database, with the prefix the URL names, and nowhere else."""
    sock = tmp_path / "redis.sock"
    own = RedisServer("--unixsocket", str(sock), "--unixsocketperm", "700")
    try:
        url = f"unix://{sock}?db=3&socket_timeout=1.5&prefix=app"

        async def asyncio_api() -> int:
            async with LockService.from_url(url) as locks:
                lock = await locks.acquire("over-unix", ttl=1)
                assert lock is not None
                await asyncio.sleep(0.5)  # a renewal, on the renewer's own connection
                assert lock.held
                assert [i.name for i in await locks.store.holders()] == ["over-unix"]
                assert await lock.release() is True
                return lock.fencing_token

        first = asyncio.run(asyncio_api())
        with sync.LockService.from_url(url) as blocking:
            again = blocking.acquire("over-unix", ttl=1)
            assert again is not None and again.fencing_token > first
            in_db3 = redis.Redis(unix_socket_path=str(sock), db=3)
            in_db0 = redis.Redis(unix_socket_path=str(sock), db=0)
            try:
                assert sorted(in_db3.keys()) == [b"{app:over-unix}:fence", b"{app:over-unix}:lease"]
                assert in_db0.keys() == []
            finally:
                in_db3.close()
                in_db0.close()
            assert again.release() is True
    finally:
        own.stop()


async def test_fencing_keeps_increasing_across_an_empty_restart(server: RedisServer) -> None:
    async with LockService.from_url(server.url) as locks:
        lock = await locks.acquire("restart", ttl=1)
        assert lock is not None
        before = lock.fencing_token
        server.restart()  # no persistence: the server comes back empty
        async with LockService.from_url(server.url) as other:
            # What Redis without persistence cannot keep: the lease itself is
            # forgotten, so another client gets it while the first still holds.
            stolen = await other.acquire("restart", ttl=1)
            assert stolen is not None, "the restart bit: the lease was forgotten"
            assert stolen.fencing_token > before
            # The first holder's next renewal finds its token gone: signalled, not hidden.
            await asyncio.wait_for(lock.wait_lost(), 5)
            assert lock.lost_reason == LOST_BY_STORE
            assert await lock.release() is False
            assert stolen.held


async def test_permits_and_terms_are_forgotten_in_an_empty_restart(server: RedisServer) -> None:
    async with LockService.from_url(server.url) as locks:
        permit = await locks.semaphore("restart", 1).acquire(ttl=1)
        term = await locks.election("restart").campaign(ttl=1)
        assert permit is not None and term is not None
        server.restart()
        async with LockService.from_url(server.url) as other:
            again = await other.semaphore("restart", 1).acquire(ttl=1)
            elected = await other.election("restart").campaign(ttl=1, wait=0)
            assert again is not None and elected is not None, "the restart bit"
            assert again.fencing_token > permit.fencing_token
            assert elected.fencing_token > term.fencing_token
            for lost in (permit, term):
                await asyncio.wait_for(lost.wait_lost(), 5)
                assert lost.lost_reason == LOST_BY_STORE
            assert await permit.release() is False and await term.resign() is False
            assert again.held and elected.held


async def test_a_wait_whose_subscribe_the_server_cut_starts_afresh(server: RedisServer) -> None:
    """A SUBSCRIBE that fails under a restart leaves no half-open pub/sub
    behind: the next waiter subscribes anew and closing the service is clean
    (it once raised the listener's "pubsub connection not set")."""
    async with LockService.from_url(server.url) as holding:
        permit = await holding.semaphore("cut", 1).acquire(ttl=30)
        assert permit is not None
        async with LockService.from_url(server.url) as waiting:
            semaphore = waiting.semaphore("cut", 1)
            server._kill()
            with pytest.raises(StoreUnavailable):  # its SUBSCRIBE is what fails
                await semaphore.acquire(ttl=1, wait=5)
            server.start()  # empty: the permit is forgotten
            freed = await holding.semaphore("cut", 1).acquire(ttl=30)
            assert freed is not None
            store, token = waiting.store.semaphores, uuid.uuid4().hex
            async with store.changes("cut") as changes:
                queued = await store.acquire("cut", token, 1, waiting.holder, 1, queue=30)
                assert isinstance(queued, Queued)
                woken = asyncio.ensure_future(changes.wait(3600))
                await asyncio.sleep(0.1)
                assert not woken.done(), "woken by nothing: its pub/sub is broken"
                await freed.release()
                await asyncio.wait_for(woken, 10)  # heard: it subscribed anew
            assert await store.release("cut", token) is False  # queued, never granted
        assert permit.lost or await permit.release() is False


async def test_scripts_are_reloaded_when_the_server_forgot_them(server: RedisServer) -> None:
    async with LockService.from_url(server.url) as locks:
        first = await locks.acquire("noscript", ttl=1)
        assert first is not None
        await first.release()
        client = Redis.from_url(server.url)
        await client.script_flush()
        await client.aclose()
        again = await locks.acquire("noscript", ttl=1)
        assert again is not None
        assert again.fencing_token > first.fencing_token


def test_the_blocking_store_reloads_scripts_and_reconnects(server: RedisServer) -> None:
    """tenure.sync sends its scripts pre-encoded on idle connections of its own:
    a flushed script cache and a restart (every idle connection broken) must
    each cost one retry, not an error."""
    with sync.LockService.from_url(server.url) as locks:
        first = locks.acquire("blocking", ttl=1)
        assert first is not None and first.release() is True
        plain = redis.Redis.from_url(server.url)
        plain.script_flush()
        plain.close()
        again = locks.acquire("blocking", ttl=1)
        assert again is not None and again.fencing_token > first.fencing_token
        assert again.release() is True
        server.restart()
        after = locks.acquire("blocking", ttl=1)
        assert after is not None and after.fencing_token > again.fencing_token
        assert after.release() is True


async def test_keys_of_one_lock_share_a_hash_slot(server: RedisServer) -> None:
    async with LockService.from_url(f"{server.url}?prefix=app1") as locks:
        assert await locks.acquire("orders:42", ttl=1) is not None
        client = Redis.from_url(server.url)
        raw: list[bytes] = await client.keys("*orders:42*")  # type: ignore[assignment]
        keys = sorted(k.decode() for k in raw)
        await client.aclose()
    tag = "{app1:orders:42}"
    assert keys == [f"{tag}:fence", f"{tag}:lease"]
    # With waiters: the queue entry, the hand-over list and the release channel
    # (the cluster hand-over tests show scripts touch them without CROSSSLOT).
    names = [*keys, f"{tag}:next", f"{tag}:handed", f"{tag}:released"]
    assert len({key_slot(k.encode()) for k in names}) == 1


async def test_prefixes_separate_applications(server: RedisServer) -> None:
    async with (
        LockService.from_url(f"{server.url}?prefix=one") as one,
        LockService.from_url(f"{server.url}?prefix=two") as two,
    ):
        assert await one.acquire("shared-name", ttl=1) is not None
        assert await two.acquire("shared-name", ttl=1) is not None
        assert [i.name for i in await one.store.holders()] == ["shared-name"]


async def test_glob_characters_in_names_do_not_leak_into_holders(server: RedisServer) -> None:
    async with LockService.from_url(server.url) as locks:
        for name in ("a*", "a[b]", "ab", "a?c"):
            assert await locks.acquire(name, ttl=1) is not None
        assert [i.name for i in await locks.store.holders("a*")] == ["a*"]
        assert [i.name for i in await locks.store.holders("a[")] == ["a[b]"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:notaport/0", "bad Redis URL"),
        ("redis://127.0.0.1:6379/0?prefix={x}", "braces"),
        ("redis://127.0.0.1:6379/0?pool_max=0", "pool_max must be a whole number from 1"),
        ("redis://127.0.0.1:6379/0?pool_max=ten", "pool_max must be a whole number"),
        ("redis://127.0.0.1:6379/0?socket_timeout=later", "socket_timeout must be a number"),
        ("redis://127.0.0.1:6379/0?socket_timeout=0", "socket_timeout must be between"),
    ],
)
def test_bad_redis_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        RedisStore.from_url(url)


def test_a_missing_driver_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['redis'] = None\n"
        "from tenure import LockService, ConfigurationError\n"
        "try:\n"
        "    LockService.from_url('redis://127.0.0.1:1/0')\n"
        "except ConfigurationError as e:\n"
        "    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "pip install 'tenure[redis]'" in out


@pytest.mark.parametrize("version", ["7.4.0", "8.0.1", "8.1.0", "8.1.0rc1"])
def test_redis_cluster_on_an_older_redis_py_is_refused(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Before 8.0 redis-py's asyncio cluster client has no pub/sub, which waiters
    need; 8.0 and 8.1 disconnect pooled connections under commands in flight
    (seen here as AttributeError and "Connection closed by server" with eight
    threads contending): refused at start-up, not at the first failure."""
    monkeypatch.setattr(redis, "__version__", version)
    with pytest.raises(ConfigurationError, match=rf"redis-py 8\.2 or newer.*this is {version}"):
        LockService.from_url("redis://127.0.0.1:7000/0?cluster=true")
    # A single server has no such limit.
    LockService.from_url("redis://127.0.0.1:7000/0")


@pytest.mark.parametrize(
    ("version", "release"),
    [("8.2.0", (8, 2, 0)), ("8.10.1", (8, 10, 1)), ("9.0.0b2", (9, 0, 0)), ("10", (10,))],
)
def test_redis_py_versions_compare_as_numbers(version: str, release: tuple[int, ...]) -> None:
    assert version_numbers(version) == release


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
async def test_holders_lists_every_lease_across_pipeline_batches(kind: str, tmp_path: Path) -> None:
    """``holders()`` (``tenure locks``) reads the leases 500 to a pipeline:
    more than two batches, on one server and across a cluster's nodes."""
    store = RedisStore.from_url(STORES[kind].make_url(tmp_path))
    try:
        fences = {}
        for i in range(1100):  # three batches
            grant = await store.acquire(f"many:{i:04d}", f"token-{i}", 30.0, f"host:{i}")
            assert grant is not None
            fences[f"many:{i:04d}"] = grant.fencing_token
        assert await store.acquire("other", "t", 30.0, "h") is not None
        assert await store.release("many:0007", "token-7") is True
        infos = await store.holders("many:")
        assert [info.name for info in infos] == sorted(set(fences) - {"many:0007"})
        for info in infos:
            assert info.fencing_token == fences[info.name]
            assert info.holder == f"host:{int(info.name[5:])}"
            assert 0 < info.expires_in <= 30
    finally:
        await store.aclose()


def _move_slot(cluster: RedisClusterServers, slot: int, source: int, target: int) -> None:
    """Move ``slot``, with its keys, from the master on port ``source`` to ``target``."""

    def cli(port: int, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(port), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    source_id, target_id = cli(source, "cluster", "myid"), cli(target, "cluster", "myid")
    assert cli(target, "cluster", "setslot", str(slot), "importing", source_id) == "OK"
    assert cli(source, "cluster", "setslot", str(slot), "migrating", target_id) == "OK"
    keys = cli(source, "cluster", "getkeysinslot", str(slot), "100").split()
    assert keys, "the slot holds the lock's keys"
    migrate = ("migrate", "127.0.0.1", str(target), "", "0", "5000", "keys", *keys)
    assert cli(source, *migrate) == "OK"
    for node in cluster.nodes:
        assert cli(node.port, "cluster", "setslot", str(slot), "node", target_id) == "OK"


async def test_the_cluster_lanes_follow_a_slot_that_moved() -> None:
    """Scripts go pre-encoded on a lane pinned to the node that serves their slot.
    One sent there after the slot moved is refused (MOVED: it did not run) and
    goes the general way, which follows the move; later calls use the new
    node's lane."""
    cluster = RedisClusterServers()
    try:
        async with LockService.from_url(f"{cluster.url}&prefix=mv") as locks:
            store = locks.store
            assert isinstance(store, RedisStore)
            await store.warm_up()  # the slot map: the first call loads it, the general way
            lock = await locks.acquire("moving", ttl=5)
            assert lock is not None
            key = "{mv:moving}:lease"
            source = store.transport.client.get_node_from_key(key)
            assert store.transport._node_lanes[source.name].conn is not None, (
                "the acquire took the lane"
            )
            target = next(node.port for node in cluster.nodes if node.port != int(source.port))
            _move_slot(cluster, key_slot(key.encode()), int(source.port), target)
            assert int(store.transport.client.get_node_from_key(key).port) == int(source.port)
            assert await lock.release() is True
            moved = store.transport.client.get_node_from_key(key)
            assert int(moved.port) == target, "the release met MOVED and followed it"
            again = await locks.acquire("moving", ttl=5)
            assert again is not None and again.fencing_token > lock.fencing_token
            assert store.transport._node_lanes[moved.name].conn is not None, "the new node's lane"
            assert await again.release() is True
        # The same for tenure.sync's blocking lanes (idle connections per node).
        with sync.LockService.from_url(f"{cluster.url}&prefix=mv") as blocking:
            bstore = blocking.store.blocking()
            assert isinstance(bstore, BlockingCalls)
            first = blocking.acquire("moving", ttl=5)
            assert first is not None
            here = bstore.client.get_node_from_key(key)
            assert bstore._node_idle[here.name][1], "the acquire went on the node's lane"
            there = next(node.port for node in cluster.nodes if node.port != int(here.port))
            _move_slot(cluster, key_slot(key.encode()), int(here.port), there)
            assert first.release() is True
            followed = bstore.client.get_node_from_key(key)
            assert int(followed.port) == there, "the release met MOVED and followed it"
            later = blocking.acquire("moving", ttl=5)
            assert later is not None and later.fencing_token > first.fencing_token
            assert bstore._node_idle[followed.name][1], "the new node's lane"
            assert later.release() is True
    finally:
        cluster.stop()


async def test_a_claim_of_an_older_shape_is_named_as_such(server: RedisServer) -> None:
    prefix = "older"
    client = Redis.from_url(server.url)
    await client.set(f"{{{prefix}:claims}}:job", "60.0")  # before claims named their claimant
    await client.aclose()
    store = RedisStore.from_url(f"{server.url}?prefix={prefix}")
    try:
        # The read that skips lost starts does not decide it: the claim says what is wrong.
        assert await store.runlog.claimed_already([("job", 120.0)]) == [False]
        with pytest.raises(StoreUnavailable, match="older shape"):
            await store.runlog.claim_occurrence("job", 120.0, "host:1:me")
    finally:
        await store.aclose()


def test_commands_are_encoded_alike_with_and_without_hiredis() -> None:
    """The pre-encoded script calls use hiredis's packer when it is installed,
    else tenure's own: both give redis-py's bytes (a float as its repr)."""
    parts = ("EVALSHA", b"\x00sha", 2, "{t:é}:lease", 1733400000.123456, 1e-07, 1 / 3, -5, "")
    assert packed_here(parts) == hiredis.pack_command(parts)  # type: ignore[arg-type]
    assert packed_here(("a", 0.5)) == b"*2\r\n$1\r\na\r\n$3\r\n0.5\r\n"
