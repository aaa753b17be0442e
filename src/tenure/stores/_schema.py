"""What a store with tables says when it finds them of another shape (PostgreSQL, MySQL)."""

from __future__ import annotations

from ..errors import ConfigurationError

__all__ = ("check_schema_version",)


def check_schema_version(
    found: str | None, expected: int, where: str, tables: str, what_else: str = ""
) -> None:
    """ConfigurationError unless ``found`` (the recorded version) is ``expected``;
    an older one is named as such. ``tables`` names them in the message;
    ``what_else`` is what to drop beside them."""
    if found is not None and found.isdigit() and int(found) < expected:
        raise ConfigurationError(
            f"{where}: {tables} are of an older shape (schema version {found}; this "
            f"tenure uses {expected}): tenure has no release yet that migrates them. "
            f"Stop every instance, drop them{what_else} (they hold only leases, claims, run "
            "records and forced-release records) or use another prefix; `tenure schema` "
            "prints the current shape"
        )
    if found != str(expected):
        raise ConfigurationError(
            f"{where}: {tables} have schema version {found!r}, this tenure expects "
            f"{expected}; use another prefix"
        )
