"""``tenure web``'s one page: HTML and the script that fills it from the API.

Rendered in the browser with ``textContent`` only: names, reasons and errors
are data, never markup. Its action buttons appear once a token signed it in
(``access``); each one posts JSON with the session's CSRF value.
"""

from __future__ import annotations

__all__ = ("PAGE",)

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>tenure</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; min-width: 40em; }
th, td { text-align: left; padding: .25em .8em .25em 0; border-bottom: 1px solid #ddd; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ran { color: #17663a; } .skipped, .paused { color: #7a6500; }
.failed, .lost, .missed, .abandoned, .error { color: #b00020; }
.muted { color: #777; } button { margin-right: .3em; } #bar { margin: .8em 0; }
</style></head>
<body>
<h1>tenure</h1><div class="muted" id="store"></div>
<div id="bar" hidden>
<span id="signin"><input type="password" id="token" placeholder="access token" size="30">
<button id="sign-in">sign in</button></span>
<span id="who" hidden><span id="label"></span> <button id="sign-out">sign out</button>
<input id="reason" placeholder="reason (optional, kept in the audit)" size="36"></span>
<div id="message"></div></div>
<h2>Held locks</h2>
<table id="holders"><thead><tr><th>lock</th><th>holder</th><th>fencing token</th>
<th>acquired (UTC)</th><th>expires in</th><th></th></tr></thead><tbody></tbody></table>
<h2>Tasks</h2>
<table id="tasks"><thead><tr><th>task</th><th>schedule</th><th>next fire (UTC)</th>
<th>state</th><th>last occurrences</th><th>skipped</th><th>failed</th><th>lost</th><th></th>
</tr></thead><tbody></tbody></table>
<h2>Audit</h2>
<table id="audit"><thead><tr><th>at (UTC)</th><th>who</th><th>action</th><th>task or lock</th>
<th>detail</th></tr></thead><tbody></tbody></table>
<p class="muted" id="updated"></p>
<script>
let csrf = null;
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td;
}
function utc(t) {
  return t == null ? "" : new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ");
}
function fill(id, rows, draw, empty) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  if (!rows.length) { cell(body.insertRow(), empty, "muted").colSpan = 9; return; }
  rows.forEach(r => draw(body.insertRow(), r));
}
function button(td, act, name, text) {
  if (csrf == null) return;
  const b = document.createElement("button");
  b.textContent = text; b.dataset.act = act; b.dataset.name = name; td.append(b);
}
function say(text, error) {
  const m = document.getElementById("message");
  m.textContent = text; m.className = error ? "error" : "";
}
async function call(method, path, body, headers) {
  const answer = await fetch(path, {method: method, headers: Object.assign(
    {"Content-Type": "application/json"}, headers || {}),
    body: body == null ? undefined : JSON.stringify(body)});
  const data = await answer.json();
  if (!answer.ok) throw new Error(data.error || answer.statusText);
  return data;
}
function signedIn(s) {
  csrf = s.csrf;
  document.getElementById("bar").hidden = !s.actions;
  document.getElementById("signin").hidden = s.label != null;
  document.getElementById("who").hidden = s.label == null;
  document.getElementById("label").textContent = s.label == null ? "" : "signed in as " + s.label;
}
async function act(action, name) {
  const reason = document.getElementById("reason").value || null;
  const field = action === "release" ? "lock" : "task";
  if (action === "release" && !confirm("Free " + name + "? Its holder may still be running.")) {
    return;
  }
  say(action + " " + name + " ...");
  try {
    const body = {reason: reason}; body[field] = name;
    const done = (await call("POST", "/api/" + action, body, {"X-CSRF-Token": csrf}))[action];
    say(action + " " + name + ": done" + (done.error ? " (" + done.error + ")" : ""));
  } catch (e) { say(action + " " + name + ": " + e.message, true); }
  refresh();
}
document.addEventListener("click", e => {
  const b = e.target.closest("button[data-act]"); if (b) act(b.dataset.act, b.dataset.name);
});
document.getElementById("sign-in").onclick = async () => {
  const input = document.getElementById("token");
  try {
    signedIn(await call("POST", "/api/session", {token: input.value})); say("");
  } catch (e) { say("sign in: " + e.message, true); }
  input.value = ""; refresh();
};
document.getElementById("sign-out").onclick = async () => {
  await call("DELETE", "/api/session"); signedIn({actions: true, label: null, csrf: null});
  refresh();
};
async function refresh() {
  try {
    const s = await (await fetch("/api/state")).json();
    document.getElementById("store").textContent = s.store;
    fill("holders", s.holders, (row, h) => {
      cell(row, h.name); cell(row, h.holder); cell(row, h.fencing_token, "num");
      cell(row, utc(h.acquired_at)); cell(row, h.expires_in.toFixed(1) + " s", "num");
      button(cell(row, ""), "release", h.lock, "free");
    }, "no lock is held");
    fill("tasks", s.tasks, (row, t) => {
      cell(row, t.task); cell(row, t.expression || ""); cell(row, utc(t.next_fire));
      if (t.paused) {
        cell(row, "paused by " + t.paused.by + ", " + t.paused.skipped + " skipped", "paused");
      } else { cell(row, t.registered ? "serving" : ""); }
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
      const acts = cell(row, "");
      if (t.registered) {
        button(acts, t.paused ? "resume" : "pause", t.task, t.paused ? "resume" : "pause");
        button(acts, "trigger", t.task, "run now");
      }
    }, "no task has run yet");
    fill("audit", s.audit, (row, a) => {
      cell(row, utc(a.at)); cell(row, a.who); cell(row, a.action); cell(row, a.target);
      cell(row, a.detail);
    }, "no operator has acted");
    document.getElementById("updated").textContent = "updated " + utc(s.now) + " UTC";
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach tenure web: " + e;
  }
}
call("GET", "/api/session").then(signedIn).finally(refresh);
setInterval(refresh, 2000);
</script></body></html>
"""
