"""``BeatScheduler``: Celery beat, safe to run on several hosts.

``celery -A proj beat -S tenure.celery.BeatScheduler`` on as many hosts as
you like: only the holder of the beat lock (``celery.beat``, a tenure lease
of ``tenure_beat_ttl`` seconds, 5 by default, renewed while it lives) sends.
The others try for it every second, so when the sender dies (SIGKILL, a lost
host) another one sends within the lease's TTL plus a second.

Each entry's occurrences are fire times every beat computes alike: a
``crontab`` entry's from its cron fields (in the app's ``timezone``), an
interval entry's as whole multiples of the interval since the Unix epoch (as
``tenure.Scheduler.every``), not from each beat's own ``last_run_at``. Each
occurrence is claimed in the store before it is sent, so it is sent at most
once, by whichever beat claimed it. A beat that takes over sends the
occurrences of the gap that are still within ``tenure_beat_misfire_grace``
seconds (30 by default) and that nobody claimed; an occurrence claimed by a
sender that died before sending it is not sent again (at most once). The
first sender, or one taking over from a sender dead for longer than the
grace, starts with the next occurrence: no backfill. The
message carries the occurrence in its ``tenure_fire_time`` header.

Each entry is registered for ``tenure.control`` as ``celery.beat:ENTRY``:
the sender claims a paused entry's occurrences and counts them instead of
sending them, and sends an entry at once when an operator asks it to run now
(``tenure trigger``; its ``tenure_fire_time`` header is None, its
``tenure_manual`` True), with a run record (outcome ``sent``).
"""

from __future__ import annotations

import collections
import time
from typing import Any

from celery import beat
from celery.schedules import crontab
from celery.schedules import schedule as every

from .._validate import check_ttl
from ..control import ControlWatch, RunRequest
from ..errors import ConfigurationError, TenureError
from ..schedule.cron import CronSchedule
from ..schedule.interval import IntervalSchedule
from ..schedule.tasks import DEFAULT_KEEP_RUNS
from ..schedule.timing import Schedule
from ..stores.runlog import RunOutcome, RunRecord
from ..sync import Lock
from .service import locks_for

__all__ = ("BEAT_LOCK", "BeatScheduler")

BEAT_LOCK = "celery.beat"
"""The lock whose holder sends (one per store prefix: one per Celery app)."""


