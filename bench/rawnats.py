"""A light load generator and collector speaking the NATS protocol on a raw asyncio socket.

On a 2-core host the benchmark's own producer and consumer share the CPU with the daemon,
nats-server and PostgreSQL. Through nats-py they cost about as much CPU per task as the daemon
itself (a `Msg` object, a header parse and a callback per message, a future per publish), which
slows down the system under test. Here frames are pre-built and written in one call per pacing
tick, PubAcks are only counted, and deliveries are parsed just far enough to read the two
headers and the store time:

- `RawProducer`: JetStream publishes (`HPUB` with a reply inbox, so each is acknowledged and
  counted), written at absolute wall times.
- `RawCollector`: a push consumer (ack none) whose deliveries arrive on a raw subscription;
  arrival = wall time when the socket read returned, store time = the timestamp in the
  delivery's `$JS.ACK` reply subject, due = `Mq-Scheduled-For` or the payload's `delay_until`.

Semantics are those of `traffic.Pipeline`/`traffic.Collector`; only the client cost differs.
"""

from __future__ import annotations

import asyncio
import json
import time
from calendar import timegm
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from traffic import STOPPING, Item, Tally, stats

_CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,' \
    b'"protocol":1,"lang":"python-raw","version":"0"}\r\n'  # fmt: skip


class _Conn:
    """A raw connection: CONNECT, then a frame parser calling `on_msg(subject, reply, hdr,
    payload, at)` for every MSG/HMSG, with PING answered."""

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 4222
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self._pong = asyncio.Event()

    async def open(self, subscribe: str) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 24
        )
        await self.reader.readline()  # INFO
        self.writer.write(_CONNECT + f"SUB {subscribe} 1\r\nPING\r\n".encode())
        self.task = asyncio.create_task(self._read())
        await asyncio.wait_for(self._pong.wait(), 5)

    def on_msg(self, subject: bytes, reply: bytes, hdr: bytes, payload: bytes, at: float) -> None:
        raise NotImplementedError

    async def _read(self) -> None:
        assert self.reader is not None and self.writer is not None
        buf = b""
        while True:
            chunk = await self.reader.read(1 << 20)
            if not chunk:
                return
            at = time.time()
            buf += chunk
            pos = 0
            while True:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                line = buf[pos:end]
                if line.startswith(b"HMSG ") or line.startswith(b"MSG "):
                    parts = line.split(b" ")
                    if parts[0] == b"HMSG":
                        subject, reply = parts[1], (parts[3] if len(parts) == 6 else b"")
                        hlen, total = int(parts[-2]), int(parts[-1])
                    else:
                        subject, reply = parts[1], (parts[3] if len(parts) == 5 else b"")
                        hlen, total = 0, int(parts[-1])
                    start = end + 2
                    if len(buf) < start + total + 2:
                        break  # the rest of this frame is still on its way
                    body = buf[start : start + total]
                    self.on_msg(subject, reply, body[:hlen], body[hlen:], at)
                    pos = start + total + 2
                    continue
                if line == b"PING":
                    self.writer.write(b"PONG\r\n")
                elif line == b"PONG":
                    self._pong.set()
                elif line.startswith(b"-ERR"):
                    print(f"rawnats: server error {line!r}")
                pos = end + 2
            buf = buf[pos:]

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.writer is not None:
            self.writer.close()


