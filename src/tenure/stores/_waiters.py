"""Local waiters by name, woken from one shared notification stream.

A store that learns of releases through one subscription (one watch, one
LISTEN) per process dispatches each to the waiters of that name here, instead
of opening a subscription per waiter: 500 waiters cost one stream, and a
release wakes the waiters of its own name, not every waiter.
"""

from __future__ import annotations

import asyncio

__all__ = ("Wakeups",)


class Wakeups:
    """Waiters on one event loop, each an ``asyncio.Event``, keyed by name."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = {}

    def add(self, name: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiting.setdefault(name, set()).add(event)
        return event

    def remove(self, name: str, event: asyncio.Event) -> None:
        waiting = self._waiting.get(name)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._waiting[name]

    def wake(self, name: str) -> None:
        for event in self._waiting.get(name, ()):
            event.set()

    def wake_all(self) -> None:
        """The stream failed: every waiter looks again (a spurious wake-up)."""
        for waiting in self._waiting.values():
            for event in waiting:
                event.set()

    def __len__(self) -> int:
        return sum(len(waiting) for waiting in self._waiting.values())
