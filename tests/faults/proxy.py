"""A TCP proxy on loopback whose behaviour a test switches while connections are open.

Modes: ``pass`` forwards; ``delay`` forwards each chunk after ``delay`` seconds;
``blackhole`` reads and drops everything, answering nothing (a partition);
``reset`` closes every connection with a TCP reset and resets new ones;
``mute`` forwards what clients send and drops what the server answers (a
request that ran, whose answer was lost). ``dropped`` counts the bytes a
blackhole or mute swallowed, so a test can show it bit; ``accepted`` counts
the connections made to it.
The proxy runs its own event loop on a thread of the test process.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode = "pass"
        self.delay = 0.0
        self.dropped = 0
        self.accepted = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0, family=socket.AF_INET)
        )
        self.port: int = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def set_mode(self, mode: str, delay: float = 0.0) -> None:
        assert mode in ("pass", "delay", "blackhole", "reset", "mute"), mode

        switched = threading.Event()

        def switch() -> None:
            self.mode, self.delay = mode, delay
            if mode == "reset":
                for writer in list(self._writers):
                    _reset(writer)
            switched.set()

        # Waited for: what the caller sends next meets the new mode.
        self._loop.call_soon_threadsafe(switch)
        switched.wait(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "reset":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(writer)
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(
                self._pump(reader, up_writer),
                self._pump(up_reader, writer, answers=True),
                return_exceptions=True,
            )
        finally:
            self._writers -= {writer, up_writer}
            for end in (writer, up_writer):
                end.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool = False
    ) -> None:
        loop = asyncio.get_running_loop()
        due = 0.0  # when the last delayed chunk goes out: later chunks keep their order
        while chunk := await reader.read(65536):
            if self.mode == "blackhole" or (self.mode == "mute" and answers):
                self.dropped += len(chunk)
                continue
            if self.mode == "reset":
                break
            if self.mode == "delay" or due > loop.time():
                # Each chunk leaves ``delay`` after it arrived (not after the one
                # before it left): a late packet, not a slower and slower link.
                due = max(due, loop.time() + (self.delay if self.mode == "delay" else 0.0))
                loop.call_at(due, _send, writer, chunk)
                continue
            writer.write(chunk)
            await writer.drain()
        loop.call_at(max(due, loop.time()), writer.close)

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            for writer in list(self._writers):
                _reset(writer)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _send(writer: asyncio.StreamWriter, chunk: bytes) -> None:
    if not writer.is_closing():
        writer.write(chunk)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a peer that vanished would."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() != -1:  # not closed by its peer meanwhile
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
