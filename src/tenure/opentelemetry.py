"""OpenTelemetry traces and metrics for a LockService and its schedulers.

Install with ``pip install 'tenure[opentelemetry]'``:

    from tenure.opentelemetry import instrument

    undo = instrument(locks)  # either API's LockService; undo() stops it

It uses the global tracer and meter providers unless given others, and needs
``opentelemetry-api`` only: the application picks the SDK and exporters.

Spans (tracer ``tenure``; attributes under ``tenure.``):

* ``tenure.acquire``: one acquire call, from when it was made to its answer,
  so its length is the time it waited; ``tenure.acquire.result`` (granted,
  contended, unavailable: then the span's status is an error).
* ``tenure.hold``: a lock held, from its grant to its release or loss;
  ``tenure.lock.fencing_token``, ``tenure.lock.outcome`` (released, lost) and,
  when lost, ``tenure.lock.lost_reason`` and an error status.
* ``tenure.run``: a scheduled task's run, around its function and current in
  it, so the spans the function opens are its children (in a plain
  function's worker thread too); ``tenure.task.name``,
  ``tenure.task.occurrence`` (POSIX seconds; absent for a manual run),
  ``tenure.task.run_id``, ``tenure.task.lateness`` (seconds from the
  occurrence to the function's start, on this host's clock),
  ``tenure.task.outcome`` (ran, failed, lost) and, when it failed, the
  exception (an event) and ``error.type``.

Every span has ``tenure.lock.name`` (or the task's) and ``tenure.holder``
(``host:pid:id``, the instance). The acquire and hold spans start on the
thread of their event (the caller's for an acquire on asyncio): their parent
is the span current there. Tokens and store URLs are never attributes.

Metrics (meter ``tenure``), the Prometheus module's in OpenTelemetry's names:

===============================  =========  =======================================
``tenure.acquire.attempts``      counter    ``tenure.lock.name``, ``tenure.acquire.result``
``tenure.acquire.duration``      histogram  seconds acquires took, waits included
``tenure.lock.hold.duration``    histogram  seconds from grant to release
``tenure.lock.losses``           counter    locks lost while held
``tenure.renewal.failures``      counter    renewal batches that did not reach the store
``tenure.task.runs``             counter    ``tenure.task.name``, ``tenure.task.outcome``
                                            (ran, skipped, failed, lost,
                                            claimed_elsewhere, missed)
``tenure.task.duration``         histogram  seconds a run took
``tenure.task.lateness``         histogram  seconds from occurrence to the function's start
``tenure.clock.skew``            gauge      a scheduler's clock minus the store's, past
                                            its ``skew_warning``
``tenure.lock.forced_releases``  counter    locks freed by ``force_release``
===============================  =========  =======================================

With many distinct lock names pass ``lock_names=False``: metrics then carry no
lock name (spans still do).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from . import __version__
from .errors import InvalidArgument, LockLost
from .events import Event, EventKind
from .schedule import CurrentRun

__all__ = ("instrument",)

_ACQUIRE_RESULTS = {
    EventKind.ACQUIRED: "granted",
    EventKind.CONTENDED: "contended",
    EventKind.UNAVAILABLE: "unavailable",
}


def instrument(
    locks: Any,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    lock_names: bool = True,
) -> Callable[[], None]:
    """Trace and measure ``locks`` (a ``tenure.LockService`` or a
    ``tenure.sync.LockService``) and the schedulers built on it; returns the
    function that stops it (spans of locks still held end then)."""
    subscribe = getattr(locks, "subscribe", None)
    wrap_runs = getattr(locks, "wrap_runs", None)
    if not callable(subscribe) or not callable(wrap_runs):
        raise InvalidArgument(
            f"instrument() takes a tenure LockService (asyncio or tenure.sync), got {locks!r}"
        )
    telemetry = _Telemetry(
        trace.get_tracer("tenure", __version__, tracer_provider),
        metrics.get_meter("tenure", __version__, meter_provider=meter_provider),
        str(locks.holder),
        lock_names,
    )
    unsubscribe = subscribe(telemetry.event)
    unwrap = wrap_runs(telemetry.run)

    def undo() -> None:
        unsubscribe()
        unwrap()
        telemetry.end_all()

    return undo


class _Telemetry:
    """One instrumentation: an event hook and a run wrapper."""

    def __init__(
        self, tracer: trace.Tracer, meter: metrics.Meter, holder: str, lock_names: bool
    ) -> None:
        self.tracer = tracer
        self.holder = holder
        self.lock_names = lock_names
        self._held: dict[tuple[str, int | None], Span] = {}
        """Hold spans of locks held now, by name and fencing token."""
        self._guard = threading.Lock()  # events come from callers' threads and the renewer's
        # The units and descriptions are the module docstring's table.
        counter, histogram = meter.create_counter, meter.create_histogram
        self.attempts = counter("tenure.acquire.attempts", "{attempt}", "Acquire calls by result.")
        self.acquire_duration = histogram("tenure.acquire.duration", "s", "Acquire call time.")
        self.hold_duration = histogram("tenure.lock.hold.duration", "s", "Time locks were held.")
        self.losses = counter("tenure.lock.losses", "{loss}", "Locks lost while held.")
        self.renewal_failures = counter("tenure.renewal.failures", "{batch}", "Failed renewals.")
        self.runs = counter("tenure.task.runs", "{run}", "Task occurrences by outcome.")
        self.run_duration = histogram("tenure.task.duration", "s", "Task run time.")
        self.lateness = histogram("tenure.task.lateness", "s", "Occurrence to function start.")
        self.skew = meter.create_gauge("tenure.clock.skew", "s", "Clock minus the store's.")
        self.forced = counter("tenure.lock.forced_releases", "{release}", "Forced releases.")

    def _lock(self, event: Event) -> dict[str, str]:
        return {"tenure.lock.name": event.name} if self.lock_names else {}

    def event(self, event: Event) -> None:
        kind = event.kind
        result = _ACQUIRE_RESULTS.get(kind)
        if result is not None:
            self._acquired(event, result)
        elif kind == EventKind.RELEASED:
            if event.seconds is not None:
                self.hold_duration.record(event.seconds, self._lock(event))
            self._end_hold(event, "lost" if event.detail == "lost" else "released", None)
        elif kind == EventKind.LOST:
            self.losses.add(1, self._lock(event))
            self._end_hold(event, "lost", event.detail)
        elif kind == EventKind.RENEWAL_FAILED:
            self.renewal_failures.add(event.count)
        elif kind == EventKind.TASK:
            outcome = event.detail or ""
            self.runs.add(1, {"tenure.task.name": event.name, "tenure.task.outcome": outcome})
            if event.seconds is not None:
                self.run_duration.record(event.seconds, {"tenure.task.name": event.name})
        elif kind == EventKind.SKEW:
            if event.seconds is not None:
                self.skew.set(event.seconds)
        elif kind == EventKind.FORCED_RELEASE:
            self.forced.add(1, self._lock(event))

    def _acquired(self, event: Event, result: str) -> None:
        labels = self._lock(event)
        self.attempts.add(1, {**labels, "tenure.acquire.result": result})
        if event.seconds is not None:
            self.acquire_duration.record(event.seconds, labels)
        end = time.time_ns()
        start = end - round((event.seconds or 0.0) * 1e9)
        attributes: dict[str, Any] = {
            "tenure.lock.name": event.name,
            "tenure.holder": event.holder,
            "tenure.acquire.result": result,
        }
        if event.fencing_token is not None:
            attributes["tenure.lock.fencing_token"] = event.fencing_token
        span = self.tracer.start_span(
            "tenure.acquire", kind=SpanKind.INTERNAL, attributes=attributes, start_time=start
        )
        if event.kind == EventKind.UNAVAILABLE:
            span.set_attribute("error.type", "StoreUnavailable")  # the semantic conventions'
            span.set_status(Status(StatusCode.ERROR, event.detail))
        span.end(end_time=end)
        if event.kind == EventKind.ACQUIRED:
            del attributes["tenure.acquire.result"]
            hold = self.tracer.start_span(
                "tenure.hold", kind=SpanKind.INTERNAL, attributes=attributes, start_time=end
            )
            with self._guard:
                self._held[(event.name, event.fencing_token)] = hold

    def _end_hold(self, event: Event, outcome: str, reason: str | None) -> None:
        with self._guard:
            span = self._held.pop((event.name, event.fencing_token), None)
        if span is None:  # acquired before instrument(), or its loss already ended it
            return
        span.set_attribute("tenure.lock.outcome", outcome)
        if outcome == "lost":
            if reason is not None:
                span.set_attribute("tenure.lock.lost_reason", reason)
            span.set_status(Status(StatusCode.ERROR, reason or "lost"))
        span.end()

    def end_all(self) -> None:
        with self._guard:
            spans, self._held = list(self._held.values()), {}
        for span in spans:
            span.set_attribute("tenure.lock.outcome", "unobserved")
            span.end()

    @contextmanager
    def run(self, run: CurrentRun) -> Iterator[None]:
        attributes: dict[str, Any] = {
            "tenure.task.name": run.task,
            "tenure.task.run_id": run.run_id,
            "tenure.holder": self.holder,
        }
        if run.lock is not None:
            attributes["tenure.lock.name"] = run.lock.name
            attributes["tenure.lock.fencing_token"] = run.lock.fencing_token
        if run.fire_time is not None:
            lateness = max(time.time() - run.fire_time, 0.0)
            attributes["tenure.task.occurrence"] = run.fire_time
            attributes["tenure.task.lateness"] = lateness
            self.lateness.record(lateness, {"tenure.task.name": run.task})
        with self.tracer.start_as_current_span(
            "tenure.run", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            try:
                yield
            except BaseException as exc:
                lost = isinstance(exc, LockLost)
                span.set_attribute("tenure.task.outcome", "lost" if lost else "failed")
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
            span.set_attribute("tenure.task.outcome", "ran")
