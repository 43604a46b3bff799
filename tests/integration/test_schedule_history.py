"""The YAML sync records each cron job definition's interval in `schedule_history`, and a new
job's cursor starts at that sync instant (so the audit's expectations match what fires)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from scheduler.clock import FakeClock
from scheduler.cron.jobs import load_text
from scheduler.daemon import migrate
from scheduler.engine.cron.firing import CronEngine
from scheduler.metrics import Metrics
from scheduler.records import PubAck
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.epoch import take_office

T0 = datetime(2026, 11, 21, 10, 0, 0, 900_000, tzinfo=UTC)
JOBS = """\
scheduled_jobs:
  - {name: alpha, subject: mq.scheduled.a, cron: "* * * * * *"}
  - {name: beta, subject: mq.scheduled.b, cron: "0 * * * *"}
"""


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[ScheduleStore]:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        yield ScheduleStore(PostgresStore(pool, Metrics()))
    finally:
        await pool.close()


async def history(store: ScheduleStore) -> list[asyncpg.Record]:
    async with store.db.pool.acquire() as conn:
        return await conn.fetch(
            "SELECT name, definition, valid_from, valid_to FROM schedule_history "
            "ORDER BY name, valid_from"
        )


async def test_sync_opens_closes_and_reopens_history_rows(store: ScheduleStore) -> None:
    """Adding, changing and removing jobs closes and opens history rows at the sync instants;
    a sync that changes nothing writes nothing."""
    jobs = load_text(JOBS).jobs
    await store.sync(jobs, T0)
    changed = load_text(JOBS.replace('"0 * * * *"', '"30 * * * *"')).jobs
    t1, t2 = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    assert await store.sync(changed, t1) == (1, 0)
    assert await store.sync(changed, t1 + timedelta(minutes=5)) == (0, 0)
    assert await store.sync([j for j in changed if j.name == "beta"], t2) == (0, 1)
    rows = [(r["name"], r["valid_from"], r["valid_to"]) for r in await history(store)]
    assert rows == [
        ("alpha", T0, t2),
        ("beta", T0, t1),
        ("beta", t1, None),
    ]
    crons = [json.loads(r["definition"])["cron"] for r in await history(store)]
    assert crons == ["* * * * * *", "0 * * * *", "30 * * * *"]


async def test_pausing_a_job_is_a_new_version(store: ScheduleStore) -> None:
    """A job paused in YAML gets a new history row whose definition says paused."""
    await store.sync(load_text(JOBS).jobs, T0)
    paused = JOBS.replace('cron: "0 * * * *"}', 'cron: "0 * * * *", paused: true}')
    await store.sync(load_text(paused).jobs, T0 + timedelta(minutes=1))
    beta = [json.loads(r["definition"])["paused"] for r in await history(store) if r[0] == "beta"]
    assert beta == [False, True]


class _Office:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.lost = asyncio.Event()

    def may_act(self) -> bool:
        return True

    async def wait_for_office(self) -> int:
        return self.epoch

    def depose(self, epoch: int | None = None) -> None:
        self.lost.set()


class _Publisher:
    """Acknowledges every publish at once and remembers the message ids."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def publish(self, subject: str, body: bytes, headers: dict[str, str]) -> object:
        self.ids.append(headers["Nats-Msg-Id"])
        done: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        done.set_result(PubAck("JOBS", len(self.ids), False))
        return done


async def test_new_job_fires_an_occurrence_between_its_sync_and_first_tick(
    store: ScheduleStore, database_url: str, tmp_path: Path
) -> None:
    """A job synced at 10:00:00.900 whose first tick runs at 10:00:01.100 still fires its
    10:00:01 occurrence: the cursor starts at the sync recorded in schedule_history."""
    (tmp_path / "jobs.yaml").write_text(JOBS)
    settings = Settings(schedules_dir=tmp_path, database_url=database_url, instance_id="t")
    clock = FakeClock(T0)
    epoch = await take_office(store.db.pool, "t")
    engine = CronEngine(settings, store, _Office(epoch), clock, Metrics())
    await engine.sync()
    clock.advance(0.2)
    publisher = _Publisher()
    await engine.tick(epoch, publisher, {})  # type: ignore[arg-type]
    assert publisher.ids == ["alpha@2026-11-21T10:00:01Z"]
    cursors = await store.cursors()
    assert cursors["alpha"] == T0.replace(second=1, microsecond=0)
    assert cursors["beta"] == T0
    assert [r["valid_from"] for r in await history(store)] == [T0, T0]


async def test_operator_pause_and_resume_are_versions(store: ScheduleStore) -> None:
    """Pausing a job through the management API starts a paused history version, resuming an
    unpaused one; pausing it again while paused changes nothing."""
    await store.sync(load_text(JOBS).jobs, T0)
    assert await store.set_paused("beta", "ops@example")
    assert await store.set_paused("beta", "ops@example")  # already paused: no new version
    assert await store.set_paused("beta", None)
    assert not await store.set_paused("gamma", "ops@example")
    rows = [r for r in await history(store) if r["name"] == "beta"]
    assert [json.loads(r["definition"])["paused"] for r in rows] == [False, True, False]
    assert rows[0]["valid_to"] == rows[1]["valid_from"] and rows[1]["valid_to"] is not None
    assert rows[2]["valid_to"] is None
    await store.set_paused("beta", "ops@example")
    edited = load_text(JOBS.replace('"0 * * * *"', '"45 * * * *"')).jobs  # YAML changes meanwhile
    await store.sync(edited, T0 + timedelta(hours=3))
    async with store.db.pool.acquire() as conn:  # the latest row (the test mixes two clocks)
        last = json.loads(
            await conn.fetchval("SELECT definition FROM schedule_history ORDER BY id DESC LIMIT 1")
        )
    assert (last["cron"], last["paused"]) == ("45 * * * *", True)  # still operator-paused


async def test_migration_backfills_the_jobs_in_force(database_url: str) -> None:
    """Upgrading a database that already has jobs opens one history row per active job, paused
    when an operator paused it, from its last change."""
    await asyncio.to_thread(migrate.downgrade, database_url, "0005")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO schedules (name, definition, fingerprint, active, paused_at, updated_at) "
            "VALUES ('on', '{\"name\": \"on\", \"paused\": false}', 'a', true, NULL, $1), "
            "('held', '{\"name\": \"held\", \"paused\": false}', 'b', true, now(), $1), "
            "('gone', '{\"name\": \"gone\", \"paused\": false}', 'c', false, NULL, $1)",
            T0,
        )
        await migrate.upgrade_async(database_url)
        rows = await conn.fetch(
            "SELECT name, definition, valid_from, valid_to FROM schedule_history ORDER BY name"
        )
    finally:
        await conn.close()
    got = [(r["name"], json.loads(r["definition"])["paused"], r["valid_from"]) for r in rows]
    assert got == [("held", True, T0), ("on", False, T0)]
    assert all(r["valid_to"] is None for r in rows)
