"""The activity log on a running daemon: every write leaves exactly one row (done or refused),
a replayed answer none; `GET /v1/activity` filters and pages it; a pause keeps its note."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from tests.integration.api.harness import READ, TARGET, ApiHarness, Reply, envelope, poll

KEY = "Idempotency-Key"


async def _synced(api: ApiHarness) -> None:
    async def names() -> list[str]:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return [j["name"] for j in r.body["items"]]

    await poll(names, lambda n: len(n) == 3)


async def _rows(database_url: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT * FROM activity_log ORDER BY id")
    finally:
        await conn.close()
    return [dict(r) for r in rows]


def _rid(reply: Reply) -> str:
    return {k.lower(): v for k, v in reply.headers.items()}["x-request-id"]


async def _one_more(
    api: ApiHarness, database_url: str, reply: Reply, before: int
) -> dict[str, Any]:
    """The single row `reply`'s request added (its request id), and that it is the only one."""
    rows = await _rows(database_url)
    assert len(rows) == before + 1, rows[before:]
    row = rows[-1]
    assert row["request_id"] == _rid(reply)
    assert row["who"].startswith("admin@") and row["via"] == "api" and row["session"] is None
    assert row["http_status"] == reply.status
    return row


async def test_every_write_leaves_one_row_done_or_refused(
    api: ApiHarness, database_url: str
) -> None:
    """Pause (with its note), resume, trigger, cancel, reschedule, replay one and a batch and
    resolve each leave exactly one row naming who, the action, the target, the detail and
    the outcome, refusals (404, 409) included; a replay of a stored answer adds none, and a
    request refused before its route runs (token, validation) is no action and adds none."""
    await api.start()
    await _synced(api)
    task = envelope(datetime.now(UTC) + timedelta(hours=1))
    await api.publish(TARGET, task)
    await poll(lambda: api.call("GET", f"/v1/delayed/{task['id']}", token=READ), _found)
    dead = str(uuid.uuid4())
    due = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    calls: list[tuple[str, str, dict[str, Any], tuple[str, str, str, int]]] = [
        ("POST", "/v1/schedules/nightly/pause", {"json_body": {"note": "vendor down"}},
         ("pause", "nightly", "paused", 200)),
        ("POST", "/v1/schedules/nightly/resume", {}, ("resume", "nightly", "resumed", 200)),
        ("POST", "/v1/schedules/frozen/resume", {}, ("resume", "frozen", "paused_in_yaml", 409)),
        ("POST", "/v1/schedules/frozen/trigger", {"headers": {KEY: "t-1"}},
         ("trigger", "frozen", "triggered", 200)),
        ("PATCH", f"/v1/delayed/{task['id']}", {"json_body": {"delay_until": due.isoformat()}},
         ("reschedule", task["id"], "rescheduled", 200)),
        ("DELETE", f"/v1/delayed/{task['id']}", {"params": {"target": TARGET, "note": "x"}},
         ("cancel", task["id"], "cancelled", 200)),
        ("DELETE", "/v1/delayed/no-such-task", {}, ("cancel", "no-such-task", "not_found", 404)),
        ("POST", f"/v1/dead-letters/{dead}/replay", {}, ("replay", dead, "not_found", 404)),
        ("POST", "/v1/dead-letters/replay", {"json_body": {"reason": "publish_failed"}},
         ("replay", "*", "done", 200)),
        ("PATCH", f"/v1/dead-letters/{dead}", {"json_body": {"resolved": True}},
         ("resolve", dead, "not_found", 404)),
    ]  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    for method, path, kwargs, (action, target, outcome, status) in calls:
        before = len(await _rows(database_url))
        reply = await api.call(method, path, **kwargs)
        assert reply.status == status, (path, reply)
        row = await _one_more(api, database_url, reply, before)
        assert (row["action"], row["target"], row["outcome"]) == (action, target, outcome), row
        rows[f"{action} {outcome}"] = row
    pause = rows["pause paused"]
    assert pause["route"] == "POST /v1/schedules/{name}/pause"
    assert '"note": "vendor down"' in pause["detail"]
    assert '"delay_until": "' + due.isoformat() in rows["reschedule rescheduled"]["detail"]
    cancelled = rows["cancel cancelled"]["detail"]
    assert f'"target": "{TARGET}"' in cancelled and "note" not in cancelled
    assert "paused in YAML" in rows["resume paused_in_yaml"]["detail"]
    assert '"reason": "publish_failed"' in rows["replay done"]["detail"]
    trigger = rows["trigger triggered"]
    assert (
        trigger["idempotency_key"] == "t-1"
        and '"msg_id": "frozen@manual-key-' in (trigger["detail"])
    )

    before = len(await _rows(database_url))
    again = await api.call("POST", "/v1/schedules/frozen/trigger", headers={KEY: "t-1"})
    replayed = {k.lower(): v for k, v in again.headers.items()}.get("idempotency-replayed")
    assert again.status == 200 and replayed == "true"
    refused = [
        await api.call("POST", "/v1/schedules/nightly/pause", token=READ),
        await api.call("POST", "/v1/schedules/nightly/pause", json_body={"note": "x" * 501}),
        await api.call("POST", "/v1/schedules/nightly/pause", json_body={"note": "a\nb"}),
    ]
    assert [r.status for r in refused] == [403, 422, 422], refused
    assert refused[1].body["errors"][0]["field"] == "body.note"
    assert len(await _rows(database_url)) == before


def _found(reply: Reply) -> bool:
    return reply.status == 200


async def test_the_list_filters_pages_newest_first_and_shows_the_note(api: ApiHarness) -> None:
    """`GET /v1/activity` (read token) lists newest first, filters by action, target, who and
    time, pages with a signed cursor; the pause's note, who and when show on the job, in the
    list and the detail, and resume clears them."""
    await api.start()
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


async def test_a_failed_record_never_fails_the_action(api: ApiHarness, database_url: str) -> None:
    """With the activity table unusable the pause is still done and answered 200; the miss is
    counted in mq_scheduler_activity_unrecorded_total; a header cannot claim a console session."""
    await api.start()
    await _synced(api)
    spoof = {"mq_scheduler.console_session": "admin-forged"}
    r = await api.call("POST", "/v1/schedules/nightly/pause", headers=spoof)
    assert r.status == 200
    shown = (await api.call("GET", "/v1/activity", token=READ)).body["items"]
    assert [(a["via"], a["session"]) for a in shown] == [("api", None)]
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("ALTER TABLE activity_log RENAME TO activity_log_away")
        assert api.daemon is not None
        metrics = api.daemon.metrics.registry
        name = "mq_scheduler_activity_unrecorded_total"
        missed = metrics.get_sample_value(name) or 0.0
        r = await api.call("POST", "/v1/schedules/nightly/resume")
        assert r.status == 200 and r.body["status"] == "resumed"
        assert metrics.get_sample_value(name) == missed + 1
        job = (await api.call("GET", "/v1/schedules/nightly", token=READ)).body
        assert not job["paused"]
    finally:
        await conn.execute("ALTER TABLE activity_log_away RENAME TO activity_log")
        await conn.close()
