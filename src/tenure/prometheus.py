"""Prometheus metrics for a LockService and its schedulers (``tenure[prometheus]``).

    from prometheus_client import start_http_server
    from tenure.prometheus import PrometheusMetrics

    locks.subscribe(PrometheusMetrics())
    start_http_server(9464, addr="127.0.0.1")

Metrics (all prefixed ``tenure_``; ``lock`` and ``task`` labels are the names):

=================================  =========  ===========================================
``acquire_attempts_total``         counter    ``lock``, ``result``: granted, contended, unavailable
``acquire_wait_seconds``           histogram  ``lock``: how long acquires took, waits included
``hold_seconds``                   histogram  ``lock``: from grant to release
``locks_lost_total``               counter    ``lock``: losses (store said no, deadline passed)
``renewal_failures_total``         counter    renewal batches that did not reach the store
``task_runs_total``                counter    ``task``, ``outcome``: ran, skipped, failed,
                                              lost, claimed_elsewhere
``task_duration_seconds``          histogram  ``task``
``clock_skew_seconds``             gauge      a scheduler's clock minus the store's, when
                                              past its ``skew_warning``
``forced_releases_total``          counter    ``lock``: locks freed by ``force_release``
=================================  =========  ===========================================

With many distinct lock names (one per user, per order...) pass
``lock_labels=False``: the ``lock`` label is then ``""`` and the series stay few.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from .events import Event, EventKind

__all__ = ("PrometheusMetrics",)

_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)


class PrometheusMetrics:
    """An event hook that keeps Prometheus counters and histograms.

    One instance per registry: it registers its metrics when made (a second
    instance on the same registry raises prometheus_client's "Duplicated
    timeseries" error). Subscribe the same instance to several services to sum
    them.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        namespace: str = "tenure",
        lock_labels: bool = True,
    ) -> None:
        self.lock_labels = lock_labels
        self.attempts = Counter(
            "acquire_attempts",
            "Acquire calls by result.",
            ["lock", "result"],
            namespace=namespace,
            registry=registry,
        )
        self.wait = Histogram(
            "acquire_wait_seconds",
            "Time acquire calls took, waits included.",
            ["lock"],
            buckets=_WAIT_BUCKETS,
            namespace=namespace,
            registry=registry,
        )
        self.hold = Histogram(
            "hold_seconds",
            "Time locks were held.",
            ["lock"],
            buckets=_HOLD_BUCKETS,
            namespace=namespace,
            registry=registry,
        )
        self.lost = Counter(
            "locks_lost", "Locks lost while held.", ["lock"], namespace=namespace, registry=registry
        )
        self.renewal_failures = Counter(
            "renewal_failures",
            "Renewal batches that did not reach the store.",
            namespace=namespace,
            registry=registry,
        )
        self.task_runs = Counter(
            "task_runs",
            "Scheduled task runs by outcome.",
            ["task", "outcome"],
            namespace=namespace,
            registry=registry,
        )
        self.task_duration = Histogram(
            "task_duration_seconds",
            "Duration of scheduled task runs.",
            ["task"],
            buckets=_HOLD_BUCKETS,
            namespace=namespace,
            registry=registry,
        )
        self.forced = Counter(
            "forced_releases",
            "Locks freed whoever held them (force_release).",
            ["lock"],
            namespace=namespace,
            registry=registry,
        )
        self.skew = Gauge(
            "clock_skew_seconds",
            "A scheduler's clock minus the store's, as last reported past its bound.",
            namespace=namespace,
            registry=registry,
        )

    def __call__(self, event: Event) -> None:
        kind = event.kind
        lock = event.name if self.lock_labels else ""
        if kind in (EventKind.ACQUIRED, EventKind.CONTENDED, EventKind.UNAVAILABLE):
            result = "granted" if kind == EventKind.ACQUIRED else str(kind)
            self.attempts.labels(lock, result).inc()
            if event.seconds is not None:
                self.wait.labels(lock).observe(event.seconds)
        elif kind == EventKind.RELEASED:
            if event.seconds is not None:
                self.hold.labels(lock).observe(event.seconds)
        elif kind == EventKind.LOST:
            self.lost.labels(lock).inc()
        elif kind == EventKind.RENEWAL_FAILED:
            self.renewal_failures.inc()
        elif kind == EventKind.SKEW:
            if event.seconds is not None:
                self.skew.set(event.seconds)
        elif kind == EventKind.FORCED_RELEASE:
            self.forced.labels(lock).inc()
        elif kind == EventKind.TASK:
            self.task_runs.labels(event.name, event.detail or "").inc()
            if event.seconds is not None:
                self.task_duration.labels(event.name).observe(event.seconds)
