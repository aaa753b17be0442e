"""Acquires whose answer never came, and the tokens they were sent with.

An acquire that failed with StoreUnavailable, or was cancelled while its call
was on the way, may have been granted before its answer was lost. Its token
is given back at once, in the background. The next acquire of that name by
the same service first waits for that give-back. If it reached the store, the
grant is gone and a new token is used. If it could not (the store was still
out of reach), the grant may still be there; the new acquire is then sent with
the same token, and the store treats a live lease of that very token as
granted to its sender (the same fencing token). So a retry after a lost
answer is never kept out by its own orphaned grant.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from ._tokens import new_token

__all__ = ("Unanswered",)

log = logging.getLogger("tenure")

_Entry = tuple[str, float, "asyncio.Future[bool]"]
"""The token, when its grant (if any) has surely lapsed (monotonic), the give-back."""


class Unanswered:
    """Per name, the token of the last acquire whose answer was lost, until settled."""

    def __init__(self, release: Callable[[str, str], Awaitable[bool]]) -> None:
        self._release = release
        self._pending: dict[str, _Entry] = {}

    def add(self, name: str, token: str, until: float) -> None:
        """``token``'s acquire of ``name`` got no answer; its grant lapses by ``until``."""
        give_back = asyncio.ensure_future(self._release(name, token))
        entry = (token, until, give_back)
        self._pending[name] = entry
        give_back.add_done_callback(functools.partial(self._settled, name, entry))

    def _settled(self, name: str, entry: _Entry, give_back: asyncio.Future[bool]) -> None:
        if give_back.cancelled() or give_back.exception() is None:
            self._forget(name, entry)  # given back: nothing of it is left in the store
        else:
            # Not given back: the grant may live until it lapses, and is ours to reuse.
            left = max(entry[1] - time.monotonic(), 0.0)
            log.debug(
                "could not give back the grant an unanswered acquire of %r may have got "
                "(a retry reuses its token; it lapses within %.1f s): %s",
                name,
                left,
                give_back.exception(),
            )
            give_back.get_loop().call_later(left, self._forget, name, entry)

    def _forget(self, name: str, entry: _Entry) -> None:
        if self._pending.get(name) is entry:
            del self._pending[name]

    async def token(self, name: str) -> str:
        """The token to acquire ``name`` with: a lost grant's, while it may be live."""
        entry = self._pending.pop(name, None)
        if entry is None:
            return new_token()
        token, until, give_back = entry
        try:
            await asyncio.shield(give_back)
        except asyncio.CancelledError:
            if give_back.cancelled():
                return new_token()
            self._pending.setdefault(name, entry)  # this caller was cancelled, not the give-back
            raise
        except Exception:
            if time.monotonic() < until:
                return token
        return new_token()

    async def settle(self) -> None:
        """Wait for the give-backs still on their way (each one store call,
        bounded by the store's timeout): a service closing meanwhile would
        otherwise leave them to be destroyed with its event loop."""
        waiting = [entry[2] for entry in self._pending.values() if not entry[2].done()]
        if waiting:
            await asyncio.wait(waiting)

    def clear(self) -> dict[str, _Entry]:
        """Forget everything (a forked child: the parent's calls are not its own);
        returns what was forgotten, for the caller to keep (see ``LockService._after_fork``)."""
        pending, self._pending = self._pending, {}
        return pending

    def __len__(self) -> int:
        return len(self._pending)
