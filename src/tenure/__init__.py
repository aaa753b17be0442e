"""tenure: distributed locks and cluster-safe cron.

The public names live here; everything else is an implementation detail.
"""

from ._threads import PoolFull
from .control import Control
from .errors import (
    ConfigurationError,
    InvalidArgument,
    LimitMismatch,
    LockLost,
    RequestNotTaken,
    StoreUnavailable,
    TenureError,
    WaitQueueFull,
)
from .events import Event, EventKind, log_events
from .locks import Election, Lock, LockService, Outcome, Permit, Semaphore, Term, current_lock
from .schedule import (
    CurrentRun,
    RunOutcome,
    ScheduledTask,
    ScheduledTaskStore,
    Scheduler,
    current_run,
)
from .stores.audit import ForcedRelease
from .stores.runlog import RunRecord

__all__ = (
    "ConfigurationError",
    "Control",
    "CurrentRun",
    "Election",
    "Event",
    "EventKind",
    "ForcedRelease",
    "InvalidArgument",
    "LimitMismatch",
    "Lock",
    "LockLost",
    "LockService",
    "Outcome",
    "Permit",
    "PoolFull",
    "RequestNotTaken",
    "RunOutcome",
    "RunRecord",
    "ScheduledTask",
    "ScheduledTaskStore",
    "Scheduler",
    "Semaphore",
    "StoreUnavailable",
    "TenureError",
    "Term",
    "WaitQueueFull",
    "current_lock",
    "current_run",
    "log_events",
)

__version__ = "0.1.0"
