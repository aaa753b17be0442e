"""What only the SQLite store has to show: its file, its clock, its durability."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tenure.sync
from tenure import ConfigurationError, LockService
from tenure.stores.base import Grant
from tenure.stores.sqlite import APPLICATION_ID, PAGE_SIZE, SCHEMA_VERSION, SQLiteStore


def test_absolute_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = SQLiteStore.from_url(f"sqlite://{tmp_path}/abs.db")
    assert absolute.path == tmp_path / "abs.db"
    assert (tmp_path / "abs.db").exists()
    assert absolute.describe() == f"sqlite://{tmp_path}/abs.db"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    relative = SQLiteStore.from_url("sqlite:sub/rel.db")
    assert (tmp_path / "sub" / "rel.db").exists()
    assert relative.describe() == "sqlite:sub/rel.db"
    assert SQLiteStore.from_url("sqlite:here.db").path == Path("here.db")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite://host/x.db", "host part"),
        ("sqlite://", "names no file"),
        ("sqlite:///", "names no file"),
        ("sqlite:///tmp/x.db?prefix=bad-prefix", "identifier"),
        ("sqlite:///tmp/x.db?prefix=a;drop", "identifier"),
        ("sqlite:///tmp/x.db?busy_timeout=soon", "busy_timeout"),
        ("sqlite:///tmp/x.db?busy_timeout=0", "busy_timeout"),
        ("sqlite:///tmp/x.db?synchronous=off", "synchronous"),
        ("sqlite:///tmp/x.db?color=blue", "unknown SQLite URL option 'color'"),
    ],
)
def test_bad_sqlite_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        LockService.from_url(url)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        LockService.from_url(f"sqlite://{tmp_path}/missing/x.db")
    assert not (tmp_path / "missing").exists()


def test_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is a directory"):
        LockService.from_url(f"sqlite://{tmp_path}")


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may write to: root ignores permission bits, so mount it read-only."""
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        yield target
        target.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only directory here: {mounted.stderr!r}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_unwritable_directory(unwritable_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="not writable"):
        LockService.from_url(f"sqlite://{unwritable_dir}/x.db")
    assert not (unwritable_dir / "x.db").exists()


def test_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    junk = b"this is not a database at all" * 200
    path.write_bytes(junk)
    with pytest.raises(ConfigurationError, match="corrupt or not a database"):
        LockService.from_url(f"sqlite://{path}")
    assert path.read_bytes() == junk, "changes nothing"


def test_foreign_application_database(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1234")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigurationError, match="another application"):
        LockService.from_url(f"sqlite://{path}")
    conn = sqlite3.connect(path)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    conn.close()
    assert tables == ["t"]


@pytest.mark.parametrize("old", [1, SCHEMA_VERSION - 1])  # the first; the last before
def test_tables_of_an_older_shape_are_named_as_such(tmp_path: Path, old: int) -> None:
    path = tmp_path / "older.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE tenure_meta (key TEXT PRIMARY KEY, value ANY) STRICT")
    conn.execute("INSERT INTO tenure_meta VALUES ('schema_version', ?)", (old,))
    conn.commit()
    conn.close()
    with pytest.raises(
        ConfigurationError,
        match=rf"older shape \(schema version {old}; this tenure uses {SCHEMA_VERSION}\)",
    ):
        LockService.from_url(f"sqlite://{path}")


def test_tables_with_our_prefix_that_we_did_not_make(tmp_path: Path) -> None:
    path = tmp_path / "clash.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE tenure_meta (key TEXT, value TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigurationError, match="did not create"):
        LockService.from_url(f"sqlite://{path}")
    # Another prefix in the same file works, beside the application's tables.
    store = SQLiteStore.from_url(f"sqlite://{path}?prefix=locks")
    assert store.prefix == "locks"


def test_new_database_is_marked_as_tenure(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "mark.db")
    conn = sqlite3.connect(tmp_path / "mark.db")
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE
    conn.close()


async def test_a_file_with_other_pages_keeps_them_and_works(tmp_path: Path) -> None:
    path = tmp_path / "big-pages.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("VACUUM")  # writes the header: the page size is now the file's
    conn.close()
    async with LockService.from_url(f"sqlite://{path}") as locks:
        lock = await locks.acquire("pages", ttl=1)
        assert lock is not None
        assert await lock.release() is True
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    conn.close()


