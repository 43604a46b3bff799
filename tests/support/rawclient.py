"""A raw-socket NATS publisher for hostile-input tests: any bytes as subject, headers, payload.

nats-py refuses to send some frames (non-UTF-8 subjects, odd header names or values); a
producer on another client library, or a broken one, can send them all the same. This client
writes `HPUB` frames as given and waits for each JetStream PubAck on its own inbox, so a test
knows the message was stored on the delay lane (or why not).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any
from urllib.parse import urlparse

_CONNECT = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
    b'"protocol":1,"lang":"python-raw-test","version":"0"}\r\n'
)


class RawClient:
    """One connection; `publish()` sends a frame and returns the PubAck (or error) it got."""

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 4222
        self.inbox = "_RAWT"
        self.errors: list[bytes] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._acks: dict[bytes, asyncio.Future[Any]] = {}
        self._pong: asyncio.Future[None] | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> RawClient:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        await self._reader.readline()  # INFO
        self._writer.write(_CONNECT + f"SUB {self.inbox}.* 1\r\n".encode())
        self._task = asyncio.create_task(self._read(), name="raw-client")
        await self.ping()
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def ping(self, timeout: float = 5.0) -> None:
        assert self._writer is not None
        self._pong = asyncio.get_running_loop().create_future()
        self._writer.write(b"PING\r\n")
        await asyncio.wait_for(self._pong, timeout)

    async def publish(
        self, subject: bytes, payload: bytes, headers: bytes | None = None, timeout: float = 5.0
    ) -> Any:
        """Publish with a reply inbox; return the PubAck JSON, or `{"error": ...}` as received
        (a 503 status when no stream captures the subject). `headers` is a whole header block
        (`NATS/1.0\\r\\n...\\r\\n\\r\\n`) sent as given."""
        assert self._writer is not None
        token = str(next(self._ids)).encode()
        reply = f"{self.inbox}.".encode() + token
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._acks[token] = fut
        if headers is None:
            head = b"PUB %s %s %d\r\n" % (subject, reply, len(payload))
        else:
            head = b"HPUB %s %s %d %d\r\n" % (
                subject,
                reply,
                len(headers),
                len(headers) + len(payload),
            )
            payload = headers + payload
        self._writer.write(head + payload + b"\r\n")
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._acks.pop(token, None)

    async def _read(self) -> None:
        assert self._reader is not None and self._writer is not None
        while True:
            line = (await self._reader.readline()).rstrip(b"\r\n")
            if not line:
                return
            if line == b"PING":
                self._writer.write(b"PONG\r\n")
            elif line == b"PONG":
                if self._pong is not None and not self._pong.done():
                    self._pong.set_result(None)
            elif line.startswith(b"-ERR"):
                self.errors.append(line)
                for fut in self._acks.values():
                    if not fut.done():
                        fut.set_result({"error": line.decode(errors="replace")})
            elif line.startswith((b"MSG ", b"HMSG ")):
                parts = line.split(b" ")
                total = int(parts[-1])
                hlen = int(parts[-2]) if parts[0] == b"HMSG" else 0
                body = await self._reader.readexactly(total + 2)
                hdr, data = body[:hlen], body[hlen:total]
                waiting = self._acks.get(parts[1].rsplit(b".", 1)[-1])
                if waiting is not None and not waiting.done():
                    fut = waiting
                    if hdr and b" 503" in hdr.split(b"\r\n", 1)[0]:
                        fut.set_result({"error": "503 no responders"})
                    else:
                        fut.set_result(json.loads(data))


def header_block(*pairs: tuple[bytes, bytes]) -> bytes:
    """`NATS/1.0` header block of raw name/value pairs, sent as given."""
    return b"NATS/1.0\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in pairs) + b"\r\n"
