"""C10: bad input gets a clear error naming what was wrong, and changes nothing."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tenure import ConfigurationError, InvalidArgument, LockService, TenureError
from tenure._validate import MAX_NAME_BYTES, MIN_TTL
from tenure.stores import from_url as store_from_url

BAD_NAMES: list[tuple[Any, str]] = [
    ("", "empty"),
    (None, "str"),
    (42, "str"),
    (b"bytes", "str"),
    ("x" * (MAX_NAME_BYTES + 1), "255"),
    ("é" * 128, "255"),  # 256 UTF-8 bytes in 128 characters
    ("nul\x00byte", "control"),
    ("new\nline", "control"),
    ("tab\tbed", "control"),
    ("del\x7f", "control"),
]

BAD_TTLS: list[tuple[Any, str]] = [
    (0, "positive"),
    (-1, "positive"),
    (math.nan, "finite"),
    (math.inf, "finite"),
    (MIN_TTL / 2, "minimum"),
    ("30", "number"),
    (True, "number"),
]

BAD_WAITS: list[tuple[Any, str]] = [
    (-0.1, "negative"),
    (math.nan, "nan"),
    ("1", "number"),
    (False, "number"),  # a bool is not a number of seconds, even one equal to 0
]


@pytest.mark.parametrize(("name", "says"), BAD_NAMES)
async def test_bad_names(locks: LockService, name: Any, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        await locks.acquire(name)
    with pytest.raises(InvalidArgument, match=says):
        await locks.run_exclusively(name, lambda: None)
    assert await locks.store.holders() == []


async def test_longest_name_and_unicode_are_fine(locks: LockService) -> None:
    for name in ("x" * MAX_NAME_BYTES, "é" * 127, "名前:ロック", "a b;c'd\"e"):
        lock = await locks.acquire(name, ttl=1)
        assert lock is not None
        assert lock.name == name
        assert [i.name for i in await locks.store.holders(name)] == [name]
        assert await lock.release()


@pytest.mark.parametrize(("ttl", "says"), BAD_TTLS)
async def test_bad_ttls(locks: LockService, ttl: Any, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        await locks.acquire("x", ttl=ttl)
    with pytest.raises(InvalidArgument, match=says):
        await locks.run_exclusively("x", lambda: None, ttl=ttl)
    assert await locks.store.holders() == []


async def test_minimum_ttl_is_at_most_half_a_second(locks: LockService) -> None:
    assert MIN_TTL <= 0.5
    # Connected first: a cold Redis Cluster client's first call (the slot map)
    # can take most of half a second on a loaded host, and counts against the TTL.
    warm = await locks.acquire("min-warm-up")
    assert warm is not None
    await warm.release()
    lock = await locks.acquire("min", ttl=MIN_TTL)
    assert lock is not None
    assert lock.held


@pytest.mark.parametrize(("wait", "says"), BAD_WAITS)
async def test_bad_waits(locks: LockService, wait: Any, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        await locks.acquire("x", wait=wait)
    assert await locks.store.holders() == []


async def test_errors_are_value_errors_under_one_root(locks: LockService) -> None:
    with pytest.raises(ValueError, match="empty") as caught:
        await locks.acquire("")
    assert isinstance(caught.value, TenureError)


async def test_run_exclusively_needs_a_callable(locks: LockService) -> None:
    with pytest.raises(InvalidArgument, match="callable"):
        await locks.run_exclusively("x", "not a function")  # type: ignore[arg-type]
    assert await locks.store.holders() == []


@pytest.mark.parametrize("url", ["mongodb://localhost/x", "http://x", "nope", "", "sqlite3:///x"])
def test_unknown_schemes_list_the_known_ones(url: str) -> None:
    known = (
        "etcd, mariadb, memory, mysql, postgres, postgresql, redis, redis+sentinel, rediss, "
        "sqlite, unix"
    )
    with pytest.raises(ConfigurationError) as raised:
        LockService.from_url(url)
    assert f"known schemes: {known}" in str(raised.value)


def test_url_must_be_a_string() -> None:
    with pytest.raises(ConfigurationError, match="str"):
        LockService.from_url(None)  # type: ignore[arg-type]


def test_password_in_a_bad_url_is_masked() -> None:
    with pytest.raises(ConfigurationError) as caught:
        LockService.from_url("mongodb://user:hunter2@localhost/db")
    assert "hunter2" not in str(caught.value)
    assert "user:***@localhost" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://app:hunter2@127.0.0.1:1/0", "redis://app:***@127.0.0.1:1/0"),
        ("unix:///run/r.sock?db=2&password=hunter2", "unix:///run/r.sock?db=2&password=***"),
        ("unix://:hunter2@/run/r.sock?db=2", "unix://:***@/run/r.sock?db=2"),
        (
            "postgresql://127.0.0.1:1/db?password=hunter2",
            "postgresql://127.0.0.1:1/db?password=***",
        ),
    ],
)
def test_a_store_describes_itself_without_its_password(url: str, shown: str) -> None:
    """Both places a URL can carry a password (before the host, and the
    ``password=`` option redis-py and libpq take), in the text every error and
    the CLI use."""
    store = store_from_url(url)
    assert store.describe().startswith(shown)  # PostgreSQL adds its connect_timeout
    assert "hunter2" not in store.describe()


@pytest.mark.parametrize("url", ["memory://x/path", "memory://x?opt=1"])
def test_bad_memory_urls(url: str) -> None:
    with pytest.raises(ConfigurationError, match="memory"):
        LockService.from_url(url)


def test_constructor_wants_a_store() -> None:
    with pytest.raises(TypeError, match="from_url"):
        LockService("sqlite:///tmp/x.db")  # type: ignore[arg-type]


async def test_closed_service_refuses_to_acquire(url: str) -> None:
    service = LockService.from_url(url)
    await service.close()
    with pytest.raises(TenureError, match="closed"):
        await service.acquire("x")


def test_current_lock_outside_run_exclusively() -> None:
    from tenure import current_lock

    with pytest.raises(TenureError, match="outside run_exclusively"):
        current_lock()
