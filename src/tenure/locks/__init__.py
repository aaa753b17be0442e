"""The lock API, with no store-specific code: ``LockService`` and the ``Lock``
it grants (the service), waiting for a held lock, many locks in few calls,
running a function under a lock, semaphores and leader election, and the
blocking API's one seam (``Direct``).

See ``docs/architecture.md`` for how a call goes from here to a store and back.
"""

from .direct import Direct
from .election import Election, Term
from .line import WAITERS
from .lock import Lock, as_current, current_lock
from .running import Outcome
from .semaphore import Permit, Semaphore
from .service import LockService

__all__ = (
    "WAITERS",
    "Direct",
    "Election",
    "Lock",
    "LockService",
    "Outcome",
    "Permit",
    "Semaphore",
    "Term",
    "as_current",
    "current_lock",
)
