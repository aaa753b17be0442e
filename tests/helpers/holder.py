"""A lock-holding worker process driven by line commands on stdin.

Each command prints one JSON line. Times are ``time.monotonic_ns()``, which on
Linux is one clock for every process of the host (and runs through SIGSTOP),
so the test can compare them with its own.

    acquire NAME TTL [WAIT] [AT_NS]  -> {"ok", "fence", "t"}   (AT_NS: spin until then)
    permit NAME LIMIT TTL            -> {"ok", "fence"}  (a semaphore's permit, held as the lock)
    hold SECONDS                     -> {"held_throughout", "checks"}
    status                           -> {"held", "lost"}
    release                          -> {"released", "held", "lost"}
    exit
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from tenure import Lock, LockService


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main(url: str) -> None:
    loop = asyncio.get_running_loop()
    lock: Lock | None = None
    async with LockService.from_url(url) as locks:
        say(ready=True, pid=os.getpid())
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd, *args = line.split()
            if cmd == "acquire":
                name, ttl = args[0], float(args[1])
                wait = float(args[2]) if len(args) > 2 else 0.0
                if len(args) > 3:
                    at = int(args[3])
                    while time.monotonic_ns() < at:
                        pass
                lock = await locks.acquire(name, ttl=ttl, wait=wait)
                say(ok=lock is not None, fence=lock and lock.fencing_token, t=time.monotonic_ns())
            elif cmd == "permit":
                semaphore = locks.semaphore(args[0], int(args[1]))
                lock = await semaphore.acquire(ttl=float(args[2]))
                say(ok=lock is not None, fence=lock and lock.fencing_token)
            elif cmd == "hold":
                assert lock is not None
                end = time.monotonic() + float(args[0])
                checks, throughout = 0, True
                while time.monotonic() < end:
                    throughout = throughout and lock.held
                    checks += 1
                    await asyncio.sleep(0.02)
                say(held_throughout=throughout and lock.held, checks=checks)
            elif cmd == "status":
                say(held=lock is not None and lock.held, lost=lock is not None and lock.lost)
            elif cmd == "release":
                assert lock is not None
                held, lost = lock.held, lock.lost
                say(released=await lock.release(), held=held, lost=lost)
            elif cmd == "exit":
                return


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
