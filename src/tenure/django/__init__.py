"""tenure for Django: settings, a service per process, tasks from each app.

Add ``"tenure.django"`` to ``INSTALLED_APPS`` and set ``TENURE_URL`` (a store
URL, as for ``LockService.from_url``). Optional: ``TENURE_SCHEDULER``, a dict
of ``tenure.Scheduler`` options (``misfire_grace``, ``shutdown_timeout``,
``threads``, ...).

* ``locks()``: this process's ``tenure.sync.LockService``, made at first use
  (so after a fork, in the process that uses it).
* ``cron(...)`` and ``every(...)``: decorators registering a task with this
  process's scheduler, in a module named ``tenure_tasks`` of any installed app
  (``python manage.py tenure_run`` imports them all, then serves). A plain
  task runs between ``close_old_connections()`` calls, as Django expects of
  code outside a request.
* ``exclusive_command(...)``: a class decorator that makes a management
  command run once at a time across the cluster (the others skip).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .._aio import is_async
from ..errors import ConfigurationError
from ..sync import LockService, Outcome, Scheduler

__all__ = ("cron", "every", "exclusive_command", "locks", "scheduler")

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

TASKS_MODULE = "tenure_tasks"
"""The module of each installed app that ``tenure_run`` imports for its tasks."""

_made: dict[str, Any] = {}
_guard = threading.Lock()


def _settings() -> tuple[str, dict[str, Any]]:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    url = getattr(settings, "TENURE_URL", None)
    if not isinstance(url, str) or not url:
        raise ImproperlyConfigured(
            f"TENURE_URL must be a store URL (such as 'sqlite:///var/lib/myapp/tenure.db' "
            f"or 'redis://host:6379/0'), got {url!r}; set it in your settings"
        )
    options = getattr(settings, "TENURE_SCHEDULER", {})
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ImproperlyConfigured(
            f"TENURE_SCHEDULER must be a dict of tenure.Scheduler options, got {options!r}"
        )
    return url, options


def check_settings() -> None:
    """ImproperlyConfigured, naming the setting, unless tenure's settings are
    usable (the app's ``ready()`` calls it: bad settings fail at start-up)."""
    from django.core.exceptions import ImproperlyConfigured

    url, options = _settings()
    try:
        from ..stores import store_class

        store_class(url)
        Scheduler(LockService.from_url("memory://"), **options)
    except (ConfigurationError, TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"tenure settings: {exc}") from exc


def locks() -> LockService:
    """This process's service on ``TENURE_URL``, made at first use."""
    with _guard:
        made = _made.get("locks")
        if made is None:
            url, _ = _settings()
            made = _made["locks"] = LockService.from_url(url)
        service: LockService = made
        return service


def scheduler() -> Scheduler:
    """This process's blocking scheduler on ``locks()``, with ``TENURE_SCHEDULER``'s options."""
    service = locks()
    with _guard:
        made = _made.get("scheduler")
        if made is None:
            _, options = _settings()
            made = _made["scheduler"] = Scheduler(service, **options)
        sched: Scheduler = made
        return sched


def _with_connections(fn: F) -> F:
    """``fn`` between ``close_old_connections()`` calls when it is plain: a
    worker thread's database connection is checked before, and closed after
    when it has outlived ``CONN_MAX_AGE``, as Django does around a request."""
    if is_async(fn):
        return fn
    from django.db import close_old_connections

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return run  # type: ignore[return-value]


def cron(expr: str, **options: Any) -> Callable[[F], F]:
    """``@cron("0 3 * * *", name=..., ttl=..., tz=...)``: a task of this
    process's scheduler (see ``tenure.Scheduler.cron``)."""

    def register(fn: F) -> F:
        scheduler().add(_with_connections(fn), expr, **options)
        return fn

    return register


def every(**options: Any) -> Callable[[F], F]:
    """``@every(minutes=15, name=...)``: a task of this process's scheduler
    (see ``tenure.Scheduler.every``)."""

    def register(fn: F) -> F:
        scheduler().every(**options)(_with_connections(fn))
        return fn

    return register


def exclusive_command(name: str | None = None, *, ttl: float = 30.0) -> Callable[[C], C]:
    """A class decorator for a management command (a ``BaseCommand``
    subclass): its ``handle`` runs under the lock ``name`` (default
    ``django.command.<module>``), renewed while it runs; when another process
    holds it, the command writes why to stderr and does nothing."""

    def decorate(command: C) -> C:
        lock_name = name or f"django.command.{command.__module__}"
        handle = command.handle  # type: ignore[attr-defined]

        @functools.wraps(handle)
        def exclusively(self: Any, *args: Any, **options: Any) -> Any:
            result: list[Any] = [None]

            def run() -> None:
                result[0] = handle(self, *args, **options)

            outcome = locks().run_exclusively(lock_name, run, ttl=ttl)
            if outcome is Outcome.SKIPPED:
                self.stderr.write(f"skipped: another process holds {lock_name!r}")
            return result[0]

        command.handle = exclusively  # type: ignore[attr-defined]
        return command

    return decorate
