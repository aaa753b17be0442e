"""What happens to locks and tasks, as events for metrics and logs.

``LockService.subscribe(hook)`` calls ``hook(event)`` for every event of that
service (and of the schedulers built on it) until the function it returned is
called. Hooks run synchronously on the thread where the event happened (the
caller's for acquires and releases, the renewer's for losses and failed
renewals), so they must be quick and must not block; an exception from a hook
is logged and never reaches tenure. With no hook subscribed, emitting costs one
attribute test.

Events carry the lock's or task's name, the holder id (``host:pid:id``) and the
fencing token, never the secret token.

Kinds (``Event.kind``, an ``EventKind``):

``acquired``        a grant; ``seconds``: how long the acquire took, waits included
``contended``       acquire returned None (held elsewhere); ``seconds`` as above
``unavailable``     acquire raised StoreUnavailable; ``detail``: the error
``released``        ``seconds``: how long it was held; ``detail``: ``held`` or ``lost``
``lost``            ``detail``: why (the store no longer has it, its deadline passed, ...)
``renewal_failed``  a renewal batch did not reach the store (retried until the
                    deadlines); ``name``: ``""``; ``count``: locks in the batch;
                    ``detail``: the error
``task``            a scheduled task's run; ``detail``: ``ran``, ``skipped``,
                    ``failed``, ``lost``, ``missed``, ``claimed_elsewhere`` or
                    ``paused`` (its pause skipped it); ``seconds``: its duration
``skew``            a scheduler found its clock off the store's by more than its
                    ``skew_warning``; ``seconds``: its clock minus the store's
``forced_release``  ``force_release`` freed a lock whoever held it; ``holder``:
                    this service's; ``fencing_token``: the evicted grant's;
                    ``detail``: ``<operator> evicted <holder>``
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ("Event", "EventKind", "Hook", "RunWrapper", "RunWrappers", "log_events")

log = logging.getLogger("tenure.events")

C = TypeVar("C", bound=Callable[..., Any])


class EventKind(enum.StrEnum):
    """What an event is about (the table above); a ``str``, so
    ``event.kind == "acquired"`` holds too."""

    ACQUIRED = "acquired"
    CONTENDED = "contended"
    UNAVAILABLE = "unavailable"
    RELEASED = "released"
    LOST = "lost"
    RENEWAL_FAILED = "renewal_failed"
    TASK = "task"
    SKEW = "skew"
    FORCED_RELEASE = "forced_release"


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    name: str
    holder: str
    fencing_token: int | None = None
    seconds: float | None = None
    detail: str | None = None
    count: int = 1


Hook = Callable[[Event], None]


class _Callables(Generic[C]):
    """Callables a service calls; copy-on-write, so calling them needs no lock."""

    __slots__ = ("items",)
    what = "callable"

    def __init__(self) -> None:
        self.items: tuple[C, ...] = ()

    def add(self, item: C) -> Callable[[], None]:
        """Add ``item``; returns the function that removes it."""
        if not callable(item):
            from .errors import InvalidArgument

            raise InvalidArgument(f"a {self.what} must be callable, got {item!r}")
        self.items = (*self.items, item)

        def remove() -> None:
            self.items = tuple(i for i in self.items if i is not item)

        return remove


class Hooks(_Callables[Hook]):
    """A service's event subscribers."""

    __slots__ = ()
    what = "hook"

    @property
    def hooks(self) -> tuple[Hook, ...]:
        return self.items

    def emit(self, event: Event) -> None:
        for hook in self.items:
            try:
                hook(event)
            except Exception:
                log.exception("a tenure event hook failed on a %r event", event.kind)


RunWrapper = Callable[[Any], AbstractContextManager[object]]
"""``wrapper(run)``, given a scheduled run's ``CurrentRun``: a context manager
entered around the run's task function (``LockService.wrap_runs``)."""


class RunWrappers(_Callables[RunWrapper]):
    """A service's run wrappers."""

    __slots__ = ()
    what = "run wrapper"

    def around(self, run: Any) -> AbstractContextManager[None]:
        """Every wrapper entered around the body, in the order added. A wrapper
        that fails is logged and left out: it cannot break the run, nor change
        how it ended."""
        if not self.items:  # the common case costs a scheduler's tick nothing
            return contextlib.nullcontext()
        return self._entered(self.items, run)

    @staticmethod
    @contextlib.contextmanager
    def _entered(wrappers: tuple[RunWrapper, ...], run: Any) -> Iterator[None]:
        entered = []
        for wrapper in wrappers:
            try:
                manager = wrapper(run)
                manager.__enter__()
            except Exception:
                log.exception("a tenure run wrapper failed entering the run of %r", run.task)
            else:
                entered.append(manager)
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            # Left in reverse, each told of the run's error; none may raise
            # past here nor swallow it.
            kind, trace = (type(error), error.__traceback__) if error else (None, None)
            for manager in reversed(entered):
                try:
                    manager.__exit__(kind, error, trace)
                except Exception:
                    log.exception("a tenure run wrapper failed leaving a run")


_LEVELS = {
    EventKind.LOST: logging.WARNING,
    EventKind.RENEWAL_FAILED: logging.WARNING,
    EventKind.UNAVAILABLE: logging.WARNING,
    EventKind.SKEW: logging.WARNING,
    EventKind.FORCED_RELEASE: logging.WARNING,
    EventKind.ACQUIRED: logging.DEBUG,
    EventKind.RELEASED: logging.DEBUG,
    EventKind.CONTENDED: logging.DEBUG,
}


def log_events(logger: logging.Logger | None = None) -> Hook:
    """A hook that logs each event as one structured record.

    The message is readable as it is; the fields are also in the record's
    ``extra`` (``tenure_event``, ``lock``, ``holder``, ``fencing_token``,
    ``seconds``, ``detail``) for JSON log formatters. Losses, failed renewals,
    an unreachable store and forced releases are warnings; the rest is INFO (``contended`` and
    ``acquired``/``released`` DEBUG, being the common case).
    """
    target = logger if logger is not None else log

    def hook(event: Event) -> None:
        level = _LEVELS.get(event.kind, logging.INFO)
        if not target.isEnabledFor(level):
            return
        parts = [f"{event.kind} {event.name!r}" if event.name else event.kind]
        parts.append(f"holder={event.holder}")
        if event.fencing_token is not None:
            parts.append(f"fencing_token={event.fencing_token}")
        if event.seconds is not None:
            parts.append(f"seconds={event.seconds:.3f}")
        if event.count != 1:
            parts.append(f"count={event.count}")
        if event.detail:
            parts.append(f"detail={event.detail}")
        target.log(
            level,
            " ".join(parts),
            extra={
                "tenure_event": event.kind,
                "lock": event.name,
                "holder": event.holder,
                "fencing_token": event.fencing_token,
                "seconds": event.seconds,
                "detail": event.detail,
            },
        )

    return hook
