"""Any instance answers: a standby serves reads from PostgreSQL and its writes take effect
through PostgreSQL and the leader; `/v1/stats` reports what an operator looks at first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.integration.api.harness import READ, TARGET, ApiHarness, envelope, poll
from tests.support.helpers import wait_until


@pytest.fixture
async def standby(api: ApiHarness) -> AsyncIterator[ApiHarness]:
    """A second instance on the same NATS and PostgreSQL (start the leader first)."""
    other = ApiHarness(api.settings.with_overrides(instance_id="test-2"), api.nc, api.http)
    try:
        yield other
    finally:
        await other.stop()


async def test_standby_answers_reads_and_its_writes_reach_the_leader(
    api: ApiHarness, standby: ApiHarness
) -> None:
    """On a standby every list and detail answers 200; a cancel there guarantees no delivery,
    a reschedule there fires on time through the leader, and a pause there stops the job."""
    leader = await api.start()
    await wait_until(lambda: leader.office is not None and leader.office.may_act(), within=10)
    second = await standby.start()
    ready = await standby.call("GET", "/readyz", token=None)
    assert ready.status == 200 and ready.body["role"] == "standby"
    assert second.office is not None and not second.office.may_act()
    now = datetime.now(UTC)
    drop, move = envelope(now + timedelta(seconds=30)), envelope(now + timedelta(seconds=30))
    await api.publish(TARGET, drop)
    await api.publish(TARGET, move)

    async def pending() -> int:
        r = await standby.call("GET", "/v1/delayed", token=READ, params={"status": "pending"})
        return len(r.body["items"])

    await poll(pending, lambda n: n == 2)
    for path in ("/v1/schedules", "/v1/schedules/nightly", "/v1/dead-letters", "/v1/stats"):
        assert (await standby.call("GET", path, token=READ)).status == 200, path
    assert (await standby.call("GET", f"/v1/delayed/{drop['id']}", token=READ)).status == 200
    assert (await standby.call("DELETE", f"/v1/delayed/{drop['id']}")).body["status"] == "cancelled"
    new_due = datetime.now(UTC) + timedelta(milliseconds=600)
    body = {"delay_until": new_due.isoformat()}
    r = await standby.call("PATCH", f"/v1/delayed/{move['id']}", json_body=body)
    assert r.status == 200 and r.body["status"] == "rescheduled"
    msgs = await api.read_stream("TASKS", quiet=1.5)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [move["id"]]
    fired = datetime.fromisoformat(msgs[0].headers["Mq-Fired-At"].replace("Z", "+00:00"))
    assert fired < new_due + timedelta(seconds=1), "the leader did not learn of the reschedule"
    assert (await standby.call("POST", "/v1/schedules/every-second/pause")).status == 200
    cron = leader.cron
    assert cron is not None
    await wait_until(lambda: "every-second" in cron.paused_by_operator, within=3)


async def test_stats_report_pending_due_lateness_dead_letters_and_leader(api: ApiHarness) -> None:
    """Stats count pending tasks per subject (top N plus other), tasks due per window, recent
    lateness from the fire log, unresolved dead letters, and the leader and epoch."""
    daemon = await api.start(max_attempts=1)
    now = datetime.now(UTC)
    for offset in (timedelta(minutes=3), timedelta(minutes=3), timedelta(minutes=30)):
        await api.publish(TARGET, envelope(now + offset))
    await api.publish("mq.tasks.other", envelope(now + timedelta(minutes=10)))
    await api.publish("mq.tasks.now", envelope(None))  # delivered at once: lateness samples
    await api.publish("mq.nowhere.x", envelope(None))  # dead letter

    async def stats() -> dict[str, Any]:
        return dict((await api.call("GET", "/v1/stats", token=READ, params={"top": 1})).body)

    s = await poll(stats, lambda s: s["pending"] == 4 and s["dead_letters_unresolved"] == 1)
    assert s["pending_by_subject"] == [
        {"subject": TARGET, "pending": 3},
        {"subject": "other", "pending": 1},
    ]
    assert s["due"] == {"1m": 0, "5m": 2, "15m": 3, "1h": 4}
    assert s["lateness_ms"]["samples"] >= 1 and s["lateness_ms"]["p99"] is not None
    assert s["lateness_ms"]["p50"] <= s["lateness_ms"]["p99"]
    assert daemon.office is not None
    assert s["leader"]["instance"] == "test-1" and s["epoch"] == daemon.office.epoch
    assert s["instance"]["instance"] == "test-1"
