"""The asyncio API's shape over ``tenure.sync``, so that the contract suite runs on both.

Every call goes through the blocking API on a worker thread (``asyncio.to_thread``),
a different thread from one call to the next: the suite then also checks that
the blocking API may be used from many threads, and that a lock acquired on
one may be released from another.
"""

from __future__ import annotations

import asyncio
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
