"""Backfilled cron occurrences in PostgreSQL (`backfill_fires`, migration 0017): the lasting
record that makes each occurrence fire once, whatever the target stream's duplicate window.

Claim before the publish, confirm after the PubAck (with the `fire_log` row, manual, in the
same statement), release when the publish was refused. A claim is the row's primary key
(job, occurrence), so two backfills over one window split it and never publish one occurrence
twice; an unconfirmed claim older than `stale_before` may be taken again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from scheduler.store.postgres.connect import PostgresStore


class BackfillStore:
    def __init__(self, db: PostgresStore) -> None:
        self.db = db

    async def fired(self, name: str, occurrences: Sequence[datetime]) -> set[datetime]:
        """Which of `occurrences` of `name` a backfill already fired (confirmed)."""
        async with self.db.timed("backfill") as conn:
            rows = await conn.fetch(
                "SELECT scheduled_for FROM backfill_fires WHERE name = $1 AND "
                "scheduled_for = ANY($2::timestamptz[]) AND fired_at IS NOT NULL",
                name,
                list(occurrences),
            )
        return {r["scheduled_for"] for r in rows}

    async def claim(
        self,
        name: str,
        occurrences: Sequence[datetime],
        msg_ids: Sequence[str],
        instance: str,
        now: datetime,
        stale_before: datetime,
    ) -> set[datetime]:
        """Claim the occurrences nobody fired or is firing (a claim older than `stale_before`
        counts as abandoned); the ones claimed now."""
        async with self.db.timed("backfill") as conn:
            rows = await conn.fetch(
                "INSERT INTO backfill_fires (name, scheduled_for, msg_id, instance, claimed_at) "
                "SELECT $1, u.at, u.msg_id, $4, $5 FROM unnest($2::timestamptz[], $3::text[]) "
                "AS u(at, msg_id) ON CONFLICT (name, scheduled_for) DO UPDATE SET "
                "claimed_at = excluded.claimed_at, instance = excluded.instance "
                "WHERE backfill_fires.fired_at IS NULL AND backfill_fires.claimed_at < $6 "
                "RETURNING scheduled_for",
                name,
                list(occurrences),
                list(msg_ids),
                instance,
                now,
                stale_before,
            )
        return {r["scheduled_for"] for r in rows}

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
        """The PubAck of one occurrence: its claim confirmed and its `fire_log` row (manual,
        `scheduled_for` the occurrence) written, once (a repeat finds the claim confirmed)."""
        async with self.db.timed("backfill") as conn:
            await conn.execute(
                "WITH b AS (UPDATE backfill_fires SET fired_at = $3, stream = $4, "
                "stream_seq = $5 WHERE name = $1 AND scheduled_for = $2 AND fired_at IS NULL "
                "RETURNING 1) INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, "
                "attempt, epoch, instance, stream, stream_seq, manual) SELECT 'cron', $1, $6, $2, "
                "$3, 1, l.epoch, $7, $4, $5, true FROM b, leadership l WHERE l.id = 1",
                name,
                occurrence,
                fired_at,
                stream,
                seq,
                subject,
                instance,
            )

    async def release(self, name: str, occurrences: Sequence[datetime]) -> None:
        """Give back unconfirmed claims whose publish was refused or never tried."""
        async with self.db.timed("backfill") as conn:
            await conn.execute(
                "DELETE FROM backfill_fires WHERE name = $1 AND "
                "scheduled_for = ANY($2::timestamptz[]) AND fired_at IS NULL",
                name,
                list(occurrences),
            )
