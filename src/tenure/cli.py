"""The ``tenure`` command: demo, run, locks, release, tasks, doctor, web and schema."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from .errors import ConfigurationError, StoreUnavailable, TenureError
from .locks import LockService
from .schedule import Scheduler
from .schedule.scheduler import SKEW_WARNING
from .schedule.view import defined_tasks, run_fields
from .stores import from_url as store_from_url
from .stores import mask_url, store_class
from .stores.base import PrintsSchema
from .stores.runlog import RunOutcome, RunRecord

__all__ = ("main",)

DEMO_TASK = "demo.tick"


def _url(given: str | None) -> str:
    url = given or os.environ.get("TENURE_URL")
    if not url:
        raise ConfigurationError("no store URL: pass --url URL or set TENURE_URL")
    return url


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


# -- demo ---------------------------------------------------------------------


async def _demo_instance(url: str, index: int, seconds: float, offset: float) -> None:
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
            print(f"{_stamp(fire)}  instance {index}  ran it")
        elif outcome == RunOutcome.CLAIMED_ELSEWHERE:
            print(f"{_stamp(fire)}  instance {index}  skipped: another instance claimed it")
        else:
            print(f"{_stamp(fire)}  instance {index}  {outcome}")
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


# -- run ----------------------------------------------------------------------


def _load(target: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(
            f"expected MODULE:ATTR (like myapp.cron:scheduler), got {target!r}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _scheduler(target: str, url: str | None) -> tuple[Scheduler, LockService]:
    """The Scheduler that ``MODULE:ATTR`` names (or makes from a LockService on ``url``)."""
    obj = _load(target)
    if isinstance(obj, Scheduler):
        if url is not None:
            raise ConfigurationError(
                f"{target} is a Scheduler that already has its store; drop --url, or point "
                "at a function that takes a LockService and returns a Scheduler"
            )
        scheduler = obj
        locks = obj.locks
    elif callable(obj):
        locks = LockService.from_url(_url(url))
        scheduler = obj(locks)
        if not isinstance(scheduler, Scheduler):
            raise ConfigurationError(f"{target}(locks) returned {scheduler!r}, not a Scheduler")
    else:
        raise ConfigurationError(f"{target} is neither a Scheduler nor a function making one")
    return scheduler, locks


async def _serve(target: str, url: str | None) -> None:
    scheduler, locks = _scheduler(target, url)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, scheduler.stop)
    async with locks:
        await scheduler.serve()


# -- tasks --------------------------------------------------------------------


async def _tasks(
    url: str | None, task: str | None, limit: int, as_json: bool, app: str | None
) -> None:
    scheduler = None
    if app is not None:
        scheduler, locks = _scheduler(app, url)
    else:
        locks = LockService.from_url(_url(url))
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


# -- locks --------------------------------------------------------------------


async def _locks(url: str, prefix: str, as_json: bool) -> None:
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
        at = _stamp(i.acquired_at) if i.acquired_at is not None else "?"
        print(f"{name:<22} {holder:<20} {i.fencing_token:>16} {at:<8} {i.expires_in:>7.1f}s")
    print(f"{len(infos)} held; times UTC")


# -- release --force --------------------------------------------------------------


async def _force_release(url: str, name: str, yes: bool) -> int:
    store = store_from_url(url)
    try:
        info = await store.holder_of(name)
        if info is None:
            print(f"lock {name!r} is not held: nothing to free")
            return 1
        what = (
            f"lock {name!r} held by {info.holder} (fencing token {info.fencing_token}, "
            f"expires in {info.expires_in:.1f} s unless renewed)"
        )
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigurationError(
                    f"refusing to free {what} without --yes: there is no terminal to ask on"
                )
            answer = await asyncio.to_thread(
                input, f"Free {what}? Its holder may still be running. [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing freed")
                return 1
        evicted = await store.force_release(name)
        if evicted is None:
            print(f"lock {name!r} was released or changed hands meanwhile: nothing freed")
            return 1
        now = time.time()
        operator = f"{os.environ.get('USER') or os.getuid()}@{socket.gethostname()}:{os.getpid()}"
        note = (
            f"forced free by {operator}: evicted {evicted.holder} "
            f"(fencing token {evicted.fencing_token})"
        )
        record = RunRecord(
            secrets.token_hex(8), f"tenure.release:{name}", None, operator, now, now, "forced", note
        )
        await store.runlog.record_run(record, keep=100)
        print(
            f"freed {name!r}: evicted {evicted.holder} (fencing token {evicted.fencing_token}). "
            "It loses the lock at its next renewal; every later grant has a larger token, "
            "so fenced resources refuse its writes. Recorded: tenure tasks --task "
            f"'tenure.release:{name}'"
        )
        successor = await store.holder_of(name)
        if successor is not None:
            # On Redis the release itself hands the lock to a queued waiter.
            print(
                f"{name!r} went straight to a waiter: now held by {successor.holder} "
                f"(fencing token {successor.fencing_token})"
            )
        return 0
    finally:
        await store.aclose()


# -- doctor -------------------------------------------------------------------


def _say(level: str, text: str, fix: str = "") -> None:
    """One finding, wrapped to 80 columns."""
    print(textwrap.fill(text, 80, initial_indent=f"{level:<7}", subsequent_indent=" " * 7))
    if fix:
        print(textwrap.fill(fix, 80, initial_indent="  fix: ", subsequent_indent=" " * 7))


async def _doctor(url: str) -> int:
    store = store_from_url(url)
    print(f"store  {store.describe()}")
    try:
        trips = []
        for _ in range(5):
            started = time.perf_counter()
            await store.holders("tenure-doctor/")
            trips.append(time.perf_counter() - started)
        trips.sort()
        _say("ok", f"reachable: round trip {trips[2] * 1000:.3f} ms (median of 5)")
        before = time.time()
        theirs = await store.server_time()
        after = time.time()
        if theirs is None:
            _say(
                "ok",
                "no clock of its own to compare: lease time is this host's monotonic "
                "clock (SQLite, memory) or the etcd leader's",
            )
        else:
            skew = theirs - (before + after) / 2
            within = (after - before) / 2
            text = (
                f"this host's clock is {abs(skew):.3f} s {'behind' if skew > 0 else 'ahead of'} "
                f"the store's (±{within:.3f} s)"
            )
            if abs(skew) > SKEW_WARNING:
                _say(
                    "warn",
                    text + ": locks do not mind (the store decides expiry), but scheduled "
                    "tasks fire by each host's clock, so this host runs its occurrences that "
                    "much early or late (each still runs once)",
                    "run NTP (chrony, systemd-timesyncd) on every host and the store's",
                )
            else:
                _say("ok", text)
        findings = await store.diagnose()
    except StoreUnavailable as exc:
        _say(
            "unsafe", f"cannot reach the store: {exc}", "check the URL, the network and the server"
        )
        return 1
    finally:
        with contextlib.suppress(TenureError):
            await store.aclose()
    for finding in findings:
        _say(finding.level, finding.what, finding.fix)
    unsafe = [f for f in findings if f.level == "unsafe"]
    if unsafe:
        print(f"{len(unsafe)} unsafe setting(s): locks can be lost or granted twice")
        return 1
    return 0


# -- web ----------------------------------------------------------------------


async def _web(url: str | None, host: str, port: int, app: str | None) -> None:
    try:
        import uvicorn

        from .web import make_app
    except ImportError as exc:
        raise ConfigurationError(f"tenure web needs {exc.name}: pip install 'tenure[web]'") from exc
    scheduler = None
    if app is not None:
        scheduler, locks = _scheduler(app, url)
        store = locks.store
    else:
        store = store_from_url(_url(url))
    config = uvicorn.Config(
        make_app(store, scheduler), host=host, port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    print(f"tenure web on http://{host}:{port}/ ({store.describe()}); Ctrl-C stops it", flush=True)
    await server.serve()


# -- schema -------------------------------------------------------------------


def _schema(url: str) -> None:
    # The class is looked at before any store is opened: opening a SQLite URL
    # would create its file.
    kind = store_class(url)
    if not issubclass(kind, PrintsSchema):
        raise ConfigurationError(
            f"tenure schema prints SQL for PostgreSQL URLs only (the stores with tables to "
            f"create ahead of time), not a {kind.__name__} URL: the other stores create what "
            "they need themselves"
        )
    store = kind.from_url(url)  # checks the URL; connects to nothing
    assert isinstance(store, PrintsSchema)
    print(store.schema_sql(), end="")


# -- entry point ----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenure", description="Distributed locks and cluster-safe cron."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "demo", help="several instances, one every-second task: each occurrence runs once"
    )
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--url", help="store URL (default: a temporary SQLite file)")
    p.add_argument(
        "--skew",
        type=float,
        default=0.4,
        help="clock offset between neighbouring instances, in seconds",
    )
    p = sub.add_parser("run", help="serve a Scheduler: MODULE:ATTR")
    p.add_argument("target")
    p.add_argument("--url", help="store URL, when ATTR is a function taking a LockService")
    p = sub.add_parser(
        "locks", help="every held lock: holder, fencing token, acquired, expires in (no secrets)"
    )
    p.add_argument("--url")
    p.add_argument(
        "--prefix", default="", help="only locks whose names start with this (not the key prefix)"
    )
    p.add_argument("--json", action="store_true")
    p = sub.add_parser(
        "release", help="free a lock whose holder is known to be gone (needs --force)"
    )
    p.add_argument("name")
    p.add_argument("--url")
    p.add_argument("--force", action="store_true", help="free it whoever holds it")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p = sub.add_parser(
        "doctor", help="reachability, clock skew and settings that weaken the guarantees"
    )
    p.add_argument("--url")
    p = sub.add_parser("web", help="a read-only page of tasks and holders that refreshes itself")
    p.add_argument("--url")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8477)
    p.add_argument(
        "--app", metavar="MODULE:ATTR", help="your Scheduler, for expressions and next fires"
    )
    p = sub.add_parser("tasks", help="recent occurrences of the tasks, from the run records")
    p.add_argument("--url")
    p.add_argument("--task")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="your Scheduler (as for tenure run), to show each task's expression and next fire",
    )
    p = sub.add_parser(
        "schema", help="print the SQL that creates tenure's PostgreSQL tables, to run by hand"
    )
    p.add_argument("--url")
    p = sub.add_parser("_instance", help=argparse.SUPPRESS)
    p.add_argument("--url", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--offset", type=float, default=0.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return demo(args.instances, args.seconds, args.url, args.skew)
        if args.command == "run":
            asyncio.run(_serve(args.target, args.url))
        elif args.command == "locks":
            asyncio.run(_locks(_url(args.url), args.prefix, args.json))
        elif args.command == "release":
            if not args.force:
                raise ConfigurationError(
                    f"tenure release frees {args.name!r} from whoever holds it; "
                    "add --force if you know its holder is gone"
                )
            return asyncio.run(_force_release(_url(args.url), args.name, args.yes))
        elif args.command == "web":
            asyncio.run(_web(args.url, args.host, args.port, args.app))
        elif args.command == "doctor":
            return asyncio.run(_doctor(_url(args.url)))
        elif args.command == "tasks":
            asyncio.run(_tasks(args.url, args.task, args.limit, args.json, args.app))
        elif args.command == "schema":
            _schema(_url(args.url))
        elif args.command == "_instance":
            asyncio.run(_demo_instance(args.url, args.index, args.seconds, args.offset))
    except TenureError as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
