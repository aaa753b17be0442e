"""The `tenure` command: run, tasks, and its errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenure import LockService

from .helpers.procs import ROOT, processes_naming


def tenure(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    env.pop("TENURE_URL", None)
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "tenure", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        cwd=ROOT,
        **kwargs,
    )


@pytest.mark.parametrize(("stop", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
async def test_run_serves_until_a_signal_and_tasks_shows_the_records(
    tmp_path: Path, stop: signal.Signals, status: int
) -> None:
    url = f"sqlite://{tmp_path}/cli.db"
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure", "run", "tests.helpers.cli_app:make", "--url", url],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        async with LockService.from_url(url) as locks:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if [r for r in await locks.store.runlog.runs("cli.tick") if r.outcome == "ran"]:
                    break
                await asyncio.sleep(0.2)
            else:
                pytest.fail("tenure run ran nothing in 20 s")
        proc.send_signal(stop)
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
        assert proc.returncode == status, err
        assert "Traceback" not in err
        # One line at start, one at stop, at INFO.
        assert "tenure.scheduler: serving 1 task(s) on sqlite://" in err
        assert "first due: 'cli.tick' at " in err
        said = re.search(rf"stopped by {stop.name}: 1 task\(s\); (\d+) occurrence\(s\) ran", err)
        assert said is not None, err
        assert int(said[1]) >= 1
        assert "0 failed; 0 running cancelled" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = await asyncio.to_thread(tenure, "tasks", "--url", url)
    assert shown.returncode == 0
    assert "cli.tick" in shown.stdout and " ran" in shown.stdout
    as_json = json.loads((await asyncio.to_thread(tenure, "tasks", "--url", url, "--json")).stdout)
    assert as_json and {"task", "fire_time", "instance", "outcome"} <= set(as_json[0])


def test_version_and_help_show_only_what_a_user_types() -> None:
    import tenure as package

    version = tenure("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"tenure {package.__version__}"
    shown = tenure("--help")
    assert shown.returncode == 0
    assert "demo" in shown.stdout and "doctor" in shown.stdout
    assert "_instance" not in shown.stdout and "SUPPRESS" not in shown.stdout


@pytest.mark.parametrize(
    "command",
    [
        ("locks",),
        ("locks", "--forced"),
        ("tasks",),
        ("tasks", "--app", "tests.helpers.cli_app:make"),
        ("doctor",),
        ("web", "--port", "1"),
        ("release", "x", "--force", "--yes"),
    ],
)
def test_read_only_commands_refuse_a_sqlite_file_that_is_not_there(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    missing = tmp_path / "typo.db"
    done = tenure(*command, "--url", f"sqlite://{missing}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("tenure: ") and len(done.stderr.splitlines()) == 1
    assert f"SQLite database {str(missing)!r} does not exist; check the path" in done.stderr
    assert list(tmp_path.iterdir()) == [], "nothing created"


async def test_tasks_text_never_cuts_a_name_a_zone_or_an_error(tmp_path: Path) -> None:
    from .helpers.cli_app import LONG_ERROR, LONG_NAME, LONG_ZONE, make_long

    url = f"sqlite://{tmp_path}/long.db"
    async with LockService.from_url(url) as locks:
        with pytest.raises(RuntimeError):
            await make_long(locks).tasks.run(LONG_NAME, occurrence=120.0)
    app = "tests.helpers.cli_app:make_long"
    shown = await asyncio.to_thread(tenure, "tasks", "--url", url, "--app", app)
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    plan, runs = shown.stdout.split("\n\n")
    assert plan.splitlines()[1].startswith(f"{LONG_NAME}  0 3 * * *")
    assert plan.splitlines()[1].endswith(LONG_ZONE)
    head, row, *error = runs.splitlines()
    assert head.split() == ["task", "occurrence", "(UTC)", "instance", "took", "outcome"]
    assert row.startswith(f"{LONG_NAME}  1970-01-01 00:02:00  {locks.holder}")
    assert row.endswith("failed")
    # The error on lines of its own, wrapped at 80 columns, whole.
    assert error[0].startswith("    error: RuntimeError: the upstream")
    assert all(len(line) <= 80 for line in error)
    assert " ".join(" ".join(error).split()) == "error: " + " ".join(LONG_ERROR.split())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("demo", "--instances", "0"), "argument --instances: must be at least 1, got 0"),
        (("demo", "--seconds", "-2"), "argument --seconds: must be a positive number of seconds"),
        (("tasks", "--limit", "many"), "argument --limit: expected a whole number, got 'many'"),
        (("web", "--port", "99999"), "argument --port: a TCP port is 1-65535, got 99999"),
        (("bogus",), "invalid choice: 'bogus'"),
    ],
)
def test_bad_arguments_get_the_usage_and_what_was_wrong(args: tuple[str, ...], says: str) -> None:
    result = tenure(*args, "--url", "memory://") if args[0] != "bogus" else tenure(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: tenure")
    assert says in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("tasks",), "no store URL"),
        (
            ("tasks", "--url", "mongodb://u:secret@h/db"),
            "known schemes: etcd, mariadb, memory, mysql, postgres, postgresql, redis, "
            "redis+sentinel, rediss, sqlite, unix",
        ),
        (("run", "nonsense"), "MODULE:ATTR"),
        (("run", "no_such_module_xyz:app", "--url", "memory://"), "cannot import"),
        (("run", "tests.helpers.cli_app:missing", "--url", "memory://"), "no attribute"),
        (("run", "tests.helpers.cli_app:not_a_scheduler"), "neither a Scheduler"),
    ],
)
def test_errors_are_one_clear_line(args: tuple[str, ...], says: str) -> None:
    result = tenure(*args)
    assert result.returncode == 2
    assert says in result.stderr
    assert result.stderr.startswith("tenure: ")
    assert "secret" not in result.stderr and "Traceback" not in result.stderr


async def test_locks_lists_holders_without_tokens(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/locks.db"
    async with LockService.from_url(url) as locks:
        a = await locks.acquire("reports.nightly", ttl=30)
        b = await locks.acquire("a-rather-long-lock-name-that-does-not-fit", ttl=30)
        other = await locks.acquire("other", ttl=30)
        term = await locks.election("primary").campaign(ttl=30, wait=0)
        assert a is not None and b is not None and other is not None and term is not None
        table = await asyncio.to_thread(tenure, "locks", "--url", url)
        listed = await asyncio.to_thread(tenure, "locks", "--url", url, "--json", "--prefix", "r")
        tokens = [a.token, b.token, other.token]
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["lock", "holder", "fencing", "token", "acquired", "expires", "in"]
    assert any(
        line.startswith("reports.nightly ") and str(a.fencing_token) in line for line in lines
    )
    # Never cut: the columns are as wide as their widest cell.
    assert any(line.startswith("a-rather-long-lock-name-that-does-not-fit ") for line in lines)
    holder_at = lines[0].index("holder")
    assert all(line[holder_at:].startswith(locks.holder) for line in lines[1:-1])
    # An election's term, named as such (its lock name holds control characters).
    assert any(line.startswith("election primary ") for line in lines)
    assert lines[-1] == "4 held; times UTC"
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "reports.nightly"
    assert entry["holder"] == locks.holder
    assert entry["fencing_token"] == a.fencing_token
    assert 0 < entry["expires_in"] <= 30
    assert abs(entry["acquired_at"] - time.time()) < 30
    for token in tokens:
        assert token not in table.stdout + listed.stdout
    empty = tenure("locks", "--url", url)
    assert empty.stdout.strip() == "no lock is held"


def _on_a_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """Run ``tenure ARGS`` with a pseudo-terminal as its stdin, typing ``answer``."""
    import pty

    main, child = pty.openpty()
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure", *args],
        stdin=child,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    os.close(child)
    os.write(main, answer.encode() + b"\n")
    out, err = proc.communicate(timeout=60)
    os.close(main)
    return proc.returncode, out + err


async def test_release_force_asks_evicts_and_leaves_a_record(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/force.db"
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("stuck", ttl=2)
        assert lock is not None
        refused = await asyncio.to_thread(tenure, "release", "stuck", "--url", url)
        assert refused.returncode == 2 and "add --force" in refused.stderr
        no_tty = await asyncio.to_thread(tenure, "release", "stuck", "--force", "--url", url)
        assert no_tty.returncode == 2 and "without --yes" in no_tty.stderr
        code, said = await asyncio.to_thread(
            _on_a_terminal, ["release", "stuck", "--force", "--url", url], "n"
        )
        assert code == 1 and "nothing freed" in said and locks.holder in said
        assert lock.held
        code, said = await asyncio.to_thread(
            _on_a_terminal,
            ["release", "stuck", "--force", "--reason", "its pod is gone", "--url", url],
            "y",
        )
        assert code == 0, said
        assert f"evicted {locks.holder} (fencing token {lock.fencing_token})" in said
        await asyncio.sleep(1.0)  # its next renewal finds the lease gone
        assert lock.lost
        again = await locks.acquire("stuck", ttl=2)
        assert again is not None and again.fencing_token > lock.fencing_token
        await again.release()
        assert lock.token not in said
    records = await asyncio.to_thread(tenure, "locks", "--url", url, "--forced", "--json")
    [record] = json.loads(records.stdout)
    assert (record["name"], record["evicted"]) == ("stuck", locks.holder)
    assert record["fencing_token"] == lock.fencing_token
    assert record["reason"] == "its pod is gone"
    who, _, where = record["operator"].partition("@")
    assert who and where.startswith(socket.gethostname() + ":"), "who freed it, from where"
    listed = await asyncio.to_thread(tenure, "locks", "--url", url, "--forced")
    assert "stuck" in listed.stdout and "its pod is gone" in listed.stdout
    assert "tenure.release" not in (await asyncio.to_thread(tenure, "tasks", "--url", url)).stdout
    assert lock.token not in listed.stdout + records.stdout
    gone = tenure("release", "stuck", "--force", "--yes", "--url", url)
    assert gone.returncode == 1 and "is not held" in gone.stdout


async def test_release_force_yes_frees_without_asking(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/yes.db"
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("stuck", ttl=2)
        assert lock is not None
        done = await asyncio.to_thread(tenure, "release", "stuck", "--force", "--yes", "--url", url)
        assert done.returncode == 0, done.stderr
        assert "freed 'stuck'" in done.stdout
        assert await locks.store.holders("stuck") == []


async def test_doctor_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/doc.db"
    async with LockService.from_url(url):  # the file exists: doctor creates nothing
        pass
    done = await asyncio.to_thread(tenure, "doctor", "--url", url)
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())  # as one line, whatever the wrapping
    assert "reachable: round trip" in said
    assert "on a local filesystem" in said
    assert "synchronous=normal" in said and "fix: add ?synchronous=full" in said
    assert all(len(line) <= 80 for line in done.stdout.splitlines())


def test_doctor_knows_network_filesystems() -> None:
    from tenure.stores.sqlite.doctor import filesystem as _filesystem

    mounts = (
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /srv/shared nfs4 rw 0 0\n"
        "/dev/sdb1 /srv/shared/local\\040disk xfs rw 0 0\n"
    )
    assert _filesystem(Path("/srv/shared/app/locks.db"), mounts) == "nfs4"
    assert _filesystem(Path("/srv/shared/local disk/locks.db"), mounts) == "xfs"
    assert _filesystem(Path("/srv/sharedness/locks.db"), mounts) == "ext4"


def test_doctor_finds_an_evicting_redis_and_masks_passwords() -> None:
    from .servers import RedisServer, free_port

    evicting = RedisServer("--maxmemory-policy", "allkeys-lru")
    durable = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    try:
        bad = tenure("doctor", "--url", evicting.url)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "unsafe" in bad.stdout and "maxmemory-policy is allkeys-lru" in bad.stdout
        assert "fix: set maxmemory-policy noeviction" in bad.stdout
        assert "a restart forgets the leases" in bad.stdout
        good = tenure("doctor", "--url", durable.url)
        assert good.returncode == 0, good.stdout
        assert "appendonly yes, appendfsync always" in good.stdout
        assert "clock is" in good.stdout and "the store's" in good.stdout
    finally:
        evicting.stop()
        durable.stop()
    gone = tenure("doctor", "--url", f"redis://me:s3cret@127.0.0.1:{free_port()}/0")
    assert gone.returncode == 1
    assert "cannot reach the store" in gone.stdout
    assert "s3cret" not in gone.stdout + gone.stderr and "me:***@" in gone.stdout


def test_doctor_on_postgres_and_etcd() -> None:
    from .conftest import etcd_cluster, postgres_server

    base = postgres_server().url()
    # libpq's options, percent-encoded (a space in them must reach libpq as a space)
    relaxed = base + ("&" if "?" in base else "?") + "options=-c%20synchronous_commit%3Doff"
    for url, expect in [
        (base, "ok     synchronous_commit is on"),
        (relaxed, "warn   synchronous_commit is off"),
        (etcd_cluster().url, "no clock of its own"),
    ]:
        done = tenure("doctor", "--url", url)
        assert done.returncode == 0, done.stdout + done.stderr
        assert expect in done.stdout


async def test_tasks_with_the_app_shows_expressions_and_next_fire(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/app.db"
    async with LockService.from_url(url) as locks:
        from .helpers.cli_app import make

        await make(locks).tasks.run("cli.tick", occurrence=120.0)
    app = "tests.helpers.cli_app:make"
    table = await asyncio.to_thread(tenure, "tasks", "--url", url, "--app", app)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["task", "expression", "next", "fire", "(UTC)", "tz"]
    assert lines[1].startswith("cli.tick") and "* * * * * *" in lines[1]
    assert any("1970-01-01 00:02:00" in line and "ran" in line for line in lines)
    before = time.time()
    listed = await asyncio.to_thread(tenure, "tasks", "--url", url, "--app", app, "--json")
    after = time.time()
    shown = json.loads(listed.stdout)
    [task] = shown["tasks"]
    assert task["expression"] == "* * * * * *"
    # The next whole second after the command read its clock, which it did
    # between before and after (a second may turn while the process runs).
    assert before < task["next_fire"] <= after + 1
    assert task["next_fire"] == int(task["next_fire"])
    assert [r["outcome"] for r in shown["runs"]] == ["ran"]


def test_demo_runs_each_occurrence_once_and_says_where_its_runs_are() -> None:
    done = tenure("demo", "--instances", "2", "--seconds", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    said = re.search(r"occurrences: (\d+)  runs: (\d+)  duplicates: 0  missing: 0", done.stdout)
    assert said is not None and int(said[1]) >= 2 and said[1] == said[2], done.stdout
    url = re.search(r"tenure tasks --url (sqlite://\S+)", done.stdout)
    workdir = re.search(r"rm -r (\S+)", done.stdout)
    assert url is not None and workdir is not None, done.stdout
    try:
        shown = tenure("tasks", "--url", url[1])
        assert shown.returncode == 0 and "demo.tick" in shown.stdout
    finally:
        shutil.rmtree(workdir[1])


@pytest.mark.parametrize(
    ("stop", "group", "status"),
    [(signal.SIGTERM, False, 0), (signal.SIGINT, False, 130), (signal.SIGINT, True, 130)],
    ids=["sigterm-to-its-pid", "sigint-to-its-pid", "ctrl-c-to-the-process-group"],
)
def test_demo_stops_on_a_signal_with_its_summary_and_leaves_no_process(
    stop: signal.Signals, group: bool, status: int
) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure", "demo", "--instances", "3", "--seconds", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal gives it
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # until the first run shows: the instances are up
            lines.append(line)
            if "ran it" in line:
                break
        else:
            pytest.fail("the demo showed no run: " + "".join(lines))
        store = re.search(r"on (sqlite://\S+)", lines[0])
        assert store is not None, lines[0]
        assert len(processes_naming(store[1])) == 3, "its three instances run"
        if group:
            os.killpg(proc.pid, stop)
        else:
            proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == status, out + err
    assert err == "", "no tracebacks, no broken pipes"
    assert f"stopped by {stop.name}; so far:" in out
    assert re.search(r"occurrences: \d+  runs: \d+  duplicates: 0", out), out
    assert processes_naming(store[1]) == [], "no instance left running"
    workdir = re.search(r"rm -r (\S+)", out)
    assert workdir is not None, out
    shutil.rmtree(workdir[1])
