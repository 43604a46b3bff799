"""Read-side queries of the management API: task and schedule listings, statistics, forecast.

Everything here only reads, so any instance (a standby too) answers from PostgreSQL. Listings
page by keyset (the last row's sort key), never by offset, so a page costs the same at any depth.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg

from scheduler.operations.stores import WINDOWS, Listed, TaskFilter
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.dead_letters import subject_clause
from scheduler.store.postgres.partitioning import EACH_PARTITION
from scheduler.store.postgres.task_admin import fired_task

_TASK_SUMMARY = (
    f"id, target, {states.reported()} AS status, priority, due_at, scheduled_for, expires_at, "
    "attempts, created_at, fired_at, seq"
)


def iso_text(column: str) -> str:
    """SQL writing an instant as the API writes one (`scheduler.clock.to_rfc3339_us`, the
    records' `Instant`): UTC, six fraction digits, `Z`, e.g. `2026-11-22T06:00:00.120000Z`."""
    return f"to_char(({column} AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"


def micros(column: str) -> str:
    """SQL for an instant as integer microseconds since the epoch (a cursor's key part)."""
    return f"(extract(epoch FROM {column}) * 1000000)::bigint"


# One task of a listing as JSON text, built by PostgreSQL from a summary row `s`: the fields,
# their order and formats of `scheduler.operations.task_records.TaskSummary` (a test holds the
# two equal), so the daemon writes the page's bytes without decoding a row into Python objects.
_SUMMARY_TIMES = ("due_at", "scheduled_for", "expires_at", "created_at", "fired_at")
SUMMARY_JSON = (
    "json_build_object("
    + ", ".join(
        f"'{name}', " + (iso_text(f"s.{name}") if name in _SUMMARY_TIMES else f"s.{name}")
        for name in (
            "id",
            "target",
            "status",
            "priority",
            "due_at",
            "scheduled_for",
            "expires_at",
            "attempts",
            "created_at",
            "fired_at",
        )
    )
    + ")::text"
)


# The filter for a reported status (scheduler.store.postgres.task_states): a claimed task keeps its
# ready status, so `pending` and `in_doubt` mean not claimed. Each a literal predicate, so
# that `pending` still reads the pending index. `$2` is always named, so its type is known.
_STATUS_FILTER: dict[str | None, str] = {
    None: "$2::text IS NULL",
    states.CLAIMED: f"($2::text IS NOT NULL AND {states.claimed()})",
    **{s: f"($2::text IS NOT NULL AND {states.unclaimed(s)})" for s in states.READY_STATUSES},
}
# A fired task in a listing, from its delivery `f` and tombstone `t`: the fields only its
# deleted row held (priority, expiry, creation) are unknown (NULL).
_FIRED_SUMMARY = (
    "t.id, t.target, 'fired' AS status, NULL::smallint AS priority, f.scheduled_for AS due_at, "
    "f.scheduled_for, NULL::timestamptz AS expires_at, f.attempt AS attempts, "
    "NULL::timestamptz AS created_at, f.fired_at"
)
# Fired tasks after a keyset ($4, $5), filtered by subject ($1) and due window ($2, $3): the
# fire log read in `fired_at` order over its index (an incremental sort adds the id), each
# delivery probing its tombstone by primary key. `OFFSET 0` keeps that probe a nested loop:
# as a plain join the planner hashes every tombstone and sorts every delivery, 0.8 s a page
# at 400,000 fired tasks against 0.3 ms this way (EXPLAIN ANALYZE, PostgreSQL 16, this host).
EARLY_SLACK = "1 day"
FIRED_SQL = (
    f"SELECT {_FIRED_SUMMARY} FROM fire_log f JOIN LATERAL (SELECT id, target FROM fired_tasks "
    "WHERE id = f.key AND fired_at = f.fired_at OFFSET 0) t ON true WHERE f.kind = 'delayed' "
    f"AND ($1::text IS NULL OR {subject_clause('f.subject', '$1')}) "
    "AND ($2::timestamptz IS NULL OR f.scheduled_for < $2) "
    "AND ($3::timestamptz IS NULL OR f.scheduled_for >= $3) "
    # a delivery never precedes its due time (beyond a leader's clock skew, 100 ms by
    # default): a day's slack lets the index skip what fired before the window
    f"AND ($3::timestamptz IS NULL OR f.fired_at >= $3 - interval '{EARLY_SLACK}') "
    # the row comparison spelled out, so the index on fired_at bounds the scan
    "AND ($4::timestamptz IS NULL OR f.fired_at >= $4 AND (f.fired_at > $4 OR f.key > $5)) "
    "ORDER BY f.fired_at, f.key LIMIT $6"
)
_TASK_DETAIL = (
    _TASK_SUMMARY + ", stream_seq, last_error, claimed_epoch, claimed_at, updated_at, "
    "headers::text AS headers, payload"
)
_SCHEDULE = (
    "s.name, s.definition::text AS definition, s.file, s.line, s.active, s.paused_at, "
    "s.paused_by, s.pause_note, s.failed_at, s.failed_reason, s.failed_error, s.updated_at, "
    "st.last_scheduled_for, st.last_fired_at, st.skipped"
)

# One range read of the pending index per partition (pending not claimed, due_at <= now +
# widest window), counted per subject and window; tasks already overdue count in every window,
# claimed ones (being published) in none.
FORECAST_SQL = (
    "SELECT target, "
    + ", ".join(
        f"count(*) FILTER (WHERE due_at <= $1::timestamptz + ${i + 2}::interval) AS w{i}"
        for i in range(len(WINDOWS))
    )
    + f" FROM {EACH_PARTITION} CROSS JOIN LATERAL (SELECT target, due_at FROM delayed_messages "
    f"WHERE {states.unclaimed(states.PENDING)} AND partition = o.part "
    f"AND due_at <= $1::timestamptz + ${len(WINDOWS) + 1}::interval) AS d GROUP BY target"
)


def prefix_pattern(subject: str | None) -> str | None:
    """A subject filter ending in `.>` as a LIKE pattern of its prefix (`%`, `_` and the
    escape character escaped); None for an exact subject or none."""
    if subject is None or not subject.endswith(".>"):
        return None
    prefix = subject[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return prefix + "%"


class OverviewStore:
    def __init__(self, db: PostgresStore) -> None:
        self.db = db

    # -- delayed tasks ------------------------------------------------------------------------
    async def tasks(
        self, where: TaskFilter, after: tuple[datetime, int, int] | None, limit: int
    ) -> list[Listed]:
        """Tasks in firing order (due, priority, intake order) after the keyset `after`.

        With `status=pending` (or `in_doubt`) this reads that status's index in order, one range
        per partition, merged; `org_id` compares the column the intake fills from the envelope
        (migration 0009, indexed for unfinished tasks): a plain comparison, so any plan works,
        parallel ones included."""
        filters = (
            # a prefix as LIKE (`$10`): PostgreSQL estimates a pattern from the column's
            # statistics, so a prefix that matches nothing is read with a scan and a sort
            # (40 ms at 200,000 tasks), not along the firing order to the end (400 ms)
            "($1::text IS NULL OR CASE WHEN $10::text IS NULL THEN target = $1 "
            "ELSE target LIKE $10 END) "
            "AND ($3::timestamptz IS NULL OR due_at < $3) "
            "AND ($4::timestamptz IS NULL OR due_at >= $4) "
            "AND ($5::text IS NULL OR org_id = $5) "
            "AND ($6::timestamptz IS NULL OR (due_at, priority, seq) > ($6, $7, $8))"
        )

        def ranged(predicate: str, by_partition: bool) -> str:
            """The first `$9` rows of one index's range in firing order; with `by_partition`
            one range per partition (the ready statuses' indexes lead with it), merged."""
            one = (
                f"SELECT {_TASK_SUMMARY} FROM delayed_messages WHERE {filters} AND {predicate} "
                + ("AND partition = o.part " if by_partition else "")
                + "ORDER BY due_at, priority, seq LIMIT $9"
            )
            if not by_partition:
                return one
            return f"SELECT p.* FROM {EACH_PARTITION} CROSS JOIN LATERAL ({one}) AS p"

        if where.status is None:
            # Every held task: each status's index read in firing order and merged (pending
            # and in_doubt per partition, the settled rest over the index of migration 0026),
            # so the first page costs a few index reads, not a sort of every row (64 ms at
            # 200,000 pending tasks, what the console's and the CLI's default listing asked).
            held = " UNION ALL ".join(
                f"({ranged(pred, by)})"
                for pred, by in (
                    (f"$2::text IS NULL AND {states.stored_as(states.PENDING)}", True),
                    (states.stored_as(states.IN_DOUBT), True),
                    (states.not_ready(), False),
                )
            )
        else:
            status = _STATUS_FILTER.get(where.status, "status = $2")
            held = ranged(status, where.status in states.READY_STATUSES)
        async with self.db.timed("tasks_list") as conn:
            rows = await conn.fetch(
                f"SELECT {SUMMARY_JSON}, {micros('s.due_at')}, s.priority, s.seq "
                f"FROM ({held}) s ORDER BY s.due_at, s.priority, s.seq LIMIT $9",
                where.subject,
                where.status,
                where.due_before,
                where.due_after,
                where.org_id,
                after[0] if after else None,
                after[1] if after else 0,
                after[2] if after else 0,
                limit,
                prefix_pattern(where.subject),
            )
        return [Listed(r[0], r[1:]) for r in rows]

    async def fired(
        self, where: TaskFilter, after: tuple[datetime, str] | None, limit: int
    ) -> list[Listed]:
        """Fired tasks in the order they fired (`fired_at`, then id) after the keyset `after`.

        Their rows are gone (migration 0010): each is the `fire_log` delivery that fired it,
        read in order over the log's `fired_at` index, joined to its tombstone in `fired_tasks`
        (same id and `fired_at`: a task fired once, and a delivery whose tombstone the upkeep
        purged is no longer listed). The subject and due window apply to the delivery's subject
        and `scheduled_for`; the tombstone keeps no `org_id` (callers refuse that filter)."""
        async with self.db.timed("fired_list") as conn:
            rows = await conn.fetch(
                f"SELECT {SUMMARY_JSON}, {micros('s.fired_at')}, s.id "
                f"FROM ({FIRED_SQL}) s ORDER BY s.fired_at, s.id",
                where.subject,
                where.due_before,
                where.due_after,
                after[0] if after else None,
                after[1] if after else "",
                limit,
            )
        return [Listed(r[0], r[1:]) for r in rows]

    async def task(self, task_id: str) -> dict[str, Any] | None:
        """One task with its envelope bytes, headers and every delivery in the fire log. A
        fired task's row is gone (migration 0010): its state comes from its tombstone and the
        fire log, without envelope bytes or headers. All reads share one snapshot, so a task
        that fires in between is never shown `claimed` with its delivery."""
        async with (
            self.db.timed("task_detail") as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row: asyncpg.Record | dict[str, Any] | None = await conn.fetchrow(
                f"SELECT {_TASK_DETAIL} FROM delayed_messages WHERE id = $1", task_id
            )
            if row is None:
                row = await fired_task(conn, task_id)
                if row is None:
                    return None
                row |= {"claimed_epoch": None, "claimed_at": None, "updated_at": row["fired_at"]}
                row |= {"headers": "{}", "payload": None}
            fires = await conn.fetch(
                "SELECT scheduled_for, fired_at, attempt, epoch, instance, stream, stream_seq "
                "FROM fire_log WHERE kind = 'delayed' AND key = $1 ORDER BY scheduled_for, "
                "fired_at LIMIT 100",
                task_id,
            )
        doc = dict(row)
        doc["headers"] = json.loads(doc["headers"])
        doc["payload"] = None if doc["payload"] is None else bytes(doc["payload"])
        doc["deliveries"] = [dict(f) for f in fires]
        return doc

    # -- cron jobs ------------------------------------------------------------------------------
    async def schedules(
        self, active: bool | None, after: str | None, limit: int
    ) -> list[dict[str, Any]]:
        """Cron jobs by name after `after`, with their cursors and operator pauses."""
        async with self.db.timed("schedules_list") as conn:
            rows = await conn.fetch(
                f"SELECT {_SCHEDULE} FROM schedules s LEFT JOIN schedule_state st "
                "ON st.name = s.name WHERE ($1::boolean IS NULL OR s.active = $1) "
                "AND ($2::text IS NULL OR s.name > $2) ORDER BY s.name LIMIT $3",
                active,
                after,
                limit,
            )
        return [_schedule(r) for r in rows]

    async def schedule(self, name: str) -> dict[str, Any] | None:
        async with self.db.timed("schedule_get") as conn:
            row = await conn.fetchrow(
                f"SELECT {_SCHEDULE} FROM schedules s LEFT JOIN schedule_state st "
                "ON st.name = s.name WHERE s.name = $1",
                name,
            )
        return None if row is None else _schedule(row)

    async def fires(self, name: str, limit: int) -> list[dict[str, Any]]:
        """A cron job's latest deliveries, newest first (the fire log's key index)."""
        async with self.db.timed("schedule_fires") as conn:
            rows = await conn.fetch(
                "SELECT scheduled_for, fired_at, attempt, epoch, instance, stream, stream_seq, "
                "manual FROM fire_log WHERE kind = 'cron' AND key = $1 "
                "ORDER BY scheduled_for DESC, fired_at DESC LIMIT $2",
                name,
                limit,
            )
        return [dict(r) for r in rows]

    # -- statistics -----------------------------------------------------------------------------
    async def forecast(self, now: datetime) -> dict[str, list[int]]:
        """Pending tasks per subject due by now + each of `WINDOWS` (in that order)."""
        async with self.db.timed("forecast") as conn:
            rows = await conn.fetch(FORECAST_SQL, now, *(span for _, span in WINDOWS))
        return {r["target"]: [int(r[f"w{i}"]) for i in range(len(WINDOWS))] for r in rows}

    async def pending_by_subject(self, top: int) -> tuple[int, list[tuple[str, int]]]:
        """All pending tasks (not claimed), and the `top` subjects holding most of them."""
        async with self.db.timed("pending_by_subject") as conn:
            rows = await conn.fetch(
                "SELECT target, count(*) AS n, sum(count(*)) OVER () AS total "
                f"FROM delayed_messages WHERE {states.unclaimed(states.PENDING)} "
                "GROUP BY target ORDER BY n DESC, target LIMIT $1",
                top,
            )
        total = int(rows[0]["total"]) if rows else 0
        return total, [(r["target"], int(r["n"])) for r in rows]

    async def lateness(self, since: datetime) -> tuple[int, float | None, float | None]:
        """Deliveries since `since` and their lateness p50 and p99 in milliseconds."""
        async with self.db.timed("lateness") as conn:
            row = await conn.fetchrow(
                "SELECT count(*) AS n, percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY "
                "greatest(extract(epoch FROM fired_at - scheduled_for), 0) * 1000) AS q "
                "FROM fire_log WHERE fired_at >= $1 AND NOT manual",
                since,
            )
        assert row is not None  # an aggregate without GROUP BY returns exactly one row
        quantiles = row["q"] or [None, None]
        return int(row["n"]), quantiles[0], quantiles[1]

    async def leadership(self) -> dict[str, Any]:
        """The fencing epoch and who took it last (PostgreSQL's view, any instance reads it)."""
        async with self.db.timed("leadership") as conn:
            row = await conn.fetchrow("SELECT epoch, instance, since FROM leadership WHERE id = 1")
        return dict(row) if row else {"epoch": 0, "instance": None, "since": None}


def _schedule(row: Any) -> dict[str, Any]:
    doc = dict(row)
    doc["definition"] = json.loads(doc["definition"])
    return doc
