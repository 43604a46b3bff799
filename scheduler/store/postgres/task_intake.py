"""Delayed tasks in PostgreSQL, intake's statements (a part of `TaskStore`, the engine's): a
batch of new tasks stored in one round trip (one call of the function `scheduler_intake_insert`
of migrations 0019 and 0022, which hold the insert's SQL), each task judged alone (stored, an
exact resend, an id another task holds, refused by PostgreSQL), the messages that were never
tasks stored as dead letters, and the statistics kept fresh after a burst.

Each task is stored in its partition, `partition_of(id, P)` (scheduler/partitions.py), computed
here and passed in, so PostgreSQL hashes nothing per row (SHA-256 measured here: ~5 us a row in
PostgreSQL, 1-2 us in Python); under P = 1 every task is in partition 0 and the argument is NULL,
nothing per task.

A task meets its id's intent here: a cancel or reschedule that reached PostgreSQL before the
task did (scheduler.store.postgres.intents) is honoured by the insert itself. An id that fired
stays refused while its tombstone (`fired_tasks`) lasts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from scheduler.messages.headers import printable
from scheduler.partitions import partition_of
from scheduler.records import Insertion, NewTask, TaskRef
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.task_rows import SEP_SQL, joined, micros, task_ref
from scheduler.store.postgres.values import ROW_ERRORS

log = logging.getLogger(__name__)

ANALYZE_AFTER_ROWS = 20_000


def _first_of(tasks: Sequence[NewTask], ids: set[str]) -> list[NewTask]:
    """The first task of `tasks` with each id of `ids`."""
    left, out = set(ids), []
    for task in tasks:
        if task.id in left:
            left.discard(task.id)
            out.append(task)
    return out


def _intake_row(r: dict[str, Any], reduced: bool = False) -> tuple[Any, ...]:
    """The values of one intake dead letter, every text PostgreSQL-safe."""
    headers = {printable(k): printable(v) for k, v in (r["headers"] or {}).items()}
    size = r.get("raw_size", len(r["raw"]))
    return (
        printable(r["original_id"], 200),
        printable(r["subject"]),
        printable(r["error"]),
        r["reason"],
        None if r["target"] is None else printable(r["target"]),
        r["raw"],
        "{}" if reduced else json.dumps(headers),
        r.get("key"),
        size,
        size > len(r["raw"]),
    )


class TaskIntake:
    """Intake's statements on `delayed_messages` and `dead_letters`."""

    def __init__(self, db: PostgresStore, partitions: int = 1) -> None:
        self.db = db
        self.partitions = partitions  # the deployment's P (scheduler/partitions.py)
        self.inserted = 0  # rows this store has inserted (see `analyze_if_stale`)
        self._analyzed_at_rows = 0  # `inserted` at the last ANALYZE, and its row estimate
        self._rows_at_analyze = 0
        self._analyze_allowed = True

    async def _insert(self, tasks: Sequence[NewTask]) -> tuple[list[TaskRef], set[str]]:
        """Store a batch in one round trip: the refs of the tasks stored to fire, and the ids
        of those stored cancelled because a cancel intent awaited them
        (scheduler.store.postgres.intents:
        a task meeting its target's live intent takes over the intent's row, honouring it; a
        task meeting another target's intent replaces it). Within the batch, the first task
        with an id is the one offered (ON CONFLICT DO UPDATE may touch a row once).

        One statement, in its own transaction: `scheduler_intake_insert` (migrations 0019,
        0022) inserts, each task in its partition, then deletes again the rows whose id has a
        tombstone (the task fired) in a second statement with a snapshot of its own, which sees
        a tombstone committed while the insert waited on the unique index for a concurrent
        `mark_fired` deleting the same id (a check inside the insert's snapshot would miss it
        and store the id again). Those rows are left out, so the caller judges them as
        conflicts."""
        if not tasks:
            return [], set()
        unique = {t.id for t in tasks}
        if len(unique) < len(tasks):  # rare (a producer's resend in the same batch): copy only then
            tasks = _first_of(tasks, unique)
        columns = (
            [t.id for t in tasks],
            [t.target for t in tasks],
            [json.dumps(t.headers) if t.headers else "{}" for t in tasks],  # never holds \x1f
        )
        packed = [joined(c) for c in columns]
        texts: tuple[str | list[str], ...]
        if None in packed:  # a separator or an empty value inside: plain arrays
            texts, (a, b, c) = columns, ("$1::text[]", "$2::text[]", "$4::jsonb[]")
        else:
            texts = tuple(t for t in packed if t is not None)
            a, b, c = (f"string_to_array(${n}, {SEP_SQL})" for n in (1, 2, 4))
            c += "::jsonb[]"
        # Columns most batches leave empty go as NULL, not as arrays of NULLs (`unnest` pads a
        # NULL array with NULLs): no expiry, no organisation, partition 0 (P = 1).
        expiries = [None if t.expires_at is None else micros(t.expires_at) for t in tasks]
        orgs = [t.org_id for t in tasks]
        count = self.partitions
        parts = None if count == 1 else [partition_of(t.id, count) for t in tasks]
        async with self.db.timed("insert") as conn:
            rows = await conn.fetch(
                f"SELECT * FROM scheduler_intake_insert({a}, {b}, $3::bytea[], {c}, "
                "$5::smallint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::text[], "
                "$10::smallint[])",
                texts[0],
                texts[1],
                [t.payload for t in tasks],
                texts[2],
                [t.priority for t in tasks],
                [micros(t.due_at) for t in tasks],
                [micros(t.scheduled_for) for t in tasks],
                expiries if expiries.count(None) < len(expiries) else None,
                orgs if orgs.count(None) < len(orgs) else None,
                parts,
            )
        self.inserted += len(rows)
        cancelled = {r["id"] for r in rows if r["status"] == "cancelled"}
        return [task_ref(r) for r in rows if r["status"] != "cancelled"], cancelled

    async def insert_batch(self, tasks: Sequence[NewTask]) -> Insertion:
        """Store a batch, judging each task alone: an id seen before is a no-op when it is the
        same task (same target, same bytes) and `taken` otherwise; a row PostgreSQL refuses is
        split out of the batch (halving it until found) and `refused`, the rest stored."""
        try:
            refs, cancelled = await self._insert(tasks)
        except ROW_ERRORS as exc:
            if len(tasks) == 1:
                log.warning("insert.refused id=%s error=%s", tasks[0].id, exc)
                return Insertion(refused=[(tasks[0], f"PostgreSQL refused it: {exc}")])
            half = len(tasks) // 2
            first = await self.insert_batch(tasks[:half])
            return first.extend(await self.insert_batch(tasks[half:]))
        result = Insertion(stored=refs)
        fresh = {r.task_id for r in refs} | cancelled
        if len(fresh) < len(tasks):
            await self._judge_conflicts(tasks, fresh, result)
        if cancelled:
            result.cancelled = _first_of(tasks, cancelled)
        return result

    async def _judge_conflicts(
        self, tasks: Sequence[NewTask], stored: set[str], result: Insertion
    ) -> None:
        """Sort the tasks not stored into exact resends and ids taken by another task, the
        row or, for a task that fired, its tombstone (target and digest of the bytes) being
        the one compared. A resend whose row still waits to fire (pending, unclaimed) has its
        heap entry kept in `resent_refs`."""
        fresh = set(stored)
        conflicts = []
        for task in tasks:  # within a batch, the first task with an id is the one stored
            if task.id in fresh:
                fresh.discard(task.id)
            else:
                conflicts.append(task)
        async with self.db.timed("conflicts") as conn:
            rows = await conn.fetch(
                "SELECT u.i, CASE WHEN d.id IS NOT NULL THEN d.target = u.target AND "
                "d.payload = u.payload WHEN f.id IS NOT NULL THEN f.target = u.target AND "
                "f.digest = md5(u.payload)::uuid ELSE true END AS same, "
                f"({states.unclaimed('pending', 'd')}) AS pending, "
                "d.id, d.due_at, d.priority, d.seq, d.org_id "
                "FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int[]) "
                "AS u(id, target, payload, i) LEFT JOIN delayed_messages d ON d.id = u.id "
                "LEFT JOIN fired_tasks f ON d.id IS NULL AND f.id = u.id",
                [t.id for t in conflicts],
                [t.target for t in conflicts],
                [t.payload for t in conflicts],
                list(range(len(conflicts))),
            )
        for row in rows:
            task = conflicts[row["i"]]
            (result.resent if row["same"] else result.taken).append(task)
            if row["same"] and row["pending"]:  # its row waits to fire (NULL: none, or fired)
                result.resent_refs.append(task_ref(row))

    async def record_bad_intake(self, rows: Sequence[dict[str, Any]]) -> None:
        """Dead-letter rows for intake messages that were never tasks (bad input).

        Each row: `original_id`, `subject`, `error`, `reason`, `target` (text, made safe for
        PostgreSQL here), `raw` (the bytes; `payload` is derived from them), `headers` and
        `key` (the message on the lane: recorded once, a redelivery adds nothing). A row
        PostgreSQL still refuses is stored again without its payload document and headers."""
        if not rows:
            return
        try:
            await self._dead_intake([_intake_row(r) for r in rows])
        except ROW_ERRORS:
            for r in rows:  # rare: find the row, keep the others whole
                try:
                    await self._dead_intake([_intake_row(r)])
                except ROW_ERRORS as exc:
                    log.warning("dead_intake.reduced id=%s error=%s", r["original_id"], exc)
                    await self._dead_intake([_intake_row(r, reduced=True)])

    async def _dead_intake(self, rows: list[tuple[Any, ...]]) -> None:
        async with self.db.timed("dead_intake") as conn:
            await conn.executemany(
                # the bytes once, in `raw` (migration 0014): `payload` is JSON null
                "INSERT INTO dead_letters (original_id, subject, payload, error, attempts, "
                "first_seen, reason, stage, target, raw, headers, intake_key, raw_size, "
                "raw_truncated) VALUES ($1, $2, 'null', $3, 1, now(), $4, 'intake', $5, $6, "
                "$7::jsonb, $8, $9, $10) ON CONFLICT (intake_key) DO NOTHING",
                rows,
            )

    async def analyze_if_stale(self, min_rows: int = ANALYZE_AFTER_ROWS) -> bool:
        """ANALYZE `delayed_messages` when this store has inserted many rows since the last one.

        Autovacuum looks at a table once a minute; until then a table filled by a burst keeps
        the statistics of its empty self, and the claim's `id = ANY(...)` is planned as a scan
        of every due row through the pending index instead of primary-key lookups (17 ms
        instead of 1.5 ms per 1,000 claimed among 100,000 due, growing with the burst).
        Returns whether it ran; a database user that may not ANALYZE is told once."""
        grown = self.inserted - self._analyzed_at_rows
        if not self._analyze_allowed or grown < max(min_rows, self._rows_at_analyze // 2):
            return False
        try:
            async with self.db.timed("analyze") as conn:
                await conn.execute("ANALYZE delayed_messages")
                estimate = await conn.fetchval(
                    "SELECT reltuples::bigint FROM pg_class "
                    "WHERE oid = 'delayed_messages'::regclass"
                )
        except asyncpg.InsufficientPrivilegeError as exc:
            self._analyze_allowed = False
            log.warning("postgres.analyze_refused error=%s (autovacuum keeps the statistics)", exc)
            return False
        self._analyzed_at_rows = self.inserted
        self._rows_at_analyze = max(int(estimate or 0), 0)
        return True
