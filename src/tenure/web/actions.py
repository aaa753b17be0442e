"""``tenure web``'s actions: ``POST /api/pause``, ``/api/resume``,
``/api/trigger`` and ``/api/release`` (a forced release), each a JSON body
naming its ``task`` or ``lock`` (and an optional ``reason``), for the page and
for scripts; and the browser's sign-in (``/api/session``).

Each action is made through ``tenure.control.Control`` as the operator
``web:LABEL@ADDRESS`` (the token's label, the client's address), so that it
leaves its audit record. Answers are JSON: the result, or ``{"error": ...}``
with 400 (bad input: nothing changed), 401 (no or a wrong token), 403 (a
read-only page, or a missing CSRF value), 415 (not JSON), 503 (the store
failed) or 504 (no instance took a run request in time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..control import Control
from ..errors import InvalidArgument, RequestNotTaken, StoreUnavailable, TenureError
from ..locks import LockService
from .access import SESSION_COOKIE, SESSION_TTL, Sessions, Tokens

__all__ = ("ACTIONS", "Actions")

FAILED_SIGN_IN_PAUSE = 0.5
"""Seconds a wrong token waits for its answer: guessing is slow."""

Act = Callable[[Control, str, str | None], Awaitable[Any]]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _pause(control: Control, name: str, reason: str | None) -> Any:
    return dataclasses.asdict(await control.pause(name, reason=reason))


async def _resume(control: Control, name: str, reason: str | None) -> Any:
    return dataclasses.asdict(await control.resume(name))


async def _trigger(control: Control, name: str, reason: str | None) -> Any:
    return dataclasses.asdict(await control.trigger(name))


async def _release(control: Control, name: str, reason: str | None) -> Any:
    return dataclasses.asdict(await control.force_release(name, reason=reason))


_STATUS: dict[type[TenureError], int] = {
    InvalidArgument: 400,
    RequestNotTaken: 504,
    StoreUnavailable: 503,
}

ACTIONS: dict[str, tuple[str, Act]] = {
    "pause": ("task", _pause),
    "resume": ("task", _resume),
    "trigger": ("task", _trigger),
    "release": ("lock", _release),
}
"""Each action's path (``/api/NAME``), the field naming what it acts on, and the act."""


class Actions:
    """The action endpoints of one page (``tokens`` None: a read-only page)."""

    def __init__(self, locks: LockService, tokens: Tokens | None) -> None:
        self.locks = locks
        self.tokens = tokens
        self.sessions = Sessions()

    def signed_in(self, request: Request) -> dict[str, Any]:
        """What ``GET /api/session`` answers: whether this page acts, and as whom."""
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        return {
            "actions": self.tokens is not None,
            "label": None if session is None else session.label,
            "csrf": None if session is None else session.csrf,
        }

    async def session(self, request: Request) -> Response:
        """``GET``: as :meth:`signed_in`; ``POST {"token": ...}``: sign in;
        ``DELETE``: sign out."""
        if request.method == "GET":
            return JSONResponse(self.signed_in(request))
        if request.method == "DELETE":
            self.sessions.close(request.cookies.get(SESSION_COOKIE))
            answer = JSONResponse({"signed_out": True})
            answer.delete_cookie(SESSION_COOKIE)
            return answer
        if self.tokens is None:
            return _error(403, "this page is read-only: start tenure web with --token-file to act")
        body = await _json(request)
        if isinstance(body, Response):
            return body
        token = body.get("token")
        label = self.tokens.label_of(token) if isinstance(token, str) else None
        if label is None:
            await asyncio.sleep(FAILED_SIGN_IN_PAUSE)
            return _error(401, "wrong token: nothing changed")
        key, made = self.sessions.open(label)
        answer = JSONResponse({"actions": True, "label": label, "csrf": made.csrf})
        answer.set_cookie(
            SESSION_COOKIE, key, max_age=int(SESSION_TTL), httponly=True, samesite="strict"
        )
        return answer

    async def act(self, request: Request) -> Response:
        """``POST /api/ACTION``: check who asks and what, then act as them."""
        what = request.url.path.rsplit("/", 1)[-1]
        field, act = ACTIONS[what]
        who = await self._who(request)
        body = who if isinstance(who, Response) else await _json(request)
        if isinstance(body, Response):
            return body
        name, reason = body.get(field), body.get("reason")
        if not isinstance(name, str) or not (reason is None or isinstance(reason, str)):
            return _error(
                400,
                f"{what} takes a JSON object: the {field} name as {field!r}, and a string"
                " 'reason' (optional)",
            )
        client = request.client.host if request.client is not None else "unknown"
        control = Control(self.locks, by=f"web:{who}@{client}")
        try:
            return JSONResponse({what: await act(control, name, reason)})
        except TenureError as exc:
            status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
            return _error(status, str(exc))

    async def _who(self, request: Request) -> str | Response:
        """The label of the token the request carries, or the answer refusing it."""
        if self.tokens is None:
            return _error(403, "this page is read-only: start tenure web with --token-file to act")
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme:
            label = self.tokens.label_of(value.strip()) if scheme.lower() == "bearer" else None
            if label is None:
                await asyncio.sleep(FAILED_SIGN_IN_PAUSE)
                return _error(
                    401, "wrong token (send Authorization: Bearer TOKEN): nothing changed"
                )
            return label
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is None:
            return _error(401, "sign in with a token first (or send Authorization: Bearer TOKEN)")
        sent = request.headers.get("x-csrf-token", "")
        if not hmac.compare_digest(sent.encode(errors="surrogateescape"), session.csrf.encode()):
            return _error(
                403, "this request lacks the page's CSRF value: reload the page and retry"
            )
        return session.label


async def _json(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the answer refusing it."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return _error(415, "send a JSON body (Content-Type: application/json)")
    try:
        body = json.loads(await request.body())
    except ValueError:
        return _error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    return body
