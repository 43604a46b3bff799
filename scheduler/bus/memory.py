"""The in-memory twin of NATS: `scheduler.engine.ports.Broker`, `Bus`, `Source` and `Delivery`,
and the operator half's `scheduler.operations.ports.BusWriter` (`MemoryWriter`).

For the engine's unit tests and as the reference the real adapters are checked against
(tests/contracts/ runs the same tests over these twins and over `scheduler.bus.nats` on
nats-server). It keeps what the scheduler relies on: streams that capture subjects (NATS
wildcards `*` and `>`), a sequence per stream, and JetStream's duplicate window (a message whose
`Nats-Msg-Id` the stream stored less than `duplicate_window` seconds ago is acknowledged as
`duplicate` and not stored again); a subject no stream captures fails (`no stream captures
...`); nothing is sent while the fence is down, the link is held or the broker is closed;
outcomes arrive later, from the event loop, as acks do from the socket; a durable consumer
delivers each message once and again only what a closed source left unacknowledged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scheduler.bus.nats.frames import HEADER_LINE, delivery_headers, kv_subject
from scheduler.clock import to_rfc3339
from scheduler.messages.prepared import PreparedMessage, StampedMessage
from scheduler.operations.ports import PUBLISH_TIMEOUT, Acked, NoAnswer, NoStream, Refused
from scheduler.records import ClaimedTask, Done, Outcome, PubAck, PublishError


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def headers_of(headers: Mapping[str, str] | bytes) -> dict[str, str]:
    """A header dict, from a dict or a `NATS/1.0` header block."""
    if not isinstance(headers, bytes):
        return dict(headers)
    lines = headers[len(HEADER_LINE) :].decode().split("\r\n")
    return dict(line.split(": ", 1) for line in lines if line)


@dataclass(slots=True)
class Stored:
    stream: str
    seq: int
    subject: str
    payload: bytes
    headers: dict[str, str]
    timestamp: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class Stream:
    name: str
    subjects: list[str]
    duplicate_window: float = 120.0
    messages: list[Stored] = field(default_factory=list)
    ids: dict[str, tuple[float, int]] = field(default_factory=dict)  # id -> (at, seq)
    last_seq: int = 0

    def captures(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.subjects)


class MemoryStreams:
    """JetStream as far as the scheduler relies on it (see the module docstring)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self.streams: dict[str, Stream] = {}
        self.durables: dict[tuple[str, str], Durable] = {}
        self.stored = asyncio.Event()  # set by every store: a consumer waiting wakes up

    def durable(self, stream: str, consumer: str) -> Durable:
        """The durable consumer `consumer` of `stream` (made on first use)."""
        return self.durables.setdefault((stream, consumer), Durable(stream, consumer))

    def acknowledge(self, reply: str) -> None:
        """A delivery's ack (an empty message to its reply subject, `MemoryBroker.ack`)."""
        parts = reply.split(".")
        if len(parts) > 4 and parts[:2] == ["$JS", "ACK"]:
            found = self.durables.get((parts[2], parts[3]))
            if found is not None:
                found.outstanding.pop(reply, None)

    def add_stream(self, name: str, subjects: list[str], duplicate_window: float = 120.0) -> None:
        self.streams[name] = Stream(name, subjects, duplicate_window)

    def messages(self, stream: str) -> list[Stored]:
        return self.streams[stream].messages

    def capturing(self, subject: str) -> Stream | None:
        """The stream that captures `subject`, if any."""
        return next((s for s in self.streams.values() if s.captures(subject)), None)

    def held_on(self, subject: str) -> int:
        """How many messages the stream capturing `subject` holds on it (LookupError: none)."""
        stream = self.capturing(subject)
        if stream is None:
            raise LookupError(f"no stream captures {subject}")
        return sum(1 for m in stream.messages if m.subject == subject)

    def consume(self, stream: str, subject: str) -> None:
        """Acknowledge every message on `subject` (work-queue retention removes them)."""
        kept = [m for m in self.streams[stream].messages if m.subject != subject]
        self.streams[stream].messages[:] = kept

    def store(self, subject: str, payload: bytes, headers: dict[str, str]) -> Outcome:
        stream = self.capturing(subject)
        if stream is None:
            return PublishError(subject, f"no stream captures {subject}")
        now = self.monotonic()
        msg_id = headers.get("Nats-Msg-Id")
        seen = stream.ids.get(msg_id) if msg_id is not None else None
        if seen is not None and now - seen[0] < stream.duplicate_window:
            return PubAck(stream.name, seen[1], True)
        stream.last_seq += 1
        seq = stream.last_seq
        if msg_id is not None:
            stream.ids[msg_id] = (now, seq)
        stream.messages.append(Stored(stream.name, seq, subject, payload, headers))
        self.stored.set()
        return PubAck(stream.name, seq, False)