async def test_fencing_survives_reopening_the_file(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/durable.db"
    async with LockService.from_url(url) as first:
        lock = await first.acquire("durable", ttl=1)
        assert lock is not None
        before = lock.fencing_token
    async with LockService.from_url(url) as second:
        lock = await second.acquire("durable", ttl=1)
        assert lock is not None
        assert lock.fencing_token > before


async def test_reboot_frees_leases_and_keeps_fencing(tmp_path: Path) -> None:
    path = tmp_path / "boot.db"
    store = SQLiteStore(path)
    grant = await store.acquire("boot", "d" * 32, 3600, "before-reboot")
    assert grant is not None
    await store.aclose()
    # What a reboot looks like to the file: another boot id, monotonic
    # expiry times from a clock that restarted.
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tenure_meta SET value = 'previous-boot' WHERE key = 'boot_id'")
    conn.execute("UPDATE tenure_leases SET expires = 1 << 62")
    conn.commit()
    conn.close()
    async with LockService.from_url(f"sqlite://{path}") as locks:
        lock = await locks.acquire("boot", ttl=1)
        assert lock is not None, "the previous boot's holder is gone"
        assert lock.fencing_token > grant.fencing_token


async def test_reboot_frees_permits_and_keeps_the_semaphores_fencing(tmp_path: Path) -> None:
    path = tmp_path / "boot.db"
    store = SQLiteStore(path)
    grant = await store.semaphores.acquire("pool", "d" * 32, 3600, "before-reboot", 1, queue=0)
    assert isinstance(grant, Grant)
    await store.aclose()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tenure_meta SET value = 'previous-boot' WHERE key = 'boot_id'")
    conn.commit()
    conn.close()
    async with LockService.from_url(f"sqlite://{path}") as locks:
        permit = await locks.semaphore("pool", 1).acquire(ttl=1)
        assert permit is not None, "the previous boot's holder is gone"
        assert permit.fencing_token > grant.fencing_token


async def test_wall_clock_plays_no_part_in_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time as time_module

    async with LockService.from_url(f"sqlite://{tmp_path}/clock.db") as locks:
        lock = await locks.acquire("clock", ttl=1)
        assert lock is not None
        real = time_module.time
        monkeypatch.setattr(time_module, "time", lambda: real() + 3600)
        assert await locks.acquire("clock", ttl=1) is None, "a step forward expires nothing"
        monkeypatch.setattr(time_module, "time", lambda: real() - 3600)
        assert await lock.release() is True
        again = await locks.acquire("clock", ttl=1)
        assert again is not None
        assert again.fencing_token > lock.fencing_token


async def test_waiter_rows_are_removed_after_waiting(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/waiters.db"
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("w", ttl=1)
        assert lock is not None
        assert await locks.acquire("w", ttl=1, wait=0.2) is None
    conn = sqlite3.connect(tmp_path / "waiters.db")
    assert conn.execute("SELECT count(*) FROM tenure_waiters").fetchone()[0] == 0
    assert conn.execute("SELECT waiting FROM tenure_leases WHERE name = 'w'").fetchone()[0] == 0
    conn.close()


async def test_waiting_flag_follows_the_waiters(tmp_path: Path) -> None:
    """Release skips the waiter lookup only while the row's flag says nobody waits."""
    store = SQLiteStore(tmp_path / "flag.db")

    def flag(name: str) -> int:
        return int(store.db.run("SELECT waiting FROM tenure_leases WHERE name = ?", (name,))[0][0])

    assert await store.acquire("f", "1" * 32, 5, "h") is not None
    waiting = asyncio.ensure_future(store.wait_released("f", 5))
    await asyncio.sleep(0.05)
    assert flag("f") == 1
    assert await store.release("f", "1" * 32) is True
    await asyncio.wait_for(waiting, 2)  # woken by the release, long before its 5 s
    assert flag("f") == 0
    # A waiter registered for a name whose row was pruned is seen by the next insert.
    store.db.run(store.sql.wait, ("tenure-test-addr", "g", 2**62))
    assert await store.acquire("g", "2" * 32, 5, "h") is not None
    assert flag("g") == 1
    store.db.run(store.sql.unwait, ("tenure-test-addr",))
    assert flag("g") == 0
    await store.aclose()


def _wal_frames(path: Path) -> int:
    """How many pages the WAL file has room for: its high-water mark (32-byte
    header, then a 24-byte header per frame)."""
    wal = path.with_name(path.name + "-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(size - 32, 0) // (PAGE_SIZE + 24)


async def _cycles(store: SQLiteStore, n: int) -> None:
    for i in range(n):
        token = f"{i:032x}"
        assert await store.acquire("churn", token, 30, "me") is not None
        assert await store.release("churn", token) is True


async def test_checkpoints_run_on_a_thread_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's thread copies the WAL into the database; the callers' commits never do
    until the WAL passes the backstop, which bounds it under sustained writes."""
    from tenure.stores.sqlite import schema

    monkeypatch.setattr(schema, "INLINE_CHECKPOINT_PAGES", 800)
    path = tmp_path / "wal.db"
    store = SQLiteStore(path)
    conn = store.db.conn()
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 800
    await _cycles(store, 300)  # 600 commits: under the backstop
    checkpointer = store.db.checkpointer
    for _ in range(100):  # asked at every 200th write; it runs when its thread gets a turn
        if checkpointer.copied:
            break
        if checkpointer.done:
            # A passive checkpoint may copy nothing (a reader or a checkpoint
            # of the callers' in its way on a busy host): 200 writes ask again.
            await _cycles(store, 100)
        await asyncio.sleep(0.05)
    assert checkpointer.done >= 1
    assert checkpointer.copied > 0, "SQLite reports frames copied by the store's thread"
    await _cycles(store, 1500)  # 3000 more commits, a frame each
    # Unbounded, the WAL's high-water mark would be 3600 frames. Bounded, it passes the
    # backstop by whatever was written while no checkpoint could restart it: a few hundred
    # frames on a quiet host, 1300 seen on a loaded one. Below 3000, it restarted at least
    # once in these 3000 commits.
    assert _wal_frames(path) < 3000, "the WAL restarts under sustained writes"
    thread = checkpointer._thread
    assert thread is not None and thread.is_alive()
    await store.aclose()
    assert not thread.is_alive(), "aclose stops the checkpoint thread"


async def test_callers_checkpoint_when_the_thread_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenure.stores.sqlite import checkpoint as module

    requests: list[int] = []
    monkeypatch.setattr(module.Checkpointer, "request", lambda self: requests.append(1))
    from tenure.stores.sqlite import schema

    monkeypatch.setattr(schema, "INLINE_CHECKPOINT_PAGES", 100)
    path = tmp_path / "backstop.db"
    store = SQLiteStore(path)
    await _cycles(store, 1000)
    assert requests, "the thread was asked, and did nothing"
    assert _wal_frames(path) < 200, "the callers' commits checkpointed past 100 pages"
    await store.aclose()


async def test_checkpoint_thread_of_a_dropped_store_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from tenure.stores.sqlite import checkpoint as module

    monkeypatch.setattr(module.Checkpointer, "_IDLE_EXIT", 0.05)
    store = SQLiteStore(tmp_path / "dropped.db")
    await _cycles(store, module.CHECKPOINT_EVERY)
    thread = store.db.checkpointer._thread
    assert thread is not None and thread.is_alive()
    del store
    gc.collect()
    thread.join(5)
    assert not thread.is_alive(), "nothing keeps the store alive, so its thread ends"


def test_processes_opening_a_new_file_together_wait_for_its_wal_switch(tmp_path: Path) -> None:
    # Another process holds the new file's write lock (as one turning it to
    # WAL mode does) for longer than busy_timeout: opening waits for it.
    path = tmp_path / "new.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE unrelated (x)")
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.5, other.execute, ("COMMIT",)).start()
    started = time.monotonic()
    with tenure.sync.LockService.from_url(f"sqlite://{path}?busy_timeout=0.1") as locks:
        assert time.monotonic() - started >= 0.4, "the write lock was held while it opened"
        lock = locks.acquire("first", ttl=5)
        assert lock is not None and lock.release()
    other.close()


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    from tenure.stores import for_reading, from_url

    missing = tmp_path / "typo.db"
    url = f"sqlite://{missing}?prefix=app"
    with pytest.raises(ConfigurationError, match="does not exist; check the path"):
        from_url(for_reading(url))
    with pytest.raises(ConfigurationError, match="does not exist"):
        SQLiteStore(missing, create=False)
    assert list(tmp_path.iterdir()) == []
    assert for_reading(url) == f"sqlite://{missing}?prefix=app&create=false"
    assert for_reading(f"sqlite://{missing}") == f"sqlite://{missing}?create=false"
    assert for_reading("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    made = from_url(url)  # a store that writes creates the file
    asyncio.run(made.aclose())
    opened = from_url(for_reading(url + "&create=true"))  # the reading one wins
    assert isinstance(opened, SQLiteStore) and opened.prefix == "app"
    asyncio.run(opened.aclose())
