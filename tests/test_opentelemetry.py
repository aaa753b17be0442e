"""The OpenTelemetry instrumentation, read back through the SDK's in-memory exporters,
and the run wrappers (``wrap_runs``) it is built on."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tenure import CurrentRun, InvalidArgument, LockLost, LockService, Outcome, Scheduler, sync
from tenure.opentelemetry import instrument

from .conftest import STORES

TTL = 1.0


@dataclass
class Otel:
    tracer_provider: TracerProvider
    exporter: InMemorySpanExporter
    meter_provider: MeterProvider
    reader: InMemoryMetricReader

    def instrument(self, locks: Any, **options: Any) -> Any:
        return instrument(
            locks,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            **options,
        )

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for m in scope.metrics
            if m.name == metric
            for point in m.data.data_points
        ]

    def value(self, metric: str, **attributes: Any) -> Any:
        """A counter's sum, or a histogram's count, for exactly these attributes."""
        for point in self.points(metric):
            if dict(point.attributes) == attributes:
                return getattr(point, "value", None) or getattr(point, "count", None)
        return None


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(tracer_provider, exporter, meter_provider, reader)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def sqlite_url(tmp: Path) -> str:
    return STORES["sqlite"].make_url(tmp)


def attribute_values(spans: list[ReadableSpan]) -> str:
    return " ".join(str(v) for span in spans for v in (span.attributes or {}).values())


async def test_a_waiting_acquire_and_a_held_lock_are_spans_and_metrics(
    tmp_path: Path, otel: Otel
) -> None:
    tracer = otel.tracer_provider.get_tracer("app")
    async with (
        LockService.from_url(sqlite_url(tmp_path)) as locks,
        LockService.from_url(sqlite_url(tmp_path)) as other,
    ):
        undo = otel.instrument(locks)
        theirs = await other.acquire("w", ttl=TTL)
        assert theirs is not None

        async def release_later() -> None:
            await asyncio.sleep(0.3)
            await theirs.release()

        releasing = asyncio.ensure_future(release_later())
        with tracer.start_as_current_span("request") as request:
            lock = await locks.acquire("w", ttl=TTL, wait=10)
        await releasing
        assert lock is not None
        assert await locks.acquire("w", ttl=TTL) is None
        await asyncio.sleep(0.05)
        assert await lock.release()
        undo()
        after = await locks.acquire("after-undo", ttl=TTL)
        assert after is not None
        await after.release()

    granted, contended = otel.spans("tenure.acquire")
    assert granted.attributes is not None and contended.attributes is not None
    assert granted.attributes["tenure.acquire.result"] == "granted"
    assert granted.attributes["tenure.lock.name"] == "w"
    assert granted.attributes["tenure.lock.fencing_token"] == lock.fencing_token
    assert granted.attributes["tenure.holder"] == locks.holder
    assert granted.end_time is not None and granted.start_time is not None
    assert granted.end_time - granted.start_time >= 0.25e9, "its length is the time it waited"
    assert granted.parent is not None
    assert granted.parent.span_id == request.get_span_context().span_id
    assert contended.attributes["tenure.acquire.result"] == "contended"
    [hold] = otel.spans("tenure.hold")
    assert hold.attributes is not None
    assert hold.attributes["tenure.lock.outcome"] == "released"
    assert hold.attributes["tenure.lock.fencing_token"] == lock.fencing_token
    assert hold.end_time is not None and hold.start_time is not None
    assert hold.end_time - hold.start_time >= 0.05e9
    assert hold.status.status_code == StatusCode.UNSET
    spans = otel.exporter.get_finished_spans()
    assert "after-undo" not in attribute_values(list(spans)), "undo() stopped it"
    assert lock.token not in attribute_values(list(spans)), "never a token"
    assert theirs.token not in attribute_values(list(spans))

    assert otel.value("tenure.acquire.attempts", **{
        "tenure.lock.name": "w", "tenure.acquire.result": "granted"
    }) == 1  # fmt: skip
    assert otel.value("tenure.acquire.attempts", **{
        "tenure.lock.name": "w", "tenure.acquire.result": "contended"
    }) == 1  # fmt: skip
    assert otel.value("tenure.acquire.duration", **{"tenure.lock.name": "w"}) == 2
    assert otel.value("tenure.lock.hold.duration", **{"tenure.lock.name": "w"}) == 1


async def test_a_lost_lock_ends_its_hold_span_once_with_the_reason(
    tmp_path: Path, otel: Otel
) -> None:
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        otel.instrument(locks, lock_names=False)
        lock = await locks.acquire("lost", ttl=TTL)
        assert lock is not None
        assert await locks.force_release("lost") is not None
        await asyncio.wait_for(lock.wait_lost(), 5)
        assert lock.lost
        assert await lock.release() is False  # a RELEASED event after the loss
    [hold] = otel.spans("tenure.hold")
    assert hold.attributes is not None
    assert hold.attributes["tenure.lock.outcome"] == "lost"
    assert hold.attributes["tenure.lock.lost_reason"] == lock.lost_reason
    assert hold.status.status_code == StatusCode.ERROR
    assert otel.value("tenure.lock.losses") == 1, "no lock name: lock_names=False"
    assert otel.value("tenure.lock.forced_releases") == 1
    assert otel.value("tenure.acquire.attempts", **{"tenure.acquire.result": "granted"}) == 1


async def test_a_run_span_is_current_in_the_task_function_and_its_threads(
    tmp_path: Path, otel: Otel
) -> None:
    tracer = otel.tracer_provider.get_tracer("app")
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        otel.instrument(locks)
        scheduler = Scheduler(locks, prune=None)

        @scheduler.cron("* * * * *", name="async-job")
        async def async_job() -> None:
            with tracer.start_as_current_span("inside-async"):
                await asyncio.sleep(0)

        @scheduler.cron("* * * * *", name="plain-job")
        def plain_job() -> None:
            assert threading.current_thread() is not threading.main_thread()
            with tracer.start_as_current_span("inside-plain"):
                pass

        @scheduler.cron("* * * * *", name="failing-job", exclusive=False)
        async def failing_job() -> None:
            raise ValueError("the job broke")

        @scheduler.cron("* * * * *", name="lost-job", ttl=TTL)
        async def lost_job() -> None:
            assert await locks.force_release("lost-job") is not None
            await asyncio.sleep(10)  # cancelled at the loss

        occurrence = time.time() - 0.5
        await scheduler.tasks.run("async-job", occurrence=occurrence)
        await scheduler.tasks.run("plain-job")
        with pytest.raises(ValueError, match="the job broke"):
            await scheduler.tasks.run("failing-job", occurrence=occurrence)
        with pytest.raises(LockLost):
            await scheduler.tasks.run("lost-job")

    runs = {s.attributes["tenure.task.name"]: s for s in otel.spans("tenure.run") if s.attributes}
    assert set(runs) == {"async-job", "plain-job", "failing-job", "lost-job"}
    for inside, task in (("inside-async", "async-job"), ("inside-plain", "plain-job")):
        [child] = otel.spans(inside)
        assert child.parent is not None
        assert child.parent.span_id == runs[task].context.span_id, f"{inside} is the run's child"
    ran = runs["async-job"].attributes
    assert ran is not None
    assert ran["tenure.task.outcome"] == "ran"
    assert ran["tenure.task.occurrence"] == occurrence
    assert float(ran["tenure.task.lateness"]) >= 0.5  # type: ignore[arg-type]
    assert ran["tenure.holder"] == locks.holder
    assert isinstance(ran["tenure.lock.fencing_token"], int)
    assert "tenure.task.occurrence" not in (runs["plain-job"].attributes or {}), "a manual run"
    failed = runs["failing-job"]
    assert failed.attributes is not None
    assert failed.attributes["tenure.task.outcome"] == "failed"
    assert failed.attributes["error.type"] == "ValueError"
    assert "tenure.lock.name" not in failed.attributes, "exclusive=False: no lock"
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    lost = runs["lost-job"].attributes
    assert lost is not None
    assert lost["tenure.task.outcome"] == "lost" and lost["error.type"] == "LockLost"
    job = {"tenure.task.name": "async-job"}
    assert otel.value("tenure.task.runs", **job, **{"tenure.task.outcome": "ran"}) == 1
    assert otel.value("tenure.task.duration", **job) == 1
    assert otel.value("tenure.task.lateness", **job) == 1
    failing = {"tenure.task.name": "failing-job", "tenure.task.outcome": "failed"}
    assert otel.value("tenure.task.runs", **failing) == 1


def test_the_blocking_api_is_instrumented_alike(tmp_path: Path, otel: Otel) -> None:
    with sync.LockService.from_url(sqlite_url(tmp_path)) as locks:
        undo = otel.instrument(locks)
        lock = locks.acquire("blocking", ttl=TTL)
        assert lock is not None
        assert lock.release()
        undo()
    [acquire] = otel.spans("tenure.acquire")
    [hold] = otel.spans("tenure.hold")
    assert acquire.attributes is not None and hold.attributes is not None
    assert acquire.attributes["tenure.lock.name"] == "blocking"
    assert hold.attributes["tenure.lock.outcome"] == "released"


def test_instrument_refuses_what_is_not_a_service(otel: Otel) -> None:
    with pytest.raises(InvalidArgument, match="LockService"):
        otel.instrument(object())
    assert otel.exporter.get_finished_spans() == ()


async def test_a_failing_run_wrapper_cannot_break_a_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entered: list[CurrentRun] = []

    @contextmanager
    def fails_on_exit(run: CurrentRun) -> Iterator[None]:
        entered.append(run)
        yield
        raise RuntimeError("wrapper broke on exit")

    def fails_on_entry(run: CurrentRun) -> Any:
        raise RuntimeError("wrapper broke on entry")

    ran: list[str] = []
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        with pytest.raises(InvalidArgument, match="run wrapper must be callable"):
            locks.wrap_runs("not callable")  # type: ignore[arg-type]
        locks.wrap_runs(fails_on_entry)
        remove = locks.wrap_runs(fails_on_exit)
        scheduler = Scheduler(locks, prune=None)
        scheduler.add(lambda: ran.append("ran"), "* * * * *", name="wrapped")
        with caplog.at_level(logging.ERROR, logger="tenure.events"):
            assert await scheduler.tasks.run("wrapped") is Outcome.RAN
        remove()
        await scheduler.tasks.run("wrapped")
    assert ran == ["ran", "ran"]
    assert [run.task for run in entered] == ["wrapped"], "removed: not entered again"
    assert "failed entering the run of 'wrapped'" in caplog.text
    assert "failed leaving a run" in caplog.text
