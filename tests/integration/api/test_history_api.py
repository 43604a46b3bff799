"""`/v1/stats/health` reports NATS, PostgreSQL, the clock and the lease; the history's
statements read the fire log over its indexes. What `/v1/stats/history` charts runs on the twins
(tests/unit/test_history_api.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.daemon.lifecycle import Daemon
from scheduler.operations.history import window_of
from scheduler.store.postgres.history import FIRES_SQL, JOB_FIRES_SQL
from tests.integration.api.harness import READ, ApiHarness, poll

INSERT = (
    "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, epoch, "
    "instance, manual) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
)


async def log_fire(
    daemon: Daemon,
    key: str,
    due: datetime,
    late_ms: float,
    epoch: int,
    instance: str,
    attempt: int = 1,
    kind: str = "delayed",
    manual: bool = False,
) -> None:
    """One fire-log row in the daemon's database (the console's browser tests chart them)."""
    fired = due + timedelta(milliseconds=late_ms)
    async with daemon.store.pool.acquire() as conn:
        row = (kind, key, "mq.tasks.work", due, fired, attempt, epoch, instance, manual)
        await conn.execute(INSERT, *row)


async def test_health_reports_nats_postgres_clock_and_lease(api: ApiHarness) -> None:
    """Health says NATS is connected, PostgreSQL answers with a round trip, the clock is within
    the bound, and names the lease holder with its tenure's age."""
    daemon = await api.start()

    async def health() -> dict[str, Any]:
        return dict((await api.call("GET", "/v1/stats/health", token=READ)).body)

    h = await poll(health, lambda h: h["role"] == "leader" and h["lease"]["instance"], within=10)
    assert h["nats"] == "connected"
    assert h["postgres"]["reachable"] and h["postgres"]["migrated"]
    assert h["postgres"]["round_trip_ms"] is not None and h["postgres"]["round_trip_ms"] >= 0
    assert h["clock_skew_ok"] is True and abs(h["clock_skew_ms"]) < h["clock_skew_bound_ms"]
    assert h["lease"]["instance"] == daemon.settings.instance_id
    assert h["lease"]["age_seconds"] >= 0


async def test_history_reads_the_fire_log_over_its_indexes(api: ApiHarness) -> None:
    """Both history statements read the fire log through an index (`fired_at` for all
    deliveries, the key index for one job), never by scanning a whole partition."""
    daemon = await api.start()
    now = datetime.now(UTC)
    async with daemon.store.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, epoch, "
            "instance) SELECT 'delayed', 't-' || i, 'mq.tasks.work', "
            "$1::timestamptz - i * interval '1 s', $1::timestamptz - i * interval '1 s', 1, 1, "
            "'x' FROM generate_series(1, 20000) i",
            now,
        )
        await conn.execute("ANALYZE fire_log")
        window = window_of("1h", now)
        args = (window.since, window.until, 60.0, window.cap, window.abnormal_ms)
        for sql, job in ((FIRES_SQL, None), (JOB_FIRES_SQL, "nightly")):
            plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args, job)
            scans = re.findall(r'"Node Type": "([^"]+)",[^{}]*?"Relation Name": "fire_log', plan)
            assert scans and all("Index" in s for s in scans), (job, scans)
