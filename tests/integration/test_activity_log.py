"""The activity log on real PostgreSQL: migration 0018 up and down, and pruning past the
retention by the operations' clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from scheduler.clock import FakeClock
from scheduler.daemon import migrate
from scheduler.metrics import Metrics
from scheduler.operations.activity import ActivityOperations
from scheduler.operations.stores import Activity, ActivityFilter
from scheduler.store.postgres.activity import ActivityStore
from scheduler.store.postgres.connect import PostgresStore, create_pool

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def _row(at: datetime, target: str = "nightly") -> Activity:
    return Activity(
        at=at, who="admin@127.0.0.1", via="api", session=None, action="pause",
        route="POST /v1/schedules/{name}/pause", target=target, detail={"note": "why"},
        http_status=200, outcome="paused", request_id="r1", idempotency_key=None,
    )  # fmt: skip


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[ActivityStore]:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        yield ActivityStore(PostgresStore(pool, Metrics()))
    finally:
        await pool.close()


async def test_rows_past_the_retention_are_pruned_by_the_clock(store: ActivityStore) -> None:
    """A pass deletes exactly the rows recorded before now minus the retention (the
    operations' clock, moved by the test), in batches, and keeps the rest."""
    clock = FakeClock(T0)
    ops = ActivityOperations(store, clock)
    for days in (100, 91, 90, 10, 0):
        await store.record(_row(T0 - timedelta(days=days), f"job-{days}"))
    await store.record(_row(T0 - timedelta(days=90, seconds=1), "job-90s"))
    assert await ops.prune(timedelta(days=90), batch=1) == 3
    kept = await store.list(ActivityFilter(), None, 10)
    assert [r["target"] for r in kept] == ["job-0", "job-10", "job-90"]
    clock.jump_wall(timedelta(days=80, seconds=1).total_seconds())
    assert await ops.prune(timedelta(days=90)) == 2
    assert [r["target"] for r in await store.list(ActivityFilter(), None, 10)] == ["job-0"]
    assert await ops.prune(timedelta(days=90)) == 0


async def test_migration_0018_adds_and_removes_the_log_and_the_note(database_url: str) -> None:
    """From 0017, 0018 adds `activity_log` and `schedules.pause_note`; the downgrade drops
    both and leaves a schema 0017 reads; upgrading again works."""
    await asyncio.to_thread(migrate.downgrade, database_url, "0017")
    conn = await asyncpg.connect(database_url)
    try:

        async def present() -> tuple[bool, bool]:
            table = await conn.fetchval("SELECT to_regclass('activity_log') IS NOT NULL")
            column = await conn.fetchval(
                "SELECT count(*) > 0 FROM information_schema.columns "
                "WHERE table_name = 'schedules' AND column_name = 'pause_note'"
            )
            return bool(table), bool(column)

        assert await present() == (False, False)
        await conn.execute(
            "INSERT INTO schedules (name, definition, fingerprint, paused_at, paused_by) "
            "VALUES ('nightly', '{}', 'f', now(), 'admin')"
        )
        await asyncio.to_thread(migrate.upgrade, database_url)
        assert await present() == (True, True)
        note = "SELECT paused_by, pause_note FROM schedules WHERE name = 'nightly'"
        row = await conn.fetchrow(note)
        assert row is not None and tuple(row) == ("admin", None)
        await conn.execute("UPDATE schedules SET pause_note = 'vendor down'")
        await conn.execute(
            "INSERT INTO activity_log (at, who, via, action, route, target, http_status, "
            "outcome, request_id) VALUES (now(), 'admin', 'api', 'pause', 'POST x', 'nightly', "
            "200, 'paused', 'r')"
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "INSERT INTO activity_log (at, who, via, action, route, target, http_status, "
                "outcome, request_id) VALUES (now(), 'a', 'nats', 'p', 'r', 't', 200, 'o', 'r')"
            )
        await asyncio.to_thread(migrate.downgrade, database_url, "0017")
        assert await present() == (False, False)
        assert await conn.fetchval("SELECT paused_by FROM schedules") == "admin"
        await asyncio.to_thread(migrate.upgrade, database_url)
        assert await present() == (True, True)
    finally:
        await conn.close()
