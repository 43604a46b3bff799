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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_SECONDS = 2.0
LINGER_BYTES = 1 << 20  # what the bound on a body lets an honest client have sent
DROPPED_BYTES = 64 << 10  # of a body no route reads (a GET's): read and dropped at most


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

    def close(self) -> None:
        if self.lingering or self._transport.is_closing():
            return
        if not self._may_be_sending() or not self._transport.can_write_eof():
            self._transport.close()  # between requests (idle, shutdown): nothing to wait for
            return
        self.lingering = True
        self._transport.write_eof()  # after what is buffered: the answer goes out first
        self._transport.resume_reading()
        self._timer = self._loop.call_later(LINGER_SECONDS, self.end)

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
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
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
