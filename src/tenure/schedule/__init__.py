"""Cluster-safe cron: the scheduler, its task registry and cron expressions."""

from .cron import CronSchedule
from .scheduler import Scheduler
from .tasks import RunOutcome, ScheduledTask, ScheduledTaskStore

__all__ = ("CronSchedule", "RunOutcome", "ScheduledTask", "ScheduledTaskStore", "Scheduler")
