"""The in-memory twin of the task store: `scheduler.engine.ports.TaskRepository` without SQL.

For the engine's unit tests (no server, a fake clock) and as the reference the real store is
checked against: tests/contracts/test_task_repository.py runs the same tests over this twin and
over `scheduler.store.postgres.tasks.TaskStore` on PostgreSQL, so the two cannot drift apart unseen.

It keeps the rules of the SQL: firing order (due, priority, intake sequence); a claim takes
`pending` and `in_doubt` tasks only, due within `CLAIM_WINDOW` of the store's clock, fenced by
the epoch; payloads within a byte budget (a row whose predecessors already fill it is claimed
without its payload, `parked`); bookkeeping applies only to tasks still claimed by the writer's
epoch; a cancel succeeds only on a `pending` task and answers `in_flight` for one in doubt; a
fired task's row is deleted and its id kept in `fired` (the tombstone of migration 0010: target
and bytes, so a resend of the same task is still told from another task reusing the id),
refused at intake. Each row keeps its partition, `partition_of(id, partitions)`, and each cron
job its own by name (scheduler/partitions.py). The fencing epoch is this object's `epoch`,
raised by `take_office` as `scheduler.store.postgres.epoch.take_office` raises PostgreSQL's.

A claimed row has the status `claimed` here; PostgreSQL leaves the status alone and marks the
claim by `claimed_epoch` (a HOT update, migration 0013). Both report `claimed`. As there, a
retry clears the claim's epoch but keeps its `claimed_at`, and every change of a row sets its
`updated_at` (the operators' reads show both: `scheduler.store.memory_task_reads`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.errors import FencedError
from scheduler.messages.subjects import org_of
from scheduler.partitions import partition_of
from scheduler.records import (
    Claimed,
    ClaimedTask,
    CronFailure,
    Fired,
    Insertion,
    Key,
    NewTask,
    TaskRef,
    ceil_ms,
    firing_order,
    to_ms,
)
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.intents import (
    CONTENDED,
    REFUSALS,
    TOO_MANY,
    TOO_MANY_ORG,
    TOO_MANY_TOTAL,
    IntentLimits,
)

READY = states.READY_STATUSES  # the statuses a claim takes (the rule: task_states)
CLAIM_WINDOW = timedelta(minutes=1)  # a claim takes only tasks due within this of now


@dataclass(slots=True)
class Row:
    """One task at rest, with the columns the engine's statements read and write."""

    task: NewTask
    seq: int
    created_at: datetime
    partition: int = 0
    status: str = "pending"
    attempts: int = 0
    doubted: bool = False
    claimed_epoch: int | None = None
    claimed_at: datetime | None = None
    fired_at: datetime | None = None
    stream_seq: int | None = None
    last_error: str | None = None
    updated_at: datetime | None = None  # None: unchanged since `created_at`

    @property
    def key(self) -> Key:
        return (to_ms(self.task.due_at), self.task.priority, self.seq)

    def ref(self) -> TaskRef:
        t = self.task
        return TaskRef(t.id, to_ms(t.due_at), t.priority, self.seq, t.org_id)

    def claimed(self, with_payload: bool = True) -> ClaimedTask:
        t = self.task
        return ClaimedTask(
            t.id,
            t.target,
            t.payload if with_payload else b"",
            t.headers,
            t.priority,
            t.due_at,
            t.scheduled_for,
            t.expires_at,
            self.attempts,
            self.seq,
            self.doubted,
            org_id=t.org_id,
        )


@dataclass(slots=True)
class Intent:
    """A cancel or reschedule waiting for a task still on the delay lane
    (store/postgres/intents.py)."""

    target: str
    kind: str  # cancel | reschedule
    due: datetime | None
    expires_at: datetime


