"""The hot publish paths written straight to the NATS protocol, bypassing nats-py's per-call work.

nats-py's `publish` validates the subject, checks every header key with a regex, strips and
re-encodes every value into a bytearray, and awaits a flush check: about 8-10 us of CPU per
message, paid twice per task here (the JetStream ack of its intake message and its delivery).
`Wire` builds the same `PUB`/`HPUB` frames with one format operation and hands them to the
client's own pending buffer and flusher, so ordering with every other write of the connection
is kept and the client still owns the socket.

It relies on three internals of `nats.aio.client.Client` (`_pending`, `_pending_data_size`,
`_flush_pending`), checked once at construction; on a client without them every call falls
back to `Client.publish`. tests/integration/test_wire.py checks, on a real server, that what
arrives is exactly what `Client.publish` would have sent. Header values with CR or LF (which
cannot come in through NATS) and keys nats-py would refuse (non-ASCII, spaces, colons) also take
the fallback, which raises nats-py's own error for them.
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, OutboundBufferLimitError

_KEY = re.compile(r"[!-9;-~]+")  # printable ASCII but ':', no spaces: nats-py's own rule


class Wire:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.raw = all(hasattr(nc, a) for a in ("_pending", "_pending_data_size", "_flush_pending"))
        self._keys: set[str] = set()

    def _learn(self, key: str) -> bool:
        """True (and remembered) for a header key nats-py would send as it is."""
        if _KEY.fullmatch(key) is None or len(self._keys) > 10_000:
            return False
        self._keys.add(key)
        return True

    def _check(self, payload_size: int) -> None:
        nc = self.nc
        if not nc.is_connected:
            raise OutboundBufferLimitError  # what nats-py raises with the reconnect buffer off
        if payload_size > nc._max_payload:
            raise MaxPayloadError

    def frame(
        self, subject: str, payload: bytes, reply: str, headers: Mapping[str, str]
    ) -> bytes | None:
        """The `HPUB` frame of one message, or None when it must go through nats-py."""
        known = self._keys
        if not self.raw or not all(k in known or self._learn(k) for k in headers):
            return None
        block = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        if block.count("\n") != len(headers) or block.count("\r") != len(headers):
            return None
        hdr = b"NATS/1.0\r\n" + block.encode() + b"\r\n"
        return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
            subject.encode(),
            reply.encode(),
            len(hdr),
            len(hdr) + len(payload),
            hdr,
            payload,
        )

    @staticmethod
    def frame_block(subject: str, payload: bytes, reply: str, hdr: bytes) -> bytes:
        """The `HPUB` frame of one message whose header block (`NATS/1.0\r\n...\r\n\r\n`)
        the caller built and vouches for (ASCII keys, no CR or LF inside values)."""
        return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
            subject.encode(),
            reply.encode(),
            len(hdr),
            len(hdr) + len(payload),
            hdr,
            payload,
        )

    async def publish(
        self, subject: str, payload: bytes, reply: str, headers: Mapping[str, str]
    ) -> None:
        """One message with headers, as `Client.publish(subject, payload, reply, headers)`."""
        frame = self.frame(subject, payload, reply, headers)
        if frame is None:
            await self.nc.publish(subject, payload, reply=reply, headers=dict(headers))
            return
        self._check(len(payload))
        await self._send([frame], len(payload))

    async def send_frames(self, frames: list[bytes], payload_bytes: int = 0) -> None:
        """Frames built by `frame()` (possibly filled in since), in one hand-over."""
        self._check(0)
        await self._send(frames, payload_bytes)

    async def empty_to(self, subjects: Iterable[str]) -> None:
        """An empty message to each subject (JetStream acks go to the delivery's reply subject)."""
        if not self.raw:
            for subject in subjects:
                await self.nc.publish(subject)
            return
        frames = [b"PUB %s 0\r\n\r\n" % s.encode() for s in subjects]
        if frames:
            self._check(0)
            await self._send(frames, 0)

    def take_unsent(self, reply_prefix: bytes) -> list[bytes]:
        """Remove from the client's pending buffer every publish whose reply subject starts
        with `reply_prefix` (frames handed over but not yet written to the socket: after a
        reconnect nats-py would send them on the new connection) and return their reply
        subjects. Other commands in the buffer (pings, subscriptions, other publishes) stay."""
        nc = self.nc
        pending = getattr(nc, "_pending", None)
        if not pending:
            return []
        keep: list[bytes] = []
        taken: list[bytes] = []
        size = 0
        for frame in pending:
            reply = _reply_of(frame)
            if reply is not None and reply.startswith(reply_prefix):
                taken.append(reply)
                size += len(frame)
            else:
                keep.append(frame)
        if taken:
            nc._pending = keep
            nc._pending_data_size = max(0, nc._pending_data_size - size)
        return taken

    def cut_backlog(self) -> bool:
        """Abort the connection when its socket has bytes queued that the peer has not taken
        (a silent link): with a reset (linger 0) the kernel drops its send buffer too, so
        nothing queued there reaches the server later. nats-py then reconnects. Returns
        whether there was a backlog to cut."""
        transport = getattr(self.nc, "_transport", None)
        writer = getattr(transport, "_io_writer", None)
        raw = getattr(writer, "transport", None)
        if raw is None or raw.is_closing() or not raw.get_write_buffer_size():
            return False
        sock = raw.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:  # already gone: abort below still drops the user-space buffer
                pass
        raw.abort()
        return True

    async def _send(self, frames: list[bytes], payload_bytes: int) -> None:
        nc = self.nc
        size = sum(len(f) for f in frames)
        nc._pending.extend(frames)
        nc._pending_data_size += size
        nc.stats["out_msgs"] += len(frames)
        nc.stats["out_bytes"] += payload_bytes
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()


# (subject, reply, payload, raw header block or None)
RawHandler = Callable[[bytes, bytes, bytes, bytes | None], None]


async def raw_subscribe(nc: Client, subject: str, handler: RawHandler) -> Any:
    """Subscribe `handler` to `subject`, called synchronously from the client's read loop with
    the raw subject, reply subject, payload and header block (None without headers).

    nats-py turns every delivery into a `Msg` (parsing its headers), queues it and wakes a task
    that awaits the callback: about 25 us per message, paid here for every PubAck. A raw
    subscription is an ordinary nats-py subscription (so it is resent after a reconnect and
    removed by `unsubscribe()`) whose deliveries are intercepted by sid before any of that.
    Without the expected client internals it falls back to a normal callback."""

    async def fallback(msg: Msg) -> None:
        raw = None
        if msg.headers:
            raw = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in msg.headers.items())
            raw = raw.encode()
        handler(msg.subject.encode(), (msg.reply or "").encode(), msg.data, raw)

    sub = await nc.subscribe(subject, cb=fallback)
    table: dict[int, RawHandler] | None = getattr(nc, "_mqs_raw", None)
    if table is None and hasattr(nc, "_process_msg") and hasattr(sub, "_id"):
        table = {}
        original = nc._process_msg

        async def process(sid: int, subj: bytes, reply: bytes, data: bytes, hdr: Any) -> None:
            raw = table.get(sid)
            if raw is None:
                await original(sid, subj, reply, data, hdr)
            else:
                raw(subj, reply, data, hdr or None)

        nc._process_msg = process  # type: ignore[method-assign]
        nc._mqs_raw = table  # type: ignore[attr-defined]
    if table is not None:
        table[sub._id] = handler
    return sub


