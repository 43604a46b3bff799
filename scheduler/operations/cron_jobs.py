"""Cron jobs for operators: list, show (next occurrences, last fires), pause, resume, trigger.

YAML stays the source of truth for what a job is. An operator's pause is stored beside it in
PostgreSQL (`schedules.paused_at`/`paused_by`/`pause_note`: when, who and why), survives
reloads and restarts, and is applied by the leader at its next sync: at once through a NATS
notice, at the latest within a few seconds through the daemon's periodic check. A job paused
in YAML can only be resumed by editing YAML.

A job stopped by a permanent publish error (`failed`, see docs/cron.md) fires again once its
definition changes in YAML, or when an operator resumes it (resume clears the failed mark as
well as an operator's pause: for a fix outside the YAML, such as a larger `max_payload`).

A manual trigger publishes one occurrence now from whichever instance received it, with its own
`Nats-Msg-Id` `<job>@manual-<instant>` (`<job>@manual-key-<digest>` under an idempotency key)
and a `fire_log` row marked `manual`; it moves no cursor, so the regular occurrences go on as
planned. The row is written before the publish, without a stream, and confirmed with the stream
and sequence once the PubAck is in: a trigger is never invisible to the audit. Once the PubAck
is in, the answer is `triggered`; if PostgreSQL cannot take the confirmation then, the daemon's
write backlog retries it (`fire_log: pending` in the answer).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import json
import logging
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

from scheduler.clock import Clock, to_rfc3339, to_rfc3339_us
from scheduler.cron.expression import occurrences
from scheduler.cron.jobs import Job, job_from_definition, load_dir, schedule_files
from scheduler.cron.misfire import fire_time
from scheduler.engine.cron.message import envelope
from scheduler.operations import Outcome
from scheduler.operations.backfill import Backfiller
from scheduler.operations.backlog import TRANSIENT, WriteBacklog
from scheduler.operations.cron_job_records import (
    Fire,
    Occurrence,
    ScheduleDetail,
    ScheduleProblem,
    ScheduleSummary,
)
from scheduler.operations.paging import NAME, Page, decode, page
from scheduler.operations.ports import PUBLISH_TIMEOUT, BusWriter, NoAnswer, NoStream, Refused
from scheduler.operations.stores import BackfillLog, ScheduleControl, ScheduleReads
from scheduler.records import Advance
from scheduler.settings import Settings

log = logging.getLogger(__name__)

CURSOR = "schedules"
NEXT_COUNT = 10
FIRES_COUNT = 20
CHANGED_SUBJECT = "scheduler.v1.internal.schedules"
CONFIRM_TIMEOUT = 2.0
_UNREAD = object()
S = TypeVar("S", bound=ScheduleSummary)


class ScheduleOperations:
    def __init__(
        self,
        bus: BusWriter,
        settings: Settings,
        store: ScheduleControl,
        overview: ScheduleReads,
        backfills: BackfillLog,
        clock: Clock,
        backlog: WriteBacklog,
    ) -> None:
        self.bus = bus
        self.backlog = backlog
        self.settings = settings
        self.store = store
        self.overview = overview
        self.clock = clock
        self._problems: tuple[object, list[ScheduleProblem]] = (_UNREAD, [])
        self.backfiller = Backfiller(bus, settings, backfills, clock, backlog)

    async def list(
        self, active: bool | None, cursor: str | None, limit: int
    ) -> Page[ScheduleSummary]:
        key = decode(CURSOR, cursor, (NAME,))
        rows = await self.overview.schedules(active, key[0] if key else None, limit + 1)
        jobs = [_summary(ScheduleSummary, row) for row in rows]
        return page(jobs, limit, lambda job: (job.name,), CURSOR)

    async def problems(self) -> builtins.list[ScheduleProblem]:  # `list` is the method above
        """Errors in the YAML files as this instance reads them now (the jobs they name are not
        loaded, so not fired): `{file, line, job, message}`. Read again only when a file was
        added, removed or changed."""
        directory = Path(self.settings.schedules_dir)
        stamp = await asyncio.to_thread(_files_stamp, directory)
        if stamp != self._problems[0]:
            self._problems = (stamp, await asyncio.to_thread(_load_problems, directory))
        return self._problems[1]

    async def show(self, name: str) -> ScheduleDetail | None:
        """A job's summary plus its next occurrences and latest deliveries with lateness."""
        row = await self.overview.schedule(name)
        if row is None:
            return None
        job = _job(row)
        after = max(self.clock.now(), row["last_scheduled_for"] or self.clock.now())
        coming = [
            Occurrence(scheduled_for=at, fire_at=fire_time(job, at))
            for at in islice(occurrences(job.cron, after, job.timezone), NEXT_COUNT)
        ]
        fires = [_fire(f) for f in await self.overview.fires(name, FIRES_COUNT)]
        return _summary(ScheduleDetail, row, definition=row["definition"], next=coming, fires=fires)

    async def pause(self, name: str, who: str, note: str | None = None) -> Outcome:
        """Pause for `who`, with the operator's `note` (why) kept beside it until resumed."""
        return await self._set_paused(name, who, note)

    async def resume(self, name: str) -> Outcome:
        row = await self.overview.schedule(name)
        if row is not None and row["definition"].get("paused"):
            where = f"{row['file']}:{row['line']}" if row["file"] else "its YAML file"
            return Outcome(
                "paused_in_yaml",
                name,
                f"job {name!r} is paused in YAML ({where}); set paused: false there and reload",
            )
        return await self._set_paused(name, None)

    async def _set_paused(self, name: str, who: str | None, note: str | None = None) -> Outcome:
        if not await self.store.set_paused(name, who, note):
            return Outcome("not_found", name, f"no cron job named {name!r}")
        await self.bus.notify(CHANGED_SUBJECT, name.encode())
        return Outcome("paused" if who else "resumed", name)

    async def trigger(
        self, name: str, key: str | None = None, first_at: datetime | None = None
    ) -> Outcome:
        """Fire one occurrence of `name` now, once, from this instance. With `key` (the API's
        idempotency key, scoped to its caller) the message id is derived from job and key, and
        `first_at` (when that key's first request began) stands for "now", so a retry
        publishes the same message, which the target stream's duplicate window drops."""
        job = await self._active_job(name)
        if isinstance(job, Outcome):
            return job
        now = first_at or self.clock.now()
        msg_id = manual_msg_id(job.name, now, key)
        body, headers = manual_envelope(job, now, msg_id)
        # Before the publish: whatever happens next, the audit sees this trigger.
        await self.store.log_manual_intent(job.name, job.subject, now, self.settings.instance_id)
        try:
            ack = await self.bus.store(job.subject, body, headers, PUBLISH_TIMEOUT)
        except (NoStream, Refused) as exc:  # refused: nothing was stored
            await self._forget(job.name, now)
            if isinstance(exc, NoStream):
                detail = f"no stream captures {job.subject}: create one, then trigger again"
                return Outcome("no_stream", name, detail)
            return Outcome("publish_failed", name, f"{job.subject} refused the message: {exc}")
        except NoAnswer as exc:  # no answer: it may have been stored
            log.warning("schedule.trigger_failed job=%s msg_id=%s error=%r", name, msg_id, exc)
            detail = (
                f"publishing to {job.subject} got no answer ({exc}): it may "
                "have been delivered (its fire_log row stays without a stream); retry with the "
                "same Idempotency-Key to be sure it fires once"
            )
            return Outcome("publish_failed", name, detail, {"msg_id": msg_id})
        fired = Advance(job.name, job.subject, now, self.clock.now(), ack.stream, ack.seq)
        logged = await self._confirm(fired, msg_id, ack.duplicate)
        data = {"msg_id": msg_id, "subject": job.subject, "stream": ack.stream, "seq": ack.seq}
        data |= {"fired_at": to_rfc3339_us(now), "fire_log": logged}
        return Outcome("triggered", name, data=data)

    async def backfill(
        self, name: str, start: datetime, end: datetime, dry_run: bool = False
    ) -> Outcome:
        """Fire each occurrence of `name` in `[start, end)` once (`scheduler.operations.backfill`),
        or with `dry_run` say what that would fire."""
        job = await self._active_job(name)
        if isinstance(job, Outcome):
            return job
        found = self.backfiller.window(job, start, end)
        if dry_run:
            return await self.backfiller.plan(job, found)
        return await self.backfiller.fire(job, found)

    async def _active_job(self, name: str) -> Job | Outcome:
        """The job `name` as synced from YAML, or why it cannot fire (`not_found`, `removed`)."""
        row = await self.overview.schedule(name)
        if row is None:
            return Outcome("not_found", name, f"no cron job named {name!r}")
        if not row["active"]:
            return Outcome("removed", name, f"job {name!r} is no longer in the YAML files")
        return _job(row)

    async def _confirm(self, fired: Advance, msg_id: str, duplicate: bool) -> str:
        """Confirm the fire-log row now (`written`) or, PostgreSQL unreachable, in the
        background (`pending`): the publish was acknowledged, so the answer is `triggered`.
        A duplicate publish (a retried key) keeps the first attempt's row if it has one."""
        write = self.store.settle_duplicate_fire if duplicate else self.store.confirm_manual_fire
        try:
            async with asyncio.timeout(CONFIRM_TIMEOUT):
                await write(fired)
            return "written"
        except TRANSIENT as exc:
            log.warning("schedule.fire_log_deferred msg_id=%s error=%r", msg_id, exc)
        what = (
            f"fire_log manual row job={fired.name} scheduled_for={to_rfc3339(fired.scheduled_for)} "
            f"msg_id={msg_id} stream={fired.stream} seq={fired.stream_seq}"
        )
        self.backlog.add(what, functools.partial(write, fired))
        return "pending"

    async def _forget(self, name: str, at: datetime) -> None:
        try:
            await self.store.forget_manual_intent(name, at)
        except TRANSIENT as exc:
            log.warning("schedule.fire_log_deferred job=%s error=%r", name, exc)
            what = f"delete unconfirmed manual row job={name} scheduled_for={to_rfc3339(at)}"
            self.backlog.add(what, functools.partial(self.store.forget_manual_intent, name, at))