class RawProducer(_Conn):
    """Paced JetStream publishes with every PubAck counted (none awaited one by one)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.inbox = f"_RAW.{time.time_ns()}"
        self.sent = self.acked = self.errors = 0
        self.first_error = ""
        self._all_acked = asyncio.Event()

    async def start(self) -> RawProducer:
        await self.open(self.inbox + ".*")
        return self

    def on_msg(self, subject: bytes, reply: bytes, hdr: bytes, payload: bytes, at: float) -> None:
        if (hdr and b" 503" in hdr) or b'"error"' in payload:
            self.errors += 1
            self.first_error = self.first_error or (payload or hdr).decode(errors="replace")
        else:
            self.acked += 1
        if self.acked + self.errors >= self.sent:
            self._all_acked.set()

    def frames(self, items: Sequence[Item]) -> list[tuple[float, bytes]]:
        out = []
        for i, (at, subject, payload, headers) in enumerate(items):
            hdr = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            h = hdr.encode()
            head = f"HPUB {subject} {self.inbox}.{i} {len(h)} {len(h) + len(payload)}\r\n"
            out.append((at, head.encode() + h + payload + b"\r\n"))
        return out

    async def produce(self, items: Sequence[Item], timeout: float = 10.0) -> dict[str, Any]:
        """Write each frame at its wall time (all frames due by now in one write); then wait,
        bounded, for every PubAck."""
        assert self.writer is not None
        frames = self.frames(items)
        lags: list[float] = []
        i, n = 0, len(frames)
        while i < n:
            if STOPPING.is_set():
                raise asyncio.CancelledError
            now = time.time()
            j = i
            while j < n and frames[j][0] <= now:
                j += 1
            if j > i:
                self.writer.write(b"".join(f for _, f in frames[i:j]))
                self.sent += j - i
                lags.extend((now - frames[k][0]) * 1000 for k in range(i, j))
                i = j
                await self.writer.drain()
            if i < n:  # at least 1 ms: libuv timers have 1 ms steps, shorter ones busy-spin
                await asyncio.sleep(max(0.001, frames[i][0] - time.time()))
        if self.acked + self.errors < self.sent:
            self._all_acked.clear()
            try:
                await asyncio.wait_for(self._all_acked.wait(), timeout)
            except TimeoutError:
                pass
        out = {"sent": self.sent, "acked": self.acked, "errors": self.errors}
        out["unacked"] = self.sent - self.acked - self.errors
        if self.first_error:
            out["first_error"] = self.first_error[:200]
        return out | {"publish_lag_ms": stats(lags, early=False), "client": "raw socket"}


_SECONDS: dict[bytes, float] = {}


def _epoch(iso: bytes) -> float:
    """`2026-11-23T06:00:00.123Z` (the daemon's and the bench's format) as epoch seconds."""
    head = iso[:19]
    base = _SECONDS.get(head)
    if base is None:
        base = float(timegm(time.strptime(head.decode(), "%Y-%m-%dT%H:%M:%S")))
        if len(_SECONDS) > 100_000:
            _SECONDS.clear()
        _SECONDS[head] = base
    frac = iso[19:].rstrip(b"Z")
    return base + (float(frac) if frac else 0.0)


def _header(hdr: bytes, name: bytes) -> bytes | None:
    i = hdr.find(b"\r\n" + name + b": ")
    if i < 0:
        return None
    i += len(name) + 4
    return hdr[i : hdr.find(b"\r\n", i)]


class RawCollector(_Conn, Tally):
    """A push consumer (ack none, all messages) on `stream`, read on a raw subscription."""

    def __init__(self, url: str, js: Any, stream: str, subject: str) -> None:
        _Conn.__init__(self, url)
        Tally.__init__(self)
        self.js, self.stream, self.subject = js, stream, subject
        self.deliver = f"_RAWD.{time.time_ns()}"
        self.consumer = ""

    async def start(self) -> RawCollector:
        await self.open(self.deliver)
        cfg = ConsumerConfig(
            deliver_subject=self.deliver, ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL, filter_subject=self.subject,
            max_ack_pending=-1, inactive_threshold=120.0,
        )  # fmt: skip
        self.consumer = (await self.js.add_consumer(self.stream, cfg)).name
        return self

    def on_msg(self, subject: bytes, reply: bytes, hdr: bytes, payload: bytes, at: float) -> None:
        due_s = _header(hdr, b"Mq-Scheduled-For") if hdr else None
        task_id = _header(hdr, b"Nats-Msg-Id") if hdr else None
        if due_s is None or task_id is None:
            doc = json.loads(payload)
            due_s = due_s or doc["delay_until"].encode()
            task_id = task_id or doc["id"].encode()
        due = _epoch(due_s)
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<timestamp ns>.<pending>, or
        # with <domain>.<account hash> after ACK (and a token at the end) in the newer form
        parts = reply.split(b".")
        stored = None
        if len(parts) == 9 or len(parts) >= 11:
            stored = int(parts[7] if len(parts) == 9 else parts[9]) / 1e9
        self.record(task_id, due, at, stored)

    async def stop(self) -> None:
        try:
            await self.js.delete_consumer(self.stream, self.consumer)
        except Exception:  # already gone with its inactivity threshold
            pass
        await self.close()

    def summary(self, expected: int) -> dict[str, Any]:
        return Tally.summary(self, expected) | {"client": "raw socket"}
