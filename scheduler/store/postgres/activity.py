"""The activity log in PostgreSQL (`activity_log`, migration 0018): operator actions, written
by the management API on its own pool, listed newest first, pruned past their retention."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from scheduler.operations.stores import Activity, ActivityFilter
from scheduler.store.postgres.connect import PostgresStore

_COLUMNS = (
    "id, at, who, via, session, action, route, target, detail::text AS detail, http_status, "
    "outcome, request_id, idempotency_key"
)
# Newest first by (at, id); the row comparison after the cursor spelled out so the (at, id)
# index bounds the scan.
_LIST = (
    f"SELECT {_COLUMNS} FROM activity_log WHERE ($1::text IS NULL OR action = $1) "
    "AND ($2::text IS NULL OR target = $2) AND ($3::text IS NULL OR starts_with(who, $3)) "
    "AND ($4::timestamptz IS NULL OR at >= $4) AND ($5::timestamptz IS NULL OR at < $5) "
    "AND ($6::timestamptz IS NULL OR at <= $6 AND (at < $6 OR id < $7)) "
    "ORDER BY at DESC, id DESC LIMIT $8"
)


class ActivityStore:
    def __init__(self, db: PostgresStore) -> None:
        self.db = db

    async def record(self, row: Activity) -> None:
        async with self.db.timed("activity_record") as conn:
            await conn.execute(
                "INSERT INTO activity_log (at, who, via, session, action, route, target, "
                "detail, http_status, outcome, request_id, idempotency_key) VALUES ($1, $2, $3, "
                "$4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12)",
                row.at,
                row.who,
                row.via,
                row.session,
                row.action,
                row.route,
                row.target,
                json.dumps(row.detail, separators=(",", ":")),
                row.http_status,
                row.outcome,
                row.request_id,
                row.idempotency_key,
            )

    async def list(
        self, where: ActivityFilter, after: tuple[datetime, int] | None, limit: int
    ) -> list[dict[str, Any]]:
        """Up to `limit` rows matching `where`, newest first, after the key `after`."""
        at, row_id = after if after is not None else (None, 0)
        async with self.db.timed("activity_list") as conn:
            rows = await conn.fetch(
                _LIST,
                where.action,
                where.target,
                where.who,
                where.since,
                where.until,
                at,
                row_id,
                limit,
            )
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]

    async def prune_over(self, keep: int, batch: int) -> int:
        """Delete up to `batch` of the rows older than the newest `keep`, oldest first; how
        many (the cut is read over the index on `at`, newest first)."""
        async with self.db.timed("activity_prune") as conn:
            status = await conn.execute(
                "DELETE FROM activity_log WHERE id IN (SELECT id FROM activity_log "
                "WHERE (at, id) <= (SELECT at, id FROM activity_log ORDER BY at DESC, id DESC "
                "OFFSET $1 LIMIT 1) ORDER BY at, id LIMIT $2 FOR UPDATE SKIP LOCKED)",
                keep,
                batch,
            )
        return int(status.split()[-1])

    async def prune(self, before: datetime, batch: int) -> int:
        """Delete up to `batch` rows recorded before `before`, oldest first; how many."""
        async with self.db.timed("activity_prune") as conn:
            status = await conn.execute(
                "DELETE FROM activity_log WHERE id IN (SELECT id FROM activity_log "
                "WHERE at < $1 ORDER BY at, id LIMIT $2 FOR UPDATE SKIP LOCKED)",
                before,
                batch,
            )
        return int(status.split()[-1])
