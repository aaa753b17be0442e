"""The ``tenure`` command's parser and entry point: demo, run, locks, release,
tasks, pause, resume, trigger, audit, doctor, web and schema."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from ..control import TRIGGER_WAIT
from ..errors import ConfigurationError, TenureError
from .common import serve_app, url_of
from .control import audit, pause, resume, trigger
from .demo import demo, demo_instance
from .doctor import doctor, schema
from .listings import forced, locks, tasks
from .release import force_release
from .web import web


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _port(text: str) -> int:
    value = _at_least_one(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1-65535, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenure", description="Distributed locks and cluster-safe cron."
    )
    parser.add_argument("--version", action="version", version=f"tenure {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "demo", help="several instances, one every-second task: each occurrence runs once"
    )
    p.add_argument("--instances", type=_at_least_one, default=3)
    p.add_argument("--seconds", type=_positive_seconds, default=10.0)
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
    p.add_argument(
        "--forced",
        action="store_true",
        help="instead, the newest forced releases: who freed which lock from whom, and when",
    )
    p = sub.add_parser(
        "release", help="free a lock whose holder is known to be gone (needs --force)"
    )
    p.add_argument("name")
    p.add_argument("--url")
    p.add_argument("--force", action="store_true", help="free it whoever holds it")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--reason", help="why, kept with the audit record")
    p = sub.add_parser(
        "doctor", help="reachability, clock skew and settings that weaken the guarantees"
    )
    p.add_argument("--url")
    p = sub.add_parser(
        "web", help="a page of tasks, holders and audit records (acts only with --token-file)"
    )
    p.add_argument("--url")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=_port, default=8477)
    p.add_argument(
        "--app", metavar="MODULE:ATTR", help="your Scheduler, for expressions and next fires"
    )
    p.add_argument(
        "--token-file",
        metavar="F",
        help="LABEL TOKEN lines, mode 600: their holders may pause, resume, run and free",
    )
    p = sub.add_parser("tasks", help="recent occurrences of the tasks, from the run records")
    p.add_argument("--url")
    p.add_argument("--task")
    p.add_argument("--limit", type=_at_least_one, default=20, help="at most this many runs")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="your Scheduler (as for tenure run), to show each task's expression and next fire",
    )
    p = sub.add_parser("pause", help="pause a task on every instance, until tenure resume")
    p.add_argument("task")
    p.add_argument("--url")
    p.add_argument("--reason", help="why, kept with the pause's record and the audit record")
    p = sub.add_parser("resume", help="end a task's pause; says how many occurrences it skipped")
    p.add_argument("task")
    p.add_argument("--url")
    p = sub.add_parser("trigger", help="have one instance that serves a task run it now")
    p.add_argument("task")
    p.add_argument("--url")
    p.add_argument(
        "--wait",
        type=_positive_seconds,
        default=TRIGGER_WAIT,
        help=f"seconds for an instance to take it (default {TRIGGER_WAIT:g}), else it fails",
    )
    p = sub.add_parser("audit", help="who paused, resumed, triggered or freed what, and when")
    p.add_argument("--url")
    p.add_argument("--limit", type=_at_least_one, default=50, help="at most this many records")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser(
        "schema", help="print the SQL that creates tenure's PostgreSQL tables, to run by hand"
    )
    p.add_argument("--url")
    return parser


def _instance_parser() -> argparse.ArgumentParser:
    """``tenure _instance``: one of ``tenure demo``'s processes. Parsed on its
    own, so that ``tenure --help`` lists only what a user types."""
    parser = argparse.ArgumentParser(prog="tenure _instance")
    parser.add_argument("--url", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--offset", type=float, default=0.0)
    return parser


def _release(args: argparse.Namespace) -> int:
    if not args.force:
        raise ConfigurationError(
            f"tenure release frees {args.name!r} from whoever holds it; "
            "add --force if you know its holder is gone"
        )
    url = url_of(args.url, reading=True)
    return asyncio.run(force_release(url, args.name, args.yes, args.reason))


def _reading(args: argparse.Namespace) -> str:
    """The store URL of an action: one that must be there already."""
    return url_of(args.url, reading=True)


def _command(args: argparse.Namespace) -> int | None:
    """Run the parsed command; its exit status (None: 0)."""
    listing = forced if getattr(args, "forced", False) else locks
    commands: dict[str, Callable[[], int | None]] = {
        "demo": lambda: demo(args.instances, args.seconds, args.url, args.skew),
        "run": lambda: asyncio.run(serve_app(args.target, args.url)),
        "locks": lambda: asyncio.run(
            listing(url_of(args.url, reading=True), args.prefix, args.json)
        ),
        "release": lambda: _release(args),
        "web": lambda: asyncio.run(web(args.url, args.host, args.port, args.app, args.token_file)),
        "doctor": lambda: asyncio.run(doctor(url_of(args.url, reading=True))),
        "tasks": lambda: asyncio.run(tasks(args.url, args.task, args.limit, args.json, args.app)),
        "pause": lambda: asyncio.run(pause(_reading(args), args.task, args.reason)),
        "resume": lambda: asyncio.run(resume(_reading(args), args.task)),
        "trigger": lambda: asyncio.run(trigger(_reading(args), args.task, args.wait)),
        "audit": lambda: asyncio.run(audit(_reading(args), args.limit, args.json)),
        "schema": lambda: schema(url_of(args.url)),
        "_instance": lambda: asyncio.run(
            demo_instance(args.url, args.index, args.seconds, args.offset)
        ),
    }
    return commands[args.command]()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_instance"]:
        args = _instance_parser().parse_args(argv[1:])
        args.command = "_instance"
    else:
        args = _parser().parse_args(argv)
    if args.command not in ("run", "_instance"):
        # A one-shot command says a failure once, in its own words; the
        # PostgreSQL pool's own warnings (one per connection attempt) would
        # come first. A served scheduler keeps them: they belong in its logs.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        return _command(args) or 0
    except TenureError as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