@dataclass
class Durable:
    """A durable consumer's state: the next stream sequence to deliver, the deliveries neither
    acknowledged nor terminated (by reply subject), what comes back to be delivered again, and
    how often each sequence was delivered."""

    stream: str
    name: str
    next_seq: int = 1
    outstanding: dict[str, Stored] = field(default_factory=dict)
    again: list[Stored] = field(default_factory=list)
    delivered: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SequencePair:
    stream: int
    consumer: int


@dataclass(frozen=True, slots=True)
class DeliveryMetadata:
    """The fields of JetStream's delivery metadata the scheduler reads (as nats-py names them)."""

    stream: str
    consumer: str
    sequence: SequencePair
    num_delivered: int
    timestamp: datetime


@dataclass(slots=True)
class MemoryDelivery:
    """`scheduler.engine.ports.Delivery` from a `MemorySource`."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None
    meta: DeliveryMetadata
    durable: Durable

    @property
    def metadata(self) -> DeliveryMetadata:
        return self.meta

    async def in_progress(self) -> None:
        """Nothing to extend: the twin redelivers only what a closed source left unacked."""

    async def term(self) -> None:
        self.durable.outstanding.pop(self.reply, None)


class MemorySource:
    """`scheduler.engine.ports.Source`: a durable consumer of one `MemoryStreams` stream.

    Every message is delivered once, in stream order; one neither acknowledged (its reply
    subject to `MemoryBroker.ack`) nor terminated when its source closes is delivered again,
    first, to the consumer's next source (no ack wait is kept: closing stands for it)."""

    def __init__(self, streams: MemoryStreams, stream: str, consumer: str, batch: int) -> None:
        self.streams = streams
        self.stream = stream
        self.durable = streams.durable(stream, consumer)
        self.batch = batch
        self._woken = asyncio.Event()
        self._taken: list[str] = []  # reply subjects this source handed out

    async def start(self) -> MemorySource:
        return self

    async def take(
        self, timeout: float, linger: float = 0.002, limit: int | None = None
    ) -> list[MemoryDelivery]:
        if not self._ready():
            self._woken.clear()
            self.streams.stored.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._woken, self.streams.stored)]
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if self._ready() and linger > 0:
                await asyncio.sleep(linger)
        most = self.batch if limit is None else min(limit, self.batch)
        return [self._deliver(m) for m in self._next_batch(most)]

    def interrupt(self) -> None:
        self._woken.set()

    def reread(self) -> None:
        pass  # the twin's lane loses nothing: an unacknowledged delivery comes back by itself

    async def close(self) -> None:
        d = self.durable
        back = [d.outstanding.pop(r) for r in self._taken if r in d.outstanding]
        d.again[:0] = sorted(back, key=lambda m: m.seq)
        self._taken = []

    def _held(self) -> list[Stored]:
        return self.streams.messages(self.stream)

    def _ready(self) -> bool:
        d = self.durable
        return bool(d.again) or any(m.seq >= d.next_seq for m in self._held())

    def _next_batch(self, most: int) -> list[Stored]:
        d = self.durable
        out, d.again = d.again[:most], d.again[most:]
        fresh = [m for m in self._held() if m.seq >= d.next_seq][: most - len(out)]
        if fresh:
            d.next_seq = fresh[-1].seq + 1
        return out + fresh

    def _deliver(self, m: Stored) -> MemoryDelivery:
        d = self.durable
        count = d.delivered[m.seq] = d.delivered.get(m.seq, 0) + 1
        consumer_seq = sum(d.delivered.values())
        reply = f"$JS.ACK.{d.stream}.{d.name}.{count}.{m.seq}.{consumer_seq}.0.0"
        d.outstanding[reply] = m
        self._taken.append(reply)
        meta = DeliveryMetadata(
            d.stream, d.name, SequencePair(m.seq, consumer_seq), count, m.timestamp
        )
        return MemoryDelivery(m.subject, reply, m.payload, dict(m.headers) or None, meta, d)


