"""The wire adapter of the `Broker` port: pipelined JetStream publishing on nats-py's connection.

`js.publish` waits for each ack in turn (~3.6k/s here); `publish_async` costs ~27 us of client
CPU per message. This publisher sends a core publish with a per-message reply subject under one
wildcard inbox subscription and resolves a future per ack, at ~11 us of CPU per message
(field notes). Every message carries `Nats-Msg-Id`, so a retry after a lost ack is dropped by the
target stream's duplicate window. `SCHEDULER_PUBLISH_PATH=nats_py` selects the plain nats-py
adapter instead (`scheduler.bus.nats.plain`).

Every send goes through `publish_batch` (the port's `publish`, `publish_tasks` and `kv_put`
alike): every message of a due batch framed and handed to the connection at once, and each
outcome handed to a callback straight from the read loop (no future, no scheduled callback, no
coroutine per message). A cron message prepared ahead (`prepare`) is a whole frame with its
reply subject reserved, only the firing time left to fill in.

A leader must never send a publish after its lease can have passed (docs/leadership.md). Every
batch is checked against the `fence` (the office's `may_act`) right before it is handed to the
connection, and against the connection's state: after a reconnect nothing is sent until the
owner has revalidated its epoch and called `release()`. Frames handed over but still in the
client's pending buffer when the link drops or office ends are taken back (`drop_unsent`), so
nats-py cannot flush them on the next connection. An outcome is definite (the message was not
stored: not sent, no stream, a JetStream error) unless `PublishError.in_doubt` says the message
went out and its ack never came: JetStream may hold it.

A publish answered 503 while its stream elects a leader is resent here, the same frame, for as
long as its deadline allows (`scheduler.bus.nats.resend`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from nats.aio.client import Client
from nats.errors import MaxPayloadError

from scheduler.bus.nats.frames import FIRED_AT_PLACEHOLDER, delivery_headers, kv_subject
from scheduler.bus.nats.inflight import MAX_INFLIGHT, InFlight, parse_ack, parse_block, settle
from scheduler.bus.nats.resend import Resends
from scheduler.bus.nats.wire import Wire, raw_subscribe
from scheduler.clock import to_rfc3339
from scheduler.messages.prepared import PreparedMessage, StampedMessage
from scheduler.records import BatchItem, ClaimedTask, Done, PubAck, PublishError

log = logging.getLogger(__name__)


# Prepared messages this publisher could not frame, sent one by one: hand the socket each batch
# of this many as it is built, so nats-server stores the first ones while the rest are built.
FLUSH_EVERY = 50


@dataclass(frozen=True, slots=True)
class _Framed(PreparedMessage):
    """A prepared message framed by the publisher whose inbox `reply` is under: the frame cut
    at the firing time's two places (`fill.join(parts)`)."""

    reply: str
    parts: tuple[bytes, ...]


