"""An acquire whose answer the network lost: its retry is granted, not kept out by its own grant.

The fault proxy forwards the acquire to the store and drops the store's
answers (``mute``), so the grant commits while the caller sees
StoreUnavailable; the give-back sent right after is lost too. The retry must
then find the lock its own (the same fencing token), where a fresh token
would find the orphaned grant in its way for a whole TTL.
"""

from __future__ import annotations

import logging

import pytest

from tenure import Lock, LockService, StoreUnavailable

from ..helpers.proxied import proxied
from ..helpers.until import until

GIVE_BACK_FAILED = "could not give back the grant an unanswered acquire"


# PostgreSQL's batches are not here: a batch commits at the end of its
# pipeline, after its answers were read, so under the mute it is rolled back.
@pytest.mark.parametrize(
    ("store", "how"), [("redis", "acquire"), ("redis", "acquire_each"), ("postgres", "acquire")]
)
async def test_an_acquire_whose_answer_was_lost_is_granted_on_retry(
    store: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    with proxied(store) as (direct, through, proxy):
        async with LockService.from_url(through) as locks, LockService.from_url(direct) as other:

            async def acquire() -> Lock | None:
                if how == "acquire":
                    return await locks.acquire("lost-answer", ttl=30)
                [lock] = await locks.acquire_each(["lost-answer"], ttl=30)
                return lock

            # Connected, tables made, scripts loaded and statements prepared
            # first: under the mute only the acquire itself runs in the store.
            for _ in range(3):
                warm = await acquire()
                assert warm is not None and await warm.release()
            caplog.set_level(logging.DEBUG, logger="tenure")
            proxy.set_mode("mute")
            with pytest.raises(StoreUnavailable):
                await acquire()
            # The give-back, sent next, is lost on its way (blocking the loop
            # until the switch: it cannot go out before).
            proxy.set_mode("blackhole")
            await until(
                lambda: any(GIVE_BACK_FAILED in r.getMessage() for r in caplog.records),
                "the give-back failed as well",
            )
            proxy.set_mode("pass")
            assert proxy.dropped > 0, "an answer of the store was lost"
            [orphan] = await other.store.holders("lost-answer")  # the grant did commit
            lock = await acquire()
            assert lock is not None, "the retry was kept out by its own grant"
            assert lock.fencing_token == orphan.fencing_token
            assert await other.acquire("lost-answer") is None
            [info] = await other.store.holders("lost-answer")
            assert info.fencing_token == orphan.fencing_token
