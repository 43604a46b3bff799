"""The operator half's ports to PostgreSQL: what `scheduler.operations` and the API read and
write, documented once here, with the values they take and return.

The operator half (`scheduler.operations`, `scheduler.api`, `scheduler.console`) imports
nothing from `scheduler.store` (import-linter checks it: pyproject.toml). The daemon gives it
the PostgreSQL stores (`scheduler.daemon.operations`), whose SQL lives in
`scheduler.store.postgres`; tests give it the in-memory twins (`scheduler.store.memory*`, one
for every port here). tests/contracts/conformance.py holds each store and twin to its port under
mypy; each port has one contract suite in tests/contracts/ run over both.

Rows that the operator half turns into its read models (`scheduler.operations.*_records`)
cross these ports as `dict[str, Any]` with the columns the read model validates.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from scheduler.records import Advance, TaskRef

# The forecast's windows, in order: label and how far ahead of now (`Statistics.forecast`).
WINDOWS: tuple[tuple[str, timedelta], ...] = (
    ("1m", timedelta(minutes=1)),
    ("5m", timedelta(minutes=5)),
    ("15m", timedelta(minutes=15)),
    ("1h", timedelta(hours=1)),
)

# PostgreSQL's clock asked once: (sent, theirs, back): this host's clock before the question,
# the database's answer, this host's clock after. Raises OSError or TimeoutError unanswered.
DatabaseTime = Callable[[], Awaitable[tuple[datetime, datetime, datetime]]]


# -- delayed tasks ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which delayed tasks to list; None means any."""

    subject: str | None = None
    org_id: str | None = None
    status: str | None = None
    due_before: datetime | None = None
    due_after: datetime | None = None


class Listed(NamedTuple):
    """One task of a listing: its JSON text and its sort key (the cursor's parts: due time in
    microseconds, priority, intake sequence for a held task; fired time and id for a fired one)."""

    doc: str
    key: tuple[Any, ...]


class TaskControl(Protocol):
    """An operator's changes to delayed tasks, and the lookups they need.

    A change never races the leader: a task the leader has claimed is `too_late` (or
    `in_flight` while its acknowledgement is outstanding), and a task not yet taken off the
    delay lane gets an intent the intake honours."""

    async def cancel(self, task_id: str, target: str) -> str:
        """`cancelled`, `in_flight`, `too_late`, `not_found`, `id_contended` or
        `too_many_intents...` (nothing changed but on `cancelled`)."""
        ...

    async def reschedule(
        self, task_id: str, target: str, due: datetime
    ) -> tuple[str, TaskRef | None]:
        """Move a pending task to `due`: `rescheduled` with its heap ref (no ref for an intent
        on a task still on the lane), or why not, as `cancel` answers."""
        ...

    async def note_lane(self, task_id: str, target: str) -> None:
        """Note, before a task is published to the delay lane, that it goes to `target`."""
        ...

    async def lane_target(self, task_id: str) -> str | None:
        """The target `note_lane` noted for `task_id` (while its intent may live), or None."""
        ...

    async def get(self, task_id: str, target: str | None = None) -> dict[str, Any] | None:
        """A task's state (no payload bytes), fired ones included; None when unknown or on
        another target."""
        ...


# -- the overview: listings and statistics ------------------------------------------------------
class TaskReads(Protocol):
    """The operators' reads of delayed tasks: listings in firing order and one task."""

    async def tasks(
        self, where: TaskFilter, after: tuple[datetime, int, int] | None, limit: int
    ) -> list[Listed]:
        """Held tasks in firing order (due, priority, intake sequence) after the key `after`."""
        ...

    async def fired(
        self, where: TaskFilter, after: tuple[datetime, str] | None, limit: int
    ) -> list[Listed]:
        """Fired tasks in the order they fired (fired time, then id) after the key `after`."""
        ...

    async def task(self, task_id: str) -> dict[str, Any] | None:
        """One task with its envelope bytes, headers and deliveries, read in one snapshot."""
        ...


class ScheduleReads(Protocol):
    """The operators' reads of cron jobs as synced from YAML, with their operator pauses,
    failed marks, cursors and fire log. Each row: `name`, `definition` (the job as a dict),
    `file`, `line`, `active`, `paused_at`, `paused_by`, `pause_note`, `failed_at`,
    `failed_reason`, `failed_error`, `updated_at`, and the cursor's `last_scheduled_for`,
    `last_fired_at`, `skipped` (None before the job's first occurrence)."""

    async def schedules(
        self, active: bool | None, after: str | None, limit: int
    ) -> list[dict[str, Any]]:
        """Cron jobs by name after `after`, with their cursors and operator pauses."""
        ...

    async def schedule(self, name: str) -> dict[str, Any] | None:
        """One cron job as `schedules` lists it, or None."""
        ...

    async def fires(self, name: str, limit: int) -> list[dict[str, Any]]:
        """A cron job's latest deliveries, newest first: `scheduled_for`, `fired_at`,
        `attempt`, `epoch`, `instance`, `stream`, `stream_seq`, `manual`."""
        ...


