"""NATS protocol bytes, as pure functions: the `HPUB` frame, the delivery header block, KV subjects.

Written once here and used by the wire (`scheduler.bus.nats.wire`), the publisher and its in-memory
twin (`scheduler.bus.memory`); the engine hands the broker tasks and ids, never headers or
frames, so no engine module spells a protocol byte. Nothing here imports
nats-py or does I/O.
"""

from __future__ import annotations

from scheduler.clock import to_rfc3339
from scheduler.records import ClaimedTask

HEADER_LINE = b"NATS/1.0\r\n"

# Where a prepared message's firing time goes until it is known: never a real firing time, and
# as long as every time `to_rfc3339` writes, so a frame built around it keeps its sizes.
FIRED_AT_PLACEHOLDER = b"1999-12-31T23:59:59.999Z"

# The delivery headers of a task without producer headers (docs/producers.md, "What arrives at
# the target"), in one format operation: Nats-Msg-Id (the task id), Mq-Scheduled-For,
# Mq-Fired-At, Mq-Attempt.
DELIVERY_BLOCK = (
    b"NATS/1.0\r\nNats-Msg-Id: %s\r\nMq-Scheduled-For: %s\r\nMq-Fired-At: %s\r\n"
    b"Mq-Attempt: %d\r\n\r\n"
)


def hpub(subject: str, payload: bytes, reply: str, hdr: bytes) -> bytes:
    """The `HPUB` frame of one message with the header block `hdr` (`NATS/1.0` lines)."""
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
        subject.encode(),
        reply.encode(),
        len(hdr),
        len(hdr) + len(payload),
        hdr,
        payload,
    )


def delivery_block(task_id: bytes, scheduled_for: bytes, fired_at: bytes, attempt: int) -> bytes:
    """The header block of a delivered task that has no producer headers; `task_id` must be
    printable ASCII (it becomes the `Nats-Msg-Id`)."""
    return DELIVERY_BLOCK % (task_id, scheduled_for, fired_at, attempt)


def delivery_headers(task: ClaimedTask, fired_at: str, fired_at_b: bytes) -> dict[str, str] | bytes:
    """The delivery's headers (docs/producers.md, "What arrives at the target"): the producer's,
    then ours (`Nats-Msg-Id` = the task id, `Mq-Scheduled-For`, `Mq-Fired-At`, `Mq-Attempt`).
    A task without producer headers whose id is plain printable ASCII gets its header block
    built in one step; the rest go through the generic checks of `Wire.frame`."""
    tid = task.id
    if not task.headers and tid.isascii() and tid.isprintable():
        scheduled_for = to_rfc3339(task.scheduled_for).encode()
        return delivery_block(tid.encode(), scheduled_for, fired_at_b, task.attempts)
    return {
        **task.headers,
        "Nats-Msg-Id": tid,
        "Mq-Scheduled-For": to_rfc3339(task.scheduled_for),
        "Mq-Fired-At": fired_at,
        "Mq-Attempt": str(task.attempts),
    }


def kv_subject(bucket: str, key: str) -> str:
    """The subject a publish to key `key` of KV bucket `bucket` goes to (a KV put)."""
    return f"$KV.{bucket}.{key}"
