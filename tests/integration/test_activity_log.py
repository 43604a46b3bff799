"""The activity log's migration 0018 up and down on real PostgreSQL (what the log's rows do is
the contract suite's: tests/contracts/test_activity_log.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from scheduler.daemon import migrate
from scheduler.metrics import Metrics
from scheduler.operations.stores import Activity
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
