"""The in-memory twins of the operator half's cron jobs: `scheduler.operations.stores`'
`ScheduleReads` and `ScheduleControl` (`MemorySchedules`, with the `sync` that loads the YAML's
jobs) and `BackfillLog` (`MemoryBackfills`, writing its manual rows to the same fire log).

It keeps the rules of `scheduler.store.postgres.cron_jobs` and `.overview`'s SQL: a sync
stores new and changed jobs as active (clearing a failed mark) and deactivates the rest;
listings go by name; a pause keeps its first `paused_at` and takes the latest `who` and note,
a resume clears all three and a failed mark; a manual trigger's fire-log row is written once
per (job, instant), confirmed once, dropped for a duplicate whose first row holds the same
stream sequence. Cursors are the engine's (`MemoryScheduleStore`): none here, as on a database
no leader has fired from. A backfill claims an occurrence nobody fired or is firing (or whose
claim is older than `stale_before`), confirms it once with its manual fire-log row, and gives
back unconfirmed claims (`scheduler.store.postgres.backfill`). tests/contracts/
test_schedule_reads.py and test_backfill_log.py hold the twins and PostgreSQL to the same
answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.cron.jobs import Job
from scheduler.records import Advance

Row = dict[str, Any]
DUPLICATE_SEARCH = timedelta(days=2)  # how far back a duplicate's first row is looked for


class MemorySchedules:
    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.now = now
        self.epoch = 0  # the leadership row's: a manual row carries it
        self.jobs: dict[str, Row] = {}  # by name, with `fingerprint`
        self.fire_log: list[Row] = []

    async def sync(self, jobs: Sequence[Job], at: datetime | None = None) -> tuple[int, int]:
        changed = 0
        for job in jobs:
            held = self.jobs.get(job.name)
            if held is not None and held["fingerprint"] == job.fingerprint() and held["active"]:
                continue
            row = held or {"name": job.name, "paused_at": None, "paused_by": None}
            row |= {"pause_note": row.get("pause_note"), "active": True}
            row |= {"definition": json.loads(json.dumps(job.definition()))}
            row |= {"fingerprint": job.fingerprint(), "file": job.file, "line": job.line}
            row |= {"failed_at": None, "failed_reason": None, "failed_error": None}
            self.jobs[job.name] = row | {"updated_at": self.now()}
            changed += 1
        names = {j.name for j in jobs}
        gone = [r for n, r in self.jobs.items() if r["active"] and n not in names]
        for row in gone:
            row |= {"active": False, "updated_at": self.now()}
        return changed, len(gone)

    # -- reads ----------------------------------------------------------------------------------
    async def schedules(self, active: bool | None, after: str | None, limit: int) -> list[Row]:
        names = sorted(n for n, r in self.jobs.items() if active is None or r["active"] == active)
        return [self._shown(n) for n in names if after is None or n > after][:limit]

    async def schedule(self, name: str) -> Row | None:
        return self._shown(name) if name in self.jobs else None

    async def fires(self, name: str, limit: int) -> list[Row]:
        mine = [f for f in self.fire_log if f["key"] == name]
        mine.sort(key=lambda f: (f["scheduled_for"], f["fired_at"]), reverse=True)
        columns = ("scheduled_for", "fired_at", "attempt", "epoch", "instance", "stream")
        return [{c: f[c] for c in (*columns, "stream_seq", "manual")} for f in mine[:limit]]

    def _shown(self, name: str) -> Row:
        row = {k: v for k, v in self.jobs[name].items() if k != "fingerprint"}
        row["definition"] = json.loads(json.dumps(row["definition"]))
        return row | {"last_scheduled_for": None, "last_fired_at": None, "skipped": None}

    # -- operator actions -----------------------------------------------------------------------
    async def set_paused(self, name: str, who: str | None, note: str | None = None) -> bool:
        row = self.jobs.get(name)
        if row is None:
            return False
        paused_at = None if who is None else (row["paused_at"] or self.now())
        row |= {"paused_at": paused_at, "paused_by": who, "updated_at": self.now()}
        row["pause_note"] = None if who is None else note
        if who is None:
            row |= {"failed_at": None, "failed_reason": None, "failed_error": None}
        return True

    async def log_manual_intent(self, name: str, subject: str, at: datetime, instance: str) -> None:
        if self._manual(name, at, lambda f: True):
            return
        self.fire_log.append(
            {"key": name, "subject": subject, "scheduled_for": at, "fired_at": at, "attempt": 1}
            | {"epoch": self.epoch, "instance": instance, "stream": None, "stream_seq": None}
            | {"manual": True}
        )

    async def confirm_manual_fire(self, fire: Advance) -> None:
        for row in self._manual(fire.name, fire.scheduled_for, _unconfirmed):
            row |= {"fired_at": fire.fired_at, "stream": fire.stream, "stream_seq": fire.stream_seq}

    async def settle_duplicate_fire(self, fire: Advance) -> None:
        since = fire.scheduled_for - DUPLICATE_SEARCH
        first = [
            f
            for f in self.fire_log
            if f["key"] == fire.name
            and f["manual"]
            and f["scheduled_for"] > since
            and (f["stream"], f["stream_seq"]) == (fire.stream, fire.stream_seq)
        ]
        if first:
            await self.forget_manual_intent(fire.name, fire.scheduled_for)
        await self.confirm_manual_fire(fire)

    async def forget_manual_intent(self, name: str, at: datetime) -> None:
        gone = self._manual(name, at, _unconfirmed)
        self.fire_log = [f for f in self.fire_log if not any(f is g for g in gone)]

    def _manual(self, name: str, at: datetime, which: Callable[[Row], bool]) -> list[Row]:
        return [
            f
            for f in self.fire_log
            if f["key"] == name and f["scheduled_for"] == at and f["manual"] and which(f)
        ]


def _unconfirmed(row: Row) -> bool:
    return row["stream"] is None


class MemoryBackfills:
    """`BackfillLog` over `schedules`' fire log: claims by (job, occurrence)."""

    def __init__(self, schedules: MemorySchedules) -> None:
        self.schedules = schedules
        self.claims: dict[tuple[str, datetime], Row] = {}

    async def fired(self, name: str, occurrences: Sequence[datetime]) -> set[datetime]:
        return {at for at in occurrences if self._confirmed(name, at)}

    async def claim(
        self,
        name: str,
        occurrences: Sequence[datetime],
        msg_ids: Sequence[str],
        instance: str,
        now: datetime,
        stale_before: datetime,
    ) -> set[datetime]:
        taken = set()
        for at, msg_id in zip(occurrences, msg_ids, strict=True):
            held = self.claims.get((name, at))
            if held is None:
                self.claims[name, at] = {"msg_id": msg_id, "fired_at": None}
            elif held["fired_at"] is not None or held["claimed_at"] >= stale_before:
                continue
            self.claims[name, at] |= {"instance": instance, "claimed_at": now}
            taken.add(at)
        return taken

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
        held = self.claims.get((name, occurrence))
        if held is None or held["fired_at"] is not None:
            return
        held |= {"fired_at": fired_at, "stream": stream, "stream_seq": seq}
        self.schedules.fire_log.append(
            {"key": name, "subject": subject, "scheduled_for": occurrence, "fired_at": fired_at}
            | {"attempt": 1, "epoch": self.schedules.epoch, "instance": instance}
            | {"stream": stream, "stream_seq": seq, "manual": True}
        )

    async def release(self, name: str, occurrences: Sequence[datetime]) -> None:
        for at in occurrences:
            if (name, at) in self.claims and not self._confirmed(name, at):
                del self.claims[name, at]

    def _confirmed(self, name: str, at: datetime) -> bool:
        held = self.claims.get((name, at))
        return held is not None and held["fired_at"] is not None
