"""Who may act from ``tenure web``: the token file, sessions and the CSRF guard.

The page acts only when started with ``--token-file F``. Its format: one
token per line, ``LABEL TOKEN`` (the label names the token's holder in the
audit records; the token is at least 16 characters); blank lines and lines
starting with ``#`` are skipped. The file is refused when it is missing,
holds no token, or is readable or writable by every user of the host (anyone
on it could read a token and act on the cluster): ``chmod 600`` it.

A script sends ``Authorization: Bearer TOKEN`` with each request. A browser
signs in once with a token (``POST /api/session``) and gets a session cookie
(``HttpOnly``, ``SameSite=Strict``) and a CSRF value that each action must
send back in the ``X-CSRF-Token`` header: a form replayed from elsewhere,
with the cookie and without the value, is refused. Tokens and session ids
are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ("SESSION_COOKIE", "SESSION_TTL", "Session", "Sessions", "Tokens", "read_tokens")

SESSION_COOKIE = "tenure_session"
SESSION_TTL = 12 * 3600.0
"""Seconds a browser's sign-in lasts."""
MIN_TOKEN = 16


@dataclass(frozen=True, slots=True)
class Tokens:
    """The tokens of a token file, by label."""

    entries: tuple[tuple[str, bytes], ...]

    def label_of(self, token: str) -> str | None:
        """The label of ``token``, or None: every entry is compared, in constant time."""
        given = token.encode("utf-8", errors="surrogateescape")
        found = None
        for label, secret in self.entries:
            if hmac.compare_digest(secret, given) and found is None:
                found = label
        return found


def read_tokens(path: str | Path) -> Tokens:
    """The tokens of the file at ``path``; ConfigurationError saying what is
    wrong with it (never quoting a token)."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"token file {str(file)!r} cannot be read ({exc.strerror}): give --token-file "
            "a file of LABEL TOKEN lines"
        ) from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigurationError(
            f"token file {str(file)!r} is readable or writable by every user of this host "
            f"(mode {stat.filemode(mode)}): anyone on it could act on the cluster; refused. "
            f"Run: chmod 600 {file}"
        )
    entries: list[tuple[str, bytes]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        where = f"token file {str(file)!r}, line {number}"
        if len(fields) != 2:
            raise ConfigurationError(f"{where}: expected LABEL TOKEN, got {len(fields)} field(s)")
        label, token = fields
        if len(token) < MIN_TOKEN:
            raise ConfigurationError(
                f"{where}: the token of {label!r} is {len(token)} characters; use at least "
                f"{MIN_TOKEN} random ones: python -c 'import secrets; "
                "print(secrets.token_urlsafe())'"
            )
        if any(label == seen for seen, _ in entries):
            raise ConfigurationError(f"{where}: the label {label!r} is used twice")
        entries.append((label, token.encode()))
    if not entries:
        raise ConfigurationError(
            f"token file {str(file)!r} holds no token: add LABEL TOKEN lines, or leave out "
            "--token-file for a read-only page"
        )
    return Tokens(tuple(entries))


@dataclass(frozen=True, slots=True)
class Session:
    label: str
    csrf: str
    until: float


class Sessions:
    """The browsers signed in, in this process's memory."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}

    def open(self, label: str) -> tuple[str, Session]:
        now = time.monotonic()
        self._open = {key: s for key, s in self._open.items() if s.until > now}
        key = secrets.token_urlsafe(32)
        session = Session(label, secrets.token_urlsafe(32), now + SESSION_TTL)
        self._open[key] = session
        return key, session

    def get(self, key: str | None) -> Session | None:
        if not key:
            return None
        found = None
        for stored, session in self._open.items():
            if hmac.compare_digest(stored.encode(), key.encode(errors="surrogateescape")):
                found = session
        if found is None or found.until <= time.monotonic():
            return None
        return found

    def close(self, key: str | None) -> None:
        if self.get(key) is not None and key is not None:
            self._open.pop(key, None)