def manual_msg_id(job: str, now: datetime, key: str | None) -> str:
    """`<job>@manual-<instant>`, or with an idempotency key `<job>@manual-key-<digest>`."""
    if key is None:
        return f"{job}@manual-{to_rfc3339(now)}"
    return f"{job}@manual-key-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def manual_envelope(job: Job, now: datetime, key: str) -> tuple[bytes, dict[str, str]]:
    """The cron envelope of an occurrence at `now`, under the manual id `key`."""
    body, headers = envelope(job, now, now)
    doc = json.loads(body)
    doc["id"] = key
    headers = {**headers, "Nats-Msg-Id": key, "Mq-Manual": "true"}
    return json.dumps(doc, separators=(",", ":")).encode(), headers


def _files_stamp(directory: Path) -> object:
    try:
        return tuple((str(p), p.stat().st_mtime_ns) for p in schedule_files(directory))
    except OSError:  # not a folder (or gone): _load_problems says so
        return None


def _load_problems(directory: Path) -> list[ScheduleProblem]:
    if not directory.is_dir():
        message = "not a folder (SCHEDULER_SCHEDULES_DIR)"
        return [ScheduleProblem(file=str(directory), line=None, job=None, message=message)]
    errors = load_dir(directory).errors
    return [ScheduleProblem(file=e.file, line=e.line, job=e.job, message=e.message) for e in errors]


