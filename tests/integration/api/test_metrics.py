"""Every metric the operations surface relies on, read from a running daemon's /metrics after
real traffic, the forecast included; and the forecast's query reads the pending index."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from scheduler.metrics import Metrics
from scheduler.operations.stores import WINDOWS
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.overview import FORECAST_SQL, OverviewStore
from tests.integration.api.harness import TARGET, ApiHarness, envelope, poll

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(api: ApiHarness) -> Samples:
    assert api.daemon is not None and api.daemon.endpoints.metrics is not None
    async with api.http.get(api.daemon.endpoints.metrics.url + "/metrics") as resp:
        text = await resp.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def test_traffic_shows_in_every_metric_the_forecast_included(api: ApiHarness) -> None:
    """After deliveries, bad input, a dead letter and tasks due in 3 minutes, /metrics has the
    leadership, pending, heap, delivery, lateness, intake, dead-letter, database, backlog and
    API metrics, and the forecast counts the 3-minute tasks within 5m but not within 1m."""
    await api.start(max_attempts=1, forecast_top=2)
    now = datetime.now(UTC)
    for _ in range(3):
        await api.publish(TARGET, envelope(now + timedelta(minutes=3)))
    await api.publish("mq.tasks.b", envelope(now + timedelta(minutes=20)))
    await api.publish("mq.tasks.c", envelope(now + timedelta(minutes=50)))
    await api.publish("mq.tasks.now", envelope(None))
    await api.publish("mq.nowhere.x", envelope(None))
    await api.js.publish("mq.delay.tasks.work", b"not json")
    assert (await api.call("GET", "/v1/stats")).status == 200

    def ready(s: Samples) -> bool:
        return (
            value(s, "mq_scheduler_due_tasks", subject=TARGET, within="5m") == 3
            and value(s, "mq_scheduler_pending_tasks") == 5
            and value(s, "mq_scheduler_dead_letters_unresolved") == 2
            and (value(s, "mq_scheduler_lease_renew_seconds_count") or 0) >= 1
        )

    s = await poll(lambda: scrape(api), ready, within=10)
    due = {w: value(s, "mq_scheduler_due_tasks", subject=TARGET, within=w) for w, _ in WINDOWS}
    assert due == {"1m": 0, "5m": 3, "15m": 3, "1h": 3}
    # top 2 by the widest window: mq.tasks.work (3), then mq.tasks.b and .c tie (1) -> by name
    listed = {labels for (name, labels) in s if name == "mq_scheduler_due_tasks"}
    subjects = {dict(labels)["subject"] for labels in listed}
    assert subjects == {TARGET, "mq.tasks.b", "other"}
    assert value(s, "mq_scheduler_due_tasks", subject="other", within="1h") == 1
    assert value(s, "mq_scheduler_due_tasks", subject="other", within="15m") == 0
    assert value(s, "mq_scheduler_is_leader") == 1
    assert (value(s, "mq_scheduler_leader_epoch") or 0) >= 1
    assert value(s, "mq_scheduler_heap_size") is not None
    assert (value(s, "mq_scheduler_fired_total", kind="delayed") or 0) >= 1
    assert (value(s, "mq_scheduler_fired_total", kind="cron") or 0) >= 1
    assert (value(s, "mq_scheduler_lateness_seconds_count", kind="delayed") or 0) >= 1
    assert value(s, "mq_scheduler_intake_total", outcome="accepted") == 7
    assert value(s, "mq_scheduler_intake_total", outcome="unparseable") == 1
    assert value(s, "mq_scheduler_dead_letters_total", reason="publish_failed") == 1
    assert value(s, "mq_scheduler_dead_letters_total", reason="unparseable") == 1
    assert (value(s, "mq_scheduler_db_seconds_count", op="claim") or 0) >= 1
    assert (value(s, "mq_scheduler_db_seconds_count", op="forecast") or 0) >= 1
    assert value(s, "mq_scheduler_intake_backlog") == 0
    assert value(s, "mq_scheduler_connected", service="nats") == 1
    route = {"route": "/v1/stats", "method": "GET", "status": "200"}
    assert value(s, "mq_scheduler_api_requests_total", **route) == 1


async def test_a_standby_exports_no_forecast(api: ApiHarness) -> None:
    """Only the leader exports the forecast, so a sum across instances counts each task once."""
    leader = await api.start()
    standby = ApiHarness(api.settings.with_overrides(instance_id="test-2"), api.nc, api.http)
    try:
        await standby.start()
        await api.publish(TARGET, envelope(datetime.now(UTC) + timedelta(minutes=3)))

        def counted(s: Samples) -> bool:
            return value(s, "mq_scheduler_due_tasks", subject=TARGET, within="5m") == 1

        await poll(lambda: scrape(api), counted, within=10)
        s = await scrape(standby)
        assert not [k for k in s if k[0] == "mq_scheduler_due_tasks"]
        assert value(s, "mq_scheduler_is_leader") == 0
        assert leader.office is not None and leader.office.may_act()
    finally:
        await standby.stop()


async def test_forecast_query_reads_the_pending_index(database_url: str) -> None:
    """With many pending tasks spread over weeks, the forecast is one range read of the partial
    pending index (EXPLAIN shows the index and no sequential scan) and counts correctly."""
    pool = await create_pool(database_url)
    try:
        async with pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
                "SELECT 't' || i, 'mq.tasks.s' || (i % 7), '{}'::bytea, "
                "now() + i * interval '1 minute', now() FROM generate_series(1, 30000) AS i"
            )
            await conn.execute("ANALYZE delayed_messages")
            now = datetime.now(UTC)
            spans = [span for _, span in WINDOWS]
            plan = await conn.fetchval("EXPLAIN (FORMAT JSON) " + FORECAST_SQL, now, *spans)
        text = json.dumps(json.loads(plan))
        assert "delayed_messages_pending_due" in text
        assert "Seq Scan" not in text
        forecast = await OverviewStore(PostgresStore(pool, Metrics())).forecast(now)
        assert sum(counts[-1] for counts in forecast.values()) in (59, 60)
        assert sum(counts[0] for counts in forecast.values()) in (0, 1)
    finally:
        await pool.close()
