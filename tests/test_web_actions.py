"""``tenure web --token-file``: its actions end to end, in headless Chromium
and for scripts; a wrong token, no token, a replay without the CSRF value,
and token files it refuses."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenure import Control, LockService, RunOutcome
from tenure.cli.main import main
from tenure.web import read_tokens

from .helpers.cli_app import make
from .test_web import post, serve_web

TOKEN = "alice-token-" + "7" * 20
LABEL = "alice"


@pytest.fixture
def acting(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``tenure web`` with a token file of one token; (page URL, store URL)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# who may act\n{LABEL} {TOKEN}\n\nbob {'b' * 24}\n")
    tokens.chmod(0o600)
    yield from serve_web(tmp_path, "--token-file", str(tokens))


def chromium() -> Any:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,800"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


@pytest.mark.skipif(
    shutil.which("chromedriver") is None and not os.environ.get("TENURE_REQUIRE_ALL"),
    reason="needs Debian's chromium-driver",  # under scripts/test.sh, missing fails instead
)
async def test_a_signed_in_page_pauses_resumes_runs_and_frees(acting: tuple[str, str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page, url = acting
    who = f"web:{LABEL}@127.0.0.1"
    async with LockService.from_url(url) as locks, make(locks) as scheduler:
        await asyncio.wait_for(scheduler.control.read_once.wait(), 10)
        stuck = await locks.acquire("nightly-report", ttl=30)
        assert stuck is not None
        control = Control(locks)

        def text(driver: Any, element: str) -> str:
            return str(driver.find_element(By.ID, element).text)

        def click(driver: Any, act: str, name: str) -> None:
            # In the page's own thread: the tables are redrawn every 2 s.
            driver.execute_script(
                "document.querySelector(`button[data-act='${arguments[0]}']"
                "[data-name='${arguments[1]}']`).click()",
                act,
                name,
            )

        def sign_in(driver: Any, token: str) -> None:
            driver.find_element(By.ID, "token").send_keys(token)
            driver.find_element(By.ID, "sign-in").click()

        def browse() -> dict[str, Any]:
            driver = chromium()
            wait = WebDriverWait(driver, 15)
            seen: dict[str, Any] = {}
            try:
                driver.get(page)
                wait.until(lambda d: d.find_element(By.ID, "sign-in").is_displayed())
                seen["buttons before"] = len(driver.find_elements(By.CSS_SELECTOR, "[data-act]"))
                sign_in(driver, "not-the-token-at-all")
                wait.until(lambda d: "wrong token" in text(d, "message"))
                sign_in(driver, TOKEN)
                wait.until(lambda d: text(d, "label") == f"signed in as {LABEL}")
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-act=pause]"))
                click(driver, "pause", "cli.tick")
                wait.until(lambda d: f"paused by {who}" in text(d, "tasks"))
                seen["cookie"] = driver.get_cookie("tenure_session")
                seen["paused"] = asyncio.run_coroutine_threadsafe(control.pauses(), loop).result()
                # A replay with the session's cookie, without the page's CSRF value.
                cookie = {"Cookie": f"tenure_session={seen['cookie']['value']}"}
                seen["replayed"] = post(page + "api/resume", {"task": "cli.tick"}, cookie)
                seen["forged"] = post(
                    page + "api/resume", {"task": "cli.tick"}, {**cookie, "X-CSRF-Token": "x"}
                )
                click(driver, "resume", "cli.tick")
                wait.until(lambda d: "resume cli.tick: done" in text(d, "message"))
                click(driver, "trigger", "cli.tick")
                wait.until(lambda d: "trigger cli.tick: done" in text(d, "message"))
                driver.execute_script("window.confirm = () => true;")
                click(driver, "release", "nightly-report")
                wait.until(lambda d: "release nightly-report: done" in text(d, "message"))
                wait.until(lambda d: text(d, "audit").count(who) == 4)
                seen["audit"] = text(driver, "audit")
                driver.find_element(By.ID, "sign-out").click()
                wait.until(lambda d: d.find_element(By.ID, "sign-in").is_displayed())
                seen["buttons after"] = len(driver.find_elements(By.CSS_SELECTOR, "[data-act]"))
            finally:
                driver.quit()
            return seen

        loop = asyncio.get_running_loop()
        seen = await asyncio.to_thread(browse)
        assert seen["buttons before"] == 0 and seen["buttons after"] == 0
        cookie = seen["cookie"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        [pause] = seen["paused"].values()
        assert (pause.task, pause.by) == ("cli.tick", who)
        csrf_refused = "this request lacks the page's CSRF value: reload the page and retry"
        assert seen["replayed"] == (403, {"error": csrf_refused})
        assert seen["forged"] == (403, {"error": csrf_refused})
        runs = await locks.store.runlog.runs("cli.tick", 1000)
        [paused] = [r for r in runs if r.outcome == RunOutcome.PAUSED]
        assert paused.ended is not None and paused.instance == who, "resumed once, by the page"
        [manual] = [r for r in runs if r.fire_time is None and r.outcome != RunOutcome.PAUSED]
        assert manual.outcome in (RunOutcome.RAN, RunOutcome.SKIPPED)  # skipped: a tick held it
        assert await locks.store.holder_of("nightly-report") is None
        [forced] = await locks.store.runlog.forced_releases("nightly-report")
        assert (forced.operator, forced.evicted) == (who, locks.holder)
        actions = [(a.action, a.target, a.who) for a in await control.audit()]
        assert actions == [
            ("force-release", "nightly-report", who),
            ("trigger", "cli.tick", who),
            ("resume", "cli.tick", who),
            ("pause", "cli.tick", who),
        ]
        for action, target, _ in actions:
            assert action in seen["audit"] and target in seen["audit"]
        assert TOKEN not in seen["audit"]


async def test_scripts_act_with_a_bearer_token_and_nothing_else(acting: tuple[str, str]) -> None:
    page, url = acting
    async with LockService.from_url(url) as locks, make(locks) as scheduler:
        await asyncio.wait_for(scheduler.control.read_once.wait(), 10)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        body = {"task": "cli.tick", "reason": "deploy"}
        began = time.monotonic()
        refusals = await asyncio.to_thread(
            lambda: [
                post(page + "api/pause", body),
                post(page + "api/pause", body, {"Authorization": "Bearer wrong-token-123456789"}),
                post(page + "api/pause", body, {"Authorization": f"Basic {TOKEN}"}),
                post(page + "api/pause", body, {**bearer, "Content-Type": "text/plain"}),
                post(page + "api/pause", None, bearer, raw=b"task=cli.tick"),
                post(page + "api/pause", {"task": "cli.tock"}, bearer),
                post(page + "api/pause", {"name": "cli.tick"}, bearer),
                post(page + "api/resume", {"task": "cli.tick"}, bearer),
                post(page + "api/release", {"lock": "free-lock"}, bearer),
            ]
        )
        assert [status for status, _ in refusals] == [401, 401, 401, 415, 400, 400, 400, 400, 400]
        assert time.monotonic() - began >= 1.0, "each wrong token waits before its answer"
        assert "no scheduler serves a task named 'cli.tock'" in refusals[5][1]["error"]
        assert await locks.store.runlog.board("control") == {}
        assert await Control(locks).audit() == [], "nothing changed, nothing audited"

        status, answer = await asyncio.to_thread(post, page + "api/pause", body, bearer)
        assert status == 200 and answer["pause"]["reason"] == "deploy"
        assert answer["pause"]["by"] == f"web:{LABEL}@127.0.0.1"
        raw = await asyncio.to_thread(lambda: urllib.request.urlopen(page + "api/state").read())
        state = json.loads(raw)
        [task] = state["tasks"]
        assert task["registered"] and task["paused"]["by"] == f"web:{LABEL}@127.0.0.1"
        assert state["audit"][0]["action"] == "pause" and "csrf" not in json.dumps(state["audit"])
        assert state["actions"] and state["label"] is None and state["csrf"] is None
        status, answer = await asyncio.to_thread(
            post, page + "api/resume", {"task": "cli.tick"}, bearer
        )
        assert status == 200 and answer["resume"]["outcome"] == "paused"


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        (None, 0o600, "cannot be read (No such file or directory)"),
        ("# only a comment\n\n", 0o600, "holds no token: add LABEL TOKEN lines"),
        (f"alice {TOKEN}\n", 0o644, "readable or writable by every user of this host"),
        (f"alice {TOKEN} extra\n", 0o600, "line 1: expected LABEL TOKEN, got 3 field(s)"),
        ("alice short\n", 0o600, "the token of 'alice' is 5 characters; use at least 16"),
        (f"alice {TOKEN}\nalice {'c' * 20}\n", 0o600, "line 2: the label 'alice' is used twice"),
    ],
)
def test_token_files_that_are_refused_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, mode: int, says: str
) -> None:
    path = tmp_path / "tokens"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    status = main(["web", "--url", f"sqlite://{tmp_path}/x.db", "--token-file", str(path)])
    err = capsys.readouterr().err
    assert status == 2 and says in err
    assert TOKEN not in err and "short" not in err.replace("'alice' is 5", "")


def test_a_token_is_found_by_its_label_only_when_it_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"alice {TOKEN}\nbob {'b' * 24}\n")
    path.chmod(0o600)
    tokens = read_tokens(path)
    assert tokens.label_of(TOKEN) == "alice" and tokens.label_of("b" * 24) == "bob"
    assert tokens.label_of(TOKEN[:-1]) is None and tokens.label_of(TOKEN + "7") is None
    assert tokens.label_of("") is None
