"""`GET /v1/activity` and the recording of operator actions, in-process on the twins
(tests/support/edge_twins.py): the list filters and pages newest first, a pause keeps its note,
a failed record never fails the action. That every write of every kind leaves one row stays on
real servers, with the tasks and dead letters it needs
(tests/integration/api/test_activity_api.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from scheduler.operations.stores import Activity
from tests.support.edge_twins import READ, EdgeOnTwins


async def _synced(api: EdgeOnTwins) -> None:
    r = await api.call("GET", "/v1/schedules", token=READ)
    assert [j["name"] for j in r.body["items"]] == ["every-second", "frozen", "nightly"], r


async def test_the_list_filters_pages_newest_first_and_shows_the_note(api: EdgeOnTwins) -> None:
    """`GET /v1/activity` (read token) lists newest first, filters by action, target, who and
    time, pages with a signed cursor; the pause's note, who and when show on the job, in the
    list and the detail, and resume clears them."""
    await _synced(api)
    start = datetime.now(UTC) - timedelta(seconds=1)
    for note in ("first", "second", "third"):
        r = await api.call("POST", "/v1/schedules/nightly/pause", json_body={"note": note})
        assert r.status == 200, r
    assert (await api.call("POST", "/v1/schedules/every-second/trigger")).status == 200

    async def listed(**params: Any) -> dict[str, Any]:
        r = await api.call("GET", "/v1/activity", token=READ, params=params)
        assert r.status == 200, r
        body: dict[str, Any] = r.body
        return body

    everything = await listed()
    assert [a["action"] for a in everything["items"]] == ["trigger", "pause", "pause", "pause"]
    notes = [a["detail"]["note"] for a in (await listed(action="pause"))["items"]]
    assert notes == ["third", "second", "first"]
    assert [a["action"] for a in (await listed(target="every-second"))["items"]] == ["trigger"]
    assert len((await listed(who="admin"))["items"]) == 4
    assert (await listed(who="read"))["items"] == []
    assert len((await listed(since=start.isoformat()))["items"]) == 4
    assert (await listed(until=start.isoformat()))["items"] == []
    first = await listed(limit=3)
    rest = await listed(limit=3, cursor=first["next_cursor"])
    assert first["next_cursor"] and rest["next_cursor"] is None
    assert [a["id"] for a in first["items"] + rest["items"]] == [
        a["id"] for a in everything["items"]
    ]
    forged = await api.call("GET", "/v1/activity", token=READ, params={"cursor": "abc"})
    assert forged.status == 400 and forged.body["code"] == "bad_cursor"

    job = (await api.call("GET", "/v1/schedules/nightly", token=READ)).body
    assert job["paused"] and job["pause_note"] == "third" and job["paused_by"].startswith("admin@")
    item = next(
        j
        for j in (await api.call("GET", "/v1/schedules", token=READ)).body["items"]
        if j["name"] == "nightly"
    )
    assert item["pause_note"] == "third" and item["paused_at"] == job["paused_at"]
    assert (await api.call("POST", "/v1/schedules/nightly/resume")).status == 200
    job = (await api.call("GET", "/v1/schedules/nightly", token=READ)).body
    assert not job["paused"] and job["pause_note"] is None and job["paused_by"] is None


async def test_a_failed_record_never_fails_the_action(
    api: EdgeOnTwins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the activity log unusable the pause is still done and answered 200; the miss is
    counted in mq_scheduler_activity_unrecorded_total; a header cannot claim a console session."""
    await _synced(api)
    spoof = {"mq_scheduler.console_session": "admin-forged"}
    r = await api.call("POST", "/v1/schedules/nightly/pause", headers=spoof)
    assert r.status == 200
    shown = (await api.call("GET", "/v1/activity", token=READ)).body["items"]
    assert [(a["via"], a["session"]) for a in shown] == [("api", None)]

    async def unusable(row: Activity) -> None:  # as PostgreSQL answers for a renamed table
        raise asyncpg.UndefinedTableError('relation "activity_log" does not exist')

    monkeypatch.setattr(api.activity, "record", unusable)
    metrics = api.metrics.registry
    name = "mq_scheduler_activity_unrecorded_total"
    missed = metrics.get_sample_value(name) or 0.0
    r = await api.call("POST", "/v1/schedules/nightly/resume")
    assert r.status == 200 and r.body["status"] == "resumed"
    assert metrics.get_sample_value(name) == missed + 1
    job = (await api.call("GET", "/v1/schedules/nightly", token=READ)).body
    assert not job["paused"]
