"""The plain nats-py adapter of the `Broker` port: the same pipelining, nats-py's public API only.

`SCHEDULER_PUBLISH_PATH=nats_py` selects it instead of the wire adapter
(`scheduler.bus.nats.publisher.Publisher`). Every message is a `Client.publish` with a reply
subject under one inbox `Client.subscribe`d for the PubAcks, so nats-py validates each subject
and header and builds each frame (about 8-10 us more CPU per message than the wire, and each ack
goes through a `Msg` and a callback task). It is the reference the wire is measured and checked
against, and the way out should a nats-py release change the internals the wire relies on
(`scheduler.bus.nats.wire.NATS_INTERNALS`).

The fence is the same (`InFlight.refusal`, checked right before every hand-over), with one
difference the public API imposes: what nats-py has buffered but not yet written when the link
drops or office ends cannot be taken back (the wire removes it from the client's buffer). The
connection is opened without a reconnect buffer (`pending_size=0`) and nats-py's flusher writes
a hand-over in the loop's next step, so that window is one step of the event loop; a message that
slips through it carries its `Nats-Msg-Id` and the target stream keeps it once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js.api import Header

from scheduler.bus.nats.frames import delivery_headers, kv_subject
from scheduler.bus.nats.inflight import InFlight, log, parse_ack, parse_block, settle
from scheduler.clock import to_rfc3339
from scheduler.messages.headers import block_size
from scheduler.messages.prepared import PreparedMessage, StampedMessage
from scheduler.records import ClaimedTask, Done, PubAck

# Messages handed to nats-py one by one: let its flusher write after every this many.
FLUSH_EVERY = 50


class PlainPublisher(InFlight):
    """`scheduler.engine.ports.Broker` through nats-py's public API (see the module)."""

    async def start(self) -> PlainPublisher:
        self._prefix = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._prefix + ".*", cb=self._on_ack)
        self._start_reaper()
        return self

    def on_link_lost(self) -> None:
        self.hold()  # what nats-py buffered is beyond reach here (see the module docstring)

    def on_office_lost(self) -> None:
        """The fence (the office's `may_act`) now refuses every send; nothing buffered can be
        taken back through the public API (see the module docstring)."""

    async def close(self) -> None:
        await self._stop_reaper()
        await self._stop_listening()

    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[PubAck]:
        fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        await self._send([(subject, payload, headers, functools.partial(settle, fut))])
        return fut

    async def publish_tasks(
        self, tasks: Sequence[ClaimedTask], done: Sequence[Done], fired_at: datetime
    ) -> None:
        fired = to_rfc3339(fired_at)
        fired_b = fired.encode()
        items = []
        for t, d in zip(tasks, done, strict=True):
            headers = delivery_headers(t, fired, fired_b)
            block = parse_block(headers) if isinstance(headers, bytes) else headers
            items.append((t.target, t.payload, block, d))
        await self._send(items)

    def prepare(self, message: StampedMessage) -> PreparedMessage:
        return PreparedMessage(message)  # nats-py builds every frame itself, at the instant

    async def publish_prepared(
        self, messages: Sequence[PreparedMessage], fired_at: datetime
    ) -> list[asyncio.Future[PubAck]]:
        text = to_rfc3339(fired_at)
        return [await self.publish(m.message.subject, *m.message.at(text)) for m in messages]

    async def kv_put(self, bucket: str, key: str, value: bytes) -> asyncio.Future[PubAck]:
        return await self.publish(kv_subject(bucket, key), value, {})

    async def ack(self, replies: Iterable[str]) -> None:
        for reply in replies:
            await self.nc.publish(reply)

    async def _send(self, items: Sequence[tuple[str, bytes, Mapping[str, str], Done]]) -> None:
        """Hand every item to nats-py in order, each checked against the fence and the
        server's limit first; each callback gets its outcome once."""
        loop = asyncio.get_running_loop()
        for n, (subject, payload, headers, done) in enumerate(items, 1):
            await self._slots.acquire()
            self._next += 1
            token = str(self._next)
            reply = f"{self._prefix}.{token}"
            self._pending[token] = (done, subject, loop.time() + self.timeout)
            why = self.refusal()
            if why is not None:
                self._refuse([token], why)
                continue
            # nats-py counts the payload alone against max_payload; the server, all of it
            size = len(subject) + len(reply) + block_size(headers) + len(payload) + 32
            if size > self.nc.max_payload:
                self._too_large(token, subject, size)
                continue
            try:
                await self.nc.publish(subject, payload, reply=reply, headers=dict(headers))
            except MaxPayloadError:
                self._too_large(token, subject, size)
            except Exception as exc:  # closed, reconnecting (no buffer): fail the message
                self._fail(token, f"publish failed: {exc!r}")
            if n % FLUSH_EVERY == 0:
                await asyncio.sleep(0)  # let nats-py's flusher write what is handed over

    async def _on_ack(self, msg: Msg) -> None:
        token = msg.subject[msg.subject.rfind(".") + 1 :]
        entry = self._pending.pop(token, None)
        if entry is None:
            return  # a late ack after its timeout: the task was already retried
        done, target, _ = entry
        self._slots.release()
        headers = msg.header or {}
        status = headers.get(Header.STATUS)  # nats-py's reading of a status reply's first line
        line = f"NATS/1.0 {status} {headers.get(Header.DESCRIPTION, '')}" if status else ""
        try:
            done(parse_ack(msg.data, line.encode() or None, target))
        except Exception:  # never let a callback break nats-py's dispatch
            log.exception("publisher.callback_failed subject=%s", target)
