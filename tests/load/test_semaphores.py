"""Hundreds of callers on one semaphore, on every store: none fails, none is
lost, never more than the limit at once.

Counts, never times. The load shows: every caller but the first few waited
in the semaphore's queue, and the limit was reached.
"""

from __future__ import annotations

import asyncio

from tenure import LockService

from .test_burst import _as_deployed

CALLERS = 200
LIMIT = 4


async def test_two_hundred_waiters_on_a_semaphore_of_four(url: str) -> None:
    async with (
        LockService.from_url(_as_deployed(url)) as first,
        LockService.from_url(_as_deployed(url)) as second,
    ):
        held = 0
        most = 0
        fences: list[int] = []
        filled = asyncio.Event()

        async def one(i: int) -> None:
            nonlocal held, most
            service = first if i % 2 else second
            permit = await service.semaphore("pool", LIMIT).acquire(ttl=10, wait=120)
            assert permit is not None, f"caller {i} waited and was never granted"
            held += 1
            most = max(most, held)
            fences.append(permit.fencing_token)
            if held == LIMIT:
                filled.set()
            # The work: the first holders keep their permits until the limit
            # is reached once (a store whose waiters poll could otherwise
            # serve them one or two at a time), then 5 ms each.
            async with asyncio.timeout(60):
                await filled.wait()
            await asyncio.sleep(0.005)
            held -= 1
            assert await permit.release(), f"caller {i}'s permit was lost"

        await asyncio.gather(*(one(i) for i in range(CALLERS)))
        assert len(fences) == CALLERS, "every caller was served"
        assert len(set(fences)) == CALLERS, "no fencing token twice"
        assert most == LIMIT, f"the load filled the semaphore, never past it ({most})"
        state = await first.semaphore("pool", LIMIT).state()
        assert state.permits == [] and state.waiting == 0, "nothing left behind"
