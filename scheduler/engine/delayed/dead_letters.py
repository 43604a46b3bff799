"""Dead-letter copies on the DLQ stream: one sender for intake and firing alike.

The `dead_letters` row is the record, written by the caller before the copy is sent. The copy
on `mq.dlq.<rest>` (stream `MQ_DLQ`) is how operators and tools see dead letters arrive. Copies
go out concurrently, at most `DLQ_INFLIGHT` unacknowledged at once, and nobody waits for their
acks: a slow or missing DLQ stream costs a log line and a metric per copy, never a stalled
intake or bookkeeper. When `DLQ_INFLIGHT` copies wait for acks, a batch waits at most
`SLOT_WAIT` for room, then drops the copies that find none (counted, logged once): a flood of bad
messages while the DLQ stream does not answer cannot hold the lane up. A copy never exceeds the
server's `max_payload`: one that would is cut to the envelope without `data`, then to no payload
at all, with its `Mq-*` headers (the reason) kept and `Mq-Truncated` saying so.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.ports import Broker
from scheduler.messages.headers import block_size, printable, split_producer_headers
from scheduler.messages.subjects import dlq_subject
from scheduler.records import PubAck

log = logging.getLogger(__name__)

DLQ_INFLIGHT = 256  # of the publisher's 1,000 slots: firing always keeps the rest
SLOT_WAIT = 0.5  # seconds a batch of copies waits, in all, for room among DLQ_INFLIGHT
# A frame's control line besides its subject: `HPUB`, the reply inbox and two sizes.
FRAME_SLACK = 128
MARK_BYTES = 1000  # each of the daemon's headers on a copy (an error text, a subject) at most


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One copy to send: where the task was headed (None: nowhere usable), its bytes and the
    producer's headers as received, why it is dead, and the stage's own headers
    (`Mq-Target`, `Mq-Original-Subject`, ...); `msg_id`, when given, is the copy's
    `Nats-Msg-Id` (so a copy sent twice is stored once)."""

    target: str | None
    payload: bytes
    headers: Mapping[str, str] | None
    reason: str
    error: str
    marks: Mapping[str, str]
    msg_id: str | None = None


def fits(subject: str, headers: Mapping[str, str], payload: bytes, max_payload: int) -> bool:
    """Whether a frame of this subject, headers and payload is within `max_payload`."""
    size = len(subject) + block_size(headers) + len(payload) + FRAME_SLACK
    return size <= max_payload


def copy_of(letter: DeadLetter, subject: str, max_payload: int) -> tuple[bytes, dict[str, str]]:
    """(payload, headers) of the copy: whole if it fits, else cut (see the module's doc). Only
    producer headers that could be delivered are kept; the daemon's are made printable."""
    marks = {k: printable(v, MARK_BYTES) for k, v in letter.marks.items()}
    if letter.msg_id is not None:  # the DLQ copy's header names are fixed by the design
        marks = {"Nats-Msg-Id": printable(letter.msg_id, MARK_BYTES), **marks}
    marks["Mq-Error"] = printable(letter.error, MARK_BYTES)
    marks["Mq-Error-Reason"] = letter.reason
    whole = {**split_producer_headers(letter.headers)[0], **marks}
    if fits(subject, whole, letter.payload, max_payload):
        return letter.payload, whole
    marks["Mq-Truncated"] = f"payload of {len(letter.payload)} bytes cut to fit max_payload"
    envelope = _without_data(letter.payload)
    if envelope is not None and fits(subject, marks, envelope, max_payload):
        return envelope, marks
    return b"", marks  # if even this is too large, the publisher refuses it, not the server


def _without_data(payload: bytes) -> bytes | None:
    """The envelope without its `data` field, or None when the payload is no JSON object."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    doc.pop("data", None)
    try:
        return json.dumps(doc, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return None


class DeadLetterCopies:
    """Sends dead-letter copies through the term's publisher, concurrently and bounded."""

    def __init__(
        self,
        publisher: Broker,
        prefix: str,
        events: DelayedEvents,
        inflight: int = DLQ_INFLIGHT,
    ) -> None:
        self.publisher = publisher
        self.prefix = prefix
        self._events = events
        self._slots = asyncio.Semaphore(inflight)
        self._pending: set[asyncio.Future[PubAck]] = set()

    async def send(self, letters: Iterable[DeadLetter]) -> None:
        """Hand every copy to the connection; while `inflight` copies are unacknowledged,
        wait up to `SLOT_WAIT` in all, then drop the copies that find no room."""
        deadline = asyncio.get_running_loop().time() + SLOT_WAIT
        dropped = 0
        for letter in letters:
            if not await self._room(deadline):
                dropped += 1
                self._events.dead_letter_copy_failed(letter.reason)
                continue
            subject = dlq_subject(letter.target, self.prefix)
            payload, headers = copy_of(letter, subject, self.publisher.max_payload)
            fut = await self.publisher.publish(subject, payload, headers)
            self._pending.add(fut)
            fut.add_done_callback(functools.partial(self._done, letter, subject))
        if dropped:
            log.warning(
                "dlq.copies_dropped count=%d: %d copies wait for the DLQ stream's acks; "
                "the dead_letters rows are kept",
                dropped,
                len(self._pending),
            )

    async def _room(self, deadline: float) -> bool:
        """Take a slot for one more copy, waiting until `deadline` at most."""
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
            return True
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(self._slots.acquire(), left)
        except TimeoutError:
            return False
        return True

    def _done(self, letter: DeadLetter, subject: str, fut: asyncio.Future[PubAck]) -> None:
        self._pending.discard(fut)
        self._slots.release()
        error = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or error is not None:
            # the dead_letters row is the record; the stream copy is a convenience
            self._events.dead_letter_copy_failed(letter.reason)
            log.warning("dlq.publish_failed subject=%s error=%s", subject, error)

    async def drain(self, timeout: float) -> None:
        """Wait, up to `timeout` seconds, for the copies in flight to be acknowledged."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)
