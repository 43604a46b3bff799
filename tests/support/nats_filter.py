"""A loopback proxy in front of nats-server that swallows the client's JetStream API requests.

The connection works (INFO, CONNECT, PING/PONG, core publishes) but every request to
`$JS.API.>` vanishes, so a client's JetStream calls hang until their own timeout: a way to
hold a daemon in its provisioning phase for as long as a test needs.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.faults.proxy import FaultProxy


class JetStreamSwallower(FaultProxy):
    def __init__(self, upstream_port: int) -> None:
        super().__init__("127.0.0.1", upstream_port)
        self.swallowed = asyncio.Event()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        link = (writer, up_writer)
        self._links.add(link)
        for pump in (self._requests(reader, up_writer), self._pump(up_reader, writer, link)):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward the client's protocol operations one by one, dropping (H)PUBs to $JS.API."""
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while line := await reader.readline():
                op = line.split(b" ", 2)
                frame = line
                if op[0].upper() in (b"PUB", b"HPUB"):
                    frame += await reader.readexactly(int(line.split()[-1]) + 2)
                    if op[1].startswith(b"$JS.API."):
                        self.swallowed.set()
                        continue
                writer.write(frame)
                await writer.drain()
        writer.close()
