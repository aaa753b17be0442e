"""The mutual-exclusion checker: what a fault run's history may and may not contain.

Every worker appends one JSON line per event to a log of its own, with
``time.monotonic_ns()`` timestamps: on Linux one clock for every process of
the host, running through SIGSTOP, so the logs of all workers merge into one
timeline.

``acquire``  t0 (called), t1 (returned), fence (None: not granted), deadline
``check``    t, held, deadline: what ``lock.held`` said, and when
``write``    t0, t1, fence, accepted: a read-modify-write on the fenced resource
``release``  t0 (sent), t1 (answered), ok (None: the store was unreachable), deadline: the
             lock's local deadline when released

A grant's lease interval is [t1 of its acquire, min(release sent, local
deadline)]; a worker killed while holding ends at the last deadline it logged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Grant:
    worker: str
    fence: int
    requested: int
    granted: int
    end: int
    released: bool | None = None
    release_answered: int | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)


def read_logs(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Each worker's events, in its own order (a torn last line of a killed worker is dropped)."""
    logs: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break
        logs[path.stem] = events
    return logs


def grants(logs: dict[str, list[dict[str, Any]]]) -> list[Grant]:
    found: list[Grant] = []
    for worker, events in logs.items():
        current: Grant | None = None
        for event in events:
            op = event["op"]
            if op == "acquire" and event["fence"] is not None:
                current = Grant(worker, event["fence"], event["t0"], event["t1"], event["deadline"])
                found.append(current)
            elif op == "check" and current is not None:
                current.checks.append(event)
                current.end = max(current.end, event["deadline"])
            elif op == "release" and current is not None:
                current.end = min(event["t0"], event["deadline"])
                current.released = event["ok"]
                current.release_answered = event["t1"]
                current = None
    return found


def most_at_once(history: list[Grant]) -> tuple[int, int]:
    """The most lease intervals that overlap at one instant, and that instant."""
    edges = sorted(
        [(g.granted, 1) for g in history] + [(g.end, -1) for g in history],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    most, at, current = 0, 0, 0
    for t, step in edges:
        current += step
        if current > most:
            most, at = current, t
    return most, at


def violations(history: list[Grant], limit: int = 1) -> list[str]:
    """Everything in the history that breaks the lock contract (``limit`` > 1: a
    semaphore's, at most that many holders at once); [] when it holds."""
    found: list[str] = []
    fences = [g.fence for g in history]
    if len(set(fences)) != len(fences):
        found.append(f"a fencing token was handed out twice: {sorted(fences)}")
    by_grant = sorted(history, key=lambda g: g.granted)
    for i, a in enumerate(by_grant):
        for b in by_grant[i + 1 :]:
            if a.granted < b.requested and not a.fence < b.fence:
                found.append(
                    f"{b.worker}'s grant (fence {b.fence}), requested after {a.worker}'s "
                    f"completed (fence {a.fence}), has the smaller token"
                )
            if limit == 1 and b.granted < a.end:
                found.append(
                    f"leases overlap: {a.worker} (fence {a.fence}) until {a.end}, "
                    f"{b.worker} (fence {b.fence}) from {b.granted}"
                )
    most, at = most_at_once(history)
    if limit > 1 and most > limit:
        found.append(f"{most} permits were held at once (at {at}), the limit is {limit}")
    for g in history:
        for check in g.checks:
            if check["held"] and check["t"] >= check["deadline"]:
                found.append(f"{g.worker} was told it held fence {g.fence} past its deadline")
    return found
