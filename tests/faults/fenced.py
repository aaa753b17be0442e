"""A fenced resource: one process holding a counter that only the newest fence may touch.

Line protocol on a loopback TCP port (printed on stdout when listening):
``read FENCE`` -> ``ok VALUE`` or ``stale MAX``; ``write FENCE VALUE`` -> ``ok`` or
``stale MAX``; ``stats`` -> ``VALUE ACCEPTED_WRITES REJECTED``. A fence below the
highest seen is rejected; an accepted one becomes the highest.

    python -m tests.faults.fenced
"""

from __future__ import annotations

import asyncio
import socket


class Resource:
    def __init__(self) -> None:
        self.value = 0
        self.highest = 0
        self.accepted = 0
        self.rejected = 0

    def handle(self, line: str) -> str:
        cmd, *args = line.split()
        if cmd == "stats":
            return f"{self.value} {self.accepted} {self.rejected}"
        fence = int(args[0])
        if fence < self.highest:
            self.rejected += 1
            return f"stale {self.highest}"
        self.highest = fence
        if cmd == "read":
            return f"ok {self.value}"
        self.value = int(args[1])
        self.accepted += 1
        return "ok"


async def main() -> None:
    resource = Resource()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write((resource.handle(line.decode()) + "\n").encode())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, family=socket.AF_INET)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
