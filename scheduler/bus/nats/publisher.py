"""Pipelined JetStream publishing: many publishes in flight, their PubAcks collected on one inbox.

`js.publish` waits for each ack in turn (~3.6k/s here); `publish_async` costs ~27 us of client
CPU per message. This publisher sends a core publish with a per-message reply subject under one
wildcard inbox subscription and resolves a future per ack, at ~11 us of CPU per message
(field notes). Every message carries `Nats-Msg-Id`, so a retry after a lost ack is dropped by the
target stream's duplicate window.

The firing path uses `publish_batch`: every message of a due batch framed and handed to the
connection at once, and each outcome handed to a callback straight from the read loop (no
future, no scheduled callback, no coroutine per message).

A leader must never send a publish after its lease can have passed (design section 5). Every
batch is checked against the `fence` (the office's `may_act`) right before it is handed to the
connection, and against the connection's state: after a reconnect nothing is sent until the
owner has revalidated its epoch and called `release()`. Frames handed over but still in the
client's pending buffer when the link drops or office ends are taken back (`drop_unsent`), so
nats-py cannot flush them on the next connection. An outcome is definite (the message was not
stored: not sent, no stream, a JetStream error) unless `PublishError.in_doubt` says the message
went out and its ack never came: JetStream may hold it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from nats.aio.client import Client
from nats.errors import MaxPayloadError

from scheduler.bus.nats.frames import delivery_headers, kv_subject
from scheduler.bus.nats.wire import Wire, raw_subscribe
from scheduler.clock import to_rfc3339
from scheduler.records import BatchItem, ClaimedTask, Done, Outcome, PubAck, PublishError

log = logging.getLogger("scheduler.publisher")


MAX_INFLIGHT = 1000


# the common PubAck, read without a JSON parse: {"stream":"S","seq":N}
_PLAIN_ACK = re.compile(rb'\{"stream":"([^"\\]*)","seq":(\d+)\}')


class _Slots:
    """A counting limit on unacknowledged messages: asyncio.Semaphore's job, but with the
    count in the open so the firing path takes a free slot without a coroutine per message."""

    __slots__ = ("_waiters", "free")

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        return self.free <= 0

    async def acquire(self) -> None:
        while self.free <= 0:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken for a slot it will not take: pass it on
                raise
        self.free -= 1

    def release(self) -> None:
        self.free += 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _settle(fut: asyncio.Future[PubAck], outcome: Outcome) -> None:
    if fut.done():
        return
    if isinstance(outcome, PubAck):
        fut.set_result(outcome)
    else:
        fut.set_exception(outcome)


class Publisher:
    """Publishes to JetStream with up to `max_inflight` unacknowledged messages at once."""

    def __init__(
        self,
        nc: Client,
        timeout: float = 5.0,
        max_inflight: int = MAX_INFLIGHT,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.nc = nc
        self.wire = Wire(nc)
        self.timeout = timeout
        self.fence = fence
        self._held = False
        self._validated = self._reconnects()
        self._slots = _Slots(max_inflight)
        # token -> (outcome callback, subject, deadline on the loop's clock)
        self._pending: dict[str, tuple[Done, str, float]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._prefix = ""
        self._next = 0
        self._sub = None

    async def start(self) -> Publisher:
        self._prefix = self.nc.new_inbox()
        self._sub = await raw_subscribe(self.nc, self._prefix + ".*", self._on_ack)
        self._reaper = asyncio.create_task(self._reap(), name="publisher-timeouts")
        return self

    async def _reap(self) -> None:
        """Fail publishes whose ack is overdue (one sweep a tick beats a timer per message)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(0.25, self.timeout / 4))
            now = loop.time()
            for token in [t for t, (_, _, deadline) in self._pending.items() if deadline <= now]:
                self._fail(token, "no acknowledgement in time", in_doubt=True)

    # -- the fence ----------------------------------------------------------------------------
    def _reconnects(self) -> int:
        stats = getattr(self.nc, "stats", None)
        return int(stats.get("reconnects", 0)) if isinstance(stats, dict) else 0

    def refusal(self) -> str | None:
        """Why nothing may be sent now, or None: out of office, or a reconnect (or a dropped
        link) since the owner last called `release()`."""
        if self.fence is not None and not self.fence():
            return "this instance is not in office"
        if self._held or self._reconnects() != self._validated:
            return "the connection was lost; the epoch is not revalidated yet"
        return None

    def may_send(self) -> bool:
        return self.refusal() is None

    def hold(self) -> None:
        """Send nothing until `release()` (the link dropped)."""
        self._held = True

    def release(self) -> None:
        """The owner revalidated its epoch on the current connection: sending may resume."""
        self._held = False
        self._validated = self._reconnects()

    def drop_unsent(self, why: str) -> int:
        """Take this publisher's frames back from the client's pending buffer and fail them
        as not sent (definite: they never reached the socket). Returns how many."""
        prefix = self._prefix + "."
        dropped = self.wire.take_unsent(prefix.encode()) if self._prefix else []
        for reply in dropped:
            self._fail(reply[len(prefix) :].decode(), f"not sent: {why}")
        if dropped:
            log.warning("publisher.dropped_unsent count=%d why=%s", len(dropped), why)
        return len(dropped)

    def on_link_lost(self) -> None:
        """The connection dropped: hold sends and take back what nats-py would otherwise
        flush onto the next connection (before anyone could revalidate the epoch)."""
        self.hold()
        self.drop_unsent("the connection was lost")

    def on_office_lost(self) -> None:
        """Office ended (self-fence, deposed): drop unsent frames and, when the socket holds a
        backlog the peer has not taken (a silent link), cut it rather than let it flow later."""
        self.drop_unsent("office lost")
        if self.wire.cut_backlog():
            log.warning("publisher.cut_backlog: the link was backed up when office ended")

    def _refuse(self, tokens: Sequence[str], why: str) -> None:
        for token in tokens:
            self._fail(token, f"not sent: {why}")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        self.drop_unsent("publisher closed")
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # connection already closed: nothing left to unsubscribe
                pass
            self._sub = None
        for token in list(self._pending):  # sent; their acks can no longer be matched
            self._fail(token, "publisher closed before the acknowledgement", in_doubt=True)

    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[PubAck]:
        """Send one message; the returned future resolves with its PubAck or a PublishError."""
        await self._slots.acquire()
        self._next += 1
        token = str(self._next)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PubAck] = loop.create_future()
        deadline = loop.time() + self.timeout
        self._pending[token] = (functools.partial(_settle, fut), subject, deadline)
        why = self.refusal()
        if why is not None:
            self._refuse([token], why)
            return fut
        try:
            await self.wire.publish(subject, payload, f"{self._prefix}.{token}", headers)
        except MaxPayloadError:
            self._too_large(token, subject, len(payload))
        except Exception as exc:  # closed, reconnecting (no buffer): fail the message
            self._fail(token, f"publish failed: {exc!r}")
        return fut

    async def kv_put(self, bucket: str, key: str, value: bytes) -> asyncio.Future[PubAck]:
        """Write `key` of KV bucket `bucket`: a publish to the bucket's subject, pipelined and
        fenced like any other; the future gives the bucket stream's PubAck."""
        return await self.publish(kv_subject(bucket, key), value, {})

    @property
    def max_payload(self) -> int:
        """The server's largest message, control line and headers included."""
        return self.nc.max_payload

    def reserve(self) -> str:
        """A reply subject for a message framed ahead of time (see `publish_frames`)."""
        self._next += 1
        return f"{self._prefix}.{self._next}"

    def frame_parts(
        self, subject: str, payload: bytes, reply: str, headers: Mapping[str, str], cut: bytes
    ) -> tuple[bytes, ...]:
        """The frame of one message split at every occurrence of `cut` (a placeholder to fill
        in later: `fill.join(parts)`, same length keeps the sizes right), or () when the message
        cannot be framed here (it must go through `publish`)."""
        frame = self.wire.frame(subject, payload, reply, headers)
        return tuple(frame.split(cut)) if frame is not None else ()

    async def ack(self, replies: Iterable[str]) -> None:
        """Acknowledge JetStream deliveries: an empty message to each reply subject, all handed
        to the connection at once."""
        await self.wire.empty_to(replies)

    async def publish_frames(
        self, items: Sequence[tuple[str, str, bytes]]
    ) -> list[asyncio.Future[PubAck]]:
        """Send `(subject, reserved reply, frame)` items built with `wire.frame()` in one
        hand-over; a future per item, as `publish` gives."""
        loop = asyncio.get_running_loop()
        futures = []
        deadline = loop.time() + self.timeout
        tokens = []
        for subject, reply, _ in items:
            await self._slots.acquire()
            token = reply[len(self._prefix) + 1 :]
            fut: asyncio.Future[PubAck] = loop.create_future()
            self._pending[token] = (functools.partial(_settle, fut), subject, deadline)
            futures.append(fut)
            tokens.append(token)
        why = self.refusal()
        if why is not None:
            self._refuse(tokens, why)
            return futures
        frames = []
        for (subject, _, frame), token in zip(items, tokens, strict=True):
            if self.wire.fits(frame):
                frames.append(frame)
            else:
                self._too_large(token, subject, len(frame))
        try:
            await self.wire.send_frames(frames)
        except Exception as exc:  # closed, reconnecting (no buffer): all fail
            for token in tokens:
                self._fail(token, f"publish failed: {exc!r}")
        return futures

    async def publish_tasks(
        self, tasks: Sequence[ClaimedTask], done: Sequence[Done], fired_at: datetime
    ) -> None:
        """Deliver claimed tasks to their targets with the delivery headers (design section 3,
        `scheduler.bus.nats.frames.delivery_headers`), as one batch; `done[i]` gets task i's
        outcome once."""
        fired = to_rfc3339(fired_at)
        fired_b = fired.encode()
        await self.publish_batch(
            [
                (t.target, t.payload, delivery_headers(t, fired, fired_b), d)
                for t, d in zip(tasks, done, strict=True)
            ]
        )

    async def publish_batch(self, items: Sequence[BatchItem]) -> None:
        """Send every item, framed and handed to the connection together; each item's callback
        is called once, from the read loop, with its PubAck or PublishError (a failure to send
        calls it at once). Waits only when `max_inflight` messages are unacknowledged."""
        why = self.refusal()
        if why is not None:  # refused before anything is framed
            for subject, _, _, done in items:
                done(PublishError(subject, f"not sent: {why}"))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        wire, pending, slots = self.wire, self._pending, self._slots
        frames: list[bytes] = []
        tokens: list[str] = []
        size = 0
        for subject, payload, headers, done in items:
            if slots.free > 0:
                slots.free -= 1
            else:
                if frames:  # send what is framed before waiting for acks
                    await self._send_frames(frames, tokens, size)
                    frames, tokens, size = [], [], 0
                await slots.acquire()
                deadline = loop.time() + self.timeout  # the wait is not the server's delay
            self._next += 1
            token = str(self._next)
            reply = f"{self._prefix}.{token}"
            pending[token] = (done, subject, deadline)
            if isinstance(headers, bytes):
                frame: bytes | None = wire.frame_block(subject, payload, reply, headers)
                if not wire.raw:
                    frame, headers = None, _parse_block(headers)
            else:
                frame = wire.frame(subject, payload, reply, headers)
            if frame is not None:
                if wire.fits(frame):
                    frames.append(frame)
                    tokens.append(token)
                    size += len(payload)
                else:
                    self._too_large(token, subject, len(frame))
                continue
            if frames:  # keep the order of the connection's writes
                await self._send_frames(frames, tokens, size)
                frames, tokens, size = [], [], 0
            why = self.refusal()
            if why is not None:  # office or link lost while waiting for a slot
                self._refuse([token], why)
                continue
            try:
                hdrs = _parse_block(headers) if isinstance(headers, bytes) else dict(headers)
                await wire.publish(subject, payload, reply, hdrs)
            except MaxPayloadError:
                self._too_large(token, subject, len(payload))
            except Exception as exc:  # closed, reconnecting (no buffer)
                self._fail(token, f"publish failed: {exc!r}")
        if frames:
            await self._send_frames(frames, tokens, size)

    async def _send_frames(self, frames: list[bytes], tokens: list[str], size: int) -> None:
        why = self.refusal()  # right before the batch leaves: a wait for slots may have
        if why is not None:  # outlived the lease or the connection
            self._refuse(tokens, why)
            return
        try:
            await self.wire.send_frames(frames, size)
        except Exception as exc:  # closed, reconnecting (no buffer): all of them fail
            for token in tokens:
                self._fail(token, f"publish failed: {exc!r}")

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A PubAck, straight from the client's read loop (see `raw_subscribe`)."""
        token = subject[subject.rfind(b".") + 1 :].decode()
        entry = self._pending.pop(token, None)
        if entry is None:
            return  # a late ack after its timeout: the task was already retried
        done, target, _ = entry
        self._slots.release()
        try:
            done(_parse_ack(data, headers, target))
        except Exception:  # never let a callback break the client's read loop
            log.exception("publisher.callback_failed subject=%s", target)

    def _fail(
        self, token: str, message: str, reason: str | None = None, in_doubt: bool = False
    ) -> None:
        entry = self._pending.pop(token, None)
        if entry is None:
            return
        done, subject, _ = entry
        self._slots.release()
        error = PublishError(subject, message, in_doubt=in_doubt)
        if reason is not None:
            error = PublishError(subject, message, permanent=True, reason=reason)
        try:
            done(error)
        except Exception:  # as in _on_ack
            log.exception("publisher.callback_failed subject=%s", subject)

    def _too_large(self, token: str, subject: str, size: int) -> None:
        """Fail a message the server would refuse (and close the connection for): not sent."""
        limit = self.nc.max_payload
        message = f"{size} bytes to {subject} cannot fit the server's max_payload of {limit}"
        self._fail(token, message, reason="too_large")


