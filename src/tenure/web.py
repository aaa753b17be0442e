"""``tenure web``: a read-only page of tasks and holders (``tenure[web]``: Starlette, uvicorn).

One page that refreshes itself every two seconds from ``/api/state`` (JSON):
the current holders (``Store.holders``), and per task its recent occurrences
from the run records, with counts of skips, failures and losses; given the
application's Scheduler, each task's expression and next fire time too. Only
GET; nothing on it can change a lock. It binds to 127.0.0.1 unless told
otherwise: lock names and holder ids are not for everyone.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from .locks.election import shown
from .schedule import Scheduler
from .schedule.view import defined_tasks, run_fields
from .stores.base import Store

__all__ = ("make_app",)

RUNS_SHOWN = 300


async def state(store: Store, scheduler: Scheduler | None) -> dict[str, Any]:
    """What the page shows, as JSON-ready data (never a secret token)."""
    holders = await store.holders()
    records = await store.runlog.runs(None, RUNS_SHOWN)
    by_task: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        by_task[r.task].append(run_fields(r))
    defined = {d["task"]: d for d in defined_tasks(scheduler)}
    tasks = []
    for name in sorted(set(by_task) | set(defined)):
        runs = by_task.get(name, [])
        counts = collections.Counter(run["outcome"] for run in runs)
        tasks.append(
            {
                **defined.get(
                    name,
                    {"expression": None, "tz": None, "next_fire": None, "exclusive": None},
                ),
                "task": name,
                "recent": runs[:5],
                "skipped": counts["skipped"],
                "failed": counts["failed"],
                "lost": counts["lost"],
            }
        )
    return {
        "store": store.describe(),
        "now": time.time(),
        # LeaseInfo: never a token; an election's term named as such
        "holders": [{**dataclasses.asdict(h), "name": shown(h.name)} for h in holders],
        "tasks": tasks,
    }


def make_app(store: Store, scheduler: Scheduler | None = None) -> Starlette:
    """The ASGI application; it closes ``store`` when it shuts down."""

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def api_state(request: Request) -> JSONResponse:
        return JSONResponse(await state(store, scheduler))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await store.aclose()

    return Starlette(routes=[Route("/", page), Route("/api/state", api_state)], lifespan=lifespan)


# Rendered in the browser with textContent only: names and errors are data, never markup.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>tenure</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; min-width: 40em; }
th, td { text-align: left; padding: .25em .8em .25em 0; border-bottom: 1px solid #ddd; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ran { color: #17663a; } .skipped { color: #7a6500; }
.failed, .lost, .missed, .abandoned { color: #b00020; }
.muted { color: #777; }
</style></head>
<body>
<h1>tenure</h1><div class="muted" id="store"></div>
<h2>Held locks</h2>
<table id="holders"><thead><tr><th>lock</th><th>holder</th><th>fencing token</th>
<th>acquired (UTC)</th><th>expires in</th></tr></thead><tbody></tbody></table>
<h2>Tasks</h2>
<table id="tasks"><thead><tr><th>task</th><th>expression</th><th>next fire (UTC)</th>
<th>last occurrences</th><th>skipped</th><th>failed</th><th>lost</th></tr></thead>
<tbody></tbody></table>
<p class="muted" id="updated"></p>
<script>
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td;
}
function utc(t) {
  return t == null ? "" : new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ");
}
function fill(id, rows, draw, empty) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  if (!rows.length) { cell(body.insertRow(), empty, "muted").colSpan = 7; return; }
  rows.forEach(r => draw(body.insertRow(), r));
}
async function refresh() {
  try {
    const s = await (await fetch("/api/state")).json();
    document.getElementById("store").textContent = s.store;
    fill("holders", s.holders, (row, h) => {
      cell(row, h.name); cell(row, h.holder); cell(row, h.fencing_token, "num");
      cell(row, utc(h.acquired_at)); cell(row, h.expires_in.toFixed(1) + " s", "num");
    }, "no lock is held");
    fill("tasks", s.tasks, (row, t) => {
      cell(row, t.task); cell(row, t.expression || ""); cell(row, utc(t.next_fire));
      const last = cell(row, "");
      t.recent.forEach(r => {
        const span = document.createElement("span");
        span.className = r.outcome;
        const at = r.fire_time == null ? "" : " " + utc(r.fire_time).slice(11);
        span.textContent = r.outcome + at;
        if (r.error) span.title = r.error;
        last.append(span, " ");
      });
      cell(row, t.skipped, "num"); cell(row, t.failed, "num"); cell(row, t.lost, "num");
    }, "no task has run yet");
    document.getElementById("updated").textContent = "updated " + utc(s.now) + " UTC";
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach tenure web: " + e;
  }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""
