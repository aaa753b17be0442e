"""``tenure tasks`` and ``tenure locks``: what ran, who holds what, and what was forced free."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from ..locks import LockService
from ..schedule.view import defined_tasks, run_fields
from ..stores import from_url as store_from_url
from ..stores.audit import FORCED_KEEP
from ..stores.base import Store
from .common import load_scheduler, stamp, url_of

T = TypeVar("T")


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns: cut, with an ellipsis, when longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


async def _read(url: str, read: Callable[[Store], Awaitable[T]]) -> T:
    """What ``read`` reads from the store at ``url``, which is closed after."""
    store = store_from_url(url)
    try:
        return await read(store)
    finally:
        await store.aclose()


async def tasks(
    url: str | None, task: str | None, limit: int, as_json: bool, app: str | None
) -> None:
    scheduler = None
    if app is not None:
        scheduler, locks = load_scheduler(app, url)
    else:
        locks = LockService.from_url(url_of(url))
    async with locks:
        records = await locks.store.runlog.runs(task, limit)
    defined = defined_tasks(scheduler, task)
    if as_json:
        runs = [run_fields(r) for r in records]
        print(json.dumps({"tasks": defined, "runs": runs} if app else runs, indent=2))
        return
    if defined:
        # 80 columns: task 24, expression 24, next fire 19 (UTC).
        print(f"{'task':<24} {'expression':<24} {'next fire (UTC)':<19} {'tz'}")
        for d in defined:
            fire = datetime.fromtimestamp(d["next_fire"], UTC).strftime("%Y-%m-%d %H:%M:%S")
            line = f"{d['task'][:24]:<24} {d['expression'][:24]:<24} {fire:<19} {d['tz']}"
            print(line[:80])
        print()
    if not records:
        print("no run records")
        return
    # 80 columns: task 20, occurrence 19, instance 18, duration 7, outcome and error.
    print(f"{'task':<20} {'occurrence (UTC)':<19} {'instance':<18} {'took':>7} outcome")
    for r in records:
        fire = (
            datetime.fromtimestamp(r.fire_time, UTC).strftime("%Y-%m-%d %H:%M:%S")
            if r.fire_time is not None
            else "manual"
        )
        took = f"{r.ended - r.started:6.2f}s" if r.ended is not None else "-"
        line = f"{r.task[:20]:<20} {fire:<19} {r.instance[:18]:<18} {took:>7} {r.outcome}"
        if r.error:
            line += f": {r.error}"
        print(fit(line, 80))


async def locks(url: str, prefix: str, as_json: bool) -> None:
    infos = await _read(url, lambda store: store.holders(prefix))
    if as_json:
        print(json.dumps([dataclasses.asdict(i) for i in infos], indent=2))
        return
    if not infos:
        print(f"no lock is held{f' with a name starting {prefix!r}' if prefix else ''}")
        return
    # 80 columns: name 22, holder 20, fencing token 16, acquired 8, expires in 8.
    print(f"{'lock':<22} {'holder':<20} {'fencing token':>16} {'acquired':<8} {'expires':>8}")
    for i in infos:
        name = fit(i.name, 22)
        holder = fit(i.holder, 20)
        at = stamp(i.acquired_at) if i.acquired_at is not None else "?"
        print(f"{name:<22} {holder:<20} {i.fencing_token:>16} {at:<8} {i.expires_in:>7.1f}s")
    print(f"{len(infos)} held; times UTC")


async def forced(url: str, prefix: str, as_json: bool) -> None:
    every = await _read(url, lambda store: store.runlog.forced_releases(limit=FORCED_KEEP))
    records = [r for r in every if r.name.startswith(prefix)][:50]
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in records], indent=2))
        return
    if not records:
        print(f"no forced release recorded{f' of a lock starting {prefix!r}' if prefix else ''}")
        return
    # 80 columns: when 19, lock 18, evicted 20, freed by; the reason on a line of its own.
    print(f"{'when (UTC)':<19} {'lock':<18} {'evicted':<20} freed by")
    for r in records:
        when = datetime.fromtimestamp(r.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        name = fit(r.name, 18)
        evicted = fit(r.evicted, 20)
        line = f"{when:<19} {name:<18} {evicted:<20} {r.operator}"
        print(fit(line, 80))
        if r.reason:
            why = f"    why: {r.reason}"
            print(fit(why, 80))
