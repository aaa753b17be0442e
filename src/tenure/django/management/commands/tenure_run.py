"""``python manage.py tenure_run``: serve the tasks of every installed app's
``tenure_tasks`` module until SIGINT or SIGTERM."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand
from django.utils.module_loading import autodiscover_modules

from ... import TASKS_MODULE, scheduler


class Command(BaseCommand):
    help = "Serve tenure's scheduled tasks (each app's tenure_tasks module) until SIGTERM."

    def handle(self, *args: Any, **options: Any) -> None:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        autodiscover_modules(TASKS_MODULE)
        served = scheduler()
        names = [task.name for task in served.tasks if task.name != "tenure.prune"]
        if not names:
            self.stderr.write(
                f"no tasks: put @tenure.django.cron or @every in an app's {TASKS_MODULE}.py"
            )
        served.serve()
        self.stdout.write(f"tenure_run stopped: {len(names)} task(s)")
