"""A TCP fault proxy on loopback, in asyncio: forward, blackhole, or reset a link on demand.

`FaultProxy(upstream_host, upstream_port)` listens on a free loopback port and forwards every
connection to the upstream. Faults:

- `blackhole()`: stop moving bytes in both directions, on open connections and new ones, while
  keeping them open, the way a network partition looks to both ends. Nothing is dropped: bytes
  already sent wait in the kernel buffers and arrive after `heal()`, as TCP retransmission
  would deliver them. That is the nasty case for a zombie leader (its stale publishes reach the
  server late), which the target stream's duplicate window must absorb.
- `reset()`: close every open connection at once; new ones still connect and forward.
- `heal()`: forward again.

`tap`, when set, is called with (connection number, bytes) for everything forwarded from a
client to the upstream (connections are numbered from 1 in the order they are accepted), so a
test can see which connection carried which publish, and when it was forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Self


class FaultProxy:
    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        chunk: int = 65536,
        receive_buffer: int | None = None,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.chunk = chunk
        self.receive_buffer = receive_buffer
        self.port = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.tap: Callable[[int, bytes], None] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> Self:
        if self.receive_buffer is None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        else:  # a small window, as over a WAN: a silent link backs up into the client quickly
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
            sock.bind(("127.0.0.1", 0))
            self._server = await asyncio.start_server(
                self._accept, sock=sock, limit=self.receive_buffer
            )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def close_soon(self) -> None:
        """Stop listening and cut every link now (teardown; the pumps end on their own)."""
        if self._server is not None:
            self._server.close()
        self.heal()
        self.reset()

    def blackhole(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def reset(self) -> None:
        for a, b in list(self._links):
            for w in (a, b):
                _abort(w)
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        link = (writer, up_writer)
        self._links.add(link)
        for src, dst, tapped in ((reader, up_writer, number), (up_reader, writer, 0)):
            pump = asyncio.create_task(self._pump(src, dst, link, tapped))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        number: int = 0,
    ) -> None:
        try:
            while True:
                await self._flowing.wait()  # blackholed: stop reading, the bytes wait in the kernel
                data = await src.read(self.chunk)
                if not data:
                    break
                await self._flowing.wait()
                if number and self.tap is not None:
                    self.tap(number, data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._links.discard(link)
            for w in link:
                _abort(w)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once with a reset (SO_LINGER 0), as a dead peer or a killed server would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.transport.abort()
