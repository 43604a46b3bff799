"""The stored notice: how an engine that stored tasks of partitions it does not own tells their
owners at once (P > 1), defined once.

Intake runs on every engine (the lane's durable consumer is shared), so a task may be stored by
an engine that does not own its partition. If it falls due inside the owner's loaded horizon
(its key at or before the owner's loader cursor), the owner's loader will never read it, and
only its sweep would find it, overdue. So after each intake batch commits, the storing engine
publishes, on core NATS, one notice per partition it does not own holding the batch's tasks of
that partition due within the horizon (`StoredNotices.send`); each engine's term subscribes to
the subjects of its own partitions (`subject`) and offers what a notice names to its horizon
(`Horizon.offer_all`: only inside the loaded range, only its own partitions).

A notice carries the tasks' heap entries (id, due ms, priority, intake sequence, organisation),
exactly as the insert returned them, so the owner puts them on its heap without asking
PostgreSQL, which is the fleet's limit (docs/leadership.md, "Partitions": why not ids read back
by id, and why a subject per partition). It is a hint: a lost notice is caught by the owner's
sweep, and a task it names that is no longer pending (or not due at that time) is skipped by
the claim, which reads the row.

It arrives over NATS, so it is bounded before it is read (size, count, then every field), and a
bad one is logged and dropped; under P = 1 no notice is ever sent (the one engine owns every
task).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from scheduler.engine.delayed.rescheduled import validated
from scheduler.partitions import MAX_PARTITIONS, partition_of
from scheduler.records import MAX_PRIORITY, TaskRef

log = logging.getLogger(__name__)

SUBJECT_PREFIX = "scheduler.v1.internal.stored"
MAX_BYTES = 64 * 1024  # a notice's payload at most; more tasks go in the next one
MAX_TASKS = 500  # a notice's tasks at most (~70 bytes each with a 26-character id)
# A task due up to this much past the sender's now + horizon is noticed too: the owner's clock
# may run a little ahead of the sender's (its loader's cursor with it).
SKEW_MARGIN_MS = 1_000
MAX_ORG = 256  # characters of a noticed task's org_id; a task with a longer one is not noticed
_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: datetime's last millisecond

TaskId = Annotated[str, Field(pattern=r"^[\x21-\x7e]{1,200}$")]  # an envelope id
Entry = tuple[
    TaskId,
    Annotated[int, Field(ge=0, le=_MAX_MS)],
    Annotated[int, Field(ge=1, le=MAX_PRIORITY)],
    Annotated[int, Field(ge=0, le=2**63 - 1)],
    Annotated[str, Field(max_length=MAX_ORG)] | None,
]


class Notice(BaseModel):
    """The notice's fields, validated strictly; fields a newer engine adds are ignored."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    p: int = Field(ge=0, lt=MAX_PARTITIONS)
    tasks: list[Entry] = Field(min_length=1, max_length=MAX_TASKS)


def subject(partition: int) -> str:
    """The subject of `partition`'s notices (its owner subscribes to it)."""
    return f"{SUBJECT_PREFIX}.{partition}"


def encode(partition: int, refs: Sequence[TaskRef]) -> list[bytes]:
    """The notices for `refs` (all of `partition`): as few as `MAX_TASKS` and `MAX_BYTES`
    allow, in order."""
    out: list[bytes] = []
    rows: list[str] = []
    size = 0
    head = f'{{"p":{partition},"tasks":['
    for ref in refs:
        row = json.dumps([ref.task_id, ref.due_ms, ref.priority, ref.seq, ref.org])
        if rows and (len(rows) >= MAX_TASKS or len(head) + size + len(row) + 2 > MAX_BYTES):
            out.append(f"{head}{','.join(rows)}]}}".encode())
            rows, size = [], 0
        rows.append(row)
        size += len(row) + 1
    if rows:
        out.append(f"{head}{','.join(rows)}]}}".encode())
    return out


def decode(data: bytes) -> tuple[int, list[TaskRef]]:
    """The partition and the tasks a notice names; ValueError says what is wrong with it."""
    notice = validated(Notice, data, MAX_BYTES)
    return notice.p, [
        TaskRef(i, due, prio, s, org or None) for i, due, prio, s, org in notice.tasks
    ]


def due_soon(refs: Iterable[TaskRef], until_ms: int) -> list[TaskRef]:
    """The tasks due by `until_ms` (+ `SKEW_MARGIN_MS`): the only ones an owner's loaded
    horizon may have passed already."""
    bound = until_ms + SKEW_MARGIN_MS
    return [r for r in refs if r.due_ms <= bound]


class StoredNotices:
    """The storing side: `send` the notices of a committed batch's tasks to their owners."""

    def __init__(
        self,
        notify: Callable[[str, bytes], Awaitable[None]],
        partitions: int,
        owns: Callable[[str], bool],
    ) -> None:
        self._notify = notify
        self._count = partitions
        self.owns = owns  # this engine's tasks (a term that grows owns more)
        self.sent = 0  # notices sent over the term (for tests and the log)

    async def send(self, refs: Sequence[TaskRef], until_ms: int) -> None:
        """Notify the owners of the tasks among `refs` this engine does not own and that
        fall due by `until_ms` (its now + horizon); a notice that cannot be sent is logged
        (the owner's sweep finds its tasks)."""
        by_partition: dict[int, list[TaskRef]] = {}
        for ref in due_soon(refs, until_ms):
            if not self.owns(ref.task_id) and len(ref.org or "") <= MAX_ORG:
                by_partition.setdefault(partition_of(ref.task_id, self._count), []).append(ref)
        for p, group in by_partition.items():
            for data in encode(p, group):
                try:
                    await self._notify(subject(p), data)
                except Exception as exc:  # the link is down: the owner's sweep covers them
                    log.warning("intake.notice_failed p=%d tasks=%d error=%r", p, len(group), exc)
                    return
                self.sent += 1
