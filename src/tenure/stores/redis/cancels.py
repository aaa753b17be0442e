"""Cancellations redis-py swallows, raised again.

redis-py's asyncio client (seen with 8.1 and 8.2 on Python 3.11) can swallow
a cancellation that arrives while it takes a pooled connection or writes a
command: its ``asyncio.wait_for`` around the write returns the result of a
write that finished as the cancellation came. The call completes, the task's
cancel request stays pending (``cancelling()``) and nothing is raised: a
waiter would return a lock to a caller that cancelled it, and wait on. The
store checks after every redis-py call and raises it again, so that the
caller's cancellation path gives back what the call obtained.
"""

from __future__ import annotations

import asyncio

__all__ = ("cancel_requests", "raise_swallowed_cancel")


def cancel_requests() -> int:
    """The current task's pending cancel requests (0 outside a task)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def raise_swallowed_cancel(before: int) -> None:
    """Raise CancelledError if a cancel was requested since ``cancel_requests()``
    returned ``before``, and the call in between returned nonetheless."""
    if cancel_requests() > before:
        raise asyncio.CancelledError
