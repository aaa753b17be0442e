"""``tenure doctor`` and ``tenure schema``: check a store's set-up, and print
the SQL that creates its tables ahead of time."""

from __future__ import annotations

import contextlib
import textwrap
import time

from ..errors import ConfigurationError, StoreUnavailable, TenureError
from ..schedule.skew import SKEW_WARNING
from ..stores import from_url as store_from_url
from ..stores import store_class
from ..stores.base import PrintsSchema


def _say(level: str, text: str, fix: str = "") -> None:
    """One finding, wrapped to 80 columns."""
    print(textwrap.fill(text, 80, initial_indent=f"{level:<7}", subsequent_indent=" " * 7))
    if fix:
        print(textwrap.fill(fix, 80, initial_indent="  fix: ", subsequent_indent=" " * 7))


async def doctor(url: str) -> int:
    store = store_from_url(url)
    print(f"store  {store.describe()}")
    try:
        trips = []
        for _ in range(5):
            started = time.perf_counter()
            await store.holders("tenure-doctor/")
            trips.append(time.perf_counter() - started)
        trips.sort()
        _say("ok", f"reachable: round trip {trips[2] * 1000:.3f} ms (median of 5)")
        before = time.time()
        theirs = await store.server_time()
        after = time.time()
        if theirs is None:
            _say(
                "ok",
                "no clock of its own to compare: lease time is this host's monotonic "
                "clock (SQLite, memory) or the etcd leader's",
            )
        else:
            skew = theirs - (before + after) / 2
            within = (after - before) / 2
            text = (
                f"this host's clock is {abs(skew):.3f} s {'behind' if skew > 0 else 'ahead of'} "
                f"the store's (±{within:.3f} s)"
            )
            if abs(skew) > SKEW_WARNING:
                _say(
                    "warn",
                    text + ": locks do not mind (the store decides expiry), but scheduled "
                    "tasks fire by each host's clock, so this host runs its occurrences that "
                    "much early or late (each still runs once)",
                    "run NTP (chrony, systemd-timesyncd) on every host and the store's",
                )
            else:
                _say("ok", text)
        findings = await store.diagnose()
    except StoreUnavailable as exc:
        _say(
            "unsafe", f"cannot reach the store: {exc}", "check the URL, the network and the server"
        )
        return 1
    finally:
        with contextlib.suppress(TenureError):
            await store.aclose()
    for finding in findings:
        _say(finding.level, finding.what, finding.fix)
    unsafe = [f for f in findings if f.level == "unsafe"]
    if unsafe:
        print(f"{len(unsafe)} unsafe setting(s): locks can be lost or granted twice")
        return 1
    return 0


def schema(url: str) -> None:
    # The class is looked at before any store is opened: opening a SQLite URL
    # would create its file.
    kind = store_class(url)
    if not issubclass(kind, PrintsSchema):
        raise ConfigurationError(
            f"tenure schema prints SQL for PostgreSQL and MySQL/MariaDB URLs only (the stores "
            f"with tables to create ahead of time), not a {kind.__name__} URL: the other "
            "stores create what they need themselves"
        )
    store = kind.from_url(url)  # checks the URL; connects to nothing
    assert isinstance(store, PrintsSchema)
    print(store.schema_sql(), end="")
