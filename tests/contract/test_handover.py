"""Grant on release: the release hands the lock to the waiter queued next.

The waiter that finds the lock held queues itself in the store; the holder's
release grants the lease to it in the same atomic step (Redis: one script;
PostgreSQL: one statement) and sends it a note (Redis: a list it BLPOPs;
PostgreSQL: a NOTIFY its store's LISTEN connection reads), so the new holder
needs no round trip of its own. These tests watch the store with a plain
client of their own (``Peek``), on every store that grants on release.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
import redis

from tenure import Lock, LockService
from tenure.lease import handover_lease, safety_margin
from tenure.stores import from_url
from tenure.stores.base import BlockingLeases

from ..conftest import STORES
from ..helpers.procs import Worker
from ..test_cli import tenure

TTL = 30.0
"""Long on purpose: every hand-over here must happen in far less than a TTL."""


class Peek:
    """What the store says of one lock, read with a plain client of the test's own."""

    def holder(self) -> str | None:
        """The holder id of the live lease."""
        raise NotImplementedError

    def fence(self) -> int:
        raise NotImplementedError

    def queued(self) -> str | None:
        """The holder id of the waiter queued next, if one is (and its entry is live)."""
        raise NotImplementedError

    def pttl(self) -> int:
        """Milliseconds left of the lease; negative when there is none."""
        raise NotImplementedError

    def entry_left(self) -> int:
        """Milliseconds left of the queued waiter's entry (each of its calls renews it)."""
        raise NotImplementedError

    def note_unread(self) -> bool | None:
        """Whether a hand-over note waits unread; None where the store cannot tell
        (a NOTIFY is pushed to the listener's socket at once)."""
        return None

    def close(self) -> None:
        raise NotImplementedError


class RedisPeek(Peek):
    def __init__(self, url: str, name: str) -> None:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        base = parts._replace(query="").geturl()
        self.client: Any = (
            redis.RedisCluster.from_url(base) if "cluster" in query else redis.Redis.from_url(base)
        )
        tag = f"{{{query['prefix'][0]}:{name}}}"
        self.lease, self.next, self.handed = tag + ":lease", tag + ":next", tag + ":handed"

    def holder(self) -> str | None:
        value = self.client.hget(self.lease, "holder")
        return None if value is None else str(value.decode())

    def fence(self) -> int:
        return int(self.client.hget(self.lease, "fence"))

    def queued(self) -> str | None:
        value = self.client.hget(self.next, "holder")
        return None if value is None else str(value.decode())

    def pttl(self) -> int:
        return int(self.client.pttl(self.lease))

    def entry_left(self) -> int:
        return int(self.client.pttl(self.next))

    def note_unread(self) -> bool | None:
        return bool(self.client.llen(self.handed) == 1)

    def close(self) -> None:
        self.client.close()


class PostgresPeek(Peek):
    def __init__(self, url: str, name: str) -> None:
        parts = urlsplit(url)
        self.table = f"{parse_qs(parts.query)['prefix'][0]}_leases"
        self.conn = psycopg.connect(parts._replace(query="").geturl(), autocommit=True)
        self.name = name

    def _one(self, column: str) -> Any:
        row = self.conn.execute(
            f"SELECT {column} FROM {self.table} WHERE name = %s", (self.name,)
        ).fetchone()
        return None if row is None else row[0]

    def holder(self) -> str | None:
        return self._text(
            "CASE WHEN token IS NOT NULL AND expires > clock_timestamp() THEN holder END"
        )

    def _text(self, column: str) -> str | None:
        value = self._one(column)
        return None if value is None else str(value)

    def fence(self) -> int:
        return int(self._one("fence"))

    def queued(self) -> str | None:
        return self._text("CASE WHEN next_until > clock_timestamp() THEN next_holder END")

    def pttl(self) -> int:
        left = self._one(
            "CASE WHEN token IS NOT NULL THEN"
            " (extract(epoch FROM expires - clock_timestamp()) * 1000)::bigint END"
        )
        return -2 if left is None or left <= 0 else int(left)

    def entry_left(self) -> int:
        left = self._one("(extract(epoch FROM next_until - clock_timestamp()) * 1000)::bigint")
        return -2 if left is None else int(left)

    def close(self) -> None:
        self.conn.close()


GRANTING = ["redis", "redis-cluster", "postgres"]


