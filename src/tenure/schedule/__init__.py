"""Cluster-safe cron: the scheduler, its task registry and cron expressions."""

from .cron import CronSchedule
from .scheduler import Scheduler
from .tasks import CurrentRun, RunOutcome, ScheduledTask, ScheduledTaskStore, current_run

__all__ = (
    "CronSchedule",
    "CurrentRun",
    "RunOutcome",
    "ScheduledTask",
    "ScheduledTaskStore",
    "Scheduler",
    "current_run",
)
