"""The operator half's cron jobs (`scheduler.operations.stores`' `ScheduleReads` and
`ScheduleControl`), over the in-memory twin and PostgreSQL alike: jobs as synced, listed by
name, paused and resumed, and the fire-log rows of manual triggers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import pytest

from scheduler.cron.jobs import Job, load_text
from scheduler.metrics import Metrics
from scheduler.operations.stores import ScheduleControl, ScheduleReads
from scheduler.records import Advance
from scheduler.store.memory_schedules import MemorySchedules

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
JOBS = """
scheduled_jobs:
  - name: b
    subject: mq.scheduled.b
    cron: "*/5 * * * *"
    description: every five minutes
  - name: a
    subject: mq.scheduled.a
    cron: "0 * * * *"
    timezone: Europe/Berlin
    data: {kind: hourly}
  - name: c
    subject: mq.scheduled.c
    cron: "0 0 * * *"
    paused: true
"""


class Sync(Protocol):
    async def __call__(
        self, jobs: Sequence[Job], at: datetime | None = None
    ) -> tuple[int, int]: ...


@dataclass
class Jobs:
    sync: Sync
    reads: ScheduleReads
    control: ScheduleControl


@pytest.fixture
async def jobs(database: str | None) -> AsyncIterator[Jobs]:
    if database is None:
        twin = MemorySchedules()
        yield Jobs(twin.sync, twin, twin)
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.cron_jobs import ScheduleStore
    from scheduler.store.postgres.overview import OverviewStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        db = PostgresStore(pool, Metrics())
        store = ScheduleStore(db)
        yield Jobs(store.sync, OverviewStore(db), store)
    finally:
        await pool.close()


async def _names(jobs: Jobs, active: bool | None = None) -> list[str]:
    return [r["name"] for r in await jobs.reads.schedules(active, None, 100)]


async def test_synced_jobs_list_by_name_in_pages_with_their_definition(jobs: Jobs) -> None:
    """Synced jobs list by name, `after` a name and `limit` at a time; a row holds the job's
    definition, file and line, active, and no pause, failure or cursor yet."""
    loaded = load_text(JOBS).jobs
    assert await jobs.sync(loaded, T0) == (3, 0)
    assert await _names(jobs) == ["a", "b", "c"]
    assert [r["name"] for r in await jobs.reads.schedules(None, "a", 1)] == ["b"]
    assert await jobs.reads.schedules(None, "c", 10) == []
    row = await jobs.reads.schedule("a")
    assert row is not None
    a = next(j for j in loaded if j.name == "a")
    assert row["definition"] == a.definition() and row["definition"]["data"] == {"kind": "hourly"}
    assert (row["file"], row["line"], row["active"]) == (a.file, a.line, True)
    for column in ("paused_at", "paused_by", "pause_note", "failed_at", "failed_reason"):
        assert row[column] is None, column
    assert (row["last_scheduled_for"], row["last_fired_at"], row["skipped"]) == (None,) * 3
    assert row["updated_at"] is not None and row == (await jobs.reads.schedules(None, None, 1))[0]
    assert await jobs.reads.schedule("nope") is None


async def test_a_job_gone_from_the_yaml_stays_listed_inactive(jobs: Jobs) -> None:
    """A job left out of the next sync is counted removed and listed inactive; `active`
    filters; a sync that names it again brings it back, counted changed."""
    loaded = load_text(JOBS).jobs
    await jobs.sync(loaded, T0)
    assert await jobs.sync([j for j in loaded if j.name != "b"], T0) == (0, 1)
    assert await _names(jobs, active=True) == ["a", "c"]
    assert await _names(jobs, active=False) == ["b"]
    gone = await jobs.reads.schedule("b")
    assert gone is not None and gone["active"] is False
    assert await jobs.sync(loaded, T0) == (1, 0)
    assert await _names(jobs, active=False) == []


async def test_a_pause_keeps_its_first_instant_and_a_resume_clears_it(jobs: Jobs) -> None:
    """A pause records who and the note; pausing again keeps `paused_at` and takes the new
    who and note; a resume clears all three; an unknown job is neither (False)."""
    await jobs.sync(load_text(JOBS).jobs, T0)
    assert await jobs.control.set_paused("nope", "admin") is False
    assert await jobs.control.set_paused("a", "admin@1", "vendor down") is True
    first = await jobs.reads.schedule("a")
    assert first is not None and first["paused_at"] is not None
    assert (first["paused_by"], first["pause_note"]) == ("admin@1", "vendor down")
    assert await jobs.control.set_paused("a", "ops@2") is True
    again = await jobs.reads.schedule("a")
    assert again is not None and again["paused_at"] == first["paused_at"]
    assert (again["paused_by"], again["pause_note"]) == ("ops@2", None)
    assert await jobs.control.set_paused("a", None) is True
    resumed = await jobs.reads.schedule("a")
    assert resumed is not None
    assert (resumed["paused_at"], resumed["paused_by"], resumed["pause_note"]) == (None,) * 3
    listed = {r["name"]: r for r in await jobs.reads.schedules(None, None, 10)}
    assert listed["a"] == resumed and listed["b"]["paused_at"] is None


async def test_a_manual_trigger_row_is_written_once_confirmed_once_or_forgotten(
    jobs: Jobs,
) -> None:
    """The intent's row (manual, no stream, fired at its instant) is written once per instant;
    the first confirmation sets stream, sequence and time, a later one changes nothing;
    forgetting drops only an unconfirmed row; rows list newest first, `limit` of them."""
    t1, t2, t3 = T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    for at in (t1, t1, t2, t3):
        await jobs.control.log_manual_intent("a", "mq.scheduled.a", at, "i-1")
    await jobs.control.log_manual_intent("b", "mq.scheduled.b", t1, "i-1")
    fired = t1 + timedelta(milliseconds=3)
    await jobs.control.confirm_manual_fire(Advance("a", "mq.scheduled.a", t1, fired, "S", 7))
    later = Advance("a", "mq.scheduled.a", t1, fired + timedelta(seconds=1), "S", 9)
    await jobs.control.confirm_manual_fire(later)
    await jobs.control.forget_manual_intent("a", t1)  # confirmed: kept
    await jobs.control.forget_manual_intent("a", t2)
    rows = await jobs.reads.fires("a", 10)
    assert [(r["scheduled_for"], r["stream"], r["stream_seq"]) for r in rows] == [
        (t3, None, None),
        (t1, "S", 7),
    ]
    assert rows[1] == {
        "scheduled_for": t1, "fired_at": fired, "attempt": 1, "epoch": 0, "instance": "i-1",
        "stream": "S", "stream_seq": 7, "manual": True,
    }  # fmt: skip
    assert rows[0]["fired_at"] == t3
    assert [r["scheduled_for"] for r in await jobs.reads.fires("a", 1)] == [t3]
    assert len(await jobs.reads.fires("b", 10)) == 1 and await jobs.reads.fires("c", 10) == []


async def test_a_duplicate_trigger_keeps_the_first_row_of_its_message(jobs: Jobs) -> None:
    """A publish that came back a duplicate drops the retry's own row when an earlier row
    (within two days) holds that stream sequence; otherwise it confirms the retry's row."""
    t1, t2, t3 = T0, T0 + timedelta(hours=1), T0 + timedelta(days=3)
    for at in (t1, t2, t3):
        await jobs.control.log_manual_intent("a", "mq.scheduled.a", at, "i-1")
    await jobs.control.confirm_manual_fire(Advance("a", "mq.scheduled.a", t1, t1, "S", 7))
    await jobs.control.settle_duplicate_fire(Advance("a", "mq.scheduled.a", t2, t2, "S", 7))
    await jobs.control.settle_duplicate_fire(Advance("a", "mq.scheduled.a", t3, t3, "S", 7))
    rows = await jobs.reads.fires("a", 10)
    assert [(r["scheduled_for"], r["stream_seq"]) for r in rows] == [(t3, 7), (t1, 7)]
