"""An application module for ``tenure run`` tests: a factory taking the LockService."""

from __future__ import annotations

from tenure import LockService, Scheduler


def make(locks: LockService) -> Scheduler:
    scheduler = Scheduler(locks, prune=None)

    @scheduler.cron("* * * * * *", name="cli.tick")
    async def tick() -> None:
        pass

    return scheduler


not_a_scheduler = 42