class Publisher(InFlight):
    """`scheduler.engine.ports.Broker` on the wire: up to `max_inflight` unacknowledged
    messages at once."""

    def __init__(
        self,
        nc: Client,
        timeout: float = 5.0,
        max_inflight: int = MAX_INFLIGHT,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(nc, timeout, max_inflight, fence)
        self.wire = Wire(nc)
        self._resends = Resends()
        self._resend_wake = asyncio.Event()
        self._resender: asyncio.Task[None] | None = None

    async def start(self) -> Publisher:
        self._prefix = self.nc.new_inbox()
        self._sub = await raw_subscribe(self.nc, self._prefix + ".*", self._on_ack)
        self._start_reaper()
        self._resender = asyncio.create_task(self._resend_loop(), name="publisher-resends")
        return self

    # -- resends while a stream elects a leader (scheduler.bus.nats.resend) ---------------------
    async def _resend_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            at = self._resends.next_at()
            self._resend_wake.clear()
            if at is None:
                await self._resend_wake.wait()
                continue
            if at > loop.time():
                try:
                    await asyncio.wait_for(self._resend_wake.wait(), at - loop.time())
                except TimeoutError:
                    pass
                continue
            await self._resend(self._resends.take_due(loop.time()))

    async def _resend(self, due: list[tuple[str, bytes]]) -> None:
        """Send again the frames whose stream had no leader, unless the fence says no (then
        they fail as not sent: a 503 stored nothing)."""
        due = [(token, frame) for token, frame in due if token in self._pending]
        if not due:
            return
        why = self.refusal()
        if why is not None:
            self._refuse([token for token, _ in due], why)
            return
        try:
            await self.wire.send_frames([frame for _, frame in due])
        except Exception as exc:  # closed, reconnecting (no buffer): all of them fail
            for token, _ in due:
                self._fail(token, f"publish failed: {exc!r}")

    def _fail(
        self, token: str, message: str, reason: str | None = None, in_doubt: bool = False
    ) -> None:
        self._resends.forget(token)
        super()._fail(token, message, reason, in_doubt)

    # -- the fence (see `InFlight.refusal`) ------------------------------------------------------
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

    def release(self) -> None:
        """Sending may resume (the owner revalidated its epoch on this connection); what is
        still unanswered went out on an earlier link and is sent again on this one, the same
        frames (same `Nats-Msg-Id`: the target stream's duplicate window drops whichever copy
        comes second), not left to its timeout: a node that froze holds what it was handed
        until it resumes, and forwards it then (measured: tasks 5 s late)."""
        relinked = self._reconnects() != self._validated
        super().release()
        if not relinked:
            return
        again = [token for token in self._pending if token in self._resends.frames]
        if again:
            log.info("publisher.resent_on_relink count=%d", len(again))
            self._resends.again(again, asyncio.get_running_loop().time())
            self._resend_wake.set()  # `_resend_loop` sends them, fenced as every resend

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

    async def close(self) -> None:
        if self._resender is not None:
            self._resender.cancel()
            await asyncio.gather(self._resender, return_exceptions=True)
            self._resender = None
        await self._stop_reaper()
        self.drop_unsent("publisher closed")
        await self._stop_listening()

    # -- the port's sends ------------------------------------------------------------------------
    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[PubAck]:
        """Send one message; the returned future resolves with its PubAck or a PublishError."""
        fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        await self.publish_batch([(subject, payload, headers, functools.partial(settle, fut))])
        return fut

    async def kv_put(self, bucket: str, key: str, value: bytes) -> asyncio.Future[PubAck]:
        """Write `key` of KV bucket `bucket`: a publish to the bucket's subject, pipelined and
        fenced like any other; the future gives the bucket stream's PubAck."""
        return await self.publish(kv_subject(bucket, key), value, {})

    async def ack(self, replies: Iterable[str]) -> None:
        """Acknowledge JetStream deliveries: an empty message to each reply subject, all handed
        to the connection at once."""
        await self.wire.empty_to(replies)

    def prepare(self, message: StampedMessage) -> PreparedMessage:
        """The message's whole `HPUB` frame built now, for a reply subject reserved on this
        publisher, cut at the two places its firing time goes (the payload and `Mq-Fired-At`;
        the placeholder has the time's length, so the frame's sizes hold). A message that
        cannot be framed here stays as it is (`publish_prepared` sends it as `publish` does)."""
        self._next += 1
        reply = f"{self._prefix}.{self._next}"
        body = message.head + FIRED_AT_PLACEHOLDER + message.tail
        headers = {**message.headers, "Mq-Fired-At": FIRED_AT_PLACEHOLDER.decode()}
        frame = self.wire.frame(message.subject, body, reply, headers)
        parts = tuple(frame.split(FIRED_AT_PLACEHOLDER)) if frame is not None else ()
        if len(parts) != 3:  # no raw framing, or the placeholder also sits elsewhere
            return PreparedMessage(message)
        return _Framed(message, reply, parts)

    async def publish_prepared(
        self, messages: Sequence[PreparedMessage], fired_at: datetime
    ) -> list[asyncio.Future[PubAck]]:
        """The messages this publisher framed, filled in with the time and handed over at once;
        the others (not framed, or framed by an earlier term's publisher) one by one first,
        yielding every FLUSH_EVERY so the first ones leave while the rest are built."""
        text = to_rfc3339(fired_at)
        stamp = text.encode()
        mine = self._prefix + "."
        whole = len(stamp) == len(FIRED_AT_PLACEHOLDER)
        futures: dict[int, asyncio.Future[PubAck]] = {}
        framed: list[tuple[int, str, str, bytes]] = []  # (index, subject, reply, frame)
        for i, prepared in enumerate(messages):
            message = prepared.message
            if whole and isinstance(prepared, _Framed) and prepared.reply.startswith(mine):
                framed.append((i, message.subject, prepared.reply, stamp.join(prepared.parts)))
                continue
            futures[i] = await self.publish(message.subject, *message.at(text))
            if len(futures) % FLUSH_EVERY == 0:
                await asyncio.sleep(0)  # let the client write what is built so far
        if framed:
            sent = await self._publish_framed([(s, r, f) for _, s, r, f in framed])
            futures.update((i, fut) for (i, _, _, _), fut in zip(framed, sent, strict=True))
        return [futures[i] for i in range(len(messages))]

    async def _publish_framed(
        self, items: Sequence[tuple[str, str, bytes]]
    ) -> list[asyncio.Future[PubAck]]:
        """Send `(subject, reserved reply, frame)` items framed by `prepare` in one hand-over;
        a future per item, as `publish` gives."""
        loop = asyncio.get_running_loop()
        futures = []
        deadline = loop.time() + self.timeout
        tokens = []
        for subject, reply, _ in items:
            await self._slots.acquire()
            token = reply[len(self._prefix) + 1 :]
            fut: asyncio.Future[PubAck] = loop.create_future()
            self._pending[token] = (functools.partial(settle, fut), subject, deadline)
            futures.append(fut)
            tokens.append(token)
        why = self.refusal()
        if why is not None:
            self._refuse(tokens, why)
            return futures
        frames = []
        keep = self._resends.keep
        for (subject, _, frame), token in zip(items, tokens, strict=True):
            if self.wire.fits(frame):
                frames.append(frame)
                keep(token, frame)
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
        """Deliver claimed tasks to their targets with the delivery headers (docs/producers.md,
        "What arrives at the target"; `scheduler.bus.nats.frames.delivery_headers`), as one
        batch; `done[i]` gets task i's outcome once."""
        fired = to_rfc3339(fired_at)
        fired_b = fired.encode()
        await self.publish_batch(
            [
                (t.target, t.payload, delivery_headers(t, fired, fired_b), d)
                for t, d in zip(tasks, done, strict=True)
            ]
        )

    # -- the adapter's one send ---------------------------------------------------------------
    async def publish_batch(self, items: Sequence[BatchItem]) -> None:
        """Send every item, framed and handed to the connection together; each item's callback
        is called once, from the read loop, with its PubAck or PublishError (a failure to send
        calls it at once). Waits only when `max_inflight` messages are unacknowledged.

        Every send of this publisher ends here (`publish`, `publish_tasks`, `kv_put`), but for
        the frames `prepare` built ahead. An item's headers are a dict, or a header block the
        caller built and vouches for (`frames.delivery_block`); a message is framed here
        (`Wire.frame`, `Wire.frame_block`) unless nats-py must check it, then it goes through
        `Wire.publish` in its turn."""
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
                    frame, headers = None, parse_block(headers)
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
                hdrs = parse_block(headers) if isinstance(headers, bytes) else dict(headers)
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
        kept = self._resends.frames
        for token, frame in zip(tokens, frames, strict=True):
            kept[token] = frame
        try:
            await self.wire.send_frames(frames, size)
        except Exception as exc:  # closed, reconnecting (no buffer): all of them fail
            for token in tokens:
                self._fail(token, f"publish failed: {exc!r}")

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A PubAck, straight from the client's read loop (see `raw_subscribe`)."""
        token = subject[subject.rfind(b".") + 1 :].decode()
        if headers is not None and headers.startswith(b"NATS/1.0 503") and self._elected(token):
            return  # its stream elects a leader: sent again shortly (`_resend_loop`)
        entry = self._pending.pop(token, None)  # `InFlight._fail`'s bookkeeping, inline: per ack
        if entry is None:
            return  # a late ack after its timeout: the task was already retried
        done, target, _ = entry
        self._slots.release()
        self._resends.forget(token)
        outcome = parse_ack(data, headers, target)
        if headers is None:
            self._resends.learned(target)
        try:
            done(outcome)
        except Exception:  # never let a callback break the client's read loop
            log.exception("publisher.callback_failed subject=%s", target)

    def _elected(self, token: str) -> bool:
        """Whether the publish `token`, answered 503, is planned to be sent again."""
        entry = self._pending.get(token)
        if entry is None:
            return False
        now = asyncio.get_running_loop().time()
        if not self._resends.schedule(token, entry[1], now, entry[2]):
            return False
        self._resend_wake.set()
        return True
