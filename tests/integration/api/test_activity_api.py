"""The activity log on a running daemon: every write leaves exactly one row (done or refused),
a replayed answer none. The list's filters and pages, the pause's note and a failed record run
on the twins: tests/unit/test_activity_api.py."""

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