class MemoryBroker:
    """One term's publisher over `MemoryStreams` (see `scheduler.engine.ports.Broker`).

    `fail` (subject -> PublishError or None) injects failures: an error with `in_doubt` is
    stored all the same, as when the message reached the stream and its ack was lost."""

    def __init__(
        self,
        streams: MemoryStreams,
        fence: Callable[[], bool] | None = None,
        timeout: float = 5.0,
        max_payload: int = 1 << 20,
    ) -> None:
        self.streams = streams
        self.fence = fence
        self.timeout = timeout
        self._max_payload = max_payload
        self._held = False
        self._closed = False
        self.fail: Callable[[str], PublishError | None] | None = None
        self.acked: list[str] = []  # reply subjects acknowledged through `ack`

    @property
    def max_payload(self) -> int:
        return self._max_payload

    def refusal(self) -> str | None:
        if self.fence is not None and not self.fence():
            return "this instance is not in office"
        if self._held:
            return "the connection was lost; the epoch is not revalidated yet"
        if self._closed:
            return "publisher closed"
        return None

    def may_send(self) -> bool:
        return self.refusal() is None

    def hold(self) -> None:
        self._held = True

    def release(self) -> None:
        self._held = False

    def on_link_lost(self) -> None:
        self.hold()  # nothing is ever buffered unsent here: nothing to take back

    def on_office_lost(self) -> None:
        """Nothing is ever buffered unsent here: the fence alone keeps what follows in."""

    def _outcome(self, subject: str, payload: bytes, headers: dict[str, str]) -> Outcome:
        why = self.refusal()
        if why is not None:
            return PublishError(subject, f"not sent: {why}")
        size = len(subject) + len(payload) + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if size > self._max_payload:
            limit = self._max_payload
            message = f"{size} bytes to {subject} cannot fit the server's max_payload of {limit}"
            return PublishError(subject, message, permanent=True, reason="too_large")
        injected = self.fail(subject) if self.fail is not None else None
        if injected is not None:
            if injected.in_doubt:
                self.streams.store(subject, payload, headers)
            return injected
        return self.streams.store(subject, payload, headers)

    def _deliver(self, done: Done, outcome: Outcome) -> None:
        asyncio.get_running_loop().call_soon(done, outcome)

    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[PubAck]:
        fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()

        def settle(outcome: Outcome) -> None:
            if fut.done():
                return
            if isinstance(outcome, PubAck):
                fut.set_result(outcome)
            else:
                fut.set_exception(outcome)

        self._deliver(settle, self._outcome(subject, payload, dict(headers)))
        return fut

    async def publish_tasks(
        self, tasks: Sequence[ClaimedTask], done: Sequence[Done], fired_at: datetime
    ) -> None:
        fired = to_rfc3339(fired_at)
        fired_b = fired.encode()
        for t, d in zip(tasks, done, strict=True):
            headers = headers_of(delivery_headers(t, fired, fired_b))
            self._deliver(d, self._outcome(t.target, t.payload, headers))

    def prepare(self, message: StampedMessage) -> PreparedMessage:
        return PreparedMessage(message)  # nothing to build ahead here

    async def publish_prepared(
        self, messages: Sequence[PreparedMessage], fired_at: datetime
    ) -> list[asyncio.Future[PubAck]]:
        text = to_rfc3339(fired_at)
        return [await self.publish(m.message.subject, *m.message.at(text)) for m in messages]

    async def kv_put(self, bucket: str, key: str, value: bytes) -> asyncio.Future[PubAck]:
        return await self.publish(kv_subject(bucket, key), value, {})

    async def ack(self, replies: Iterable[str]) -> None:
        for reply in replies:
            self.acked.append(reply)
            self.streams.acknowledge(reply)

    async def close(self) -> None:
        self._closed = True