class Statistics(Protocol):
    """What `/v1/stats` and the history read besides the fire log: pending tasks, the
    forecast, recent lateness, leadership."""

    async def forecast(self, now: datetime) -> dict[str, list[int]]:
        """Pending tasks per subject due by now + each of `WINDOWS` (in that order)."""
        ...

    async def pending_by_subject(self, top: int) -> tuple[int, list[tuple[str, int]]]:
        """All pending tasks (not claimed), and the `top` subjects holding most of them."""
        ...

    async def lateness(self, since: datetime) -> tuple[int, float | None, float | None]:
        """Deliveries since `since` and their lateness p50 and p99 in milliseconds."""
        ...

    async def leadership(self) -> dict[str, Any]:
        """The fencing epoch and who took it last: `{epoch, instance, since}`."""
        ...


@dataclass(frozen=True, slots=True)
class Window:
    """What to read: [since, until) in buckets of `bucket`, at most `cap` rows per table."""

    since: datetime
    until: datetime
    bucket: timedelta
    cap: int
    abnormal_ms: float
    job: str | None = None


class FireHistory(Protocol):
    """The fire log's figures over a window (`scheduler.operations.history` shapes them)."""

    async def read(self, window: Window) -> dict[str, Any]:
        """`deliveries`, `oldest`, `p50`, `p99`, `max`, `buckets`, `epochs`, `worst`, and
        `dead` (dead letters per bucket; None for one job's window)."""
        ...


# -- cron jobs ----------------------------------------------------------------------------------
class ScheduleControl(Protocol):
    """An operator's changes to cron jobs: pauses, and the fire-log rows of manual triggers."""

    async def set_paused(self, name: str, who: str | None, note: str | None = None) -> bool:
        """Pause a job for `who` with `note`, or resume it (`who` None); False when no job
        has that name."""
        ...

    async def log_manual_intent(self, name: str, subject: str, at: datetime, instance: str) -> None:
        """A manual trigger's fire-log row, written once per (job, `at`) before its publish."""
        ...

    async def confirm_manual_fire(self, fire: Advance) -> None:
        """The trigger's acknowledgement (stream, sequence, time) on its row, once."""
        ...

    async def settle_duplicate_fire(self, fire: Advance) -> None:
        """A trigger's publish came back a duplicate: its row goes when an earlier row holds
        that stream sequence, else it is confirmed."""
        ...

    async def forget_manual_intent(self, name: str, at: datetime) -> None:
        """Delete the unconfirmed row of a trigger whose publish was refused."""
        ...


class BackfillLog(Protocol):
    """The claims that make each backfilled occurrence fire once: claim before the publish,
    confirm after its acknowledgement, release when it was refused."""

    async def fired(self, name: str, occurrences: Sequence[datetime]) -> set[datetime]:
        """Which of `occurrences` the job has in its fire log already."""
        ...

    async def claim(
        self,
        name: str,
        occurrences: Sequence[datetime],
        msg_ids: Sequence[str],
        instance: str,
        now: datetime,
        stale_before: datetime,
    ) -> set[datetime]:
        """The occurrences claimed now (free ones, or unconfirmed claims older than
        `stale_before`)."""
        ...

    async def confirm(
        self,
        name: str,
        subject: str,
        occurrence: datetime,
        fired_at: datetime,
        stream: str,
        seq: int,
        instance: str,
    ) -> None:
        """The claim confirmed and its manual fire-log row written, once."""
        ...

    async def release(self, name: str, occurrences: Sequence[datetime]) -> None:
        """Give up unconfirmed claims (their publish was refused)."""
        ...


