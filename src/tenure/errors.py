"""The exception tree of tenure.

::

    TenureError                      every error tenure raises on purpose
    ├── InvalidArgument (ValueError) a bad name, TTL, wait, cron expression ...
    │   ├── ConfigurationError       a bad URL, option, or store file
    │   └── LimitMismatch            a semaphore's limit differs from its live one
    ├── StoreUnavailable             the store could not be reached or failed;
    │                                the driver's exception is ``__cause__``
    ├── RequestNotTaken              no instance took a request to run a task now
    └── LockLost                     a held lock was lost under running work

Bad arguments are ``ValueError`` subclasses so that code written against the
standard library's conventions catches them. Nothing is changed in any store
when one of them is raised.
"""

from __future__ import annotations

__all__ = (
    "ConfigurationError",
    "InvalidArgument",
    "LimitMismatch",
    "LockLost",
    "RequestNotTaken",
    "StoreUnavailable",
    "TenureError",
    "WaitQueueFull",
)


class TenureError(Exception):
    """The root of every exception tenure raises on purpose."""


class InvalidArgument(TenureError, ValueError):
    """An argument was rejected before anything was sent to a store."""


class ConfigurationError(InvalidArgument):
    """A store URL, a store option, or the store's file or schema is unusable."""


class LimitMismatch(InvalidArgument):
    """A semaphore was asked for with a limit other than the one its live
    permits and waiters were granted under; nothing was changed. Once it is
    idle (no permit, no waiter), the next caller's limit holds."""

    def __init__(self, name: str, live: int, asked: int) -> None:
        super().__init__(
            f"semaphore {name!r} is in use with limit {live}, not {asked}: every caller "
            f"must ask the same limit while a permit or a waiter exists (a new limit "
            f"takes effect once the semaphore is idle)"
        )
        self.name = name
        self.live = live
        self.asked = asked


class StoreUnavailable(TenureError):
    """The store could not be reached or failed to answer.

    Never means "the lock is held elsewhere": contention is ``None`` from
    ``acquire``. The driver's own exception is attached as ``__cause__``.
    """


class RequestNotTaken(TenureError):
    """A request to run a task now (``tenure trigger``) that no instance
    serving the task took in time; it was withdrawn, and nothing ran."""


class LockLost(TenureError):
    """A lock was lost while work ran under it.

    Raised by ``run_exclusively`` when a renewal found the token gone, or when
    no renewal was confirmed before the lock's local deadline.
    """

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"lock {name!r} was lost while held: {reason}")
        self.name = name
        self.reason = reason


class WaitQueueFull(TenureError):
    """As many callers as the bound allows already wait for this name here."""
