"""Records of missed occurrences: written in batches by one writer, merged per task while unwritten.

While the store fails, every occurrence due misses, and each would otherwise
keep a coroutine of its own retrying its record: a thousand every-second tasks
make thousands within a minute. Here a task has at most one unwritten record:
the occurrences it misses meanwhile merge into it ("missed N occurrences from
T1 to T2"), and ``merged`` counts them. One writer sends whatever is pending
in one batch, again and again with a growing pause until the store takes it;
``flush`` waits for it (a stopping scheduler, for a while).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable

from ..errors import TenureError
from ..stores.runlog import RunRecord

__all__ = ("CLOSE_MOST", "MissedRecords")

log = logging.getLogger("tenure")

CLOSE_MOST = 100
"""The most merged records per task whose possible ``running`` record is closed."""


@dataclasses.dataclass(slots=True)
class _Pending:
    record: RunRecord
    """The first missed occurrence's record; its run_id names the merged one."""
    count: int = 1
    earliest: float | None = None
    latest: float | None = None
    """The merged occurrences' fire times span these (they miss in any order)."""
    reason: str = ""
    ended: float = 0.0
    version: int = 0
    closes: list[RunRecord] = dataclasses.field(default_factory=list)
    """Merged records whose run_id may name a ``running`` record in the store."""

    def merged(self) -> RunRecord:
        first = self.record
        if self.count == 1:
            return first
        return dataclasses.replace(
            first,
            fire_time=self.earliest,
            ended=self.ended,
            error=(
                f"missed {self.count} occurrences from {_when(self.earliest)} to "
                f"{_when(self.latest)}; the last: {self.reason}"
            ),
        )

    def add(self, record: RunRecord) -> None:
        self.count += 1
        fire_time = record.fire_time
        if fire_time is not None:
            self.earliest = fire_time if self.earliest is None else min(self.earliest, fire_time)
            self.latest = fire_time if self.latest is None else max(self.latest, fire_time)
        self.reason = record.error or ""
        self.ended = record.ended or self.ended
        self.version += 1


def _when(fire_time: float | None) -> str:
    if fire_time is None:
        return "a manual run"
    return datetime.datetime.fromtimestamp(fire_time, datetime.UTC).isoformat()


class MissedRecords:
    """Missed occurrences' records on their way to the store, one per task at most."""

    def __init__(
        self,
        write: Callable[[list[RunRecord]], Awaitable[object]],
        close: Callable[[list[RunRecord]], Awaitable[object]],
        *,
        first_pause: float,
        most_pause: float,
    ) -> None:
        self._write = write
        self._close = close
        self._first_pause = first_pause
        self._most_pause = most_pause
        self._pending: dict[str, _Pending] = {}
        self._writer: asyncio.Task[None] | None = None
        self._attempt: asyncio.Future[None] | None = None
        self.merged = 0
        """Missed occurrences merged into another's record (not written on their own)."""

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, record: RunRecord, *, maybe_started: bool = False) -> asyncio.Future[None]:
        """Queue ``record`` (merged into its task's unwritten one, if any).

        ``maybe_started``: a ``running`` record of ``record.run_id`` may be in
        the store (a start whose answer was lost). Unmerged, ``record``
        replaces it (the same run_id); merged into the task's pending record,
        it closes it as well (``close``: written where it still says
        ``running``), up to ``CLOSE_MOST`` per task.

        Returns the next write attempt: done when it was tried (it may have
        failed: the writer tries again by itself).
        """
        pending = self._pending.get(record.task)
        if pending is not None and maybe_started:
            if len(pending.closes) < CLOSE_MOST:
                pending.closes.append(record)
            else:
                log.debug("run %s may still read running: too many to close", record.run_id)
        if pending is None:
            self._pending[record.task] = _Pending(
                record,
                earliest=record.fire_time,
                latest=record.fire_time,
                reason=record.error or "",
                ended=record.ended or 0.0,
            )
        else:
            pending.add(record)
            self.merged += 1
        if self._attempt is None or self._attempt.done():
            self._attempt = asyncio.get_running_loop().create_future()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_all())
        return self._attempt

    async def _write_all(self) -> None:
        pause = self._first_pause
        while self._pending:
            attempt = self._attempt
            # The next attempt's waiters are those who come from here on.
            self._attempt = None
            sent = {task: (p, p.version) for task, p in self._pending.items()}
            try:
                await self._write([p.merged() for p, _ in sent.values()])
                closes = [r for p, _ in sent.values() for r in p.closes]
                if closes:
                    await self._close(closes)
            except TenureError as exc:
                log.debug("could not record %d missed occurrence(s) yet: %s", len(sent), exc)
                failed = True
            else:
                failed = False
                for task, (p, version) in sent.items():
                    if self._pending.get(task) is p and p.version == version:
                        del self._pending[task]  # merged into since: written again
            finally:
                if attempt is not None and not attempt.done():
                    attempt.set_result(None)
            if failed:
                await asyncio.sleep(pause)
                pause = min(pause * 2, self._most_pause)
            else:
                pause = self._first_pause

    async def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every pending record to be written."""
        writer = self._writer
        if writer is None or writer.done():
            return
        done, _ = await asyncio.wait((writer,), timeout=timeout)
        if not done:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if self._attempt is not None and not self._attempt.done():
                self._attempt.set_result(None)
            log.warning(
                "%d record(s) of missed occurrences could not be written before the "
                "scheduler stopped (the store kept failing); their events and counts stand",
                len(self._pending),
            )
