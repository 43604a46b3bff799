"""Cron jobs through the management API, in-process on the twins (tests/support/edge_twins.py):
list and show with the next occurrences, a trigger that publishes once with a manual id and a
fire-log row, and the YAML problems the list reports. Firing itself (fires, pauses that stop
it) stays on real servers (tests/integration/api/test_schedules_api.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from zoneinfo import ZoneInfo

from scheduler.cron.expression import CronExpr, occurrences
from tests.support.edge_twins import READ, EdgeOnTwins, edge_on_twins


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


BROKEN = """
scheduled_jobs:
  - name: weekly-report
    subject: mq.scheduled.report
    cron: "0 9 * * MON"
    timezone: Mars/Olympus
    data: {}
"""


async def test_schedule_list_reports_yaml_problems_with_file_line_and_job(
    tmp_path: Path,
) -> None:
    """An invalid job in a schedules file is listed under `problems` with its file, line and
    job, and leaves the list once the file is fixed."""
    (tmp_path / "schedules").mkdir()
    broken = tmp_path / "schedules" / "broken.yaml"
    broken.write_text(BROKEN)
    async with edge_on_twins(tmp_path) as api:
        body = (await api.call("GET", "/v1/schedules", token=READ)).body
        [problem] = body["problems"]
        assert problem["file"] == str(broken) and problem["job"] == "weekly-report"
        assert problem["line"] == 6 and "Mars/Olympus" in problem["message"]
        assert "weekly-report" not in [job["name"] for job in body["items"]]
        broken.write_text(BROKEN.replace("Mars/Olympus", "Europe/Paris"))
        assert (await api.call("GET", "/v1/schedules", token=READ)).body["problems"] == []
