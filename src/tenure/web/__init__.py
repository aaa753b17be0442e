"""``tenure web``: a page of tasks, holders and audit records
(``tenure[web]``: Starlette, uvicorn); it acts only when given tokens.

One page that refreshes itself every two seconds from ``/api/state`` (JSON):
the current holders, each task (defined by the application's Scheduler,
registered by a serving one, or with run records) with its pause and recent
runs, and the newest audit records. Without a token file it is read-only:
nothing on it can change anything. With one (``access``), a signed-in
browser or a script with a token may pause, resume and run tasks and free
locks (``actions``), each action audited. It binds to 127.0.0.1 unless told
otherwise: lock names and holder ids are not for everyone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from ..control import Control
from ..locks import LockService
from ..schedule import Scheduler
from ..stores.base import Store
from .access import Tokens, read_tokens
from .actions import ACTIONS, Actions
from .page import PAGE
from .state import state

__all__ = ("Tokens", "make_app", "read_tokens")


def make_app(
    store: Store, scheduler: Scheduler | None = None, *, tokens: Tokens | None = None
) -> Starlette:
    """The ASGI application; it closes ``store`` when it shuts down. With
    ``tokens`` (``read_tokens``), the holders of a token may act."""
    locks = scheduler.locks if scheduler is not None else LockService(store)
    actions = Actions(locks, tokens)

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def api_state(request: Request) -> JSONResponse:
        shown = await state(Control(locks), scheduler)
        return JSONResponse({**shown, **actions.signed_in(request), "csrf": None})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await store.aclose()

    routes = [
        Route("/", page),
        Route("/api/state", api_state),
        Route("/api/session", actions.session, methods=["GET", "POST", "DELETE"]),
        *(Route(f"/api/{name}", actions.act, methods=["POST"]) for name in ACTIONS),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
