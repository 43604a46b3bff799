"""The records every layer speaks in: a task, a cron fire, the outcome of a publish, the task id.

This module imports nothing from the project (engine, store, bus and the API all import it, it
imports none of them; import-linter checks it). Records are frozen (`Advance`, a cron fire's
outcome), except those built once per task on the hot path (`TaskRef`, `NewTask`,
`ClaimedTask`, `Fired`, `PubAck`) and the two accumulators (`Claimed`, `Insertion`): slots only,
because a frozen dataclass's `__init__` costs 3-5x (0.47 us against 0.13 us measured here), paid
per task at tens of thousands of tasks a second. Nothing mutates the per-task records after
construction but the claimer, which drops a parked task's payload once sent.

Times are aware UTC datetimes at the edges and integer epoch milliseconds in the hot paths
(`to_ms`, `from_ms`, `ceil_ms`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

TaskId = str  # printable ASCII, validated at intake (scheduler.messages.envelope)

# (due_ms, priority, seq, task_id): a task's place in firing order
Entry = tuple[int, int, int, TaskId]
Key = tuple[int, int, int]

MAX_PRIORITY = 10

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def ceil_ms(dt: datetime) -> datetime:
    """Round up to the millisecond, so a task is never due before the time the producer asked."""
    micro = dt.microsecond
    if micro % 1000 == 0:
        return dt
    return dt.replace(microsecond=0) + timedelta(milliseconds=math.ceil(micro / 1000))


def to_ms(dt: datetime) -> int:
    """Epoch milliseconds, floored, in exact integer arithmetic (never rounds a time up)."""
    return (dt - _EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(slots=True)  # not frozen: built per task, and frozen init costs 5x
class TaskRef:
    """A pending task as the horizon sees it: enough to order and claim it, no payload."""

    task_id: TaskId
    due_ms: int
    priority: int
    seq: int
    org: str | None = None  # the envelope's org_id: fair firing takes due tasks by org

    @property
    def entry(self) -> Entry:
        return (self.due_ms, self.priority, self.seq, self.task_id)

    @property
    def key(self) -> Key:
        return (self.due_ms, self.priority, self.seq)


@dataclass(slots=True)  # not frozen: built per task, and frozen init costs 5x
class NewTask:
    """A validated task from the delay lane, ready to store."""

    id: TaskId
    target: str
    payload: bytes
    headers: dict[str, str]
    priority: int
    due_at: datetime
    scheduled_for: datetime
    expires_at: datetime | None
    # keyword-only, so it sorts after every positional field, subclasses' included
    org_id: str | None = field(default=None, kw_only=True)


@dataclass(slots=True)  # not frozen: built per task, and frozen init costs 5x
class ClaimedTask(NewTask):
    """A task this leader has claimed and is about to publish."""

    attempts: int
    seq: int
    doubted: bool = False  # an earlier publish went out unacknowledged: it may be stored

    @property
    def due_ms(self) -> int:
        return to_ms(self.due_at)


def firing_order(t: ClaimedTask) -> tuple[datetime, int, int]:
    return (t.due_at, t.priority, t.seq)


@dataclass(slots=True)
class Claimed:
    """Tasks a claim took, in firing order: `ready` with their payloads, `parked` (claimed
    too) past the byte budget and without them, to be fetched with `load_claimed`."""

    ready: list[ClaimedTask]
    parked: list[ClaimedTask]


@dataclass(slots=True)
class Insertion:
    """What became of a batch offered to `insert_batch`."""

    stored: list[TaskRef] = field(default_factory=list)
    # the id was stored before with the same target and bytes: an idempotent no-op
    resent: list[NewTask] = field(default_factory=list)
    # of those, the ones whose row still waits to fire, as the heap sees them (the owner of a
    # partition is told of a redelivered one: `scheduler.engine.delayed.stored`)
    resent_refs: list[TaskRef] = field(default_factory=list)
    # the id is taken by a task with another target or other bytes: `duplicate_id`
    taken: list[NewTask] = field(default_factory=list)
    # PostgreSQL refused the row itself (the error's text): `unstorable`
    refused: list[tuple[NewTask, str]] = field(default_factory=list)
    # a cancel intent awaited the task (scheduler.store.postgres.intents): stored cancelled, never
    # fired
    cancelled: list[NewTask] = field(default_factory=list)

    def extend(self, other: Insertion) -> Insertion:
        self.stored += other.stored
        self.cancelled += other.cancelled
        self.resent += other.resent
        self.resent_refs += other.resent_refs
        self.taken += other.taken
        self.refused += other.refused
        return self


@dataclass(slots=True)  # not frozen: built per task, and frozen init costs 5x
class Fired:
    """The outcome of a delivered task: where JetStream stored it, and when it went out."""

    task: ClaimedTask
    fired_at: datetime
    stream: str
    stream_seq: int


@dataclass(frozen=True, slots=True)
class Advance:
    """A cron fire's outcome: one job's cursor moving to `scheduled_for`; `fired_at` set when
    it was delivered. `earlier`: the job's other occurrences delivered in the same tick, before
    `scheduled_for` (a catch-up after a takeover or an outage), each logged as its own
    delivery: (scheduled_for, fired_at, stream, stream_seq)."""

    name: str
    subject: str
    scheduled_for: datetime
    fired_at: datetime | None = None
    stream: str | None = None
    stream_seq: int | None = None
    attempt: int = 1
    skipped: int = 0
    earlier: tuple[tuple[datetime, datetime, str | None, int | None], ...] = ()

    def deliveries(self) -> list[Advance]:
        """One entry per occurrence delivered (the earlier ones, then this one's), for the
        fire log; none when nothing was delivered."""
        if self.fired_at is None:
            return []
        before = [
            Advance(self.name, self.subject, at, fired, stream, seq, self.attempt)
            for at, fired, stream, seq in self.earlier
        ]
        return [*before, self]


@dataclass(frozen=True, slots=True)
class CronFailure:
    """A cron job stopped by a permanent publish error: the definition it failed with (its
    `fingerprint`), the error's `reason` code (`too_large`, ...) and a text naming the field."""

    name: str
    fingerprint: str
    reason: str
    error: str
    failed_at: datetime
    scheduled_for: datetime


@dataclass(slots=True)  # not frozen: built per task, and frozen init costs 5x
class PubAck:
    stream: str
    seq: int
    duplicate: bool


class PublishError(Exception):
    """A publish was not acknowledged: no stream, a JetStream error, a timeout or a lost link.

    `permanent` ones are not worth retrying; `reason` is the dead-letter reason they lead to
    (`too_large`: the message cannot fit the server's max_payload and was never sent);
    `in_doubt` ones were sent but not acknowledged: the stream may have stored them."""

    def __init__(
        self,
        subject: str,
        message: str,
        permanent: bool = False,
        reason: str = "publish_failed",
        in_doubt: bool = False,
    ) -> None:
        super().__init__(message)
        self.subject = subject
        self.permanent = permanent
        self.reason = reason
        self.in_doubt = in_doubt  # sent, but unacknowledged: the stream may have stored it


Item = tuple[str, bytes, dict[str, str]]
Outcome = PubAck | PublishError
Done = Callable[[Outcome], None]
# (subject, payload, headers or a whole header block built by the caller, called once with
# the outcome); see Wire.frame_block for what a header block must be
BatchItem = tuple[str, bytes, Mapping[str, str] | bytes, Done]
