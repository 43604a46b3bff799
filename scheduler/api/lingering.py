"""A lingering close for the HTTP connections: an answer is never lost to a reset.

When the server closes a connection whose client is still sending (a body the edge refused
before reading it, `scheduler.api.edge`; a request uvicorn cannot parse, answered 400), the
unread bytes make the kernel send a reset. A reset can reach the client before it has read the
answer, which it then never sees: schemathesis saw "connection reset by peer" in the middle of
a 401. As nginx does (`lingering_close`), a close in the middle of a request (its body not
read, or bytes h11 refused) first ends the sending side (the answer and a FIN go out), then
reads and discards what the client still sends, at most `LINGER_BYTES` for at most
`LINGER_SECONDS`, and closes once the client has closed its side or a bound is reached. A
client that keeps sending past either bound gets the reset: it has had its answer, and the
daemon reads nothing more of it. A connection between requests (idle, timed out, or at
shutdown) closes at once: no client is sending on it.

A body no route reads (a GET's, `scheduler.api.deadlines`) is not read at all past what arrived
with its head: the connection is held (`LingeringTransport.hold`), reading paused, so what the
client sends waits in the sockets' buffers and, once they are full, the client waits too; its
answer (and the FIN) go out `HELD_ANSWER_WAIT` (1 s) after the head, and the reset
`LINGER_SECONDS` after it. Read and dropped up to `DROPPED_BYTES`, then cut, and answered at
once, an endless chunked GET came straight back for a new connection after each answer: 210 a
second from one client, each a handshake, 64 KiB of loopback traffic and a reset, the attacker
itself near a core, and the engine's p99 at 1.5-1.8x its quiet figure on a 2-core host
(bench/README.md, host Q).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_SECONDS = 2.0
LINGER_BYTES = 1 << 20  # what the bound on a body lets an honest client have sent
DROPPED_BYTES = 64 << 10  # of a body no route reads (a GET's): read and dropped at most
HELD_BUFFER = 4096  # the receive buffer of a held connection (the kernel doubles it)
HELD_ANSWER_WAIT = 1.0  # s from a held connection's hold to its answer going out


class LingeringTransport(asyncio.Transport):
    """The connection's transport as uvicorn sees it: `close()` lingers, the rest delegates."""

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        may_be_sending: Callable[[], bool],
    ) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._may_be_sending = may_be_sending
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False
        self.discarded = 0
        self.limit = LINGER_BYTES  # bytes discarded, lingering or before, past which it ends
        self.held = False  # read nothing more (`hold`)
        self._deferred: list[bytes] | None = None  # a held connection's answer, until its time
        self._eof_deferred = False
        self._release: asyncio.TimerHandle | None = None

    def close(self) -> None:
        if self.lingering or self._transport.is_closing():
            return
        if not self._may_be_sending() or not self._transport.can_write_eof():
            self._transport.close()  # between requests (idle, shutdown): nothing to wait for
            return
        self.lingering = True
        self.write_eof()  # after what is buffered: the answer goes out first
        if not self.held:
            self._transport.resume_reading()
        if self._timer is None:  # (a held connection's runs from its hold)
            self._timer = self._loop.call_later(LINGER_SECONDS, self.end)

    def hold(self) -> None:
        """Read nothing more of this connection (a body no route reads), and answer it only
        `HELD_ANSWER_WAIT` from now: the client's bytes wait in the sockets' buffers, then
        the client does, and a client that comes back for a new connection after each answer
        gets about one a second, whichever part of the edge answers it. The connection ends
        `LINGER_SECONDS` after the hold, whatever the application does meanwhile."""
        self.held = True
        self._transport.pause_reading()
        sock = self._transport.get_extra_info("socket")
        with contextlib.suppress(AttributeError, OSError):  # what waits unread stays small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, HELD_BUFFER)
        self._deferred = []
        self._release = self._loop.call_later(HELD_ANSWER_WAIT, self._let_out)
        if self._timer is None:
            self._timer = self._loop.call_later(LINGER_SECONDS, self.end)

    def _let_out(self) -> None:
        """A held connection's time: its answer (and its FIN, once closed) go out."""
        self._release = None
        deferred, self._deferred = self._deferred, None
        if self._transport.is_closing():
            return
        if deferred:
            self._transport.writelines(deferred)
        if self._eof_deferred:
            self._transport.write_eof()

    def discard(self, size: int) -> None:
        """Bytes that arrived while lingering (or a body dropped unread): dropped, up to the
        bound."""
        self.discarded += size
        if self.discarded > self.limit:
            self.end()

    def end(self) -> None:
        """Close for good (the client closed its side, a bound was reached, or shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._release is not None:  # (at shutdown: a held answer not out yet is dropped)
            self._release.cancel()
            self._release = None
        self._transport.close()

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        if not self.lingering:  # a lingering connection reads until it ends
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.held:
            self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._deferred is not None:
            self._deferred.append(bytes(data))
            return
        self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._deferred is not None:
            self._deferred.extend(bytes(d) for d in list_of_data)
            return
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        if self._deferred is not None:
            self._eof_deferred = True
            return
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def abort(self) -> None:
        self.end()
        self._transport.abort()


class LingeringH11Protocol(H11Protocol):
    """uvicorn's h11 protocol on a `LingeringTransport`."""

    linger: LingeringTransport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.linger = LingeringTransport(transport, self.loop, self._may_be_sending)
        super().connection_made(self.linger)

    def _may_be_sending(self) -> bool:
        """The client is in the middle of a request: its body unread, or bytes h11 refused."""
        return self.conn.their_state in (h11.SEND_BODY, h11.ERROR)

    def data_received(self, data: bytes) -> None:
        if self.linger is not None and self.linger.lingering:
            self.linger.discard(len(data))
            return
        super().data_received(data)

    def eof_received(self) -> None:
        if self.linger is not None and self.linger.lingering:
            self.linger.end()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.linger is not None:
            self.linger.end()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self.linger is not None and self.linger.lingering:
            self.linger.end()
            return
        super().shutdown()
