"""What the operator half answers about dead letters, as records
(`scheduler.operations.dead_letters`; the HTTP API serves them as they are)."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import Field

from scheduler.operations.records import Instant, Record


class DeadLetterSummary(Record):
    id: uuid.UUID
    original_id: str
    subject: str
    target: str | None
    reason: str
    stage: str = Field(description="intake (bad input, never a task) or firing")
    error: str | None
    attempts: int
    first_seen: Instant
    last_failed: Instant
    resolved: bool
    resolved_at: Instant | None
    resolved_by: str | None
    replayed_at: Instant | None
    raw_size: int | None = Field(
        default=None, description="the message's size in bytes as received (null: not recorded)"
    )
    raw_truncated: bool = Field(
        default=False,
        description="only the first SCHEDULER_DEAD_LETTER_PAYLOAD_CAP bytes were kept; the "
        "DLQ stream holds the whole message, and replay answers 409 payload_truncated",
    )


class DeadLetterDetail(DeadLetterSummary):
    payload: Any = Field(
        description="the message as JSON (bytes that are not JSON: base64; null when cut)"
    )
    headers: dict[str, Any]
    raw_base64: str | None


class DeadLetterPage(Record):
    items: list[DeadLetterSummary]
    next_cursor: str | None