class _Listening:
    def __init__(self, handlers: list[Any], entry: Any) -> None:
        self._handlers, self._entry = handlers, entry

    async def unsubscribe(self) -> None:
        if self._entry in self._handlers:
            self._handlers.remove(self._entry)


class MemoryBus:
    """`scheduler.engine.ports.Bus` over `MemoryStreams`: publishers, core listeners, the
    delay lane's consumer (`MemorySource`, or a source the test feeds), and what the streams
    hold; a test acknowledges messages with `MemoryStreams.consume`."""

    def __init__(self, streams: MemoryStreams, source: MemorySource | None = None) -> None:
        self.streams = streams
        self.source = source
        self.link_listeners: list[Callable[[bool], None]] = []
        self.listeners: list[tuple[str, Callable[[bytes], Awaitable[None]]]] = []
        self.publishers: list[MemoryBroker] = []

    @property
    def max_payload(self) -> int:
        return 1 << 20

    async def open_publisher(self, timeout: float, fence: Callable[[], bool]) -> MemoryBroker:
        broker = MemoryBroker(self.streams, fence, timeout)
        self.publishers.append(broker)
        return broker

    def intake_source(self, stream: str, consumer: str, batch: int) -> MemorySource:
        """The stream's durable consumer, or the source the test gave (one of its own, shaped
        as `scheduler.engine.ports.Source`)."""
        if self.source is not None:
            return self.source
        return MemorySource(self.streams, stream, consumer, batch)

    async def listen(self, subject: str, handler: Callable[[bytes], Awaitable[None]]) -> Any:
        entry = (subject, handler)
        self.listeners.append(entry)
        return _Listening(self.listeners, entry)

    async def notify(self, subject: str, data: bytes) -> None:
        """A core message on `subject`, to every listener."""
        for pattern, handler in list(self.listeners):
            if subject_matches(pattern, subject):
                await handler(data)

    async def duplicate_window(self, stream: str) -> float:
        found = self.streams.streams.get(stream)
        return found.duplicate_window if found is not None else 0.0

    async def messages_held(self, subject: str) -> int:
        return self.streams.held_on(subject)

    def link(self, up: bool) -> None:
        """The connection dropped (False) or came back (True)."""
        for listener in list(self.link_listeners):
            listener(up)


class MemoryWriter:
    """`scheduler.operations.ports.BusWriter` over `MemoryStreams`: stores as a stream would
    (duplicate window by `Nats-Msg-Id`), refuses a body over `max_payload` before storing (nats-py
    judges the body alone), and hands notices to `bus`'s listeners
    (kept in `notices` as well). `down` makes every store end without an answer, as a lost
    connection does."""

    def __init__(
        self, streams: MemoryStreams, bus: MemoryBus | None = None, max_payload: int = 1 << 20
    ) -> None:
        self.streams, self.bus, self._max_payload = streams, bus, max_payload
        self.notices: list[tuple[str, bytes]] = []
        self.down = False

    @property
    def max_payload(self) -> int:
        return self._max_payload

    async def store(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        timeout: float = PUBLISH_TIMEOUT,
    ) -> Acked:
        if len(body) > self._max_payload:
            raise Refused(f"the message exceeds the server's max_payload ({self._max_payload} B)")
        if self.down:
            raise NoAnswer("the connection is down")
        outcome = self.streams.store(subject, body, dict(headers or {}))
        if isinstance(outcome, PublishError):
            raise NoStream(f"no stream captures {subject}")
        return Acked(outcome.stream, outcome.seq, outcome.duplicate)

    async def notify(self, subject: str, data: bytes) -> None:
        self.notices.append((subject, data))
        if self.bus is not None:
            await self.bus.notify(subject, data)

    async def held(self, subject: str) -> int | None:
        try:
            return self.streams.held_on(subject)
        except LookupError:
            return None