@pytest.fixture(params=GRANTING)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORES[request.param].make_url(tmp_path)


@pytest.fixture
def peek(url: str) -> Iterator[Callable[[str], Peek]]:
    """``peek(name)``: a Peek at lock ``name`` on the test's store, closed after the test."""
    made: list[Peek] = []

    def make(name: str) -> Peek:
        made.append(PostgresPeek(url, name) if url.startswith("postgres") else RedisPeek(url, name))
        return made[-1]

    yield make
    for each in made:
        each.close()


@pytest.fixture
async def raw(url: str) -> AsyncIterator[BlockingLeases]:
    """A store's plain calls: its acquire and release never let the test's
    event loop run in between (the waiter cannot act meanwhile)."""
    store = from_url(url)
    calls = store.blocking()
    assert calls is not None, f"{url} has no plain calls"
    yield calls
    await store.aclose()


async def until(check: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out waiting for a condition"
        await asyncio.sleep(0.01)


HELD = "t" * 32
"""The token of the raw holder the tests start from."""


async def queued_waiter(
    raw: BlockingLeases, keys: Peek, locks: LockService, name: str, wait: float = 10.0
) -> asyncio.Future[Lock | None]:
    """``name`` held by a raw grant, and an acquire of ``locks`` queued for it."""
    assert raw.acquire(name, HELD, TTL, "raw-holder") is not None
    waiting = asyncio.ensure_future(locks.acquire(name, ttl=TTL, wait=wait))
    await until(lambda: keys.queued() == locks.holder)
    return waiting


async def test_a_release_hands_the_lock_to_the_queued_waiter(
    url: str, raw: BlockingLeases, peek: Callable[[str], Peek]
) -> None:
    keys = peek("h")
    async with LockService.from_url(url) as locks:
        waiting = await queued_waiter(raw, keys, locks, "h")
        before = keys.fence()
        assert raw.release("h", HELD) is True
        # The release itself granted it: the waiter has not run since.
        assert not waiting.done()
        assert keys.holder() == locks.holder
        assert keys.queued() is None
        assert 0 < keys.pttl() <= handover_lease(TTL) * 1000, "a short hand-over lease"
        lock = await asyncio.wait_for(waiting, 5)
        assert lock is not None and lock.held
        assert lock.fencing_token == keys.fence() > before
        # The new holder's renewer extends the short lease to the TTL at once.
        await until(lambda: keys.pttl() > handover_lease(TTL) * 1000)
        assert lock.held
        assert await lock.release() is True
        assert keys.holder() is None


async def test_waiters_take_turns_in_the_queue(
    url: str, raw: BlockingLeases, peek: Callable[[str], Peek]
) -> None:
    keys = peek("turns")
    assert raw.acquire("turns", HELD, TTL, "raw-holder") is not None
    async with LockService.from_url(url) as first, LockService.from_url(url) as second:
        a = asyncio.ensure_future(first.acquire("turns", ttl=TTL, wait=10))
        await until(lambda: keys.queued() == first.holder)
        b = asyncio.ensure_future(second.acquire("turns", ttl=TTL, wait=10))
        await asyncio.sleep(0.2)
        assert keys.queued() == first.holder, "one waiter is queued; the other waits its turn"
        raw.release("turns", HELD)
        lock_a = await asyncio.wait_for(a, 5)
        assert lock_a is not None and not b.done()
        # The release woke the other waiter, which queued itself next.
        await until(lambda: keys.queued() == second.holder)
        await lock_a.release()
        lock_b = await asyncio.wait_for(b, 5)
        assert lock_b is not None and lock_b.held
        assert lock_b.fencing_token > lock_a.fencing_token
        await lock_b.release()


async def test_a_waiter_that_times_out_leaves_the_queue(
    url: str, raw: BlockingLeases, peek: Callable[[str], Peek]
) -> None:
    keys = peek("late")
    async with LockService.from_url(url) as locks:
        started = time.monotonic()
        waiting = await queued_waiter(raw, keys, locks, "late", wait=0.5)
        assert await waiting is None
        assert time.monotonic() - started >= 0.5
        assert keys.queued() is None
        assert raw.release("late", HELD) is True
        assert keys.holder() is None, "nobody was queued: nothing was handed over"


async def test_a_cancelled_waiter_leaves_the_queue(
    url: str, raw: BlockingLeases, peek: Callable[[str], Peek]
) -> None:
    keys = peek("gone")
    async with LockService.from_url(url) as locks:
        waiting = await queued_waiter(raw, keys, locks, "gone")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until(lambda: keys.queued() is None)
        assert raw.release("gone", HELD) is True
        assert keys.holder() is None


async def test_a_waiter_cancelled_the_moment_it_queues_is_cancelled(
    url: str, raw: BlockingLeases, peek: Callable[[str], Peek]
) -> None:
    """Cancelled as soon as its queue entry shows, again and again, on a fresh
    service each time: the moment a PostgreSQL waiter opens its LISTEN
    connection among them (on Python 3.11 ``asyncio.wait_for`` there dropped
    a cancellation that came as the connection completed, and the waiter
    waited on until its deadline)."""
    for attempt in range(15):
        name = f"gone-{attempt}"
        keys = peek(name)
        async with LockService.from_url(url) as locks:
            waiting = await queued_waiter(raw, keys, locks, name, wait=5.0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(waiting, 2.0)
        await until(lambda peek=keys: peek.queued() is None)
        assert raw.release(name, HELD) is True
        assert keys.holder() is None, "nothing was handed to the cancelled waiter"


async def test_a_waiter_cancelled_after_the_hand_over_gives_the_lock_back(
    url: str, raw: BlockingLeases, peek: Callable[[str], Peek]
) -> None:
    keys = peek("given")
    async with LockService.from_url(url) as locks, LockService.from_url(url) as third:
        waiting = await queued_waiter(raw, keys, locks, "given")
        raw.release("given", HELD)
        assert keys.holder() == locks.holder, "handed over before the waiter could read it"
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Released in the background, not left to lapse.
        await until(lambda: keys.holder() is None, timeout=2.0)
        lock = await third.acquire("given", ttl=TTL)
        assert lock is not None
        await lock.release()


@pytest.fixture
def worker(url: str) -> Iterator[Worker]:
    proc = Worker(url)
    yield proc
    proc.close()


@pytest.mark.parametrize("deadline", ["passed", "ahead"])
async def test_a_waiter_paused_across_the_hand_over_keeps_the_lock(
    url: str, raw: BlockingLeases, worker: Worker, deadline: str, peek: Callable[[str], Peek]
) -> None:
    """SIGSTOPped while queued, past its wait's timeout: the hand-over note
    waits unread (Redis: on the list; PostgreSQL: in the socket), and on waking
    the waiter finds the lease is its own, by the note, by its wait running out
    (withdraw) or by its next call (enlist)."""
    keys = peek("paused")
    wait = 1.0 if deadline == "passed" else 20.0
    started = time.monotonic()
    # Handed over as late and woken as soon as the case allows: the hand-over
    # is trusted for only HANDOVER_GRACE after it, and a loaded host can take
    # a while to run the woken waiter.
    release_at = started + wait - 0.1 if deadline == "passed" else 0.0
    stopped, handed_fence = await stop_across_a_hand_over(
        keys, raw, worker, wait, release_at=release_at
    )
    resume_at = started + wait + 0.05 if deadline == "passed" else time.monotonic() + 0.1
    await asyncio.sleep(max(0.0, resume_at - time.monotonic()))
    assert time.monotonic() - stopped < handover_lease(TTL), "the hand-over lease still runs"
    worker.signal(signal.SIGCONT)
    got = worker.read()
    assert got["ok"] is True
    assert got["fence"] == handed_fence == keys.fence()
    if deadline == "passed":
        assert got["t"] / 1e9 - started >= wait, "its wait had run out"
    assert worker.ask("status") == {"held": True, "lost": False}
    await until(lambda: keys.pttl() > handover_lease(TTL) * 1000)  # renewed to the TTL
    assert worker.ask("release")["released"] is True


async def test_a_waiter_paused_past_the_hand_over_lease_does_not_trust_it(
    url: str, raw: BlockingLeases, worker: Worker, peek: Callable[[str], Peek]
) -> None:
    """Woken after the hand-over lease stopped being trusted locally (its safety
    margin) but while the store still has it: the waiter must not return that
    grant (C9: never a lock it may not have); it gives it back and takes a
    fresh one."""
    keys = peek("stale")
    # Stopped once the call it just made is answered: a call in flight across
    # a stop this long would time out at the resume, its answer unread.
    _, handed_fence = await stop_across_a_hand_over(keys, raw, worker, 20.0, "stale", settle=0.15)
    handed = time.monotonic()
    trusted_until = handed + handover_lease(TTL) - safety_margin(TTL)
    await asyncio.sleep(max(0.0, trusted_until + 0.5 - time.monotonic()))
    assert keys.fence() == handed_fence, "the store still has the hand-over"
    assert keys.pttl() > 0
    worker.signal(signal.SIGCONT)
    got = worker.read()
    assert got["ok"] is True
    assert got["fence"] > handed_fence, "a fresh grant, not the untrusted hand-over"
    assert worker.ask("status") == {"held": True, "lost": False}
    assert worker.ask("release")["released"] is True


async def stop_across_a_hand_over(
    keys: Peek,
    raw: BlockingLeases,
    worker: Worker,
    wait: float,
    name: str = "paused",
    *,
    settle: float = 0.0,
    release_at: float = 0.0,
) -> tuple[float, int]:
    """Queue the worker, SIGSTOP it ``settle`` seconds (20 ms at least) after
    its next call, hand it the lock (at ``release_at`` if later); when it
    stopped, and the fence."""
    assert raw.acquire(name, HELD, TTL, "raw-holder") is not None
    worker.send(f"acquire {name} {TTL} {wait}")
    await until(lambda: (keys.queued() or "").split(":")[1:2] == [str(worker.pid)])
    # Stopped just after a call of the waiter's, not as it starts one: a call
    # stamped before a stop and sent after it finds the lease handed over and
    # can only date it from the stamp (its trust would seem long gone).
    await next_call(keys)
    await asyncio.sleep(max(settle, 0.02))
    worker.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    # Past any BLPOP it had sent (a third of a second at most).
    await asyncio.sleep(max(0.5, release_at - time.monotonic()))
    assert raw.release(name, HELD) is True
    assert (keys.holder() or "").split(":")[1] == str(worker.pid), "handed to a stopped process"
    unread = keys.note_unread()
    assert unread is None or unread, "the note waits unread"
    return stopped, keys.fence()


async def next_call(keys: Peek) -> None:
    """Until the queued waiter calls the store again (its entry's life grows back)."""
    last = keys.entry_left()

    def renewed() -> bool:
        nonlocal last
        left, last = last, keys.entry_left()
        return last > left

    await until(renewed)


async def test_a_killed_queued_waiter_costs_the_name_only_the_hand_over_lease(
    url: str, raw: BlockingLeases, worker: Worker, peek: Callable[[str], Peek]
) -> None:
    keys = peek("dead")
    ttl = 10.0
    assert raw.acquire("dead", HELD, ttl, "raw-holder") is not None
    worker.send(f"acquire dead {ttl} 30")
    await until(lambda: (keys.queued() or "").split(":")[1:2] == [str(worker.pid)])
    worker.signal(signal.SIGKILL)
    worker.proc.wait()
    assert raw.release("dead", HELD) is True
    released = time.monotonic()
    assert (keys.holder() or "").split(":")[1] == str(worker.pid), "handed to a dead process"
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("dead", ttl=ttl, wait=ttl)
        waited = time.monotonic() - released
        assert lock is not None
        assert waited < handover_lease(ttl) + 1.0 < ttl
        await lock.release()


async def test_a_forced_release_hands_the_lock_to_the_queued_waiter(
    url: str, peek: Callable[[str], Peek]
) -> None:
    async with LockService.from_url(url) as stuck, LockService.from_url(url) as waiter:
        lock = await stuck.acquire("forced", ttl=2)
        assert lock is not None
        waiting = asyncio.ensure_future(waiter.acquire("forced", ttl=TTL, wait=20))
        keys = peek("forced")
        await until(lambda: keys.queued() == waiter.holder)
        done = await asyncio.to_thread(
            tenure, "release", "forced", "--force", "--yes", "--url", url
        )
        assert done.returncode == 0, done.stderr
        said = " ".join(done.stdout.split())
        assert f"evicted {stuck.holder}" in said
        assert f"went straight to a waiter: now held by {waiter.holder}" in said
        got = await asyncio.wait_for(waiting, 5)
        assert got is not None and got.fencing_token > lock.fencing_token
        await asyncio.wait_for(lock.wait_lost(), 5)  # the evicted holder's next renewal
        assert got.held
        await got.release()
