"""Lock tokens: 128 random bits from the OS CSPRNG, as hex.

``os.urandom`` is a system call, about a microsecond in a VM: a tenth of an
uncontended acquire on the embedded store. Tokens are therefore drawn 256 at a
time and handed out one by one. ``deque.pop`` is atomic, so threads that
acquire at once never share a token (two that find the pool empty both refill
it, with different bytes). A forked child empties the pool, which would
otherwise mint its parent's next tokens.
"""

from __future__ import annotations

import os
from collections import deque

__all__ = ("new_token",)

_BATCH = 256
_pool: deque[str] = deque()


def new_token() -> str:
    """A fresh token: never handed out before in this process or any other."""
    while True:
        try:
            return _pool.pop()
        except IndexError:
            raw = os.urandom(16 * _BATCH).hex()
            _pool.extend([raw[i : i + 32] for i in range(0, len(raw), 32)])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.clear)
