"""The scheduler's run log: the second half of the store contract.

A store keeps leases (``stores.base``) and, beside them, what the scheduler
persists: the last claimed occurrence of each task (so that each occurrence
runs once in the cluster) and a record of each run (so that "did the 02:00 run
happen?" has an answer). Every store offers its run log as ``store.runlog``;
the scheduler, the CLI and the web page use it through this contract only.

The rules of ``stores.base`` hold here too: each operation is one atomic step
in the store; driver errors surface as StoreUnavailable; the batch methods
take at most ``Store.batch_max`` items per call, each item decided on its own,
and StoreUnavailable means nothing is known about any item.

A record that says ``running`` is the record of a live run only while its
instance's *presence lease* (``PRESENCE_PREFIX + holder``, held and renewed
like any lease while a scheduler runs) is live: once that has run out, the
instance died or could not reach the store for a whole ``PRESENCE_TTL``, and
the run reads ``abandoned``. Deciding this when reading needs no write from
anyone and cannot race a run's own final record; the scheduler's prune task
then stores the outcome (only where the record still says ``running``).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .audit import ForcedRelease
from .base import AcquireItem, Grant
from .board import Board

if TYPE_CHECKING:
    from .base import Store

__all__ = (
    "PRESENCE_PREFIX",
    "PRESENCE_TTL",
    "Claim",
    "RunLog",
    "RunOutcome",
    "RunRecord",
    "StartItem",
    "Started",
    "abandoned",
    "live_instances",
    "presence_name",
)

PRESENCE_PREFIX = "tenure.instance/"
PRESENCE_TTL = 15.0
"""Seconds: how long after its instance stopped renewing a run reads abandoned."""


class RunOutcome(enum.StrEnum):
    """What became of one occurrence or run: a record's outcome, and the
    ``detail`` of a ``task`` event."""

    RUNNING = "running"
    """Started; its record is written again when it ends."""
    RAN = "ran"
    SKIPPED = "skipped"
    """Its lock was still held by an earlier run."""
    FAILED = "failed"
    """The task raised."""
    LOST = "lost"
    """Its lock was lost under it."""
    MISSED = "missed"
    """It could not run: the store failed for longer than the misfire grace."""
    SENT = "sent"
    """A Celery beat sent the task's message, as an operator asked
    (``tenure.celery.BeatScheduler``): a worker runs it."""
    PAUSED = "paused"
    """The record of one pause of a task (``tenure.control``): ``started`` and
    ``ended`` say from when to when, ``error`` by whom and how many
    occurrences it skipped; ``instance`` is who paused it."""
    ABANDONED = "abandoned"
    """Its instance died while it ran (read from a ``running`` record whose
    instance's presence lease is gone; stored so by the prune task)."""
    CLAIMED_ELSEWHERE = "claimed_elsewhere"
    """Another instance claimed the occurrence: an event and a count only,
    never a record (the instance that ran it wrote one)."""


_Row = tuple[str, str, float | None, str, float, float | None, str, str | None, int | None]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What became of one run of a scheduled task: the answer to "did the 02:00 run happen?"."""

    run_id: str
    """Random id of this run; a record is written at the start and again at the end."""
    task: str
    fire_time: float | None
    """The occurrence (POSIX seconds, from the cron expression); None for a manual run."""
    instance: str
    """The instance that ran or skipped it: ``host:pid:id``."""
    started: float
    ended: float | None
    outcome: str
    """A :class:`RunOutcome` (a ``str``): ``running``, then how it ended."""
    error: str | None = None
    fence: int | None = None
    """The fencing token of the task's lock that the run held; None when it
    held none (skipped, missed, or a task with ``exclusive=False``). An
    occurrence's start writes it with its claim and its ``running`` record in
    one atomic step, so a run killed at any point leaves a record naming its
    grant."""

    def row(self) -> _Row:
        """The fields in order, as every store writes them (a table's columns,
        a JSON array); :meth:`from_row` reads them back
        (``dataclasses.astuple`` costs twenty times as much)."""
        return (
            self.run_id,
            self.task,
            self.fire_time,
            self.instance,
            self.started,
            self.ended,
            self.outcome,
            self.error,
            self.fence,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunRecord:
        """The record :meth:`row` wrote. A row of eight fields (stored before
        ``fence``) reads with no fence."""
        return cls(*row)


def presence_name(instance: str) -> str:
    """The name of the presence lease of the instance whose holder is ``instance``."""
    return PRESENCE_PREFIX + instance


async def live_instances(store: Store) -> set[str]:
    """The holders of every live presence lease (one store call)."""
    return {
        info.name.removeprefix(PRESENCE_PREFIX)
        for info in await store.holders(PRESENCE_PREFIX)
        if info.name.startswith(PRESENCE_PREFIX)
    }


def abandoned(
    records: Sequence[RunRecord], live: Iterable[str], *, seen: float | None = None
) -> list[RunRecord]:
    """``records`` with each ``running`` one of an instance not in ``live`` as ``abandoned``.

    ``seen`` (POSIX seconds), when given, is when its presence was found gone:
    the record's ``ended``, the latest its lease can have run out.
    """
    alive = set(live)
    return [
        record
        if record.outcome != RunOutcome.RUNNING or record.instance in alive
        else dataclasses.replace(
            record,
            outcome=RunOutcome.ABANDONED,
            ended=seen,
            error=_why(record.instance, seen),
        )
        for record in records
    ]


def _why(instance: str, seen: float | None) -> str:
    by = (
        ""
        if seen is None
        else " by " + datetime.datetime.fromtimestamp(seen, datetime.UTC).isoformat()
    )
    return (
        f"its instance {instance} stopped renewing its presence lease{by}: it died "
        f"(killed, out of memory, host lost) or could not reach the store for {PRESENCE_TTL:g} s"
    )


class Claim(NamedTuple):
    """One occurrence claim of a batch (:meth:`RunLog.claim_occurrences`)."""

    task: str
    fire_time: float
    claimant: str


class StartItem(NamedTuple):
    """One occurrence's start (:meth:`RunLog.start_runs`): its claim, the
    acquire of its task's lock (``lock.name`` is ``claim.task``) and its
    start record (outcome ``running``; the store writes it with the grant's
    fencing token as its ``fence``)."""

    claim: Claim
    lock: AcquireItem
    record: RunRecord


class Started(NamedTuple):
    """What :meth:`RunLog.start_runs` did with one item."""

    claimed: bool
    """The occurrence is this claimant's (see :meth:`RunLog.claim_occurrence`)."""
    grant: Grant | None
    """The lock, when the occurrence was claimed and the lock was free (the
    start record is then written); None when either was not."""


class RunLog(Board):
    """Claims and run records, kept in a store beside its leases (``store.runlog``);
    the audit records of forced releases (``stores.audit``); and the control
    board (``stores.board``)."""

    @property
    @abstractmethod
    def leases(self) -> Store:
        """The store whose run log this is: its leases, and its presence leases."""

    @abstractmethod
    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        """Compare-and-advance the last claimed occurrence of ``task`` to ``fire_time``.

        Atomic. True when ``fire_time`` is later than every occurrence of
        ``task`` claimed before (and is now the last claimed, by
        ``claimant``), and also when ``claimant`` itself made the last claim,
        of this very ``fire_time``: a claim resent after its answer was lost
        is still its maker's. False when an equal or later one was claimed by
        another, or a later one by anyone. This is what keeps an instance
        whose clock runs behind from re-running an occurrence that already ran.
        """

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        """:meth:`claim_occurrence` for each claim (distinct tasks); one bool each, in order."""
        return [await self.claim_occurrence(*claim) for claim in claims]

    @abstractmethod
    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        """For each ``(task, fire_time)`` (distinct tasks), whether that
        occurrence or a later one of the task is claimed already: then a claim
        of it by a new claimant answers False. A read, one call for at most
        ``batch_max``; it writes nothing. Claims only advance, so True stays
        true: the scheduler skips the start of an occurrence another instance
        took, instead of sending its claim, lock and record to lose.
        """

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        """Start each occurrence of ``items`` (distinct tasks): claim it; if
        claimed, acquire its lock; if granted, write its start record, with
        the grant's fencing token as its ``fence``. One answer each, in order.

        A store that can makes each item one atomic step (one transaction,
        one script, one statement), so that a claimed occurrence whose lock
        was granted always has its record, whatever happens to the caller
        next; the default makes three batch calls (claims, then acquires of
        the claimed, then records of the granted). Resent with the same
        claimant, token and run id after a lost answer, every part answers
        as it did the first time (a claim, an acquire and a record are each
        idempotent for their maker), so a retry never loses an occurrence.
        """
        claimed = await self.claim_occurrences([item.claim for item in items])
        won = [item for item, yes in zip(items, claimed, strict=True) if yes]
        grants = iter(await self.leases.acquire_many([item.lock for item in won]) if won else [])
        answers = [Started(yes, next(grants) if yes else None) for yes in claimed]
        records = [
            dataclasses.replace(item.record, fence=answer.grant.fencing_token)
            for item, answer in zip(items, answers, strict=True)
            if answer.grant is not None
        ]
        if records:
            await self.record_runs(records, keep=keep)
        return answers

    @abstractmethod
    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        """Insert or replace each record (distinct run ids) by its ``run_id``.

        Keeps at most the ``keep`` newest records (by ``started``) of each
        task that an ended record names.
        """

    async def record_run(self, record: RunRecord, *, keep: int) -> None:
        """:meth:`record_runs` of one record."""
        await self.record_runs([record], keep=keep)

    async def runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        """The newest run records, of one task or of all, newest first.

        A record that says ``running`` reads ``abandoned`` once its instance's
        presence lease is no longer live (see the module docstring): one call
        more, made only when a record says ``running``.
        """
        records = await self.stored_runs(task, limit)
        if not any(record.outcome == RunOutcome.RUNNING for record in records):
            return records
        return abandoned(records, await live_instances(self.leases))

    @abstractmethod
    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        """:meth:`runs` as stored: a record says ``running`` until it is written again."""

    @abstractmethod
    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        """Write each of ``records`` (outcome ``abandoned``; or ``missed``, for
        a start whose answer was lost) where the stored record of its run_id
        still says ``running``; returns how many were.

        Each record is its own compare-and-set: a run's own final record,
        written meanwhile, is never overwritten.
        """

    @abstractmethod
    async def record_forced(self, record: ForcedRelease) -> None:
        """Add the audit record of a forced release; keep the newest
        ``audit.FORCED_KEEP`` (by ``at``)."""

    @abstractmethod
    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        """The newest forced-release records, of the lock ``name`` or of all, newest first."""
