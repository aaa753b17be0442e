"""What the control board holds (``stores.board``), as records and their JSON.

Three kinds: ``tasks`` (a :class:`Registration` per task a scheduler serves,
keyed by the task's name), ``control`` (a :class:`Pause` keyed ``pause:TASK``
while a task is paused, a :class:`RunRequest` keyed ``run:ID`` until an
instance takes it) and ``audit`` (an :class:`Action` per operator's action,
keyed by its id). An entry that does not read as this version's shape is
named as such, never guessed at.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigurationError

__all__ = (
    "AUDIT",
    "CONTROL",
    "PAUSE",
    "RUN",
    "TASKS",
    "Action",
    "Pause",
    "Registration",
    "RunRequest",
    "decode",
    "encode",
    "pause_key",
    "pauses_of",
    "request_key",
)

TASKS = "tasks"
CONTROL = "control"
AUDIT = "audit"
PAUSE = "pause:"
RUN = "run:"


def pause_key(task: str) -> str:
    return PAUSE + task


def request_key(request_id: str) -> str:
    return RUN + request_id


@dataclass(frozen=True, slots=True)
class Registration:
    """A task that a scheduler serves: what the CLI and the page accept as a task name."""

    task: str
    schedule: str
    """Its cron expression or interval, as ``tenure tasks`` shows it."""
    instance: str
    """The instance that registered it last (``host:pid:id``)."""
    seen: float
    """When (POSIX seconds); refreshed hourly while a scheduler serves it."""
    keep_runs: int
    """How many run records of it that scheduler keeps (a pause's record is one)."""


@dataclass(frozen=True, slots=True)
class Pause:
    """A task's pause, while it lasts."""

    pause_id: str
    """The run id of its ``paused`` run record."""
    task: str
    since: float
    by: str
    """Who paused it: ``user@host:pid``, or the page's ``web:LABEL@ADDRESS``."""
    reason: str | None = None
    skipped: int = 0
    """Occurrences not run since, counted once in the cluster each."""
    last: float | None = None
    """The fire time of the last occurrence counted."""


@dataclass(frozen=True, slots=True)
class RunRequest:
    """A request to run a task now, until an instance that serves it takes it."""

    request_id: str
    """Also the run id of the run it makes."""
    task: str
    at: float
    by: str


@dataclass(frozen=True, slots=True)
class Action:
    """The audit record of one operator's action."""

    action_id: str
    at: float
    who: str
    """``user@host:pid`` from the CLI; ``web:LABEL@ADDRESS`` from the page."""
    action: str
    """``pause``, ``resume``, ``trigger`` or ``force-release``."""
    target: str
    """The task or lock acted on."""
    detail: str = ""


def encode(record: Registration | Pause | RunRequest | Action) -> str:
    """The entry's value: its fields as a JSON object."""
    return json.dumps(dataclasses.asdict(record), separators=(",", ":"))


R = TypeVar("R", Registration, Pause, RunRequest, Action)


def decode(shape: type[R], kind: str, key: str, value: str) -> R:
    """The record an entry holds; ConfigurationError naming the entry when it
    is not of this version's shape."""
    try:
        fields: Any = json.loads(value)
        return shape(**fields)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"the control board's entry {key!r} (kind {kind!r}) is not of the shape this "
            f"tenure reads ({shape.__name__}: {exc}); it was written by another version: "
            "remove it, or run the version that wrote it"
        ) from None


def pauses_of(entries: dict[str, str]) -> dict[str, Pause]:
    """The pauses among the entries of a ``control`` board read, by task."""
    pauses = (
        decode(Pause, CONTROL, key, value)
        for key, value in entries.items()
        if key.startswith(PAUSE)
    )
    return {pause.task: pause for pause in pauses}
