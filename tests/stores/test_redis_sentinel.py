"""What only Redis under Sentinel has: its URL, credentials of its own, how a
call fails when no sentinel answers, and what ``tenure doctor`` says of its
replication. (The contract suite runs on it
too, tests/contract/conftest.py; failovers are in tests/faults.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tenure import ConfigurationError, LockService, StoreUnavailable
from tenure.stores import from_url

from ..conftest import redis_sentinels
from ..faults.proxy import Proxy
from ..helpers.procs import ROOT
from ..sentinel_servers import SERVICE, RedisSentinels, client


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://127.0.0.1:26379", "no service name"),
        ("redis+sentinel://127.0.0.1:26379/", "no service name"),
        ("redis+sentinel:///mymaster", "no sentinel host:port"),
        ("redis+sentinel://127.0.0.1:99999/mymaster", "bad sentinel address '127.0.0.1:99999'"),
        ("redis+sentinel://127.0.0.1:x/mymaster", "bad sentinel address"),
        ("redis+sentinel://127.0.0.1:26379/mymaster/zero", "database 'zero'"),
        ("redis+sentinel://127.0.0.1:26379/mymaster?ssl_cert_reqs=none", "'ssl_cert_reqs'"),
        ("redis+sentinel://127.0.0.1:26379/mymaster?socket_timeout=0", "socket_timeout"),
        ("redis+sentinel://127.0.0.1:26379/mymaster?cluster=true", "cluster=true does not go"),
    ],
)
def test_bad_sentinel_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        from_url(url)
    assert says in str(raised.value)


def test_every_password_is_masked() -> None:
    store = from_url(
        "redis+sentinel://app:s3cret@127.0.0.1:26379,127.0.0.1:26380/mymaster"
        "?sentinel_password=t0ken&prefix=x"
    )
    described = store.describe()
    assert "s3cret" not in described and "t0ken" not in described, described
    assert described.startswith("redis+sentinel://app:***@127.0.0.1:26379,127.0.0.1:26380/")
    assert "sentinel_password=***" in described


async def test_passwords_of_the_master_and_of_the_sentinels() -> None:
    servers = RedisSentinels(password="m4ster", sentinel_password="s3ntinel")
    try:
        async with LockService.from_url(f"{servers.url}&prefix=auth") as locks:
            lock = await locks.acquire("guarded", ttl=5)
            assert lock is not None and await lock.release()
        wrong = servers.url.replace("s3ntinel", "wrong")
        async with LockService.from_url(wrong) as locks:
            with pytest.raises(StoreUnavailable) as raised:
                await locks.acquire("guarded", ttl=5)
        message = str(raised.value)
        assert "No master found" in message and "wrong" not in message, message
    finally:
        servers.stop()


async def test_doctor_on_sentinel_names_replication_and_clocks() -> None:
    servers = redis_sentinels()
    url = f"{servers.url}?prefix=doctor"
    async with LockService.from_url(url) as locks:
        found = await locks.store.diagnose()
    texts = [f"{f.level}: {f.what}" for f in found]
    assert any(t.startswith("warn: min-replicas-to-write is 0") for t in texts), texts
    replica = f"replica 127.0.0.1:{servers.replica.port}'s clock is within"
    assert any(t.startswith(f"ok: {replica}") for t in texts), texts
    master = servers.master_port()
    with client(master) as direct:
        direct.config_set("min-replicas-to-write", 1)
    try:
        shown = subprocess.run(
            [sys.executable, "-m", "tenure", "doctor", "--url", url],
            check=False,  # (its exit status says whether anything was unsafe)
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    finally:
        with client(master) as direct:
            direct.config_set("min-replicas-to-write", 0)
    said = " ".join(shown.stdout.split())  # (wrapped at 80 columns)
    assert "min-replicas-to-write is 1" in said, shown.stdout + shown.stderr
    assert SERVICE in said, "the doctor names the store it checked"


async def test_sentinels_that_do_not_answer_are_asked_by_one_connection_only() -> None:
    """A new connection asks every sentinel for the master, twice (its own retry),
    each within a share of the timeout; when none answers, the call fails then.
    The store's retry on a broken connection used to ask them all once more,
    doubling the wait (two timeouts instead of one)."""
    servers = redis_sentinels()
    proxies = [Proxy(port) for port in servers.ports]
    hosts = ",".join(f"127.0.0.1:{proxy.port}" for proxy in proxies)
    store = from_url(f"redis+sentinel://{hosts}/{SERVICE}?socket_timeout=1.2&prefix=unanswered")
    try:
        for proxy in proxies:
            proxy.set_mode("blackhole")
        with pytest.raises(StoreUnavailable) as raised:
            await store.acquire("anything", "a" * 32, 5, "me")
        message = str(raised.value)
        assert "No master found for" in message and "<redis" not in message, message
        assert message.count("Timeout reading from") == 3, "each sentinel's answer, once"
        assert all(proxy.dropped > 0 for proxy in proxies), "each sentinel was asked, unanswered"
        # A connection given up after its timeout, a new one for each question
        # (counted by each proxy's thread when it gets a turn: waited for).
        for _ in range(100):
            if sum(proxy.accepted for proxy in proxies) >= 6:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # and no more than that
        assert [proxy.accepted for proxy in proxies] == [2, 2, 2]
    finally:
        await store.aclose()
        for proxy in proxies:
            proxy.close()