def message_of(nc: Client, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> Msg:
    """A nats-py `Msg` (ack, nak, term and metadata work as usual) for a raw delivery that is
    not a status message, with its headers parsed the way nats-py parses them."""
    headers = None
    if hdr and len(hdr) > len(_HDR_LINE) + 2:
        headers = nc._parse_header_lines(hdr[len(_HDR_LINE) :])
    return Msg(
        _client=nc, subject=subject.decode(), reply=reply.decode(), data=data, headers=headers
    )


def _reply_of(frame: bytes) -> bytes | None:
    """The reply subject of a `PUB`/`HPUB` command frame, or None (another command, or none)."""
    if not frame.startswith((b"HPUB ", b"PUB ")):
        return None
    head = frame[: frame.find(b"\r\n")].split(b" ")
    # PUB subject [reply] size / HPUB subject [reply] header-size total-size
    expected = 5 if head[0] == b"HPUB" else 4
    return head[2] if len(head) == expected else None


def status_of(hdr: bytes | None) -> str | None:
    """The status code of a status message (`NATS/1.0 408 Request Timeout`), else None."""
    if not hdr or not hdr.startswith(b"NATS/1.0 "):
        return None
    return hdr[9:12].decode(errors="replace")


_HDR_LINE = b"NATS/1.0\r\n"
