"""``tenure pause``, ``resume``, ``trigger`` and ``audit``: acting on the
cluster through its store (``tenure.control``)."""

from __future__ import annotations

import dataclasses
import json

from ..control import Control
from ..locks import LockService
from .common import stamp
from .listings import note, table, when


async def pause(url: str, task: str, reason: str | None) -> int:
    async with LockService.from_url(url) as service:
        made = await Control(service).pause(task, reason=reason)
    print(
        f"paused {task!r} (from {stamp(made.since)} UTC): no instance runs its occurrences "
        "once it has read the store (within a second); `tenure resume` ends it"
    )
    return 0


async def resume(url: str, task: str) -> int:
    async with LockService.from_url(url) as service:
        record = await Control(service).resume(task)
    print(f"resumed {task!r}: {record.error}")
    return 0


async def trigger(url: str, task: str, wait: float) -> int:
    async with LockService.from_url(url) as service:
        record = await Control(service).trigger(task, wait=wait)
    print(
        f"{task!r} started on {record.instance} as run {record.run_id} "
        f"({record.outcome}); `tenure tasks --task {task}` shows how it ends"
    )
    return 0


async def audit(url: str, limit: int, as_json: bool) -> int:
    async with LockService.from_url(url) as service:
        actions = await Control(service).audit(limit)
    if as_json:
        print(json.dumps([dataclasses.asdict(action) for action in actions], indent=2))
        return 0
    if not actions:
        print("no operator has acted on this store")
        return 0
    rows = [(when(a.at), a.action, a.target, a.who) for a in actions]
    lines = table(("at (UTC)", "action", "task or lock", "who"), rows)
    print(lines[0])
    for line, action in zip(lines[1:], actions, strict=True):
        print(line)
        if action.detail:
            print(note("detail", action.detail))
    return 0
