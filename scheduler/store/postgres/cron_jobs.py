"""Cron jobs in PostgreSQL: the YAML synced into `schedules` (with a failed job's mark and its
partition, `partition_of(name, P)`: scheduler/partitions.py), cursors in `schedule_state`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from scheduler.cron.jobs import Job
from scheduler.partitions import partition_of
from scheduler.records import Advance, CronFailure
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.epoch import fenced, fenced_by


class ScheduleStore:
    def __init__(self, db: PostgresStore, partitions: int = 1) -> None:
        self.db = db
        self.partitions = partitions  # the deployment's P (scheduler/partitions.py)
        # the partitions the engine's term holds: every one, as TaskStore.office
        self.office: Sequence[int] = range(partitions)

    def _partitions_of(self, names: Sequence[str]) -> list[int]:
        """Each job's partition, `partition_of(name, P)` (as `sync` stores it)."""
        if self.partitions == 1:
            return [0] * len(names)
        return [partition_of(name, self.partitions) for name in names]

    async def sync(self, jobs: Sequence[Job], at: datetime | None = None) -> tuple[int, int]:
        """Upsert the YAML's jobs as active, deactivate the rest; return (changed, removed).

        Every added, changed or removed job also closes its open `schedule_history` row and
        (unless removed) opens a new one at `at` (the daemon's clock; the database's if None),
        so the drift audit knows which definition was in force when."""
        names = [j.name for j in jobs]
        async with self.db.timed("sync") as conn, conn.transaction():
            changed = await conn.fetch(
                "WITH u AS (SELECT * FROM unnest($1::text[], $2::jsonb[], $3::text[], "
                "$4::text[], $5::int[], $6::smallint[]) "
                "AS u(name, definition, fingerprint, file, line, partition)) "
                "INSERT INTO schedules (name, definition, fingerprint, file, line, partition) "
                "SELECT * FROM u ON CONFLICT (name) DO UPDATE SET definition = "
                "excluded.definition, fingerprint = excluded.fingerprint, file = excluded.file, "
                "line = excluded.line, partition = excluded.partition, active = true, "
                "failed_at = NULL, failed_reason = NULL, "
                "failed_error = NULL, updated_at = now() WHERE "
                "schedules.fingerprint <> excluded.fingerprint OR NOT schedules.active "
                "RETURNING name",
                names,
                [json.dumps(j.definition()) for j in jobs],
                [j.fingerprint() for j in jobs],
                [j.file for j in jobs],
                [j.line for j in jobs],
                [partition_of(name, self.partitions) for name in names],
            )
            removed = await conn.fetch(
                "UPDATE schedules SET active = false, updated_at = now() "
                "WHERE active AND NOT (name = ANY($1::text[])) RETURNING name",
                names,
            )
            await self._record_history(
                conn, [r["name"] for r in changed], [r["name"] for r in removed], at
            )
        return len(changed), len(removed)

    @staticmethod
    async def _record_history(
        conn: Any, changed: Sequence[str], removed: Sequence[str], at: datetime | None
    ) -> None:
        """Close the open history rows of `changed` and `removed` jobs at `at` and open new ones
        for `changed` (their definition as stored, paused when an operator paused the job)."""
        ended = [*changed, *removed]
        if not ended:
            return
        await conn.execute(
            "UPDATE schedule_history SET valid_to = GREATEST(valid_from, "
            "COALESCE($2::timestamptz, now())) WHERE valid_to IS NULL AND name = ANY($1::text[])",
            ended,
            at,
        )
        await conn.execute(
            "INSERT INTO schedule_history (name, definition, fingerprint, valid_from) "
            "SELECT name, CASE WHEN paused_at IS NULL THEN definition ELSE definition || "
            "'{\"paused\": true}'::jsonb END, fingerprint, COALESCE($2::timestamptz, now()) "
            "FROM schedules WHERE name = ANY($1::text[]) AND active "
            "ON CONFLICT (name) WHERE valid_to IS NULL DO NOTHING",
            list(changed),
            at,
        )

    async def cursors(self) -> dict[str, datetime]:
        async with self.db.timed("cursors") as conn:
            rows = await conn.fetch("SELECT name, last_scheduled_for FROM schedule_state")
        return {r["name"]: r["last_scheduled_for"] for r in rows}

    async def advance(self, epoch: int, moves: Sequence[Advance], instance: str) -> None:
        """Move cursors and log deliveries in one fenced statement; a retried statement adds no
        second `fire_log` row (the unique index `fire_log_once`, migration 0006)."""
        if not moves:
            return
        fired = [d for m in moves for d in m.deliveries()]  # each occurrence delivered
        async with self.db.timed("cron_advance") as conn:
            await fenced(
                conn,
                epoch,
                "u AS (SELECT * FROM unnest($3::text[], $4::timestamptz[], "
                "$5::timestamptz[], $6::bigint[], $7::bigint[], $15::smallint[]) AS u(name, "
                "sched, fired, seq, skipped, part)), st AS (INSERT INTO schedule_state (name, "
                "last_scheduled_for, last_fired_at, last_stream_seq, skipped, epoch) SELECT "
                "u.name, u.sched, u.fired, u.seq, u.skipped, $1 FROM u JOIN lead ON "
                "lead.partition = u.part ON CONFLICT (name) DO UPDATE SET "
                "last_scheduled_for = GREATEST(schedule_state.last_scheduled_for, "
                "excluded.last_scheduled_for), last_fired_at = COALESCE(excluded.last_fired_at, "
                "schedule_state.last_fired_at), last_stream_seq = COALESCE("
                "excluded.last_stream_seq, schedule_state.last_stream_seq), skipped = "
                "schedule_state.skipped + excluded.skipped, epoch = $1, updated_at = now() "
                "RETURNING 1), f AS (SELECT * FROM unnest($8::text[], $9::text[], "
                "$10::timestamptz[], $11::timestamptz[], $12::int[], $13::text[], $14::bigint[], "
                "$16::smallint[]) AS f(key, subject, sched, fired, attempt, stream, seq, part)), "
                "ins AS (INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, "
                "attempt, epoch, instance, stream, stream_seq) SELECT 'cron', f.key, f.subject, "
                "f.sched, f.fired, f.attempt, $1, $2, f.stream, f.seq FROM f JOIN lead ON "
                "lead.partition = f.part ON CONFLICT DO NOTHING RETURNING 1)",
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
                self._partitions_of([m.name for m in moves]),
                self._partitions_of([m.name for m in fired]),
                **fenced_by(set(self._partitions_of([m.name for m in moves])), self.office),
            )

    async def fail(self, epoch: int, failures: Sequence[CronFailure]) -> None:
        """Mark jobs failed, each only while its definition has the failure's fingerprint (a
        sync that changed it in between wins); fenced like `advance`."""
        if not failures:
            return
        async with self.db.timed("cron_fail") as conn:
            await fenced(
                conn,
                epoch,
                "u AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], "
                "$5::text[], $6::timestamptz[]) AS u(name, fingerprint, reason, error, at)), "
                "f AS (UPDATE schedules s SET failed_at = u.at, failed_reason = u.reason, "
                "failed_error = u.error, updated_at = now() FROM u, lead WHERE s.name = u.name "
                "AND s.partition = lead.partition AND s.fingerprint = u.fingerprint AND s.active "
                "RETURNING 1)",
                [f.name for f in failures],
                [f.fingerprint for f in failures],
                [f.reason for f in failures],
                [f.error for f in failures],
                [f.failed_at for f in failures],
                **fenced_by(set(self._partitions_of([f.name for f in failures])), self.office),
            )

    async def failed(self) -> frozenset[str]:
        """Names of the active jobs marked failed."""
        async with self.db.timed("failed") as conn:
            rows = await conn.fetch(
                "SELECT name FROM schedules WHERE active AND failed_at IS NOT NULL"
            )
        return frozenset(r["name"] for r in rows)

    # -- operator actions (management API) ----------------------------------------------------
    async def set_paused(self, name: str, who: str | None, note: str | None = None) -> bool:
        """Pause a job for `who` with the operator's `note` (why), or resume it (`who` None:
        the note goes too); False when no job has that name. Pausing a paused job keeps its
        `paused_at` and takes the new `who` and `note`.

        Resuming also clears a failed mark (see `fail`): the job is tried again. A change of
        pause state also starts a new `schedule_history` version (paused or not) now."""
        async with self.db.timed("pause") as conn, conn.transaction():
            was = await conn.fetchval(
                "SELECT paused_at IS NOT NULL FROM schedules WHERE name = $1 FOR UPDATE", name
            )
            if was is None:
                return False
            await conn.execute(
                "UPDATE schedules SET paused_at = CASE WHEN $2::text IS NULL THEN NULL "
                "ELSE coalesce(paused_at, now()) END, paused_by = $2, pause_note = CASE WHEN "
                "$2::text IS NULL THEN NULL ELSE $3::text END, updated_at = now() WHERE name = $1",
                name,
                who,
                note,
            )
            if who is None:
                await conn.execute(
                    "UPDATE schedules SET failed_at = NULL, failed_reason = NULL, "
                    "failed_error = NULL WHERE name = $1 AND failed_at IS NOT NULL",
                    name,
                )
            if was != (who is not None):
                await self._record_history(conn, [name], [], None)
        return True

    async def operator_paused(self) -> frozenset[str]:
        """Names of the jobs an operator has paused (on top of `paused` in YAML)."""
        async with self.db.timed("paused") as conn:
            rows = await conn.fetch("SELECT name FROM schedules WHERE paused_at IS NOT NULL")
        return frozenset(r["name"] for r in rows)

    async def log_manual_intent(self, name: str, subject: str, at: datetime, instance: str) -> None:
        """A manual trigger's `fire_log` row, written before its publish: marked `manual`, not
        fenced (no cursor moves), with no stream yet (`confirm_manual_fire` adds it after the
        PubAck). Written once per (job, `at`): a retry of the same trigger finds it there."""
        async with self.db.timed("manual_fire") as conn:
            await conn.execute(
                "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, "
                "epoch, instance, manual) SELECT 'cron', $1, $2, $3, $3, 1, epoch, $4, true "
                "FROM leadership WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM fire_log WHERE "
                "kind = 'cron' AND key = $1 AND scheduled_for = $3 AND manual)",
                name,
                subject,
                at,
                instance,
            )

    async def confirm_manual_fire(self, fire: Advance) -> None:
        """The PubAck of the manual trigger `fire` (at `scheduled_for`): its stream, sequence
        and acknowledgement time on the row `log_manual_intent` wrote (once: a repeat finds
        the row confirmed and changes nothing)."""
        async with self.db.timed("manual_fire") as conn:
            await conn.execute(
                "UPDATE fire_log SET fired_at = $3, stream = $4, stream_seq = $5 "
                "WHERE kind = 'cron' AND key = $1 AND scheduled_for = $2 AND manual "
                "AND stream IS NULL",
                fire.name,
                fire.scheduled_for,
                fire.fired_at,
                fire.stream,
                fire.stream_seq,
            )

    async def settle_duplicate_fire(self, fire: Advance) -> None:
        """A manual trigger's publish came back a duplicate (a retry under the same
        idempotency key): when the first attempt's row already holds that stream sequence,
        the retry's own unconfirmed row goes (one row per message), else it is confirmed.
        Only rows of the last two days are searched: a duplicate window is far shorter."""
        async with self.db.timed("manual_fire") as conn:
            await conn.execute(
                "DELETE FROM fire_log WHERE kind = 'cron' AND key = $1 AND scheduled_for = $2 "
                "AND manual AND stream IS NULL AND EXISTS (SELECT 1 FROM fire_log WHERE "
                "kind = 'cron' AND key = $1 AND scheduled_for > $2 - interval '2 days' "
                "AND manual AND stream = $3 AND stream_seq = $4)",
                fire.name,
                fire.scheduled_for,
                fire.stream,
                fire.stream_seq,
            )
        await self.confirm_manual_fire(fire)

    async def forget_manual_intent(self, name: str, at: datetime) -> None:
        """Delete the unconfirmed row of a manual trigger whose publish was refused."""
        async with self.db.timed("manual_fire") as conn:
            await conn.execute(
                "DELETE FROM fire_log WHERE kind = 'cron' AND key = $1 AND scheduled_for = $2 "
                "AND manual AND stream IS NULL",
                name,
                at,
            )