def _parse_block(block: bytes) -> dict[str, str]:
    """The headers of a `NATS/1.0` header block, for the nats-py fallback."""
    lines = block.decode().split("\r\n")[1:]
    return dict(line.split(": ", 1) for line in lines if line)


def _parse_ack(data: bytes, headers: bytes | None, subject: str) -> PubAck | PublishError:
    if headers:  # a status reply: "NATS/1.0 503" (no stream listens) or another error
        first = headers.split(b"\r\n", 1)[0].decode(errors="replace")
        parts = first.split(" ", 2)
        status = parts[1] if len(parts) > 1 else ""
        if status == "503":
            return PublishError(subject, f"no stream captures {subject}")
        if status:
            return PublishError(subject, f"status {status} {parts[2] if len(parts) > 2 else ''}")
    plain = _PLAIN_ACK.fullmatch(data)
    if plain is not None:
        return PubAck(plain[1].decode(), int(plain[2]), False)
    try:
        doc = json.loads(data)
    except ValueError:
        return PublishError(subject, f"unreadable PubAck {data[:80]!r}")
    if "error" in doc:
        err = doc["error"]
        return PublishError(
            subject, f"JetStream error {err.get('err_code')}: {err.get('description')}"
        )
    return PubAck(
        stream=str(doc.get("stream", "")),
        seq=int(doc.get("seq", 0)),
        duplicate=bool(doc.get("duplicate", False)),
    )
