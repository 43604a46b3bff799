"""The operator half's port to the bus: what `scheduler.operations` writes to NATS.

Every write an operator's request causes goes through a `BusWriter`: a task put on the delay
lane (the API's create, the NATS `schedule` verb, a dead letter replayed through intake), a cron
occurrence triggered or backfilled to its target stream, the core notices that tell the leader
of a reschedule or a paused job, and the one question the backfill asks of a target stream
(whether it still holds a message on a subject). `scheduler.bus.nats.writer.NatsWriter` is the
adapter on a nats-py connection; `scheduler.bus.memory.MemoryWriter` the twin over
`MemoryStreams`; tests/contracts/test_bus_writer.py holds both to the same answers.

A failed store is one of three errors, each saying whether the message may be stored:
`NoStream` and `Refused` (nothing was stored: safe to report as not done) and `NoAnswer` (no
acknowledgement in time: it may have been stored, so callers must say so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

PUBLISH_TIMEOUT = 5.0  # s an operator's write waits for the stream's acknowledgement


@dataclass(frozen=True, slots=True)
class Acked:
    """A stream's acknowledgement: where the message is, and whether it was a resend the
    stream's duplicate window dropped (then `seq` is the first copy's)."""

    stream: str
    seq: int
    duplicate: bool


class WriteFailed(Exception):
    """A store that did not end in an acknowledgement; `maybe_stored` says whether the
    message may be in a stream all the same."""

    maybe_stored = False


class NoStream(WriteFailed):
    """No stream captures the subject: nothing was stored."""


class Refused(WriteFailed):
    """The stream refused the message (its text says why): nothing was stored."""


class NoAnswer(WriteFailed):
    """No acknowledgement in time (or the connection is down): it may have been stored."""

    maybe_stored = True


class BusWriter(Protocol):
    """What the operator half writes to, and asks of, NATS."""

    @property
    def max_payload(self) -> int:
        """The largest message (subject, headers and body) the server takes, in bytes."""
        ...

    async def store(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        timeout: float = PUBLISH_TIMEOUT,
    ) -> Acked:
        """Publish to the stream capturing `subject` and wait for its acknowledgement; a
        `Nats-Msg-Id` header is judged by the stream's duplicate window. Raises NoStream,
        Refused or NoAnswer."""
        ...

    async def notify(self, subject: str, data: bytes) -> None:
        """A core message (no stream, no acknowledgement): a notice to whoever listens."""
        ...

    async def held(self, subject: str) -> int | None:
        """How many messages the stream capturing `subject` holds on it; None when unknown
        (no stream captures it, or NATS did not answer)."""
        ...
