"""Cron jobs through the management API: list, show, pause, resume, trigger."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg

from scheduler.cron.expression import CronExpr, occurrences
from tests.integration.api.harness import READ, ApiHarness, poll
from tests.support.helpers import wait_until


async def _synced(api: ApiHarness) -> None:
    """Wait until the leader has synced the YAML into PostgreSQL."""

    async def names() -> list[str]:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return [j["name"] for j in r.body["items"]]

    await poll(names, lambda n: len(n) == 3)


async def test_list_and_show_come_from_postgres_with_next_occurrences(api: ApiHarness) -> None:
    """The list shows spec, file and line and the pause state; a job's detail lists its next 10
    occurrences exactly as the daemon's cron code computes them, in its time zone."""
    await api.start()
    await _synced(api)
    r = await api.call("GET", "/v1/schedules", token=READ)
    jobs = {j["name"]: j for j in r.body["items"]}
    assert sorted(jobs) == ["every-second", "frozen", "nightly"]
    nightly = jobs["nightly"]
    assert nightly["cron"] == "30 2 * * *" and nightly["timezone"] == "Europe/Berlin"
    assert nightly["subject"] == "mq.scheduled.nightly"
    assert nightly["file"].endswith("jobs.yaml") and nightly["line"] == 7
    assert jobs["frozen"]["paused"] and jobs["frozen"]["paused_in_yaml"]
    assert not nightly["paused"]
    before = datetime.now(UTC)
    r = await api.call("GET", "/v1/schedules/nightly", token=READ)
    assert r.status == 200
    got = [datetime.fromisoformat(o["scheduled_for"]) for o in r.body["next"]]
    expected = list(
        islice(occurrences(CronExpr.parse("30 2 * * *"), before, ZoneInfo("Europe/Berlin")), 10)
    )
    assert got == expected
    assert all(t.astimezone(ZoneInfo("Europe/Berlin")).hour == 2 for t in got)
    assert r.body["definition"]["data"] == {"kind": "night"}


async def test_fires_show_lateness_and_pause_stops_firing_until_resume(api: ApiHarness) -> None:
    """The detail lists recent fires with their lateness; a paused job stops firing (and says
    who paused it), a resumed one fires again; YAML's own pause cannot be resumed here."""
    await api.start()
    await _synced(api)

    async def fires() -> list[dict[str, Any]]:
        r = await api.call("GET", "/v1/schedules/every-second", token=READ)
        return list(r.body["fires"])

    recent = await poll(fires, lambda f: len(f) >= 2)
    assert all(0 <= f["lateness_ms"] < 5000 and not f["manual"] for f in recent)
    assert recent[0]["scheduled_for"] > recent[1]["scheduled_for"]  # newest first
    r = await api.call("POST", "/v1/schedules/every-second/pause")
    assert r.status == 200 and r.body == {"name": "every-second", "status": "paused"}
    daemon = api.daemon
    assert daemon is not None and daemon.cron is not None
    cron = daemon.cron
    await wait_until(lambda: "every-second" in cron.paused_by_operator, within=3)
    await asyncio.sleep(0.3)  # an occurrence in flight when the pause landed may still record
    count = len(await fires())
    await asyncio.sleep(2.2)
    assert len(await fires()) == count, "a paused job fired"
    shown = (await api.call("GET", "/v1/schedules/every-second", token=READ)).body
    assert shown["paused"] and not shown["paused_in_yaml"]
    assert shown["paused_by"].startswith("admin@")
    r = await api.call("POST", "/v1/schedules/every-second/resume")
    assert r.status == 200 and r.body["status"] == "resumed"
    await poll(fires, lambda f: len(f) >= min(count + 2, 20), within=5)
    r = await api.call("POST", "/v1/schedules/frozen/resume")
    assert r.status == 409 and r.body["code"] == "paused_in_yaml"
    assert "jobs.yaml:" in r.body["detail"]


async def test_pause_survives_a_restart(api: ApiHarness) -> None:
    """An operator's pause is kept in PostgreSQL: a restarted leader applies it at once."""
    await api.start()
    await _synced(api)
    assert (await api.call("POST", "/v1/schedules/every-second/pause")).status == 200
    await api.stop()
    daemon = await api.start()
    cron = daemon.cron
    assert cron is not None
    await wait_until(lambda: "every-second" in cron.paused_by_operator, within=5)
    assert next(j for j in cron.jobs if j.name == "every-second").paused


async def test_trigger_fires_once_now_with_a_manual_id_and_a_log_row(
    api: ApiHarness, database_url: str
) -> None:
    """A trigger publishes one occurrence now as `<job>@manual-<instant>`, logged as manual,
    even for a job paused in YAML."""
    await api.start()
    await _synced(api)
    fired = await api.call("POST", "/v1/schedules/frozen/trigger")
    assert fired.status == 200, fired
    msg_id = fired.body["msg_id"]
    assert msg_id.startswith("frozen@manual-") and msg_id.endswith("Z")
    assert fired.body["stream"] == "SCHEDULED" and fired.body["subject"] == "mq.scheduled.frozen"
    # the stream also takes `every-second`'s deliveries: read only the triggered job's subject
    msgs = await api.read_stream("SCHEDULED", subject="mq.scheduled.frozen")
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [msg_id]
    assert msgs[0].headers["Mq-Schedule"] == "frozen"
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT manual, stream_seq FROM fire_log WHERE key = 'frozen'")
    finally:
        await conn.close()
    assert [(row["manual"], row["stream_seq"]) for row in rows] == [(True, fired.body["seq"])]
    shown = (await api.call("GET", "/v1/schedules/frozen", token=READ)).body
    assert shown["fires"][0]["manual"] is True
