"""The in-memory twin of the dead letters for operators (`scheduler.operations.stores.DeadLetters`).

It reads the dead letters the engine's twin records (`MemoryTaskStore.dead_letters`: `kill` at
firing, `record_bad_intake` at intake), giving each the row PostgreSQL would hold (the firing
ones take the task's target, bytes, headers and attempts; `last_failed` by this twin's clock),
and keeps the rules of `scheduler.store.postgres.dead_letters`' SQL: newest first by (last
failure, id) after a key, the subject filter exact or a `.>` prefix on the target or the
subject, a replay marked once, a requeue that puts the task back to `pending` only while it is
still `dead` and changes nothing otherwise. tests/contracts/test_dead_letters.py holds the two
to the same answers.
"""

from __future__ import annotations

import builtins
import json
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from scheduler.operations.stores import DeadLetterFilter, Requeued
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.postgres.values import jsonb_text

Row = dict[str, Any]
LISTED = (
    "id", "original_id", "subject", "target", "reason", "stage", "error", "attempts",
    "first_seen", "last_failed", "resolved", "resolved_at", "resolved_by", "replayed_at",
    "raw_size", "raw_truncated",
)  # fmt: skip


class MemoryDeadLetterStore:
    def __init__(
        self, tasks: MemoryTaskStore, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.tasks, self.now = tasks, now
        self.rows: dict[uuid.UUID, Row] = {}
        self._taken = 0  # how many of `tasks.dead_letters` are rows here

    async def list(
        self, where: DeadLetterFilter, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> builtins.list[Row]:
        found = sorted(self.held(), key=_key, reverse=True)
        found = [r for r in found if _matches(r, where) and (after is None or _key(r) < after)]
        return [{c: r[c] for c in LISTED} for r in found[:limit]]

    async def get(self, dead_id: uuid.UUID) -> Row | None:
        self._take_in()
        row = self.rows.get(dead_id)
        return None if row is None else _detail(row)

    async def resolve(self, dead_id: uuid.UUID, resolved: bool, who: str) -> Row | None:
        self._take_in()
        row = self.rows.get(dead_id)
        if row is None:
            return None
        row |= {"resolved": resolved, "resolved_at": self.now() if resolved else None}
        row["resolved_by"] = who if resolved else None
        return _detail(row)

    async def requeue(self, dead_id: uuid.UUID, task_id: str, due: datetime, who: str) -> Requeued:
        self._take_in()
        dead = self.rows.get(dead_id)
        if dead is None or dead["replayed_at"] is not None:
            return Requeued("already_replayed")
        task = self.tasks.rows.get(task_id)
        if task is None or task.status != "dead":
            status = self.tasks.status(task_id)
            return Requeued("missing_task" if status is None else "not_dead", task_status=status)
        task.task = replace(task.task, due_at=due, scheduled_for=due)
        task.status, task.claimed_epoch, task.claimed_at = "pending", None, None
        task.updated_at = self.now()
        task.attempts, task.last_error = 0, None
        self._mark(dead, who)
        return Requeued("replayed", task.ref())

    async def mark_replayed(self, dead_id: uuid.UUID, who: str) -> bool:
        self._take_in()
        dead = self.rows.get(dead_id)
        if dead is None or dead["replayed_at"] is not None:
            return False
        self._mark(dead, who)
        return True

    async def unmark_replayed(self, dead_id: uuid.UUID) -> None:
        self._take_in()
        dead = self.rows.get(dead_id)
        if dead is not None:
            dead |= {"replayed_at": None, "resolved": False, "resolved_at": None}
            dead["resolved_by"] = None

    async def unresolved(self) -> int:
        return sum(1 for r in self.held() if not r["resolved"])

    def _mark(self, dead: Row, who: str) -> None:
        now = self.now()
        dead |= {"replayed_at": now, "resolved": True, "resolved_at": now}
        dead["resolved_by"] = f"{who} (replay)"

    def held(self) -> builtins.list[Row]:
        """Every dead letter as its row, the engine twin's new ones taken in first."""
        self._take_in()
        return builtins.list(self.rows.values())

    def _take_in(self) -> None:
        """The engine twin's new dead letters as rows."""
        for entry in self.tasks.dead_letters[self._taken :]:
            row = self._row(entry)
            self.rows[row["id"]] = row
        self._taken = len(self.tasks.dead_letters)

    def _row(self, entry: Row) -> Row:
        now = self.now()
        row: Row = {"id": uuid.uuid4(), "original_id": entry["original_id"], "last_failed": now}
        row |= {"reason": entry["reason"], "stage": entry["stage"], "error": entry["error"]}
        row |= {"resolved": False, "resolved_at": None, "resolved_by": None, "replayed_at": None}
        if entry["stage"] == "firing":
            task = self.tasks.rows[entry["original_id"]]
            t = task.task
            row |= {"subject": t.target, "target": t.target, "raw": t.payload}
            row |= {"headers": dict(t.headers), "attempts": task.attempts}
            row |= {"first_seen": task.created_at, "raw_size": len(t.payload)}
            return row | {"raw_truncated": False}
        size = entry.get("raw_size", len(entry["raw"]))
        row |= {"subject": entry["subject"], "target": entry["target"], "raw": entry["raw"]}
        row |= {"headers": dict(entry["headers"] or {}), "attempts": 1, "first_seen": now}
        return row | {"raw_size": size, "raw_truncated": size > len(entry["raw"])}


def _key(row: Row) -> tuple[datetime, uuid.UUID]:
    return (row["last_failed"], row["id"])


def subject_matches(column: str | None, pattern: str) -> bool:
    """`subject_clause`: exact, or a prefix when the pattern ends in `.>`."""
    if column is None:
        return False
    return column.startswith(pattern[:-1]) if pattern.endswith(".>") else column == pattern


def _matches(row: Row, where: DeadLetterFilter) -> bool:
    subject = where.subject
    return (
        (where.reason is None or row["reason"] == where.reason)
        and (
            subject is None
            or subject_matches(row["subject"] if row["target"] is None else row["target"], subject)
            or subject_matches(row["subject"], subject)
        )
        and (where.stage is None or row["stage"] == where.stage)
        and (where.resolved is None or row["resolved"] == where.resolved)
    )


def _detail(row: Row) -> Row:
    """As `DeadLetterStore.get` answers: the payload read from the bytes (stored once)."""
    doc = {c: row[c] for c in LISTED}
    doc["headers"] = json.loads(json.dumps(row["headers"]))
    doc["raw"], doc["payload"] = row["raw"], None
    if row["raw"] is not None and not row["raw_truncated"]:
        doc["payload"] = json.loads(jsonb_text(row["raw"]))
    return doc
