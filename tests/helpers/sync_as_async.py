"""The asyncio API's shape over ``tenure.sync``, so that the contract suite runs on both.

Every call goes through the blocking API on a worker thread (``asyncio.to_thread``),
a different thread from one call to the next: the suite then also checks that
the blocking API may be used from many threads, and that a lock acquired on
one may be released from another.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tenure import sync
from tenure.renewer import Renewer
from tenure.stores import Store


class LockOverSync:
    def __init__(self, lock: sync.Lock) -> None:
        self.blocking = lock

    def __getattr__(self, attribute: str) -> Any:  # name, token, fencing_token, held, lost ...
        return getattr(self.blocking, attribute)

    async def release(self) -> bool:
        return await asyncio.to_thread(self.blocking.release)

    async def wait_lost(self) -> None:
        await asyncio.to_thread(self.blocking.wait_lost)

    async def __aenter__(self) -> LockOverSync:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.blocking.__exit__, exc_type, exc, tb)


class SemaphoreOverSync:
    def __init__(self, semaphore: sync.Semaphore) -> None:
        self.blocking = semaphore

    def __getattr__(self, attribute: str) -> Any:  # name, limit
        return getattr(self.blocking, attribute)

    async def acquire(self, *, ttl: float = 30.0, wait: float = 0.0) -> Any:
        permit = await asyncio.to_thread(self.blocking.acquire, ttl=ttl, wait=wait)
        return None if permit is None else LockOverSync(permit)

    async def run_exclusively(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.blocking.run_exclusively, fn, *args, **kwargs)

    async def state(self) -> Any:
        return await asyncio.to_thread(self.blocking.state)


class TermOverSync(LockOverSync):
    async def resign(self) -> bool:
        return await self.release()


class ElectionOverSync:
    def __init__(self, election: sync.Election) -> None:
        self.blocking = election

    async def campaign(self, *, ttl: float = 30.0, wait: float = math.inf) -> Any:
        term = await asyncio.to_thread(self.blocking.campaign, ttl=ttl, wait=wait)
        return None if term is None else TermOverSync(term.lock)

    async def leader(self) -> str | None:
        return await asyncio.to_thread(self.blocking.leader)

    async def serve(self, *, ttl: float = 30.0) -> None:
        # serve() blocks its thread until stop(): a cancelled wait stops it.
        try:
            await asyncio.shield(asyncio.to_thread(self.blocking.serve, ttl=ttl))
        except asyncio.CancelledError:
            self.blocking.stop()
            raise


class ServiceOverSync:
    """``tenure.LockService``'s methods, each made by ``tenure.sync.LockService``."""

    def __init__(self, url: str) -> None:
        self.blocking = sync.LockService.from_url(url)
        # The test's own loop gets a store of its own on the same data: the
        # service's may be bound to the blocking API's loop thread.
        self.store: Store = self.blocking.store.sibling()

    @property
    def holder(self) -> str:
        return self.blocking.holder

    @property
    def renewer(self) -> Renewer:
        return self.blocking._core.renewer

    async def acquire(self, name: str, *, ttl: float = 30.0, wait: float = 0.0) -> Any:
        lock = await asyncio.to_thread(self.blocking.acquire, name, ttl=ttl, wait=wait)
        return None if lock is None else LockOverSync(lock)

    def semaphore(self, name: str, limit: int) -> SemaphoreOverSync:
        return SemaphoreOverSync(self.blocking.semaphore(name, limit))

    def election(self, name: str, **callbacks: Any) -> ElectionOverSync:
        return ElectionOverSync(self.blocking.election(name, **callbacks))

    async def run_exclusively(
        self, name: str, fn: Callable[..., Any], *args: Any, ttl: float = 30.0, **kwargs: Any
    ) -> sync.Outcome:
        return await asyncio.to_thread(
            self.blocking.run_exclusively, name, fn, *args, ttl=ttl, **kwargs
        )

    async def __aenter__(self) -> ServiceOverSync:
        await asyncio.to_thread(self.blocking.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.blocking.close)
        if self.store is not self.blocking.store:
            await self.store.aclose()
