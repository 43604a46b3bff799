"""Dead letters in PostgreSQL for operators: list, look up, resolve, and the replay transitions.

A replay is one transaction that marks the dead letter replayed and, for a task that died while
firing, puts the task back to `pending` (same id, attempts from zero, due now) only if it is
still `dead`: two replays racing each other, or a second dead letter of the same task, find it
no longer dead and change nothing, so a task is never queued for delivery twice.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from scheduler.operations.stores import DeadLetterFilter, Requeued
from scheduler.records import TaskRef, to_ms
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.values import jsonb_text

_COLUMNS = (
    "id, original_id, subject, target, reason, stage, error, attempts, first_seen, last_failed, "
    "resolved, resolved_at, resolved_by, replayed_at, raw_size, raw_truncated"
)
_DETAIL = _COLUMNS + ", payload::text AS payload, headers::text AS headers, raw"


class _Abort(Exception):
    """Rolls a replay transaction back, carrying the answer."""

    def __init__(self, outcome: Requeued) -> None:
        super().__init__(outcome.status)
        self.outcome = outcome


def subject_clause(column_sql: str, placeholder: str) -> str:
    """A filter on a subject column: exact, or a prefix when the pattern ends in `.>`."""
    return (
        f"(CASE WHEN right({placeholder}, 2) = '.>' THEN starts_with({column_sql}, "
        f"left({placeholder}, -1)) ELSE {column_sql} = {placeholder} END)"
    )


class DeadLetterStore:
    def __init__(self, db: PostgresStore) -> None:
        self.db = db

    async def list(
        self, where: DeadLetterFilter, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[dict[str, Any]]:
        """Newest first (last failure, then id), `limit` rows after the keyset `after`."""
        async with self.db.timed("dlq_list") as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM dead_letters WHERE ($1::text IS NULL OR reason = $1) "
                f"AND ($2::text IS NULL OR {subject_clause('coalesce(target, subject)', '$2')} "
                f"OR {subject_clause('subject', '$2')}) AND ($3::text IS NULL OR stage = $3) "
                "AND ($4::boolean IS NULL OR resolved = $4) AND ($5::timestamptz IS NULL OR "
                "(last_failed, id) < ($5, $6::uuid)) ORDER BY last_failed DESC, id DESC LIMIT $7",
                where.reason,
                where.subject,
                where.stage,
                where.resolved,
                after[0] if after else None,
                after[1] if after else None,
                limit,
            )
        return [dict(r) for r in rows]

    async def get(self, dead_id: uuid.UUID) -> dict[str, Any] | None:
        async with self.db.timed("dlq_get") as conn:
            row = await conn.fetchrow(f"SELECT {_DETAIL} FROM dead_letters WHERE id = $1", dead_id)
        return None if row is None else _detail(row)

    async def resolve(self, dead_id: uuid.UUID, resolved: bool, who: str) -> dict[str, Any] | None:
        """Mark resolved (or open again); None when there is no such dead letter."""
        async with self.db.timed("dlq_resolve") as conn:
            row = await conn.fetchrow(
                "UPDATE dead_letters SET resolved = $2, resolved_at = CASE WHEN $2 THEN now() "
                "END, resolved_by = CASE WHEN $2 THEN $3 END WHERE id = $1 "
                f"RETURNING {_DETAIL}",
                dead_id,
                resolved,
                who,
            )
        return None if row is None else _detail(row)

    async def requeue(self, dead_id: uuid.UUID, task_id: str, due: datetime, who: str) -> Requeued:
        """Replay a firing-stage dead letter: its task back to pending, due at `due`."""
        try:
            async with self.db.timed("dlq_requeue") as conn, conn.transaction():
                # The task's row first, then the dead letter's (whose trigger locks the
                # `dead_letter_counts` row): the order `kill` takes them in, so no deadlock.
                row = await conn.fetchrow(
                    f"UPDATE delayed_messages SET {states.REQUEUED}, due_at = $2, "
                    "scheduled_for = $2, attempts = 0, last_error = NULL, "
                    "updated_at = now() WHERE id = $1 AND status = 'dead' "
                    "RETURNING id, due_at, priority, seq, org_id",
                    task_id,
                    due,
                )
                await _mark_replayed(conn, dead_id, who)
                if row is None:
                    status = await conn.fetchval(
                        f"SELECT coalesce((SELECT {states.reported()} FROM delayed_messages "
                        "WHERE id = $1), "
                        "(SELECT 'fired' FROM fired_tasks WHERE id = $1))",
                        task_id,
                    )
                    kind = "missing_task" if status is None else "not_dead"
                    raise _Abort(Requeued(kind, task_status=status))
        except _Abort as abort:
            return abort.outcome
        ref = TaskRef(row["id"], to_ms(row["due_at"]), row["priority"], row["seq"], row["org_id"])
        return Requeued("replayed", ref)

    async def mark_replayed(self, dead_id: uuid.UUID, who: str) -> bool:
        """Claim the replay of a dead letter (false if it was replayed already)."""
        try:
            async with self.db.timed("dlq_mark") as conn:
                await _mark_replayed(conn, dead_id, who)
        except _Abort:
            return False
        return True

    async def unmark_replayed(self, dead_id: uuid.UUID) -> None:
        """Undo `mark_replayed` when the replay could not be sent."""
        async with self.db.timed("dlq_unmark") as conn:
            await conn.execute(
                "UPDATE dead_letters SET replayed_at = NULL, resolved = false, "
                "resolved_at = NULL, resolved_by = NULL WHERE id = $1",
                dead_id,
            )

    async def unresolved(self) -> int:
        """How many dead letters nobody has resolved yet: one row, kept exact by the triggers
        of migration 0014 in the transaction of every write, whatever the table's size."""
        async with self.db.timed("dlq_count") as conn:
            return int(await conn.fetchval("SELECT unresolved FROM dead_letter_counts"))

    async def prune(self, before: datetime, batch: int) -> int:
        """Delete up to `batch` dead letters that last failed before `before`, oldest first,
        over the `dead_letters_age` index; rows another instance is deleting are skipped."""
        async with self.db.timed("dlq_prune") as conn:
            status = await conn.execute(
                "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters "
                "WHERE last_failed < $1 ORDER BY last_failed, id LIMIT $2 "
                "FOR UPDATE SKIP LOCKED)",
                before,
                batch,
            )
        return int(status.split()[-1])


async def _mark_replayed(conn: asyncpg.Connection, dead_id: uuid.UUID, who: str) -> None:
    done = await conn.fetchval(
        "UPDATE dead_letters SET replayed_at = now(), resolved = true, resolved_at = now(), "
        "resolved_by = $2 WHERE id = $1 AND replayed_at IS NULL RETURNING id",
        dead_id,
        f"{who} (replay)",
    )
    if done is None:
        raise _Abort(Requeued("already_replayed"))


def _detail(row: asyncpg.Record) -> dict[str, Any]:
    doc = dict(row)
    doc["payload"] = json.loads(doc["payload"]) if doc["payload"] is not None else None
    doc["headers"] = json.loads(doc["headers"]) if doc["headers"] is not None else {}
    raw = doc.pop("raw")
    doc["raw"] = bytes(raw) if raw is not None else None
    if doc["payload"] is None and doc["raw"] is not None and not doc["raw_truncated"]:
        # stored once since migration 0014: the document is read from the bytes
        doc["payload"] = json.loads(jsonb_text(doc["raw"]))
    return doc
