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


LONG_NAME = "reports.nightly-export-of-every-customer-invoice"
LONG_ZONE = "America/Argentina/Buenos_Aires"
LONG_ERROR = "RuntimeError: " + "the upstream ledger answered 503 Service Unavailable, " * 3


def make_long(locks: LockService) -> Scheduler:
    """A task whose name, zone and error are longer than any column would be."""
    scheduler = Scheduler(locks, prune=None)

    @scheduler.cron("0 3 * * *", name=LONG_NAME, tz=LONG_ZONE)
    async def export() -> None:
        raise RuntimeError(LONG_ERROR.removeprefix("RuntimeError: "))

    return scheduler
