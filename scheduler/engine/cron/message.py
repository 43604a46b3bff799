"""The message of one cron occurrence: a fresh `hanzo.mq.v1` envelope, and the same built ahead.

`envelope()` is the definition; `Prepared` is that message built while idle with a placeholder
firing time cut out, and handed to the term's broker to prepare (`Broker.prepare`), so that at
the instant only the time is filled in. No I/O.
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
from scheduler.messages.prepared import PreparedMessage, StampedMessage
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
    what `envelope()` would give at the firing time (`message.at(fired_at)`); `outgoing` is the
    same as the term's broker prepared it to leave at once (as it is, without one)."""

    cursor: datetime
    at: datetime
    message: StampedMessage
    outgoing: PreparedMessage

    @classmethod
    def build(
        cls, job: Job, cursor: datetime, at: datetime, publisher: Broker | None = None
    ) -> Prepared | None:
        """None when the job's own data contains the placeholder (then it takes the slow path)."""
        body, headers = envelope(job, at, _STAMP)
        head, sep, tail = body.partition(_STAMP_TEXT.encode())
        if not sep or _STAMP_TEXT.encode() in tail:
            return None
        message = StampedMessage(job.subject, head, tail, headers)
        if publisher is None:
            return cls(cursor, at, message, PreparedMessage(message))
        return cls(cursor, at, message, publisher.prepare(message))