# -- dead letters -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters to list or replay; None means any. `subject` is exact, or a prefix
    when it ends in `.>`; it matches the target (or the subject when there is none) or the
    subject."""

    reason: str | None = None
    subject: str | None = None
    stage: str | None = None
    resolved: bool | None = None


@dataclass(frozen=True, slots=True)
class Requeued:
    """What a replay did: the task back in `pending` (with its heap ref), or why not."""

    status: str  # "replayed" | "already_replayed" | "not_dead" | "missing_task"
    ref: TaskRef | None = None
    task_status: str | None = None


class DeadLetters(Protocol):
    """Dead letters for operators: list, look up, resolve, and the replay's transitions.

    A dead letter is replayed at most once: `replayed_at` set by `requeue` or `mark_replayed`
    (which also resolve it, by `"<who> (replay)"`) and cleared only by `unmark_replayed`."""

    async def list(
        self, where: DeadLetterFilter, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[dict[str, Any]]:
        """Newest first (last failure, then id), `limit` rows after the key `after`."""
        ...

    async def get(self, dead_id: uuid.UUID) -> dict[str, Any] | None:
        """One dead letter with its payload (parsed), headers and raw bytes, or None."""
        ...

    async def resolve(self, dead_id: uuid.UUID, resolved: bool, who: str) -> dict[str, Any] | None:
        """Mark resolved by `who` (or open again, forgetting who); None when unknown."""
        ...

    async def requeue(self, dead_id: uuid.UUID, task_id: str, due: datetime, who: str) -> Requeued:
        """Replay a firing-stage dead letter: its task, only while still `dead`, back to
        pending due at `due` with attempts from zero, in one transaction with the mark."""
        ...

    async def mark_replayed(self, dead_id: uuid.UUID, who: str) -> bool:
        """Claim the replay (False when it was replayed already)."""
        ...

    async def unmark_replayed(self, dead_id: uuid.UUID) -> None:
        """Undo `mark_replayed` when the replay could not be sent (it is open again)."""
        ...

    async def unresolved(self) -> int:
        """How many dead letters nobody has resolved yet."""
        ...


# -- the activity log ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Activity:
    """One operator action as recorded (every text already bounded by the caller)."""

    at: datetime
    who: str
    via: str  # "api" or "console"
    session: str | None
    action: str
    route: str
    target: str
    detail: dict[str, Any]
    http_status: int
    outcome: str
    request_id: str
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class ActivityFilter:
    action: str | None = None
    target: str | None = None
    who: str | None = None  # a prefix: `admin` matches `admin@10.0.0.7`
    since: datetime | None = None  # at or after
    until: datetime | None = None  # strictly before


class ActivityLog(Protocol):
    """Operator actions, each given an increasing `id` when recorded, listed newest first by
    (`at`, `id`)."""

    async def record(self, row: Activity) -> None:
        """Keep `row`."""
        ...

    async def list(
        self, where: ActivityFilter, after: tuple[datetime, int] | None, limit: int
    ) -> list[dict[str, Any]]:
        """Up to `limit` rows matching `where`, newest first, strictly after the key `after`
        (`at`, `id`): each the fields of `Activity` plus its `id`."""
        ...

    async def prune(self, before: datetime, batch: int) -> int:
        """Delete up to `batch` rows recorded before `before`, oldest first; how many."""
        ...

    async def prune_over(self, keep: int, batch: int) -> int:
        """Delete up to `batch` of the rows older than the newest `keep`, oldest first; how
        many."""
        ...


# -- idempotency keys ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KeyUse:
    """One request's use of a key: who (scope), the key, what it asks (route, target) and a
    hash of the whole request (method, route, target, body)."""

    scope: str
    key: str
    route: str
    target: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Claim:
    """The key is this request's to run: `first_at` is when its first request began."""

    use: KeyUse
    owner: uuid.UUID
    first_at: datetime


@dataclass(frozen=True, slots=True)
class Recorded:
    """The key's row as another request left it."""

    route: str
    target: str
    fingerprint: str
    state: str  # "running" or "done"
    locked_until: datetime
    status: int | None
    media_type: str | None
    body: bytes | None


class IdempotencyKeys(Protocol):
    """The first answer of each write sent with an `Idempotency-Key`, per (scope, key).

    Exactly one of concurrent claims of a key owns it. A key is free again once it expired
    (`keep` after its first claim), and a `running` key whose lock passed (its request
    stopped without an answer) may be taken over by a request with the same fingerprint,
    keeping its `first_at`."""

    max_keys: int | None  # how many keys `prune` keeps at most; None: bounded by age only

    async def claim(
        self, use: KeyUse, now: datetime, lock: timedelta, keep: timedelta
    ) -> Claim | Recorded:
        """Own `use.key` (a Claim, `running` and locked until `now + lock`), or the row
        another request left (Recorded)."""
        ...

    async def finish(self, claim: Claim, status: int, media_type: str, body: bytes) -> None:
        """Store the answer of the claim's request (`done`; nothing if another request took
        the key over)."""
        ...

    async def release(self, claim: Claim, now: datetime) -> None:
        """The request ended without an answer to keep: a retry may take the key at once."""
        ...

    async def prune(self, now: datetime) -> int:
        """Delete the keys expired by `now`, then the soonest to expire past `max_keys` (never
        a `running` one); how many."""
        ...
