"""Cron jobs through the management API, in-process on the twins (tests/support/edge_twins.py):
list and show with the next occurrences, a trigger that publishes once with a manual id and a
fire-log row. Firing itself (fires, pauses that stop it) stays on real servers
(tests/integration/api/test_schedules_api.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice
from zoneinfo import ZoneInfo

from scheduler.cron.expression import CronExpr, occurrences
from tests.support.edge_twins import READ, EdgeOnTwins


async def test_list_and_show_with_next_occurrences(api: EdgeOnTwins) -> None:
    """The list shows spec, file and line and the pause state; a job's detail lists its next 10
    occurrences exactly as the daemon's cron code computes them, in its time zone."""
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


async def test_trigger_fires_once_now_with_a_manual_id_and_a_log_row(api: EdgeOnTwins) -> None:
    """A trigger publishes one occurrence now as `<job>@manual-<instant>`, logged as manual,
    even for a job paused in YAML."""
    fired = await api.call("POST", "/v1/schedules/frozen/trigger")
    assert fired.status == 200, fired
    msg_id = fired.body["msg_id"]
    assert msg_id.startswith("frozen@manual-") and msg_id.endswith("Z")
    assert fired.body["stream"] == "SCHEDULED" and fired.body["subject"] == "mq.scheduled.frozen"
    msgs = await api.read_stream("SCHEDULED", subject="mq.scheduled.frozen")
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [msg_id]
    assert msgs[0].headers["Mq-Schedule"] == "frozen"
    rows = [f for f in api.schedules.fire_log if f["key"] == "frozen"]
    assert [(row["manual"], row["stream_seq"]) for row in rows] == [(True, fired.body["seq"])]
    shown = (await api.call("GET", "/v1/schedules/frozen", token=READ)).body
    assert shown["fires"][0]["manual"] is True
