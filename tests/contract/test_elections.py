"""The leader election contract, run over every store and both APIs.

One leader at a time; each term's number (its fencing token) is larger than
every earlier one's; a resignation hands over at once to the campaigner
waiting longest; ``serve()`` calls ``on_elected`` and ``on_revoked``; an
election and a lock of the same name do not meet.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tenure import InvalidArgument, LockService

from ..helpers.sync_as_async import ServiceOverSync
from ..helpers.until import until

TTL = 1.0


@pytest.fixture(params=["asyncio", "sync"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def locks(api: str, url: str) -> AsyncIterator[Any]:
    service = LockService.from_url(url) if api == "asyncio" else ServiceOverSync(url)
    await service.__aenter__()
    yield service
    await service.__aexit__(None, None, None)


@pytest.fixture
async def other(url: str) -> AsyncIterator[LockService]:
    async with LockService.from_url(url) as service:
        yield service


async def test_one_leader_at_a_time_and_terms_rise(locks: Any, other: LockService) -> None:
    mine, theirs = locks.election("primary"), other.election("primary")
    assert await mine.leader() is None
    term = await mine.campaign(ttl=TTL, wait=0)
    assert term is not None and term.held
    assert await mine.leader() == locks.holder
    assert await theirs.campaign(ttl=TTL, wait=0) is None
    assert await theirs.campaign(ttl=TTL, wait=0.3) is None
    waiting = asyncio.ensure_future(theirs.campaign(ttl=TTL, wait=10))
    await asyncio.sleep(0.3)
    start = time.monotonic()
    assert await term.resign() is True
    successor = await asyncio.wait_for(waiting, 10)
    assert successor is not None
    # Handed over at once, not at a poll or an expiry.
    assert time.monotonic() - start < 0.5 * TTL
    assert successor.fencing_token > term.fencing_token
    assert await theirs.leader() == other.holder
    assert await term.resign() is False  # no longer held: nothing changes
    assert successor.held
    await successor.resign()


async def test_a_crashed_leaders_term_ends_within_its_ttl(url: str, other: LockService) -> None:
    crashed = LockService.from_url(url)
    term = await crashed.election("primary").campaign(ttl=TTL)
    assert term is not None
    crashed.renewer.stop()  # the fault: nobody renews the term any more
    start = time.monotonic()
    successor = await other.election("primary").campaign(ttl=TTL, wait=15)
    assert successor is not None
    assert successor.fencing_token > term.fencing_token
    assert time.monotonic() - start < TTL + 2.0
    assert not term.held
    await successor.resign()
    await crashed.close()


async def test_serve_calls_back_and_hands_over_on_cancel(locks: Any, other: LockService) -> None:
    seen: list[tuple[str, Any]] = []
    election = locks.election(
        "singleton",
        on_elected=lambda term: seen.append(("elected", term.fencing_token)),
        on_revoked=lambda reason: seen.append(("revoked", reason)),
    )
    serving = asyncio.ensure_future(election.serve(ttl=TTL))
    await until(lambda: bool(seen), "elected")
    assert seen[0][0] == "elected"
    assert await other.election("singleton").leader() == locks.holder
    standby = asyncio.ensure_future(other.election("singleton").campaign(ttl=TTL, wait=10))
    await asyncio.sleep(0.2)
    serving.cancel()
    successor = await asyncio.wait_for(standby, 10)
    assert successor is not None and successor.fencing_token > seen[0][1]
    await until(lambda: len(seen) == 2, "revoked")
    assert seen[1] == ("revoked", "resigned")
    await successor.resign()


async def test_async_callbacks_and_a_lost_term(url: str) -> None:
    reasons: list[str] = []
    elected = asyncio.Event()

    async def on_elected(term: Any) -> None:
        elected.set()

    async def on_revoked(reason: str) -> None:
        reasons.append(reason)

    async with LockService.from_url(url) as locks:
        election = locks.election("lossy", on_elected=on_elected, on_revoked=on_revoked)
        serving = asyncio.ensure_future(election.serve(ttl=TTL))
        await asyncio.wait_for(elected.wait(), 10)
        # The term disappears from the store (an operator freed it).
        assert await locks.store.force_release(election.key) is not None
        await until(lambda: bool(reasons), "revoked", timeout=5)
        assert "no longer has" in reasons[0]  # lost, not resigned
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving


async def test_elections_and_locks_do_not_meet(locks: Any) -> None:
    lock = await locks.acquire("leader", ttl=TTL)
    term = await locks.election("leader").campaign(ttl=TTL, wait=0)
    assert lock is not None and term is not None
    await term.resign()
    assert lock.held
    await lock.release()


@pytest.fixture
async def on_memory(api: str) -> AsyncIterator[Any]:
    """A service on the memory store: argument checks need no other."""
    url = f"memory://elections-{uuid.uuid4().hex}"
    service = LockService.from_url(url) if api == "asyncio" else ServiceOverSync(url)
    await service.__aenter__()
    yield service
    await service.__aexit__(None, None, None)


@pytest.mark.parametrize("callback", ["on_elected", "on_revoked"])
async def test_a_callback_that_is_not_callable_is_refused(on_memory: Any, callback: str) -> None:
    with pytest.raises(InvalidArgument, match=callback):
        on_memory.election("x", **{callback: "not a function"})


@pytest.mark.parametrize(("ttl", "wait"), [(0.1, 1.0), (math.nan, 1.0), (1.0, -2.0)])
async def test_bad_ttl_or_wait_is_refused(on_memory: Any, ttl: Any, wait: Any) -> None:
    with pytest.raises(InvalidArgument):
        await on_memory.election("x").campaign(ttl=ttl, wait=wait)
    assert await on_memory.election("x").leader() is None
