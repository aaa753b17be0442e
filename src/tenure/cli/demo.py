"""``tenure demo``: a few instances of one application on one store, each
occurrence of their task run once, shown side by side."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import queue
import signal
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
    """One instance of the demo application: an every-second task, a skewed clock.

    It stops early, quietly, on SIGINT or SIGTERM (``tenure demo`` passes
    them on; a terminal's Ctrl-C reaches the whole process group), and when
    its reader went away (its stdout closed)."""
    async with LockService.from_url(url) as locks:

        def say(task: str, fire: float | None, outcome: str) -> None:
            if task != DEMO_TASK:
                return
            line = {"instance": index, "fire": fire, "outcome": outcome}
            try:
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            except OSError:  # BrokenPipeError: the demo is gone; so is the point
                scheduler.stop()

        scheduler = Scheduler(locks, clock=lambda: time.time() + offset, listener=say)

        @scheduler.cron("* * * * * *", name=DEMO_TASK, ttl=5)
        async def tick() -> None:
            await asyncio.sleep(0.001)  # finishes in a millisecond: ShedLock's double-run case

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, scheduler.stop)
        loop.call_later(seconds, scheduler.stop)
        await scheduler.serve()
    with contextlib.suppress(OSError):
        sys.stdout.close()  # a closed pipe: say so now, not in a traceback at exit


def _pump(index: int, stream: IO[str], events: queue.Queue[tuple[int, str | None]]) -> None:
    for line in stream:
        events.put((index, line))
    events.put((index, None))


class _Stop(Exception):
    """SIGINT or SIGTERM reached ``tenure demo``."""

    def __init__(self, sig: int) -> None:
        super().__init__(signal.Signals(sig).name)
        self.sig = sig


def _raise_stop(sig: int, _frame: object) -> None:
    raise _Stop(sig)


def demo(instances: int, seconds: float, url: str | None, skew: float) -> int:
    """Run the demo; its exit status: 0 when every occurrence ran exactly once,
    1 when one did not, 2 when an instance failed; stopped by a signal, the
    summary so far and 130 (SIGINT) or 0 (SIGTERM), as ``tenure run``."""
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
    print("are offset by " + ", ".join(f"{o:+.2f} s" for o in offsets) + ".\n", flush=True)
    reports = _Reports()
    procs: list[subprocess.Popen[str]] = []
    stopped: _Stop | None = None
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            for i in range(instances):
                procs.append(_start(url, i, seconds, offsets[i]))
                reports.follow(i, procs[-1])
            reports.show(procs)
        except _Stop as stop:
            stopped = stop
            for sig, handler in previous.items():  # a second signal: the default's way
                signal.signal(sig, handler)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            reports.show(procs, quietly=True)  # what they still say as they stop
        codes = [_reap(proc) for proc in procs]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:  # only on an error of the demo's own: none is left running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    duplicates, missing = _summary(instances, reports.ran, reports.seen, stopped)
    if workdir is not None:
        print("the runs are kept in a temporary file; to see them, then remove it:")
        print(f"  tenure tasks --url {url}")
        print(f"  rm -r {workdir}")
    if stopped is not None:
        return 130 if stopped.sig == signal.SIGINT else 0
    if any(codes):
        print(f"an instance failed: exit codes {codes}", file=sys.stderr)
        return 2
    return 0 if duplicates == 0 and missing == 0 else 1


def _start(url: str, index: int, seconds: float, offset: float) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tenure", "_instance", "--url", url, "--index", str(index)]
    command += ["--seconds", str(seconds), "--offset", str(offset)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


class _Reports:
    """What the instances report, one JSON line per occurrence each, read by
    a thread per instance into one queue."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.open = 0
        self.ran: dict[float, list[int]] = collections.defaultdict(list)
        self.seen: set[float] = set()

    def follow(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.open += 1
        threading.Thread(target=_pump, args=(index, proc.stdout, self.events), daemon=True).start()

    def show(self, procs: list[subprocess.Popen[str]], *, quietly: bool = False) -> None:
        """Print each report as a line until every instance's output ended.
        ``quietly``: count them, print nothing (the instances are stopping)."""
        said = {
            RunOutcome.RAN: "ran it",
            RunOutcome.CLAIMED_ELSEWHERE: "skipped: another instance claimed it",
        }
        while self.open:
            try:
                index, line = self.events.get(timeout=0.5)
            except queue.Empty:
                if all(proc.poll() is not None for proc in procs) and self.events.empty():
                    return  # they all ended; a pump still reading what they left counts not
                continue
            if line is None:
                self.open -= 1
                continue
            event = json.loads(line)
            fire, outcome = event["fire"], event["outcome"]
            self.seen.add(fire)
            if outcome == RunOutcome.RAN:
                self.ran[fire].append(index)
            if not quietly:
                print(f"{stamp(fire)}  instance {index}  {said.get(outcome, outcome)}", flush=True)


def _reap(proc: subprocess.Popen[str]) -> int:
    """The instance's exit code, after at most 10 s (then it is killed)."""
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _summary(
    instances: int, ran: dict[float, list[int]], seen: set[float], stopped: _Stop | None
) -> tuple[int, int]:
    """Print the summary; the occurrences run twice or more, and not at all."""
    occurrences = len(seen)
    runs = sum(len(v) for v in ran.values())
    duplicates = sum(len(v) - 1 for v in ran.values() if len(v) > 1)
    missing = sum(1 for fire in seen if not ran.get(fire))
    print()
    if stopped is not None:
        print(f"stopped by {stopped}; so far:")
    print(f"occurrences: {occurrences}  runs: {runs}  duplicates: {duplicates}  missing: {missing}")
    print(
        f"(without tenure each instance would have run every occurrence: "
        f"{occurrences * instances} runs)"
    )
    return duplicates, missing
