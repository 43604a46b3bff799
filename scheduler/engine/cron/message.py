"""The message of one cron occurrence: a fresh `hanzo.mq.v1` envelope, and the same built ahead.

`envelope()` is the definition; `Prepared` is that message built while idle with a placeholder
firing time cut out, so that at the instant only the time is filled in. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler.clock import to_rfc3339
from scheduler.cron.jobs import Job, occurrence_key
from scheduler.engine.ports import Broker
from scheduler.messages.headers import block_size
from scheduler.records import PublishError

_STAMP = datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)  # never a real firing time
_STAMP_TEXT = to_rfc3339(_STAMP)


def envelope(job: Job, occurrence: datetime, now: datetime) -> tuple[bytes, dict[str, str]]:
    """The fresh `hanzo.mq.v1` envelope and headers of one occurrence."""
    key = occurrence_key(job.name, occurrence)
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": key,
        "type": job.type,
        "source": "scheduler",
        "timestamp": to_rfc3339(now),
        "priority": job.priority,
        "data": job.data,
    }
    if job.ttl_seconds is not None:
        doc["ttl_seconds"] = job.ttl_seconds
    headers = {
        "Nats-Msg-Id": key,
        "Mq-Scheduled-For": to_rfc3339(occurrence),
        "Mq-Fired-At": to_rfc3339(now),
        "Mq-Attempt": "1",
        "Mq-Schedule": job.name,
    }
    return json.dumps(doc, separators=(",", ":")).encode(), headers


def failure_text(job: Job, occurrence: datetime, error: PublishError, max_payload: int) -> str:
    """Why a job's occurrence can never be published, naming the YAML field at fault."""
    if error.reason != "too_large":
        return f"{error.reason}: {error}"
    body, headers = envelope(job, occurrence, _STAMP)
    total = len(job.subject) + block_size(headers) + len(body)
    return (
        f"data: envelope of {len(body)} bytes ({total} with subject and headers) does not fit "
        f"the server's max_payload of {max_payload} bytes; make data smaller"
    )


@dataclass(frozen=True, slots=True)
class Prepared:
    """One job's next message, built while idle: only the firing time is filled in when due.

    Built by `envelope()` with a placeholder time that is then cut out, so it is byte for byte
    what `envelope()` would give at the firing time."""

    cursor: datetime
    at: datetime
    head: bytes
    tail: bytes
    headers: dict[str, str]
    # With a publisher: the whole wire frame, cut at the two places the firing time goes (the
    # body's `timestamp` and the `Mq-Fired-At` header; same length as the placeholder, so the
    # frame's sizes hold), for the reply subject reserved on that publisher.
    publisher: Broker | None = None
    reply: str = ""
    frame_parts: tuple[bytes, ...] = ()

    @classmethod
    def build(
        cls, job: Job, cursor: datetime, at: datetime, publisher: Broker | None = None
    ) -> Prepared | None:
        """None when the job's own data contains the placeholder (then it takes the slow path)."""
        body, headers = envelope(job, at, _STAMP)
        stamp = _STAMP_TEXT.encode()
        head, sep, tail = body.partition(stamp)
        if not sep or stamp in tail:
            return None
        if publisher is None:
            return cls(cursor, at, head, tail, headers)
        reply = publisher.reserve()
        parts = publisher.frame_parts(
            job.subject, body, reply, {**headers, "Mq-Fired-At": _STAMP_TEXT}, stamp
        )
        if len(parts) != 3:  # no raw framing, or the placeholder also sits in a header
            return cls(cursor, at, head, tail, headers)
        return cls(cursor, at, head, tail, headers, publisher, reply, parts)

    def message(self, fired_at: str) -> tuple[bytes, dict[str, str]]:
        return self.head + fired_at.encode() + self.tail, {**self.headers, "Mq-Fired-At": fired_at}

    def frame(self, fired_at: bytes) -> bytes:
        return fired_at.join(self.frame_parts)
