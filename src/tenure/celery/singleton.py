"""``SingletonTask``: a Celery task that runs at most once at a time, across
every worker, for the same key.

The key is the task's name plus the arguments named in ``singleton_key``;
while one call with a key runs, another call with the same key is skipped
(returns None without running; the default) or retried later
(``singleton_on_contention = "retry"``). The lock is a tenure lease, renewed
while the task runs and released when it ends: a worker killed mid-task
frees the key within ``singleton_ttl`` seconds, with no stale lock to clear
by hand.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, ClassVar

from celery import Task

from ..errors import ConfigurationError
from .service import locks_for

__all__ = ("SingletonTask",)


class SingletonTask(Task):  # type: ignore[misc]
    """``@app.task(base=SingletonTask, singleton_key=("report_id",))``.

    Options, as task attributes (``@app.task(..., option=value)``):

    * ``singleton_key``: names of the task's arguments whose values make the
      key, besides the task's name (default: none, one run at a time in all).
    * ``singleton_ttl``: the lease's TTL in seconds (default 60): how long a
      killed worker's key stays taken. A running task keeps it renewed.
    * ``singleton_on_contention``: ``"skip"`` (default: return None without
      running) or ``"retry"`` (``self.retry`` after
      ``singleton_retry_countdown`` seconds, default 1, within the task's
      ``max_retries``).
    """

    abstract = True
    singleton_key: ClassVar[tuple[str, ...]] = ()
    singleton_ttl: ClassVar[float] = 60.0
    singleton_on_contention: ClassVar[str] = "skip"
    singleton_retry_countdown: ClassVar[float] = 1.0

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Bad options fail when the task is bound to its app, naming them."""
        if cls.singleton_on_contention not in ("skip", "retry"):
            raise ConfigurationError(
                f"task {cls.name}: singleton_on_contention must be 'skip' or 'retry', "
                f"got {cls.singleton_on_contention!r}"
            )
        if isinstance(cls.singleton_key, str):
            raise ConfigurationError(
                f"task {cls.name}: singleton_key is a tuple of argument names, "
                f"got the string {cls.singleton_key!r} (write ({cls.singleton_key!r},))"
            )
        takes = set(inspect.signature(cls.run).parameters)
        unknown = [name for name in cls.singleton_key if name not in takes]
        if unknown:
            raise ConfigurationError(
                f"task {cls.name}: singleton_key names {unknown}, which it does not take "
                f"(its arguments: {sorted(takes - {'self'})})"
            )

    def singleton_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name of a call: ``celery.<task>`` and the key's values."""
        if not self.singleton_key:
            return f"celery.{self.name}"
        bound = inspect.signature(self.run).bind(*args, **kwargs)
        bound.apply_defaults()
        values = [bound.arguments[name] for name in self.singleton_key]
        return f"celery.{self.name}:{json.dumps(values, sort_keys=True, default=str)}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.singleton_name(args, kwargs)
        lock = locks_for(self.app).acquire(name, ttl=self.singleton_ttl)
        if lock is None:
            if self.singleton_on_contention == "retry":
                raise self.retry(countdown=self.singleton_retry_countdown)
            return None
        with lock:
            return super().__call__(*args, **kwargs)
