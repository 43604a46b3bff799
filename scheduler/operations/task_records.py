"""What the operator half answers about delayed tasks, as records (`scheduler.operations.tasks`).

The HTTP API serves them as they are (its OpenAPI document is generated from them); the NATS
verbs reply with their fields. A listing's items are `TaskSummary`s written as JSON text by
PostgreSQL (`scheduler.store.postgres.overview.SUMMARY_JSON`, held equal to the model by a test),
so a page is joined, never decoded into these."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from scheduler.operations.records import Instant, Record


class TaskSummary(Record):
    id: str
    target: str
    status: str = Field(description="pending, claimed, fired, cancelled, expired, dead, ...")
    priority: int | None = Field(description="null once fired (the task's row is deleted)")
    due_at: Instant = Field(description="when it fires (moves on retries and reschedules)")
    scheduled_for: Instant = Field(description="the time the producer (or a replay) asked for")
    expires_at: Instant | None
    attempts: int
    created_at: Instant | None = Field(description="null once fired")
    fired_at: Instant | None


class TaskState(TaskSummary):
    """A task's state without its bytes: what the NATS `get` verb answers."""

    stream_seq: int | None
    last_error: str | None


class Delivery(Record):
    scheduled_for: Instant
    fired_at: Instant
    attempt: int
    epoch: int
    instance: str
    stream: str | None
    stream_seq: int | None


class TaskDetail(TaskState):
    claimed_epoch: int | None
    claimed_at: Instant | None
    updated_at: Instant
    headers: dict[str, Any] = Field(description="producer headers delivered with the task")
    envelope: dict[str, Any] | None = Field(description="the stored envelope, when it is JSON")
    payload_base64: str | None = Field(description="the stored bytes, when they are not JSON")
    deliveries: list[Delivery]


class TaskPage(Record):
    items: list[TaskSummary]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class DelayedScheduled(Record):
    """The NATS `schedule` verb's answer: the task is on the delay lane (durable)."""

    status: Literal["scheduled"]
    id: str
    target: str
    due_at: str = Field(description="when it fires, RFC 3339 UTC (now if due or past)")
