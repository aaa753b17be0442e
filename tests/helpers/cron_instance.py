"""One instance of a scheduled application, for the scheduler's process tests.

    python cron_instance.py URL WORK_SECONDS

Runs the task ``job`` every second (TTL 1 s, presence lease 1 s); each run prints
``{"started": fire_time}`` and then works for WORK_SECONDS.
"""

from __future__ import annotations

import asyncio
import json
import sys

from tenure import LockService, Scheduler


async def main(url: str, work: float) -> None:
    async with LockService.from_url(url) as locks:
        # A short presence: the test sees a killed instance's run abandoned soon.
        scheduler = Scheduler(locks, prune=None, presence_ttl=1)

        @scheduler.cron("* * * * * *", name="job", ttl=1)
        async def job() -> None:
            sys.stdout.write(json.dumps({"started": True, "holder": locks.holder}) + "\n")
            sys.stdout.flush()
            await asyncio.sleep(work)

        sys.stdout.write(json.dumps({"ready": True, "holder": locks.holder}) + "\n")
        sys.stdout.flush()
        await scheduler.serve()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