@dataclass
class MemoryTaskStore:
    """Delayed tasks, the fire log and the dead letters in dictionaries."""

    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    epoch: int = 0
    partitions: int = 1  # the deployment's P
    rows: dict[str, Row] = field(default_factory=dict)
    fired: dict[str, Row] = field(default_factory=dict)  # tombstones: deleted rows, by id
    fire_log: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    intent_limits: IntentLimits = field(default_factory=IntentLimits)
    intents: dict[str, Intent] = field(default_factory=dict)  # by task id, as PostgreSQL's rows
    # task id -> (target, expires_at), as lane_notes: a note lives as long as an intent
    lane_notes: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    office: tuple[str | None, datetime | None] = (None, None)  # the last take_office's
    # the partitions the term's loader and sweep read (TaskStore.office; None: every one)
    owned: Collection[int] | None = None
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- leadership (scheduler.store.postgres.epoch)
    # ------------------------------------------------

    async def take_office(self, instance: str = "") -> int:
        """A new fencing epoch: every write fenced by an older one fails from now on."""
        self.epoch += 1
        self.office = (instance, self.now())  # who took it and when, as the leadership row
        return self.epoch

    def fence(self, epoch: int) -> None:
        """Raise FencedError unless `epoch` is the current one: every write of a leader calls
        it first, as each of PostgreSQL's runs through `scheduler.store.postgres.epoch.fenced`
        (so a `MemoryScheduleStore` sharing this office fences its writes the same way)."""
        if epoch != self.epoch:
            raise FencedError(epoch)

    async def current_epoch(self) -> int:
        return self.epoch

    # -- intake ---------------------------------------------------------------------------------

    async def _insert(self, tasks: Sequence[NewTask]) -> tuple[list[TaskRef], list[NewTask]]:
        """As TaskStore._insert: a task takes over an intent for its id, honouring it when it
        is live and names the task's target; the tasks stored cancelled come second."""
        refs, cancelled = [], []
        for t in tasks:
            if t.id in self.rows or t.id in self.fired:
                continue
            intent = self.intents.pop(t.id, None)
            live = intent is not None and intent.target == t.target and self._live(intent)
            stored = replace(t)
            if live and intent is not None and intent.kind == "reschedule" and intent.due:
                stored.due_at = stored.scheduled_for = intent.due
            partition = partition_of(t.id, self.partitions)
            row = self.rows[t.id] = Row(stored, next(self._seq), self.now(), partition)
            if live and intent is not None and intent.kind == "cancel":
                row.status = "cancelled"
                cancelled.append(t)
            else:
                refs.append(row.ref())
        return refs, cancelled

    def _live(self, intent: Intent) -> bool:
        return intent.expires_at > self.now()

    async def insert_batch(self, tasks: Sequence[NewTask]) -> Insertion:
        refs, cancelled = await self._insert(tasks)
        result = Insertion(stored=refs, cancelled=cancelled)
        fresh = {r.task_id for r in refs} | {t.id for t in cancelled}
        for t in tasks:
            if t.id in fresh:
                fresh.discard(t.id)
                continue
            row = self.rows.get(t.id)
            kept = (row or self.fired[t.id]).task
            same = kept.target == t.target and kept.payload == t.payload
            (result.resent if same else result.taken).append(t)
            if same and row is not None and row.status == "pending":
                result.resent_refs.append(row.ref())
        return result

    async def record_bad_intake(self, rows: Sequence[dict[str, Any]]) -> None:
        seen = {d.get("key") for d in self.dead_letters if d.get("key") is not None}
        for r in rows:
            if r.get("key") is None or r["key"] not in seen:
                self.dead_letters.append({**r, "stage": "intake"})
                seen.add(r.get("key"))

    # -- loading --------------------------------------------------------------------------------

    def _ready(self) -> list[Row]:
        return sorted((r for r in self.rows.values() if r.status in READY), key=lambda r: r.key)

    async def load_page(
        self, after: Key, until: datetime, limit: int, partitions: Collection[int] | None = None
    ) -> list[TaskRef]:
        rows = self._of(partitions if partitions is not None else self.owned)
        return [r.ref() for r in rows if r.key > after and r.task.due_at <= until][:limit]

    async def overdue(self, before: datetime, limit: int) -> list[TaskRef]:
        return [r.ref() for r in self._of(self.owned) if r.task.due_at < before][:limit]

    def _of(self, partitions: Collection[int] | None) -> list[Row]:
        """The ready rows of `partitions` (every one when None), in firing order."""
        ready = self._ready()
        if partitions is None:
            return ready
        return [r for r in ready if partition_of(r.task.id, self.partitions) in partitions]

    async def pending_count(self) -> int:
        return len(self._ready())

    async def pending_by_org(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for r in self.rows.values():
            if r.status in (*READY, "claimed"):
                counts[r.task.org_id] = counts.get(r.task.org_id, 0) + 1
        return counts

    async def analyze_if_stale(self, min_rows: int = 0) -> bool:
        return False  # no planner statistics to refresh

    # -- claims ---------------------------------------------------------------------------------

    @staticmethod
    def _budgeted(rows: list[Row], budget: int) -> Claimed:
        """Rows in firing order with payloads while the bytes before each stay under budget."""
        ready: list[ClaimedTask] = []
        parked: list[ClaimedTask] = []
        run = 0
        for row in sorted(rows, key=lambda r: r.key):
            size = len(row.task.payload)
            run += size
            if run - size < budget:
                ready.append(row.claimed())
            else:
                parked.append(row.claimed(with_payload=False))
        return Claimed(sorted(ready, key=firing_order), sorted(parked, key=firing_order))

    async def claim_within(
        self, epoch: int, ids: Sequence[str], until: datetime, budget: int
    ) -> Claimed:
        self.fence(epoch)
        taken = []
        until = min(until, self.now() + CLAIM_WINDOW)
        for task_id in dict.fromkeys(ids):
            row = self.rows.get(task_id)
            if row is None or row.status not in READY or row.task.due_at > until:
                continue
            row.status, row.claimed_epoch, row.claimed_at = "claimed", epoch, self.now()
            row.updated_at = row.claimed_at
            row.attempts += 1
            taken.append(row)
        return self._budgeted(taken, budget)

    async def reclaim_orphans(
        self,
        epoch: int,
        stale: timedelta | None = None,
        limit: int = 1000,
        budget: int = 2**62,
        partitions: Collection[int] | None = None,
    ) -> Claimed:
        self.fence(epoch)
        now = self.now()
        picked = [
            r
            for r in sorted(self.rows.values(), key=lambda r: r.key)
            if r.status == "claimed"
            and (partitions is None or partition_of(r.task.id, self.partitions) in partitions)
            and (
                r.claimed_epoch != epoch
                or (stale is not None and r.claimed_at is not None and r.claimed_at < now - stale)
            )
        ][:limit]
        for row in picked:
            row.claimed_epoch, row.claimed_at, row.updated_at = epoch, now, now
        return self._budgeted(picked, budget)

    async def load_claimed(self, epoch: int, ids: Sequence[str], budget: int) -> Claimed:
        rows = [
            r
            for r in (self.rows.get(i) for i in dict.fromkeys(ids))
            if r is not None and r.status == "claimed" and r.claimed_epoch == epoch
        ]
        return self._budgeted(rows, budget)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _mine(self, epoch: int, task_id: str) -> Row | None:
        row = self.rows.get(task_id)
        if row is None or row.status != "claimed" or row.claimed_epoch != epoch:
            return None
        return row

    async def mark_fired(self, epoch: int, fired: Sequence[Fired], instance: str) -> None:
        if not fired:
            return
        self.fence(epoch)
        for f in fired:
            row = self._mine(epoch, f.task.id)
            if row is None:
                continue
            row.status, row.fired_at, row.stream_seq = "fired", f.fired_at, f.stream_seq
            self.fired[f.task.id] = self.rows.pop(f.task.id)
            entry = {
                "kind": "delayed",
                "key": f.task.id,
                "subject": f.task.target,
                "scheduled_for": f.task.scheduled_for,
                "fired_at": f.fired_at,
                "attempt": f.task.attempts,
                "epoch": epoch,
                "instance": instance,
                "stream": f.stream,
                "stream_seq": f.stream_seq,
            }
            if entry not in self.fire_log:  # the unique index fire_log_once
                self.fire_log.append(entry)

    async def retry_later(
        self, epoch: int, items: Sequence[tuple[ClaimedTask, datetime, str, bool]]
    ) -> None:
        if not items:
            return
        self.fence(epoch)
        for task, due, error, doubt in items:
            row = self._mine(epoch, task.id)
            if row is None:
                continue
            row.doubted = row.doubted or doubt
            row.status = "in_doubt" if row.doubted else "pending"
            row.task.due_at, row.last_error = due, error
            row.claimed_epoch, row.updated_at = None, self.now()  # claimed_at stays, as in SQL

    async def expire(self, epoch: int, ids: Sequence[str]) -> None:
        if not ids:
            return
        self.fence(epoch)
        for task_id in ids:
            row = self._mine(epoch, task_id)
            if row is not None:
                row.status, row.updated_at = "expired", self.now()

    async def kill(self, epoch: int, items: Sequence[tuple[ClaimedTask, str, str]]) -> None:
        if not items:
            return
        self.fence(epoch)
        for task, error, reason in items:
            row = self._mine(epoch, task.id)
            if row is None:
                continue
            row.status, row.last_error, row.updated_at = "dead", error, self.now()
            self.dead_letters.append(
                {"original_id": task.id, "reason": reason, "error": error, "stage": "firing"}
            )

    def status(self, task_id: str) -> str | None:
        """A task's status, `fired` from its tombstone; None when unknown (for tests)."""
        row = self.rows.get(task_id) or self.fired.get(task_id)
        return None if row is None else row.status

    # -- the API's calls ------------------------------------------------------------------------

    def _answer_status(self, task_id: str, target: str) -> str | None:
        row = self.rows.get(task_id) or self.fired.get(task_id)
        if row is None or row.task.target != target:
            return None
        return "in_doubt" if row.status == "claimed" and row.doubted else row.status

    async def cancel(self, task_id: str, target: str) -> str:
        row = self.rows.get(task_id)
        if row is not None and row.task.target == target and row.status == "pending":
            row.status, row.updated_at = "cancelled", self.now()
            return "cancelled"
        status = self._answer_status(task_id, target)
        if status is None:
            status = self._intend(task_id, target, "cancel", None)
        if status == "cancelled":
            return "cancelled"
        if status in (CONTENDED, *REFUSALS):
            return status
        return {None: "not_found", "in_doubt": "in_flight"}.get(status, "too_late")

    def _intend(self, task_id: str, target: str, kind: str, due: datetime | None) -> str | None:
        """Record (or renew) an intent for an id with no row of `target`, as
        scheduler.store.postgres.intents does: `cancelled`/`rescheduled`, or why not."""
        if task_id in self.rows or task_id in self.fired:
            return None  # another target's task or tombstone holds the id
        held = self.intents.get(task_id)
        if held is not None and held.target != target:
            return CONTENDED if self._live(held) else None
        if held is not None and kind == "reschedule" and held.kind == "cancel":
            if self._live(held):
                return "too_late"  # a live cancel is never turned into a reschedule
        if held is None:
            refused = self._at_limit(target)
            if refused is not None:
                return refused
        expires = self.now() + self.intent_limits.ttl
        self.intents[task_id] = Intent(target, kind, due, expires)
        return "cancelled" if kind == "cancel" else "rescheduled"

    def _at_limit(self, target: str) -> str | None:
        """The refusal of one more intent of `target` past a bound (intents.at_limit)."""
        live = [i.target for i in self.intents.values() if self._live(i)]
        org, limits = org_of(target), self.intent_limits
        if live.count(target) >= limits.max_per_target:
            return TOO_MANY
        if org is not None and [org_of(t) for t in live].count(org) >= limits.max_per_org:
            return TOO_MANY_ORG
        return TOO_MANY_TOTAL if len(live) >= limits.max_total else None

    async def note_lane(self, task_id: str, target: str) -> None:
        self.lane_notes[task_id] = (target, self.now() + self.intent_limits.ttl)

    async def lane_target(self, task_id: str) -> str | None:
        target, expires_at = self.lane_notes.get(task_id, (None, self.now()))
        return target if expires_at > self.now() else None

    async def reschedule(
        self, task_id: str, target: str, due: datetime
    ) -> tuple[str, TaskRef | None]:
        due = ceil_ms(due)
        row = self.rows.get(task_id)
        if row is not None and row.task.target == target and row.status == "pending":
            row.task.due_at = row.task.scheduled_for = due
            row.updated_at = self.now()
            return "rescheduled", row.ref()
        status = self._answer_status(task_id, target)
        if status is None:
            status = self._intend(task_id, target, "reschedule", due)
        if status in ("rescheduled", CONTENDED, *REFUSALS):
            return str(status), None
        return {None: "not_found", "in_doubt": "in_flight"}.get(status, "too_late"), None

    async def get(self, task_id: str, target: str | None = None) -> dict[str, Any] | None:
        row = self.rows.get(task_id) or self.fired.get(task_id)
        if row is None or (target is not None and row.task.target != target):
            return None
        t = row.task
        if row.status == "fired":  # only the tombstone and the fire log are left
            return {
                "id": t.id,
                "target": t.target,
                "status": "fired",
                "priority": None,
                "due_at": t.scheduled_for,
                "scheduled_for": t.scheduled_for,
                "expires_at": None,
                "attempts": row.attempts,
                "fired_at": row.fired_at,
                "stream_seq": row.stream_seq,
                "last_error": None,
                "created_at": None,
            }
        return {
            "id": t.id,
            "target": t.target,
            "status": row.status,
            "priority": t.priority,
            "due_at": t.due_at,
            "scheduled_for": t.scheduled_for,
            "expires_at": t.expires_at,
            "attempts": row.attempts,
            "fired_at": row.fired_at,
            "stream_seq": row.stream_seq,
            "last_error": row.last_error,
            "created_at": row.created_at,
        }


@dataclass
class MemoryScheduleStore:
    """The twin of `scheduler.store.postgres.cron_jobs.ScheduleStore` (the engine's
    `ScheduleRepository`): jobs by name and fingerprint, cursors, the cron fire log. Its
    `epoch` fences `advance` as PostgreSQL's does; share a `MemoryTaskStore`'s by `office`."""

    office: MemoryTaskStore = field(default_factory=MemoryTaskStore)
    partitions: int = 1  # the deployment's P
    fingerprints: dict[str, str] = field(default_factory=dict)  # active jobs
    job_partitions: dict[str, int] = field(default_factory=dict)  # by name, as synced
    paused: set[str] = field(default_factory=set)  # by an operator
    state: dict[str, datetime] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    fire_log: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, CronFailure] = field(default_factory=dict)  # of active jobs

    async def sync(self, jobs: Sequence[Any], at: datetime | None = None) -> tuple[int, int]:
        wanted = {j.name: j.fingerprint() for j in jobs}
        changed = [n for n, f in wanted.items() if self.fingerprints.get(n) != f]
        removed = [n for n in self.fingerprints if n not in wanted]
        self.fingerprints = wanted
        for name in changed:
            self.failures.pop(name, None)
            self.job_partitions[name] = partition_of(name, self.partitions)
        return len(changed), len(removed)

    async def fail(self, epoch: int, failures: Sequence[CronFailure]) -> None:
        if not failures:
            return
        self.office.fence(epoch)
        for f in failures:
            if self.fingerprints.get(f.name) == f.fingerprint:
                self.failures[f.name] = f

    async def failed(self) -> frozenset[str]:
        return frozenset(n for n in self.failures if n in self.fingerprints)

    async def set_paused(self, name: str, who: str | None) -> bool:
        """The operator's pause (`who`) or resume (None, which also clears a failed mark)."""
        if name not in self.fingerprints:
            return False
        if who is None:
            self.paused.discard(name)
            self.failures.pop(name, None)
        else:
            self.paused.add(name)
        return True

    async def operator_paused(self) -> frozenset[str]:
        return frozenset(self.paused)

    async def cursors(self) -> dict[str, datetime]:
        return dict(self.state)

    async def advance(self, epoch: int, moves: Sequence[Any], instance: str) -> None:
        if not moves:
            return
        self.office.fence(epoch)
        for m in moves:
            self.state[m.name] = max(self.state.get(m.name, m.scheduled_for), m.scheduled_for)
            self.skipped[m.name] = self.skipped.get(m.name, 0) + m.skipped
            for d in m.deliveries():
                entry = {
                    "kind": "cron",
                    "key": d.name,
                    "subject": d.subject,
                    "scheduled_for": d.scheduled_for,
                    "fired_at": d.fired_at,
                    "attempt": d.attempt,
                    "epoch": epoch,
                    "instance": instance,
                    "stream": d.stream,
                    "stream_seq": d.stream_seq,
                }
                if entry not in self.fire_log:
                    self.fire_log.append(entry)
