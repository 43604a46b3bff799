"""The hot publish paths written straight to the NATS protocol, bypassing nats-py's per-call work.

This is the only module of the project that touches nats-py's private internals. They are listed
in `NATS_INTERNALS` below (tests/unit/test_nats_internals.py fails, naming the attribute, when an
installed nats-py lacks one; pyproject.toml pins nats-py to the range tested):

- `Client._pending`, `Client._pending_data_size`, `Client._flush_pending`, `Client._flush_queue`:
  the client's write buffer and its flusher (`Wire._send`, `Wire.take_unsent`);
- `Client._transport` (and its `_io_writer.transport`): the socket (`Wire._send`, `cut_backlog`);
- `Client._max_payload`, `Client._server_info`: the server's limits and version;
- `Client._process_msg` (patched) and `Subscription._id`: raw deliveries (`raw_subscribe`);
- `Msg(_client=)`: messages built from raw deliveries (`message_of`).


nats-py's `publish` validates the subject, checks every header key with a regex, strips and
re-encodes every value into a bytearray, and awaits a flush check: about 8-10 us of CPU per
message, paid twice per task here (the JetStream ack of its intake message and its delivery).
`Wire` builds the same `PUB`/`HPUB` frames with one format operation and hands them to the
client's own pending buffer and flusher, so ordering with every other write of the connection
is kept and the client still owns the socket.

It relies on internals of `nats.aio.client.Client` (`_pending`, `_pending_data_size`,
`_flush_pending`, `_transport`), checked once at construction; on a client without them every
call falls back to `Client.publish`. tests/integration/test_wire.py checks, on a real server,
that what arrives is exactly what `Client.publish` would have sent. Header values with CR or LF
and keys nats-py would refuse (non-ASCII, spaces, colons) also take the fallback, which raises
nats-py's own error for them.

No frame leaves through here bigger than the server's `max_payload`, counting its control line
(subject, reply, sizes), headers and payload: the server would refuse it and nats-py then
closes the connection for good. `MaxPayloadError` is raised instead, nothing sent.

Incoming deliveries are decoded here too (`message_of`), strictly: bytes that are not UTF-8 in
a subject or a header, or a header block that is not `NATS/1.0` lines of `name: value`, never
raise in the client's read loop; they are kept readable with backslash escapes and reported as
the message's `defect` for the caller to refuse.
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, OutboundBufferLimitError

from scheduler.bus.nats.frames import HEADER_LINE, hpub
from scheduler.messages.headers import block_size

_KEY = re.compile(r"[!-9;-~]+")  # printable ASCII but ':', no spaces: nats-py's own rule

# (owner, attribute): every nats-py internal used by this module (see the docstring above).
NATS_INTERNALS: tuple[tuple[str, str], ...] = (
    ("Client", "_pending"),
    ("Client", "_pending_data_size"),
    ("Client", "_flush_pending"),
    ("Client", "_flush_queue"),
    ("Client", "_transport"),
    ("Client", "_max_payload"),
    ("Client", "_server_info"),
    ("Client", "_process_msg"),
    ("Subscription", "_id"),
    ("Msg", "_client"),
)


def server_version(nc: Client | None) -> str:
    """The version the connected server announced, or "unknown"."""
    info = getattr(nc, "_server_info", None)
    if not info:
        return "unknown"
    return str(info.get("version", "unknown"))


class Wire:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.raw = all(
            hasattr(nc, a)
            for a in ("_pending", "_pending_data_size", "_flush_pending", "_transport")
        )
        self._keys: set[str] = set()

    def _learn(self, key: str) -> bool:
        """True (and remembered) for a header key nats-py would send as it is."""
        if _KEY.fullmatch(key) is None or len(self._keys) > 10_000:
            return False
        self._keys.add(key)
        return True

    def _check(self, size: int) -> None:
        """Refuse to send `size` bytes (control line, headers and payload of one frame) that
        the server would refuse, or anything while disconnected."""
        nc = self.nc
        if not nc.is_connected:
            raise OutboundBufferLimitError  # what nats-py raises with the reconnect buffer off
        if size > nc._max_payload:
            raise MaxPayloadError

    def fits(self, frame: bytes) -> bool:
        """True when the server takes `frame` (built by `frame()` or `frame_block()`)."""
        return len(frame) - 4 <= self.nc._max_payload

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
        return hpub(subject, payload, reply, HEADER_LINE + block.encode() + b"\r\n")

    @staticmethod
    def frame_block(subject: str, payload: bytes, reply: str, hdr: bytes) -> bytes:
        """The `HPUB` frame of one message whose header block (`NATS/1.0\r\n...\r\n\r\n`)
        the caller built and vouches for (ASCII keys, no CR or LF inside values)."""
        return hpub(subject, payload, reply, hdr)

    async def publish(
        self, subject: str, payload: bytes, reply: str, headers: Mapping[str, str]
    ) -> None:
        """One message with headers, as `Client.publish(subject, payload, reply, headers)`."""
        frame = self.frame(subject, payload, reply, headers)
        if frame is None:  # nats-py counts the payload alone against max_payload: count it all
            self._check(len(subject) + len(reply) + block_size(headers) + len(payload) + 32)
            await self.nc.publish(subject, payload, reply=reply, headers=dict(headers))
            return
        self._check(len(frame) - 4)
        await self._send([frame], len(payload))

    async def send_frames(self, frames: list[bytes], payload_bytes: int = 0) -> None:
        """Frames built by `frame()` (possibly filled in since), in one hand-over; none is
        sent when one of them is too large for the server (see `fits`)."""
        self._check(max((len(f) - 4 for f in frames), default=0))
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
        nc._pending.extend(frames)  # after whatever the client queued: the order is kept
        nc._pending_data_size += sum(len(f) for f in frames)
        nc.stats["out_msgs"] += len(frames)
        nc.stats["out_bytes"] += payload_bytes
        # Written now, in the step that checked the fence and the size, not later by the
        # client's flusher task: a process frozen in between (SIGSTOP, a starved host) would
        # find the frames still buffered on waking, and the flusher, ready before any timer,
        # would send them before the lease check could see that office had ended.
        transport = getattr(nc, "_transport", None)
        if transport is not None and nc.is_connected:
            transport.writelines(nc._pending)
            nc._pending = []
            nc._pending_data_size = 0
        elif nc._flush_queue is not None and nc._flush_queue.empty():
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
            block = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in msg.headers.items())
            raw = block.encode()
        handler(msg.subject.encode(), (msg.reply or "").encode(), msg.data, raw)

    sub = await nc.subscribe(subject, cb=fallback)
    table: dict[int, RawHandler] | None = getattr(nc, "_mqs_raw", None)
    if table is None and hasattr(nc, "_process_msg") and hasattr(sub, "_id"):
        table = {}
        original = nc._process_msg

        async def process(
            sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any
        ) -> None:
            raw = table.get(sid)
            if raw is None:
                await original(sid, subject, reply, data, headers)
            else:
                raw(subject, reply, data, headers or None)

        nc._process_msg = process  # type: ignore[method-assign]
        nc._mqs_raw = table  # type: ignore[attr-defined]
    if table is not None:
        table[sub._id] = handler
    return sub


def forget_raw(nc: Client, sub: Any) -> None:
    """Drop an unsubscribed raw subscription's handler (`raw_subscribe`), once whatever the
    server sent it before the unsubscribe has been taken (after a flush)."""
    table: dict[int, RawHandler] | None = getattr(nc, "_mqs_raw", None)
    if table is not None:
        table.pop(getattr(sub, "_id", None), None)  # type: ignore[arg-type]


@dataclass
class RawMsg(Msg):
    """A nats-py `Msg` built from a raw delivery; `defect` is `(field, problem)` when its
    subject or headers could not be decoded (see `message_of`)."""

    defect: tuple[str, str] | None = None


@dataclass
class RecoveredMsg(RawMsg):
    """A lane message read back from its stream by sequence (`Puller`'s recovery of deliveries
    lost on the way): its metadata is the stream's, and it has no ack subject of its own, so
    ack, nak, in-progress and term do nothing. The consumer still counts the lost delivery as
    pending: it is delivered again after the ack wait, and intake then finds it stored (an
    exact resend) and acks that delivery."""

    stored: Msg.Metadata | None = None  # the stream's sequence and store time

    @property
    def metadata(self) -> Msg.Metadata:
        assert self.stored is not None
        return self.stored

    async def ack(self) -> None:
        """Nothing to acknowledge: see the class."""

    async def nak(self, delay: float | None = None) -> None:
        """Likewise."""

    async def in_progress(self) -> None:
        """Likewise."""

    async def term(self) -> None:
        """Likewise."""


def message_of(nc: Client, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> RawMsg:
    """A nats-py `Msg` (ack, nak, term and metadata work as usual) for a raw delivery that is
    not a status message. Never raises: what does not decode is escaped and named in `defect`."""
    defect = None
    try:
        text = subject.decode()
    except UnicodeDecodeError as exc:
        text = subject.decode(errors="backslashreplace")
        defect = ("subject", f"is not UTF-8 (byte 0x{subject[exc.start]:02x} at {exc.start})")
    headers = None
    if hdr:
        headers, problem = parse_header_block(hdr)
        defect = defect or problem
    return RawMsg(
        _client=nc,
        subject=text,
        reply=reply.decode(errors="backslashreplace"),
        data=data,
        headers=headers,
        defect=defect,
    )


def parse_header_block(hdr: bytes) -> tuple[dict[str, str] | None, tuple[str, str] | None]:
    """(headers, defect) of a header block, parsed as nats-py does (names and values stripped,
    the last of a repeated name kept), but strictly: a name or value that is not UTF-8, a line
    that is not `name: value` or a block without the `NATS/1.0` line is a defect, not skipped
    or replaced. Never raises."""
    if not hdr.startswith(HEADER_LINE[:8]):
        shown = hdr[:40].decode(errors="backslashreplace")
        return None, ("headers", f"the header block does not start with NATS/1.0: {shown}")
    out: dict[str, str] = {}
    defect = None
    for line in hdr.split(b"\r\n")[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        try:
            key, text = name.strip().decode(), value.strip().decode()
        except UnicodeDecodeError:
            key = name.strip().decode(errors="backslashreplace")
            text = value.strip().decode(errors="backslashreplace")
            defect = defect or (f"header {key[:100]}", "is not UTF-8")
        if not sep:
            defect = defect or ("headers", f"line {key[:100]!r} is not 'name: value'")
            continue
        out[key] = text
    return out or None, defect


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
