"""The schedule repository's contract, over the in-memory twin and PostgreSQL alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.cron.jobs import load_text
from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.partitions import partition_of
from scheduler.records import Advance, CronFailure
from scheduler.store.memory import MemoryScheduleStore
from tests.contracts.admin import StoredSchedules

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
JOBS = """
scheduled_jobs:
  - name: a
    subject: mq.scheduled.a
    cron: "0 * * * *"
  - name: b
    subject: mq.scheduled.b
    cron: "*/5 * * * *"
"""


@dataclass
class Repo:
    schedules: StoredSchedules
    take_office: Callable[[], Awaitable[int]]
    partition: Callable[[str], Awaitable[int]]  # the partition a synced job's row holds
    # a job's fire log: (scheduled_for, stream_seq) of each delivery, oldest first
    logged: Callable[[str], Awaitable[list[tuple[datetime, int | None]]]]


@pytest.fixture
async def repo(database: str | None) -> AsyncIterator[Repo]:
    async with open_repo(database) as opened:
        yield opened


@asynccontextmanager
async def open_repo(database: str | None, partitions: int = 1) -> AsyncIterator[Repo]:
    """The twin, or the PostgreSQL store on `database`, for a deployment of `partitions`."""
    if database is None:
        store = MemoryScheduleStore(partitions=partitions)

        async def partition_memory(name: str) -> int:
            return store.job_partitions[name]

        async def logged_memory(name: str) -> list[tuple[datetime, int | None]]:
            rows = [e for e in store.fire_log if e["kind"] == "cron" and e["key"] == name]
            return sorted((e["scheduled_for"], e["stream_seq"]) for e in rows)

        yield Repo(store, store.office.take_office, partition_memory, logged_memory)
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.cron_jobs import ScheduleStore
    from scheduler.store.postgres.epoch import take_office

    pool = await create_pool(database, min_size=1, max_size=2)

    async def partition_real(name: str) -> int:
        return int(await pool.fetchval("SELECT partition FROM schedules WHERE name = $1", name))

    async def logged_real(name: str) -> list[tuple[datetime, int | None]]:
        rows = await pool.fetch(
            "SELECT scheduled_for, stream_seq FROM fire_log WHERE kind = 'cron' AND key = $1 "
            "ORDER BY scheduled_for",
            name,
        )
        return [(r[0], r[1]) for r in rows]

    try:
        real = ScheduleStore(PostgresStore(pool, Metrics()), partitions)
        yield Repo(real, lambda: take_office(pool, "t"), partition_real, logged_real)
    finally:
        await pool.close()


async def test_sync_counts_changed_and_removed_jobs(repo: Repo) -> None:
    """New jobs count as changed; the same set again changes nothing; a changed definition and
    a job gone from the YAML are counted."""
    jobs = load_text(JOBS).jobs
    assert await repo.schedules.sync(jobs, T0) == (2, 0)
    assert await repo.schedules.sync(jobs, T0) == (0, 0)
    changed = load_text(JOBS.replace('"0 * * * *"', '"30 * * * *"')).jobs[:1]
    assert await repo.schedules.sync(changed, T0) == (1, 1)


async def test_a_synced_job_holds_the_partition_of_its_name(database: str | None) -> None:
    """Under P = 8 each synced job holds `partition_of(name, 8)`, a changed one too; under
    P = 1 every job is in partition 0."""
    jobs = load_text(JOBS).jobs
    async with open_repo(database, partitions=8) as repo:
        await repo.schedules.sync(jobs, T0)
        await repo.schedules.sync(load_text(JOBS.replace("*/5", "*/10")).jobs, T0)
        got = [await repo.partition(j.name) for j in jobs]
        assert got == [partition_of(j.name, 8) for j in jobs] == [2, 6]
    others = load_text(JOBS.replace("name: a", "name: c").replace("name: b", "name: d")).jobs
    async with open_repo(database) as repo:
        await repo.schedules.sync(others, T0)
        assert [await repo.partition(j.name) for j in others] == [0, 0]


async def test_cursors_move_forward_only_and_writes_are_fenced(repo: Repo) -> None:
    """`advance` moves a cursor forward (never back); an older epoch's advance fails with
    FencedError and moves nothing."""
    await repo.schedules.sync(load_text(JOBS).jobs, T0)
    old = await repo.take_office()
    later, earlier = T0 + timedelta(hours=1), T0
    await repo.schedules.advance(old, [Advance("a", "mq.scheduled.a", later)], "x")
    await repo.schedules.advance(old, [Advance("a", "mq.scheduled.a", earlier)], "x")
    assert await repo.schedules.cursors() == {"a": later}
    await repo.take_office()
    with pytest.raises(FencedError):
        moved = Advance("a", "mq.scheduled.a", later + timedelta(hours=1), fired_at=later)
        await repo.schedules.advance(old, [moved], "x")
    assert await repo.schedules.cursors() == {"a": later}
    assert await repo.schedules.operator_paused() == frozenset()


async def test_each_occurrence_delivered_in_a_tick_is_logged(repo: Repo) -> None:
    """A move that caught up three occurrences of a job (its cursor at the last, the two
    before it `earlier`) logs three deliveries, each with its own occurrence and stream
    sequence; the cursor stands at the last."""
    await repo.schedules.sync(load_text(JOBS).jobs, T0)
    epoch = await repo.take_office()
    hours = [T0 + timedelta(hours=h) for h in (1, 2, 3)]
    fired = T0 + timedelta(hours=3, seconds=1)
    move = Advance(
        "a", "mq.scheduled.a", hours[2], fired, "S", 3,
        earlier=((hours[0], fired, "S", 1), (hours[1], fired, "S", 2)),
    )  # fmt: skip
    await repo.schedules.advance(epoch, [move], "x")
    assert await repo.logged("a") == [(hours[0], 1), (hours[1], 2), (hours[2], 3)]
    assert await repo.schedules.cursors() == {"a": hours[2]}


def _failure(job: Any, fingerprint: str | None = None) -> CronFailure:
    return CronFailure(
        job.name, fingerprint or job.fingerprint(), "too_large", "data: too large", T0, T0
    )


async def test_a_failed_mark_holds_until_the_definition_changes_or_a_resume(repo: Repo) -> None:
    """`fail` marks a job failed (fenced); a failure for another fingerprint is ignored; a
    sync of the same definition keeps the mark, a changed definition clears it, and so does
    an operator's resume."""
    jobs = load_text(JOBS).jobs
    await repo.schedules.sync(jobs, T0)
    epoch = await repo.take_office()
    await repo.schedules.fail(epoch, [_failure(jobs[0]), _failure(jobs[1], "f" * 32)])
    assert await repo.schedules.failed() == frozenset({"a"})
    await repo.schedules.sync(jobs, T0)
    assert await repo.schedules.failed() == frozenset({"a"})
    assert await repo.schedules.set_paused("a", None)
    assert await repo.schedules.failed() == frozenset()
    await repo.schedules.fail(epoch, [_failure(jobs[0])])
    changed = load_text(JOBS.replace('"0 * * * *"', '"30 * * * *"')).jobs
    await repo.schedules.sync(changed, T0)
    assert await repo.schedules.failed() == frozenset()
    await repo.take_office()
    with pytest.raises(FencedError):
        await repo.schedules.fail(epoch, [_failure(changed[0])])
    assert await repo.schedules.failed() == frozenset()
