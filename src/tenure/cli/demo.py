"""``tenure demo``: a few instances of one application on one store, each
occurrence of their task run once, shown side by side."""

from __future__ import annotations

import asyncio
import collections
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from ..errors import ConfigurationError
from ..locks import LockService
from ..schedule import Scheduler
from ..stores import from_url as store_from_url
from ..stores import mask_url
from ..stores.runlog import RunOutcome
from .common import stamp

DEMO_TASK = "demo.tick"


async def demo_instance(url: str, index: int, seconds: float, offset: float) -> None:
    """One instance of the demo application: an every-second task, a skewed clock."""

    def say(task: str, fire: float | None, outcome: str) -> None:
        if task == DEMO_TASK:
            line = {"instance": index, "fire": fire, "outcome": outcome}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    async with LockService.from_url(url) as locks:
        scheduler = Scheduler(locks, clock=lambda: time.time() + offset, listener=say)

        @scheduler.cron("* * * * * *", name=DEMO_TASK, ttl=5)
        async def tick() -> None:
            await asyncio.sleep(0.001)  # finishes in a millisecond: ShedLock's double-run case

        serving = asyncio.ensure_future(scheduler.serve())
        await asyncio.sleep(seconds)
        scheduler.stop()
        await serving


def _pump(index: int, stream: IO[str], events: queue.Queue[tuple[int, str | None]]) -> None:
    for line in stream:
        events.put((index, line))
    events.put((index, None))


def demo(instances: int, seconds: float, url: str | None, skew: float) -> int:
    if instances < 1 or seconds <= 0:
        raise ConfigurationError("--instances must be at least 1 and --seconds positive")
    workdir = None
    if url is None:
        workdir = tempfile.mkdtemp(prefix="tenure-demo-")
        url = f"sqlite://{Path(workdir) / 'demo.db'}"
    # A bad URL fails here, once, with its own message, not in every instance.
    asyncio.run(store_from_url(url).aclose())
    offsets = [(i - (instances - 1) / 2) * skew for i in range(instances)]
    print(f"tenure demo: {instances} instances of one application on {mask_url(url)}")
    print(f"each runs the task {DEMO_TASK!r} every second, for {seconds:g} s; their clocks")
    print("are offset by " + ", ".join(f"{o:+.2f} s" for o in offsets) + ".\n")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tenure",
                "_instance",
                "--url",
                url,
                "--index",
                str(i),
                "--seconds",
                str(seconds),
                "--offset",
                str(offsets[i]),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(instances)
    ]
    events: queue.Queue[tuple[int, str | None]] = queue.Queue()
    for i, proc in enumerate(procs):
        assert proc.stdout is not None
        threading.Thread(target=_pump, args=(i, proc.stdout, events), daemon=True).start()
    ran: dict[float, list[int]] = collections.defaultdict(list)
    seen: set[float] = set()
    open_streams = instances
    while open_streams:
        index, line = events.get()
        if line is None:
            open_streams -= 1
            continue
        event = json.loads(line)
        fire, outcome = event["fire"], event["outcome"]
        seen.add(fire)
        if outcome == RunOutcome.RAN:
            ran[fire].append(index)
            print(f"{stamp(fire)}  instance {index}  ran it")
        elif outcome == RunOutcome.CLAIMED_ELSEWHERE:
            print(f"{stamp(fire)}  instance {index}  skipped: another instance claimed it")
        else:
            print(f"{stamp(fire)}  instance {index}  {outcome}")
    codes = [proc.wait() for proc in procs]
    occurrences = len(seen)
    runs = sum(len(v) for v in ran.values())
    duplicates = sum(len(v) - 1 for v in ran.values() if len(v) > 1)
    missing = sum(1 for fire in seen if not ran.get(fire))
    print()
    print(f"occurrences: {occurrences}  runs: {runs}  duplicates: {duplicates}  missing: {missing}")
    print(
        f"(without tenure each instance would have run every occurrence: "
        f"{occurrences * instances} runs)"
    )
    if any(codes):
        print(f"an instance failed: exit codes {codes}", file=sys.stderr)
        return 2
    return 0 if duplicates == 0 and missing == 0 else 1
