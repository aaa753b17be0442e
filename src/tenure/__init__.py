"""tenure: distributed locks and cluster-safe cron.

The public names live here; everything else is an implementation detail.
"""

from ._threads import PoolFull
from .errors import (
    ConfigurationError,
    InvalidArgument,
    LockLost,
    StoreUnavailable,
    TenureError,
    WaitQueueFull,
)
from .events import Event, EventKind, log_events
from .locks import Lock, LockService, Outcome, current_lock
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
    "CurrentRun",
    "Event",
    "EventKind",
    "ForcedRelease",
    "InvalidArgument",
    "Lock",
    "LockLost",
    "LockService",
    "Outcome",
    "PoolFull",
    "RunOutcome",
    "RunRecord",
    "ScheduledTask",
    "ScheduledTaskStore",
    "Scheduler",
    "StoreUnavailable",
    "TenureError",
    "WaitQueueFull",
    "current_lock",
    "current_run",
    "log_events",
)

__version__ = "0.1.0"