class BeatScheduler(beat.Scheduler):  # type: ignore[misc]
    """See the module docstring. Options, in the Celery app's configuration:
    ``tenure_url`` (else ``$TENURE_URL``), ``tenure_beat_ttl`` (5 s) and
    ``tenure_beat_misfire_grace`` (30 s)."""

    def setup_schedule(self) -> None:
        super().setup_schedule()
        conf = self.app.conf
        self.ttl = check_ttl(conf.get("tenure_beat_ttl", 5.0), "tenure_beat_ttl")
        self.grace = float(conf.get("tenure_beat_misfire_grace", 30.0))
        if not self.grace >= 0:
            raise ConfigurationError(
                f"tenure_beat_misfire_grace must be seconds, not negative, got {self.grace!r}"
            )
        self.plans: dict[str, Schedule] = {
            name: _plan(name, entry.schedule, self.app.timezone)
            for name, entry in self.schedule.items()
        }
        self.locks = locks_for(self.app)
        self.claimant = f"{self.locks.holder}/beat"
        self.lock: Lock | None = None
        self.last: dict[str, float] = {}
        """Per entry: the last occurrence this beat decided (sent, claimed elsewhere, missed)."""
        self.requests: collections.deque[RunRequest] = collections.deque()
        self.control = ControlWatch(
            self.locks.store,
            self.locks.holder,
            lambda: {_task(name): plan.expr for name, plan in self.plans.items()},
            self.requests.append,
            keep_runs=DEFAULT_KEEP_RUNS,
            serving=lambda: self.lock is not None and self.lock.held,
        )
        self.watching = self.locks.submit(self.control.watch())

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send what is due if this beat holds the beat lock; the seconds until
        the next call."""
        now = time.time()
        if self.lock is None or not self.lock.held:
            self.lock = self.locks.acquire(BEAT_LOCK, ttl=self.ttl)
            if self.lock is None:
                return 1.0  # another beat sends; try again in a second
            self.last = self._resume(now)
            self.logger.info("tenure: this beat sends now (%s)", self.claimant)
        while self.requests:
            self._send_now(self.requests.popleft())
        wake = now + 1.0
        for name, plan in self.plans.items():
            fire = plan.next_after(self.last[name])
            while fire <= now:
                if self._claimed(name, fire) and not self._paused(name, fire):
                    self._send(self.schedule[name], fire)
                self.last[name] = fire
                fire = plan.next_after(fire)
            wake = min(wake, fire)
        return max(0.0, wake - time.time())

    def _resume(self, now: float) -> dict[str, float]:
        """Where each entry starts when this beat becomes the sender: within
        the grace, where another sender left off (its claims refuse what it
        sent, so the gap's occurrences go out once); with no claim in the
        grace (the first sender, or one dead longer ago), at now: no backfill."""
        names = list(self.plans)
        first = {name: self.plans[name].next_after(now - self.grace) for name in names}
        taken = self.locks.submit(
            self.locks.store.runlog.claimed_already([(_task(name), first[name]) for name in names])
        ).result()
        return {
            name: now - self.grace if was and first[name] <= now else now
            for name, was in zip(names, taken, strict=True)
        }

    def _claimed(self, name: str, fire: float) -> bool:
        claim = self.locks.store.runlog.claim_occurrence(_task(name), fire, self.claimant)
        claimed: bool = self.locks.submit(claim).result()
        return claimed

    def _send(self, entry: Any, fire: float) -> None:
        options = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        headers.update(celery_beat_task=True, tenure_fire_time=fire)
        self.app.send_task(entry.task, entry.args, entry.kwargs, headers=headers, **options)
        self.logger.info("tenure: sent %s for %s", entry.name, fire)

    def _paused(self, name: str, fire: float) -> bool:
        """Whether the entry's pause takes this occurrence (counted in it)."""
        if _task(name) not in self.control.paused:
            return False
        try:
            skipped: bool = self.locks.submit(self.control.count_skip(_task(name), fire)).result()
        except TenureError as exc:
            self.logger.warning(
                "tenure: %s for %s not sent (paused), not counted: %s", name, fire, exc
            )
            return True
        if skipped:
            self.logger.info("tenure: skipped %s for %s: paused", name, fire)
        return skipped

    def _send_now(self, request: RunRequest) -> None:
        """Send an entry at once, as an operator asked, and record it."""
        name = request.task.removeprefix(_task(""))
        entry = self.schedule.get(name)
        if entry is None:
            self.logger.warning("tenure: asked to send %s, which this beat has no entry for", name)
            return
        options = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        headers.update(celery_beat_task=True, tenure_fire_time=None, tenure_manual=True)
        self.app.send_task(entry.task, entry.args, entry.kwargs, headers=headers, **options)
        self.logger.info("tenure: sent %s now, as %s asked", name, request.by)
        now = time.time()
        record = RunRecord(
            request.request_id, request.task, None, self.locks.holder, now, now, RunOutcome.SENT
        )
        try:
            self.locks.submit(
                self.locks.store.runlog.record_run(record, keep=DEFAULT_KEEP_RUNS)
            ).result()
        except TenureError as exc:
            self.logger.warning("tenure: the record of %s sent now was not written: %s", name, exc)

    def close(self) -> None:
        self.watching.cancel()
        if self.lock is not None:
            self.lock.release()
        super().close()


def _task(entry: str) -> str:
    """The name an entry's occurrences are claimed under."""
    return f"celery.beat:{entry}"


def _plan(name: str, when: Any, timezone: Any) -> Schedule:
    """The fire times of a beat entry's schedule."""
    if isinstance(when, crontab):
        # Its fields as the sets crontab expanded them to (day of week 0 is Sunday, as in cron).
        fields = (when.minute, when.hour, when.day_of_month, when.month_of_year, when.day_of_week)
        expr = " ".join(",".join(str(v) for v in sorted(values)) for values in fields)
        return CronSchedule(expr, getattr(timezone, "key", "UTC"))
    if isinstance(when, every):
        return IntervalSchedule(when.run_every.total_seconds())
    raise ConfigurationError(
        f"beat entry {name!r}: tenure.celery.BeatScheduler takes crontab and interval "
        f"schedules, got {type(when).__name__}"
    )
