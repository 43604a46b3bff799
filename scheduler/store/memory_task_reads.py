"""The in-memory twin of the operators' reads of delayed tasks
(`scheduler.operations.stores.TaskReads`), over the engine's twin (`MemoryTaskStore`).

It keeps the rules of `scheduler.store.postgres.overview`'s statements: held tasks (every row
still in the store, whatever its status) in firing order (due, priority, intake sequence),
`pending` and `in_doubt` meaning not claimed, `claimed` any claimed row, another status the
stored one; fired tasks as the delayed deliveries of the fire log that have a tombstone of the
same instant, in the order they fired (fired time, then id), the subject and due window read
on the delivery, with a day's slack before `due_after` on the fired time; a subject filter is
exact or a prefix when it ends in `.>`; keyset pages after the last row's key. Each listed
task is its summary as PostgreSQL's `json_build_object` writes it (`SUMMARY_JSON`: its
separators, its escapes, instants in UTC with six fraction digits and `Z`),
keyed by the due (or fired) time in integer microseconds. One task's detail is its row with
headers and bytes, or, once fired, its tombstone and latest delivery, with its deliveries in
the order they were due. Ids compare by code point, as PostgreSQL compares them under a `C`
collation (the test databases' `C.UTF-8`; under a linguistic one, two ids fired at the same
instant that differ in case or punctuation may list the other way round).
tests/contracts/test_task_reads.py holds the twin and PostgreSQL to the same answers.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from scheduler.clock import to_rfc3339_us
from scheduler.operations.stores import Listed, TaskFilter
from scheduler.store.memory import MemoryTaskStore, Row
from scheduler.store.memory_dead_letters import subject_matches
from scheduler.store.postgres.task_rows import micros

EARLY_SLACK = timedelta(days=1)  # overview.EARLY_SLACK: a delivery never precedes its due time
DELIVERIES = 100  # the most deliveries one task's detail shows
_DELIVERY = ("scheduled_for", "fired_at", "attempt", "epoch", "instance", "stream", "stream_seq")
Fire = dict[str, Any]


class MemoryTaskReads:
    def __init__(self, tasks: MemoryTaskStore) -> None:
        self.store = tasks

    async def tasks(
        self, where: TaskFilter, after: tuple[datetime, int, int] | None, limit: int
    ) -> list[Listed]:
        rows = sorted(
            (r for r in self.store.rows.values() if _held(r, where)),
            key=lambda r: (r.task.due_at, r.task.priority, r.seq),
        )
        if after is not None:
            rows = [r for r in rows if (r.task.due_at, r.task.priority, r.seq) > after]
        return [
            Listed(summary_json(_summary(r)), (micros(r.task.due_at), r.task.priority, r.seq))
            for r in rows[:limit]
        ]

    async def fired(
        self, where: TaskFilter, after: tuple[datetime, str] | None, limit: int
    ) -> list[Listed]:
        fires = sorted(
            (f for f in self._delivered() if _fired(f, where)),
            key=lambda f: (f["fired_at"], f["key"]),
        )
        if after is not None:
            fires = [f for f in fires if (f["fired_at"], f["key"]) > after]
        return [
            Listed(summary_json(self._fired_summary(f)), (micros(f["fired_at"]), f["key"]))
            for f in fires[:limit]
        ]

    async def task(self, task_id: str) -> dict[str, Any] | None:
        row = self.store.rows.get(task_id)
        if row is not None:
            doc = _summary(row) | {"seq": row.seq, "stream_seq": row.stream_seq}
            doc |= {"last_error": row.last_error, "claimed_epoch": row.claimed_epoch}
            doc |= {"claimed_at": row.claimed_at, "updated_at": row.updated_at or row.created_at}
            doc |= {"headers": json.loads(json.dumps(row.task.headers))}
            doc["payload"] = bytes(row.task.payload)
        else:
            tomb = self.store.fired.get(task_id)
            if tomb is None:
                return None
            doc = self._tombstone(tomb)
        fires = sorted(self._fires_of(task_id), key=lambda f: (f["scheduled_for"], f["fired_at"]))
        doc["deliveries"] = [{c: f[c] for c in _DELIVERY} for f in fires[:DELIVERIES]]
        return doc

    # -- fired tasks: the fire log's deliveries and the tombstones ----------------------------
    def _fires_of(self, task_id: str) -> list[Fire]:
        return [f for f in self.store.fire_log if f["kind"] == "delayed" and f["key"] == task_id]

    def _delivered(self) -> list[Fire]:
        """The deliveries that fired a task whose tombstone is kept (`FIRED_SQL`'s join)."""
        fired = self.store.fired
        return [
            f
            for f in self.store.fire_log
            if f["kind"] == "delayed"
            and f["key"] in fired
            and fired[f["key"]].fired_at == f["fired_at"]
        ]

    def _fired_summary(self, fire: Fire) -> dict[str, Any]:
        tomb = self.store.fired[fire["key"]].task
        doc: dict[str, Any] = {"id": tomb.id, "target": tomb.target, "status": "fired"}
        doc |= {"priority": None, "due_at": fire["scheduled_for"]}
        doc |= {"scheduled_for": fire["scheduled_for"], "expires_at": None}
        return doc | {"attempts": fire["attempt"], "created_at": None, "fired_at": fire["fired_at"]}

    def _tombstone(self, tomb: Row) -> dict[str, Any]:
        """`fired_task` (the tombstone and its latest delivery) as the detail shows it."""
        fires = self._fires_of(tomb.task.id)
        last = max(fires, key=lambda f: f["fired_at"]) if fires else None
        due = tomb.fired_at if last is None else last["scheduled_for"]
        doc: dict[str, Any] = {"id": tomb.task.id, "target": tomb.task.target}
        doc |= {"status": "fired", "priority": None, "due_at": due, "scheduled_for": due}
        doc |= {"expires_at": None, "attempts": 1 if last is None else last["attempt"]}
        doc |= {
            "fired_at": tomb.fired_at,
            "stream_seq": None if last is None else last["stream_seq"],
        }
        doc |= {"last_error": None, "created_at": None, "claimed_epoch": None}
        return doc | {
            "claimed_at": None,
            "updated_at": tomb.fired_at,
            "headers": {},
            "payload": None,
        }


def _held(row: Row, where: TaskFilter) -> bool:
    due = row.task.due_at
    return (
        (where.subject is None or subject_matches(row.task.target, where.subject))
        and (where.status is None or row.status == where.status)
        and (where.due_before is None or due < where.due_before)
        and (where.due_after is None or due >= where.due_after)
        and (where.org_id is None or row.task.org_id == where.org_id)
    )


def _fired(fire: Fire, where: TaskFilter) -> bool:
    due, after = fire["scheduled_for"], where.due_after
    return (
        (where.subject is None or subject_matches(fire["subject"], where.subject))
        and (where.due_before is None or due < where.due_before)
        and (after is None or (due >= after and fire["fired_at"] >= after - EARLY_SLACK))
    )


def _summary(row: Row) -> dict[str, Any]:
    """A held task's `TaskSummary` fields, in its order; a claimed row reports `claimed` (the
    twin stores that status; PostgreSQL derives it, `task_states.reported`)."""
    t = row.task
    doc: dict[str, Any] = {"id": t.id, "target": t.target, "status": row.status}
    doc |= {"priority": t.priority, "due_at": t.due_at, "scheduled_for": t.scheduled_for}
    doc |= {"expires_at": t.expires_at, "attempts": row.attempts}
    return doc | {"created_at": row.created_at, "fired_at": row.fired_at}


def summary_json(fields: dict[str, Any]) -> str:
    """`fields` as PostgreSQL's `json_build_object(...)::text` writes them (`SUMMARY_JSON`)."""
    return "{" + ", ".join(f"{_text(k)} : {_value(v)}" for k, v in fields.items()) + "}"


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, datetime):
        return _text(to_rfc3339_us(value))  # `overview.iso_text`, the API's form
    return _text(value) if isinstance(value, str) else str(int(value))


def _text(value: str) -> str:
    """A JSON string as PostgreSQL escapes one: quote, backslash and controls only."""
    return json.dumps(value, ensure_ascii=False)
