"""``tenure web`` end to end: a real server on a real store, read by headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenure import LockService
from tenure.stores.runlog import presence_name
from tenure.stores.sqlite import SQLiteStore

from .helpers.cli_app import make
from .helpers.procs import ROOT
from .servers import free_port


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``tenure web`` on a SQLite store; (page URL, store URL)."""
    yield from serve_web(tmp_path)


def serve_web(tmp_path: Path, *options: str) -> Iterator[tuple[str, str]]:
    """``tenure web`` with ``options`` on a SQLite store, while the generator
    is open; (page URL, store URL)."""
    url = f"sqlite://{tmp_path}/web.db"
    # The application made the store; tenure web, which only reads, creates none.
    asyncio.run(SQLiteStore(tmp_path / "web.db").aclose())
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tenure",
            "web",
            "--url",
            url,
            "--port",
            str(port),
            "--app",
            "tests.helpers.cli_app:make",
            *options,
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    page = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(page, timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"tenure web did not start: {proc.communicate()}") from None
            time.sleep(0.1)
    try:
        yield page, url
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def _pixels(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and the raw (filtered) scanlines of a PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    data, at = b"", 8
    while at < len(png):
        size, kind = struct.unpack(">I4s", png[at : at + 8])
        if kind == b"IDAT":
            data += png[at + 8 : at + 8 + size]
        at += 12 + size
    return width, height, zlib.decompress(data)


async def test_the_api_serves_holders_and_tasks_without_tokens(web: tuple[str, str]) -> None:
    page, url = web
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("nightly-report", ttl=30)
        assert lock is not None
        tasks = make(locks).tasks
        await tasks.run("cli.tick", occurrence=60.0)
        assert await tasks.presence.ready(10)
        raw = await asyncio.to_thread(lambda: urllib.request.urlopen(page + "api/state").read())
        await lock.release()
    state = json.loads(raw)
    # The lock, and the presence lease of the instance that ran the task.
    holder, presence = state["holders"]
    assert holder["name"] == "nightly-report" and holder["fencing_token"] == lock.fencing_token
    assert presence["name"] == presence_name(locks.holder)
    [task] = state["tasks"]
    assert task["task"] == "cli.tick" and task["expression"] == "* * * * * *"
    assert task["recent"][0]["outcome"] == "ran"
    assert lock.token not in raw.decode()
    refused = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", page + "api/state"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.stdout == "405", "the state is read, never written"
    for action, body in (("pause", {"task": "cli.tick"}), ("release", {"lock": "nightly-report"})):
        answer = post(page + "api/" + action, body, {"Authorization": "Bearer " + "x" * 20})
        assert answer == (403, {"error": READ_ONLY}), "a read-only page acts for no one"
    answer = post(page + "api/session", {"token": "x" * 20})
    assert answer == (403, {"error": READ_ONLY})
    async with LockService.from_url(url) as locks:
        assert await locks.store.runlog.board("control") == {}
        assert await locks.store.holder_of("nightly-report") is None


READ_ONLY = "this page is read-only: start tenure web with --token-file to act"


def post(
    url: str, body: object, headers: dict[str, str] | None = None, *, raw: bytes | None = None
) -> tuple[int, Any]:
    """A JSON POST (or ``raw`` bytes, as sent); its status and its JSON answer."""
    request = urllib.request.Request(
        url,
        data=raw if raw is not None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.skipif(
    shutil.which("chromedriver") is None and not os.environ.get("TENURE_REQUIRE_ALL"),
    # Under scripts/test.sh (which installs it) a missing driver fails this test instead.
    reason="needs Debian's chromium-driver",
)
async def test_the_page_renders_tasks_and_holders_in_chromium(
    web: tuple[str, str], tmp_path: Path
) -> None:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page, url = web
    async with LockService.from_url(url) as locks:
        lock = await locks.acquire("nightly-report", ttl=30)
        assert lock is not None
        await make(locks).tasks.run("cli.tick", occurrence=60.0)

        def look() -> tuple[str, str, bytes]:
            options = webdriver.ChromeOptions()
            options.binary_location = shutil.which("chromium") or "chromium"
            for arg in (
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1100,700",
            ):
                options.add_argument(arg)
            service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
            driver = webdriver.Chrome(options=options, service=service)
            try:
                driver.get(page)
                WebDriverWait(driver, 15).until(
                    lambda d: "nightly-report" in d.find_element(By.ID, "holders").text
                )
                holders = driver.find_element(By.ID, "holders").text
                tasks = driver.find_element(By.ID, "tasks").text
                png = driver.get_screenshot_as_png()
            finally:
                driver.quit()
            return holders, tasks, png

        holders, tasks, png = await asyncio.to_thread(look)
        await lock.release()
    assert locks.holder[:20] in holders and str(lock.fencing_token) in holders
    assert "cli.tick" in tasks and "* * * * * *" in tasks and "ran" in tasks
    (tmp_path / "page.png").write_bytes(png)
    width, height, pixels = _pixels(png)
    assert width >= 800 and height >= 300
    assert len(set(pixels)) > 20, "the screenshot shows a rendered page, not a blank one"
