"""Delayed tasks in PostgreSQL, the operators' statements: cancel, reschedule, a task's state
(the API, the CLI and producers over NATS, through scheduler.operations), and the purge of
finished tasks (the daemon's upkeep). The engine's statements are scheduler.store.postgres.tasks.

A task whose publish went out but was never acknowledged is `in_doubt`: JetStream may hold it.
It is due again after a backoff (the leader republishes it with the same `Nats-Msg-Id`, which
the target stream's duplicate window drops if it was stored), and until then a cancel or a
reschedule answers `in_flight`, never `cancelled`: a `cancelled` answer is never followed by a
delivery. A claimed task is never moved or cancelled (`too_late`): each statement acts only on
an unclaimed `pending` task (scheduler.store.postgres.task_states). A cancel or reschedule that
reaches PostgreSQL before its task does is kept as an intent (scheduler.store.postgres.intents).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from scheduler.records import TaskRef, ceil_ms
from scheduler.store.postgres import intents, lane_notes
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.task_rows import task_ref

IN_FLIGHT = "in_flight"  # what cancel and reschedule answer for a task in doubt
_TOO_LATE: dict[str | None, str] = {None: "not_found", states.IN_DOUBT: IN_FLIGHT}
_INTENT_ANSWERS = (intents.CONTENDED, *intents.REFUSALS)
RACE_RETRIES = 3  # see _update_or_status


async def _answer_status(conn: asyncpg.Connection, task_id: str, target: str) -> str | None:
    """The status a cancel or reschedule that changed nothing reports on (`states.answered`),
    `fired` for a task that fired, None for an unknown one."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        f"SELECT coalesce((SELECT {states.answered()} FROM delayed_messages "
        "WHERE id = $1 AND target = $2), "
        "(SELECT 'fired' FROM fired_tasks WHERE id = $1 AND target = $2))",
        task_id,
        target,
    )


async def _update_or_status(
    conn: asyncpg.Connection, update: str, task_id: str, target: str, *args: Any
) -> tuple[asyncpg.Record | None, str | None]:
    """Run a cancel's or reschedule's `update` of the pending task (`$1` id, `$2` target):
    its row, or, when it changed nothing, the status to answer from (`_answer_status`).

    The UPDATE can miss a task intake commits just after it, which the status read then sees
    `pending`: the UPDATE runs again (once is enough; intake cannot store the same id twice)."""
    status: str | None = None
    for _ in range(RACE_RETRIES):
        row = await conn.fetchrow(update, task_id, target, *args)
        if row is not None:
            return row, None
        status = await _answer_status(conn, task_id, target)
        if status != states.PENDING:
            break
    return None, status


# The state of a fired task, whose row is gone: its tombstone and latest delivery. The fields
# only the row held (priority, expiry, creation) are unknown (None).
_FIRED = (
    "SELECT t.id, t.target, 'fired' AS status, NULL::smallint AS priority, "
    "coalesce(f.scheduled_for, t.fired_at) AS due_at, "
    "coalesce(f.scheduled_for, t.fired_at) AS scheduled_for, NULL::timestamptz AS expires_at, "
    "coalesce(f.attempt, 1) AS attempts, t.fired_at, f.stream_seq, NULL::text AS last_error, "
    "NULL::timestamptz AS created_at FROM fired_tasks t LEFT JOIN LATERAL (SELECT "
    "scheduled_for, attempt, stream_seq FROM fire_log WHERE kind = 'delayed' AND key = t.id "
    "ORDER BY fired_at DESC LIMIT 1) f ON true WHERE t.id = $1 AND ($2::text IS NULL OR "
    "t.target = $2)"
)


async def fired_task(
    conn: asyncpg.Connection, task_id: str, target: str | None = None
) -> dict[str, Any] | None:
    """A fired task's state (see `_FIRED`), None when `task_id` has no tombstone."""
    row = await conn.fetchrow(_FIRED, task_id, target)
    return None if row is None else dict(row)


class TaskAdmin:
    """The operators' statements on `delayed_messages` (and its intents and tombstones)."""

    def __init__(self, db: PostgresStore, intent_limits: IntentLimits | None = None) -> None:
        self.db = db
        self.intent_limits = intent_limits or IntentLimits()
        self.seen_full = intents.SeenFull()

    async def cancel(self, task_id: str, target: str) -> str:
        """`cancelled` (now or before, or an intent recorded for a task not yet taken off the
        delay lane), `in_flight` (published, acknowledgement outstanding: it may be
        delivered), `too_late` (claimed or done), `id_contended` or `too_many_intents`
        (`_org`, `_total`: scheduler.store.postgres.intents; nothing changed).

        A claim racing the cancel either commits first (the cancel then waits on the row lock,
        re-checks its `WHERE` on the claimed row, changes nothing and answers `too_late`) or
        waits for the cancel and skips the cancelled row: `cancelled` is never followed by a
        delivery. Intake racing it: see scheduler.store.postgres.intents."""
        async with self.db.timed("cancel") as conn:
            done, status = await _update_or_status(
                conn,
                "UPDATE delayed_messages SET status = 'cancelled', updated_at = now() "
                f"WHERE id = $1 AND target = $2 AND {states.unclaimed(states.PENDING)} "
                "RETURNING id",
                task_id,
                target,
            )
            if done is not None:
                return "cancelled"
            if status is None or status == intents.INTENT:
                status = await self._cancel_ahead(conn, task_id, target, status)
        if status in ("cancelled", intents.INTENT):
            return "cancelled"
        return status if status in _INTENT_ANSWERS else _TOO_LATE.get(status, "too_late")

    async def _cancel_ahead(
        self, conn: asyncpg.Connection, task_id: str, target: str, status: str | None
    ) -> str | None:
        """Cancel `task_id` of `target` whatever arrives first, the task or this cancel
        (scheduler.store.postgres.intents); the status to answer from."""
        limits = self.intent_limits
        refused = (
            None
            if status is not None
            else await intents.refusal(conn, target, limits, self.seen_full)
        )
        if refused is not None:
            return refused
        got = await intents.record_cancel(conn, task_id, target, limits)
        return got or await self._why_not(conn, task_id, target)

    async def _why_not(self, conn: asyncpg.Connection, task_id: str, target: str) -> str | None:
        """The status of a task an intent could not be recorded for."""
        status = await _answer_status(conn, task_id, target)
        if status is None and await intents.contended(conn, task_id, target):
            return intents.CONTENDED
        return status

    async def reschedule(
        self, task_id: str, target: str, due: datetime
    ) -> tuple[str, TaskRef | None]:
        """Move a pending task to `due`: `rescheduled` (+ its heap ref; no ref when an intent
        was recorded for a task not yet taken off the lane), `in_flight` (in doubt: it may
        have been delivered, so it is never moved), `too_late`, `not_found` never, or
        `id_contended` / `too_many_intents` (see `cancel`)."""
        due = ceil_ms(due)
        async with self.db.timed("reschedule") as conn:
            row, status = await _update_or_status(
                conn,
                "UPDATE delayed_messages SET due_at = $3, scheduled_for = $3, updated_at = now() "
                f"WHERE id = $1 AND target = $2 AND {states.unclaimed(states.PENDING)} "
                "RETURNING id, due_at, priority, seq, org_id",
                task_id,
                target,
                due,
            )
            if row:
                return "rescheduled", task_ref(row)
            if status is None or status == intents.INTENT:
                return await self._reschedule_ahead(conn, task_id, target, due, status)
        return _TOO_LATE.get(status, "too_late"), None

    async def _reschedule_ahead(
        self, conn: asyncpg.Connection, task_id: str, target: str, due: datetime, status: str | None
    ) -> tuple[str, TaskRef | None]:
        """Reschedule `task_id` of `target` whatever arrives first (see `_cancel_ahead`)."""
        limits = self.intent_limits
        refused = (
            None
            if status is not None
            else await intents.refusal(conn, target, limits, self.seen_full)
        )
        if refused is not None:
            return refused, None
        row = await intents.record_reschedule(conn, task_id, target, due, limits)
        if row is None:
            why = await self._why_not(conn, task_id, target)
            return (why if why in _INTENT_ANSWERS else _TOO_LATE.get(why, "too_late")), None
        if row["status"] == intents.INTENT:
            return "rescheduled", None
        return "rescheduled", task_ref(row)

    async def note_lane(self, task_id: str, target: str) -> None:
        """Note, before the task is published to the delay lane, that `task_id` goes to
        `target` (scheduler.store.postgres.lane_notes), for as long as an intent lives."""
        async with self.db.timed("lane_note") as conn:
            await lane_notes.write(conn, task_id, target, self.intent_limits.ttl)

    async def lane_target(self, task_id: str) -> str | None:
        """The target noted for `task_id` when it was put on the lane, None without one."""
        async with self.db.timed("lane_note") as conn:
            return await lane_notes.target_of(conn, task_id)

    async def get(self, task_id: str, target: str | None = None) -> dict[str, Any] | None:
        """A task's state for the API (no payload bytes)."""
        async with self.db.timed("get") as conn:
            row = await conn.fetchrow(
                f"SELECT id, target, {states.reported()} AS status, priority, due_at, "
                "scheduled_for, expires_at, attempts, fired_at, stream_seq, last_error, created_at "
                "FROM delayed_messages "
                "WHERE id = $1 AND ($2::text IS NULL OR target = $2)",
                task_id,
                target,
            )
            if row is None:
                return await fired_task(conn, task_id, target)
        return dict(row)

    async def purge_finished(self, retention_days: int) -> int:
        """Delete cancelled and expired tasks older than the retention (and fired ones a
        daemon older than migration 0010 left), and the tombstones of tasks that fired before
        it: their ids may be used again. Returns the rows deleted from both tables."""
        async with self.db.timed("purge") as conn:
            status = await conn.execute(
                "DELETE FROM delayed_messages WHERE status IN ('fired', 'cancelled', 'expired') "
                "AND updated_at < now() - make_interval(days => $1)",
                retention_days,
            )
            tombs = await conn.execute(
                "DELETE FROM fired_tasks WHERE fired_at < now() - make_interval(days => $1)",
                retention_days,
            )
            lapsed = await intents.purge(conn) + await lane_notes.purge(conn)
        return int(status.split()[-1]) + int(tombs.split()[-1]) + lapsed
