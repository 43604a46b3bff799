"""`/v1/stats/history` charts the fire log (lateness, deliveries, dead letters per bucket) and
names why abnormal fires were late; `/v1/stats/health` reports NATS, PostgreSQL, the clock and
the lease."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.daemon.lifecycle import Daemon
from scheduler.operations.history import bucket_start, window_of
from scheduler.store.postgres.history import FIRES_SQL, JOB_FIRES_SQL
from tests.integration.api.harness import READ, ApiHarness, envelope, poll

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
    fired = due + timedelta(milliseconds=late_ms)
    async with daemon.store.pool.acquire() as conn:
        row = (kind, key, "mq.tasks.work", due, fired, attempt, epoch, instance, manual)
        await conn.execute(INSERT, *row)


async def history(api: ApiHarness, **params: Any) -> dict[str, Any]:
    reply = await api.call("GET", "/v1/stats/history", token=READ, params=params)
    assert reply.status == 200, reply
    return dict(reply.body)


async def test_history_buckets_lateness_and_names_the_cause_of_abnormal_fires(
    api: ApiHarness,
) -> None:
    """An hour's history has 60 one-minute buckets; a 7,341 ms fire delivered by a new epoch
    after the old one's last delivery is marked abnormal with a leader-change cause, a third
    attempt with a retry cause; a manual fire is left out; dead letters count in their bucket."""
    daemon = await api.start(max_attempts=1)
    now = datetime.now(UTC)
    due = bucket_start(now - timedelta(minutes=30), timedelta(minutes=1))
    await log_fire(daemon, "t-old", due - timedelta(minutes=10), 4, 900, "old-leader")
    await log_fire(daemon, "t-gap", due, 7341, 901, "new-leader")
    await log_fire(daemon, "t-retry", due + timedelta(minutes=5), 2500, 901, "new-leader", 3)
    await log_fire(daemon, "t-hand", due, 60_000, 901, "new-leader", manual=True)
    await log_fire(daemon, "t-day", now - timedelta(hours=3), 2, 900, "old-leader")
    await api.publish("mq.nowhere.x", envelope(None))  # a dead letter, now

    async def dead() -> int:
        unresolved: int = (await api.call("GET", "/v1/stats", token=READ)).body[
            "dead_letters_unresolved"
        ]
        return unresolved

    await poll(dead, lambda n: n == 1)  # before the first read: an answer is kept for 10 s
    h = await history(api)
    assert len(h["buckets"]) == 60 and h["bucket_seconds"] == 60
    assert h["buckets"][-1]["dead_letters"] == 1
    late = {f["key"]: f for f in h["late"]}
    assert set(late) == {"t-gap", "t-retry"}, "a manual fire or an on-time one was listed"
    assert late["t-gap"]["lateness_ms"] == 7341
    assert (
        "leader change" in late["t-gap"]["cause"]
        and "epoch 900 (old-leader)" in (late["t-gap"]["cause"])
    )
    assert late["t-retry"]["cause"].startswith("retried: delivered at attempt 3")
    gap = next(b for b in h["buckets"] if b["start"] == due.isoformat().replace("+00:00", "Z"))
    assert gap["abnormal"] and gap["max_ms"] == 7341 and gap["deliveries"] == 1
    assert {e["epoch"] for e in h["epochs"]} >= {900, 901}
    day = await history(api, window="1d")
    assert len(day["buckets"]) == 24 and day["bucket_seconds"] == 3600
    assert day["deliveries"] >= h["deliveries"] + 1, "the 3-hour-old fire is in the day only"


async def test_history_of_one_job_reads_only_its_fires(api: ApiHarness) -> None:
    """With `job`, only that cron job's deliveries count, and dead letters are not charted."""
    daemon = await api.start()
    due = datetime.now(UTC) - timedelta(minutes=20)
    await log_fire(daemon, "nightly", due, 1500, 900, "old-leader", kind="cron")
    await log_fire(daemon, "t-other", due, 9000, 900, "old-leader")
    h = await history(api, job="nightly")
    assert h["job"] == "nightly" and h["deliveries"] == 1
    assert [f["key"] for f in h["late"]] == ["nightly"]
    assert all(b["dead_letters"] is None for b in h["buckets"])


async def test_history_refuses_an_unknown_window_or_a_bad_job_name(api: ApiHarness) -> None:
    """A window other than 1h or 1d, or a job name outside the pattern, is refused 422."""
    await api.start()
    for params in ({"window": "2h"}, {"job": "Not A Job"}, {"job": "x" * 101}):
        reply = await api.call("GET", "/v1/stats/history", token=READ, params=params)
        assert reply.status == 422, (params, reply)
    assert (await api.call("GET", "/v1/stats/history", token=None)).status == 401


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
