"""A loopback proxy in front of nats-server that swallows the client's JetStream API requests.

The connection works (INFO, CONNECT, PING/PONG, core publishes) but every request to
`$JS.API.>` vanishes, so a client's JetStream calls hang until their own timeout: a way to
hold a daemon in its provisioning phase for as long as a test needs.
"""

from __future__ import annotations

import asyncio
import contextlib


class JetStreamSwallower:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.swallowed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> JetStreamSwallower:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        for pump in (self._client_to_server(reader, up_writer), _copy(up_reader, writer)):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Forward protocol operations one by one, dropping (H)PUBs to $JS.API."""
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while line := await reader.readline():
                op = line.split(b" ", 2)
                frame = line
                if op[0].upper() in (b"PUB", b"HPUB"):
                    size = int(line.split()[-1])
                    frame += await reader.readexactly(size + 2)
                    if op[1].startswith(b"$JS.API."):
                        self.swallowed.set()
                        continue
                writer.write(frame)
                await writer.drain()
        writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()
