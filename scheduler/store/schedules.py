"""Cron jobs in PostgreSQL: the YAML synced into `schedules`, cursors in `schedule_state`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from scheduler.errors import FencedError
from scheduler.schedules import Job
from scheduler.store.postgres import PostgresStore


@dataclass(frozen=True, slots=True)
class Advance:
    """One job's cursor moving to `scheduled_for`; `fired_at` set when it was delivered."""

    name: str
    subject: str
    scheduled_for: datetime
    fired_at: datetime | None = None
    stream: str | None = None
    stream_seq: int | None = None
    attempt: int = 1
    skipped: int = 0


class ScheduleStore:
    def __init__(self, db: PostgresStore) -> None:
        self.db = db

    async def sync(self, jobs: Sequence[Job]) -> tuple[int, int]:
        """Upsert the YAML's jobs as active, deactivate the rest; return (changed, removed)."""
        names = [j.name for j in jobs]
        async with self.db.timed("sync") as conn, conn.transaction():
            changed = await conn.fetchval(
                "WITH u AS (SELECT * FROM unnest($1::text[], $2::jsonb[], $3::text[], "
                "$4::text[], $5::int[]) AS u(name, definition, fingerprint, file, line)), "
                "up AS (INSERT INTO schedules (name, definition, fingerprint, file, line) "
                "SELECT * FROM u ON CONFLICT (name) DO UPDATE SET definition = "
                "excluded.definition, fingerprint = excluded.fingerprint, file = excluded.file, "
                "line = excluded.line, active = true, updated_at = now() WHERE "
                "schedules.fingerprint <> excluded.fingerprint OR NOT schedules.active "
                "RETURNING 1) SELECT count(*) FROM up",
                names,
                [json.dumps(j.definition()) for j in jobs],
                [j.fingerprint() for j in jobs],
                [j.file for j in jobs],
                [j.line for j in jobs],
            )
            removed = await conn.execute(
                "UPDATE schedules SET active = false, updated_at = now() "
                "WHERE active AND NOT (name = ANY($1::text[]))",
                names,
            )
        return int(changed), int(removed.split()[-1])

    async def cursors(self) -> dict[str, datetime]:
        async with self.db.timed("cursors") as conn:
            rows = await conn.fetch("SELECT name, last_scheduled_for FROM schedule_state")
        return {r["name"]: r["last_scheduled_for"] for r in rows}

    async def advance(self, epoch: int, moves: Sequence[Advance], instance: str) -> None:
        """Move cursors and log deliveries in one fenced statement."""
        if not moves:
            return
        fired = [m for m in moves if m.fired_at is not None]
        async with self.db.timed("cron_advance") as conn:
            in_office = await conn.fetchval(
                "WITH lead AS (SELECT epoch FROM leadership WHERE id = 1 AND epoch = $1 "
                "FOR SHARE), u AS (SELECT * FROM unnest($3::text[], $4::timestamptz[], "
                "$5::timestamptz[], $6::bigint[], $7::bigint[]) AS u(name, sched, fired, seq, "
                "skipped)), st AS (INSERT INTO schedule_state (name, last_scheduled_for, "
                "last_fired_at, last_stream_seq, skipped, epoch) SELECT u.name, u.sched, u.fired, "
                "u.seq, u.skipped, $1 FROM u, lead ON CONFLICT (name) DO UPDATE SET "
                "last_scheduled_for = GREATEST(schedule_state.last_scheduled_for, "
                "excluded.last_scheduled_for), last_fired_at = COALESCE(excluded.last_fired_at, "
                "schedule_state.last_fired_at), last_stream_seq = COALESCE("
                "excluded.last_stream_seq, schedule_state.last_stream_seq), skipped = "
                "schedule_state.skipped + excluded.skipped, epoch = $1, updated_at = now() "
                "RETURNING 1), f AS (SELECT * FROM unnest($8::text[], $9::text[], "
                "$10::timestamptz[], $11::timestamptz[], $12::int[], $13::text[], $14::bigint[]) "
                "AS f(key, subject, sched, fired, attempt, stream, seq)), ins AS (INSERT INTO "
                "fire_log (kind, key, subject, scheduled_for, fired_at, attempt, epoch, instance, "
                "stream, stream_seq) SELECT 'cron', f.key, f.subject, f.sched, f.fired, "
                "f.attempt, $1, $2, f.stream, f.seq FROM f, lead RETURNING 1) "
                "SELECT count(*) FROM lead",
                epoch,
                instance,
                [m.name for m in moves],
                [m.scheduled_for for m in moves],
                [m.fired_at for m in moves],
                [m.stream_seq for m in moves],
                [m.skipped for m in moves],
                [m.name for m in fired],
                [m.subject for m in fired],
                [m.scheduled_for for m in fired],
                [m.fired_at for m in fired],
                [m.attempt for m in fired],
                [m.stream for m in fired],
                [m.stream_seq for m in fired],
            )
        if in_office == 0:
            raise FencedError(epoch)

    # -- operator actions (management API) ----------------------------------------------------
    async def set_paused(self, name: str, who: str | None) -> bool:
        """Pause a job for `who`, or resume it (`who` None); False when no job has that name."""
        async with self.db.timed("pause") as conn:
            done = await conn.fetchval(
                "UPDATE schedules SET paused_at = CASE WHEN $2::text IS NULL THEN NULL "
                "ELSE coalesce(paused_at, now()) END, paused_by = $2, updated_at = now() "
                "WHERE name = $1 RETURNING name",
                name,
                who,
            )
        return done is not None

    async def operator_paused(self) -> frozenset[str]:
        """Names of the jobs an operator has paused (on top of `paused` in YAML)."""
        async with self.db.timed("paused") as conn:
            rows = await conn.fetch("SELECT name FROM schedules WHERE paused_at IS NOT NULL")
        return frozenset(r["name"] for r in rows)

    async def log_manual_fire(self, fire: Advance, instance: str) -> None:
        """A manual trigger's `fire_log` row: not fenced (no cursor moves), marked `manual`."""
        async with self.db.timed("manual_fire") as conn:
            await conn.execute(
                "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, "
                "epoch, instance, stream, stream_seq, manual) SELECT 'cron', $1, $2, $3, $4, 1, "
                "epoch, $5, $6, $7, true FROM leadership WHERE id = 1",
                fire.name,
                fire.subject,
                fire.scheduled_for,
                fire.fired_at,
                instance,
                fire.stream,
                fire.stream_seq,
            )
