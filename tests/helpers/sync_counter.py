"""A blocking-API worker: read-modify-write a counter file under a lock, for a while.

    python sync_counter.py URL COUNTER_FILE SECONDS

Each turn: ``tenure.sync`` acquire (waiting up to 2 s), read the counter,
pause, write it back plus one, release. The pause between the read and the
write makes two holders at once lose an update. Prints one JSON line: every
grant's fencing token with ``time.monotonic_ns()`` at the start of its turn
(one clock for every process of a Linux host).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tenure.sync import LockService


def main(url: str, counter: Path, seconds: float) -> None:
    turns: list[tuple[int, int]] = []
    with LockService.from_url(url) as locks:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            lock = locks.acquire("counter", ttl=2, wait=2)
            if lock is None:
                continue
            with lock:
                turns.append((time.monotonic_ns(), lock.fencing_token))
                value = int(counter.read_text())
                time.sleep(0.002)
                counter.write_text(str(value + 1))
    print(json.dumps({"turns": turns}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]))
