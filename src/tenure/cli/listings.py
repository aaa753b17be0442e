"""``tenure tasks`` and ``tenure locks``: what ran, who holds what, and what was forced free."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

from ..locks import LockService
from ..schedule.view import defined_tasks, run_fields
from ..stores import from_url as store_from_url
from ..stores.audit import FORCED_KEEP
from .common import load_scheduler, stamp, url_of


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
        print(line if len(line) <= 80 else line[:79] + "…")


async def locks(url: str, prefix: str, as_json: bool) -> None:
    store = store_from_url(url)
    try:
        infos = await store.holders(prefix)
    finally:
        await store.aclose()
    if as_json:
        print(json.dumps([dataclasses.asdict(i) for i in infos], indent=2))
        return
    if not infos:
        print(f"no lock is held{f' with a name starting {prefix!r}' if prefix else ''}")
        return
    # 80 columns: name 22, holder 20, fencing token 16, acquired 8, expires in 8.
    print(f"{'lock':<22} {'holder':<20} {'fencing token':>16} {'acquired':<8} {'expires':>8}")
    for i in infos:
        name = i.name if len(i.name) <= 22 else i.name[:21] + "…"
        holder = i.holder if len(i.holder) <= 20 else i.holder[:19] + "…"
        at = stamp(i.acquired_at) if i.acquired_at is not None else "?"
        print(f"{name:<22} {holder:<20} {i.fencing_token:>16} {at:<8} {i.expires_in:>7.1f}s")
    print(f"{len(infos)} held; times UTC")


async def forced(url: str, prefix: str, as_json: bool) -> None:
    store = store_from_url(url)
    try:
        records = [
            r
            for r in await store.runlog.forced_releases(limit=FORCED_KEEP)
            if r.name.startswith(prefix)
        ][:50]
    finally:
        await store.aclose()
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
        name = r.name if len(r.name) <= 18 else r.name[:17] + "…"
        evicted = r.evicted if len(r.evicted) <= 20 else r.evicted[:19] + "…"
        line = f"{when:<19} {name:<18} {evicted:<20} {r.operator}"
        print(line if len(line) <= 80 else line[:79] + "…")
        if r.reason:
            why = f"    why: {r.reason}"
            print(why if len(why) <= 80 else why[:79] + "…")