def _job(row: dict[str, Any]) -> Job:
    return job_from_definition(row["definition"], row["file"] or "", row["line"] or 0)


def _summary(record: type[S], row: dict[str, Any], **more: Any) -> S:
    """A job as listed (`ScheduleSummary`) or shown (`ScheduleDetail`, its fields in `more`)
    from its row (`OverviewStore.schedules`): paused in YAML or by an operator, failed."""
    definition = row["definition"]
    in_yaml = bool(definition.get("paused"))
    return record(
        name=row["name"],
        subject=definition["subject"],
        cron=definition["cron"],
        timezone=definition["timezone"],
        description=definition.get("description", ""),
        active=row["active"],
        paused=in_yaml or row["paused_at"] is not None,
        paused_in_yaml=in_yaml,
        paused_at=row["paused_at"],
        paused_by=row["paused_by"],
        pause_note=row.get("pause_note"),
        failed=row["failed_at"] is not None,
        failed_at=row["failed_at"],
        failed_reason=row["failed_reason"],
        failed_error=row["failed_error"],
        file=row["file"],
        line=row["line"],
        last_scheduled_for=row["last_scheduled_for"],
        last_fired_at=row["last_fired_at"],
        skipped=row["skipped"] or 0,
        **more,
    )


def _fire(row: dict[str, Any]) -> Fire:
    late = (row["fired_at"] - row["scheduled_for"]).total_seconds() * 1000
    return Fire.model_validate(row | {"lateness_ms": round(late, 3)})
