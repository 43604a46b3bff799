"""The reschedule notice: how an instance that moved a task tells the leader, defined once.

A reschedule (NATS service or HTTP API, on any instance) changes the task's row in
PostgreSQL, then publishes this notice on core NATS; the leader (`LeaderEngine`) offers the
task to its heap at the new time, so it fires then even when the loader has already read past
that time. The notice is a hint: a lost one is caught by the leader's sweep, and a task the
notice names that is no longer pending is skipped by the claim.

The notice carries the task's heap entry, organisation included: with fair firing the heap
keeps one queue per organisation, and a task offered without its `org` would wait in the
no-organisation queue, taking that queue's turns instead of its own organisation's.

It arrives over NATS, so it is bounded before it is read (size, then every field); a notice
without `org` (from an instance older than this module) is read as a task of no organisation.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler.records import MAX_PRIORITY, TaskRef

SUBJECT = "scheduler.v1.internal.rescheduled"
MAX_BYTES = 64 * 1024  # a notice is ~100 bytes plus the org_id; a longer one is refused
_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: datetime's last millisecond


class Notice(BaseModel):
    """The notice's fields, validated strictly; fields a newer instance adds are ignored."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    # an envelope id (scheduler.messages.envelope); pydantic's (Rust) `$` is the end of the text
    # only
    id: str = Field(pattern=r"^[\x21-\x7e]{1,200}$")
    due_ms: int = Field(ge=0, le=_MAX_MS)
    priority: int = Field(ge=1, le=MAX_PRIORITY)
    seq: int = Field(ge=0, le=2**63 - 1)
    org: str | None = None


def encode(ref: TaskRef) -> bytes:
    """The notice for a task moved to `ref` (its heap entry and organisation)."""
    doc = {"id": ref.task_id, "due_ms": ref.due_ms, "priority": ref.priority, "seq": ref.seq}
    return json.dumps(doc | {"org": ref.org}).encode()


def decode(data: bytes) -> TaskRef:
    """The task a notice names; ValueError says what is wrong with it."""
    notice = validated(Notice, data, MAX_BYTES)
    return TaskRef(notice.id, notice.due_ms, notice.priority, notice.seq, notice.org or None)


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: bytes, max_bytes: int) -> M:
    """A notice's bytes as `model`, its size checked before it is parsed; ValueError names
    the first field that is wrong and why (the stored notice's too: `engine.delayed.stored`)."""
    if len(data) > max_bytes:
        raise ValueError(f"notice: {len(data)} bytes, more than {max_bytes}")
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "notice"
        raise ValueError(f"{where}: {first['msg']}") from None
