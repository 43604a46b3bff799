"""How task rows travel between the task statements and the records: a batch's columns encoded
for one round trip, and the rows a statement returns decoded (`TaskRef`, `ClaimedTask`).
Shared by the engine's statements (scheduler.store.postgres.tasks) and the operators'
(scheduler.store.postgres.task_admin)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import asyncpg

from scheduler.records import Claimed, ClaimedTask, TaskRef, firing_order, to_ms

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


# Large batches pass text columns as one string split in SQL and instants as integer
# microseconds: asyncpg encodes a text[] element in 0.6 us and a timestamptz[] one in 1.3 us,
# a joined string in a tenth of that. The separator (ASCII unit separator) cannot occur in a
# task id (printable ASCII), a subject or a stream name; `joined` checks anyway.
SEP = "\x1f"
SEP_SQL = "chr(31)"
EPOCH_US = "'1970-01-01T00:00:00Z'::timestamptz"
ONE_US = "interval '1 microsecond'"


def joined(values: list[str]) -> str | None:
    """`values` joined by the separator, or None when one of them is empty or holds it."""
    text = SEP.join(values)
    if text.count(SEP) != len(values) - 1 or not all(values):
        return None
    return text


def micros(dt: datetime) -> int:
    """Microseconds since the epoch, exactly."""
    return (dt - _EPOCH) // _MICROSECOND


_NO_HEADERS: dict[str, str] = {}  # shared by every task without headers; never mutated


def claimed_of(rows: Iterable[asyncpg.Record]) -> Claimed:
    """The tasks of claimed rows, those with their payload `ready`, the rest `parked`, each
    list in firing order."""
    ready: list[ClaimedTask] = []
    parked: list[ClaimedTask] = []
    for r in rows:
        (ready if r["payload"] is not None else parked).append(_claimed(r))
    order = firing_order
    return Claimed(sorted(ready, key=order), sorted(parked, key=order))


def _claimed(row: asyncpg.Record) -> ClaimedTask:
    headers = row["headers"]
    payload = row["payload"] or b""
    return ClaimedTask(
        id=row["id"],
        target=row["target"],
        payload=payload if type(payload) is bytes else bytes(payload),
        headers=_NO_HEADERS if headers == "{}" else json.loads(headers),
        priority=row["priority"],
        due_at=row["due_at"],
        scheduled_for=row["scheduled_for"],
        expires_at=row["expires_at"],
        attempts=row["attempts"],
        seq=row["seq"],
        doubted=row["doubted"],
        org_id=row["org_id"],
    )


def task_ref(row: asyncpg.Record) -> TaskRef:
    return TaskRef(row["id"], to_ms(row["due_at"]), row["priority"], row["seq"], row["org_id"])
