"""Cluster-safe cron: the scheduler, its task registry and cron expressions."""

from .cron import CronSchedule
from .runs import CurrentRun, current_run
from .scheduler import Scheduler
from .tasks import RunOutcome, ScheduledTask, ScheduledTaskStore

__all__ = (
    "CronSchedule",
    "CurrentRun",
    "RunOutcome",
    "ScheduledTask",
    "ScheduledTaskStore",
    "Scheduler",
    "current_run",
)
