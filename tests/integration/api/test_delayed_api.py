"""Delayed tasks through the management API on a running daemon: cancel and reschedule as the
NATS service answers them, on a task still on the delay lane, and the race between an HTTP
cancel and a firing batch. Listing and detail run on the twins (tests/unit/test_delayed_api.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from scheduler import client
from tests.integration.api.harness import READ, TARGET, ApiHarness, envelope, poll


async def _pending(api: ApiHarness, count: int) -> None:
    async def stored() -> int:
        r = await api.call("GET", "/v1/delayed", token=READ, params={"limit": 500})
        return len(r.body["items"])

    await poll(stored, lambda n: n >= count)


async def test_cancel_and_reschedule_answer_like_the_nats_service(api: ApiHarness) -> None:
    """HTTP cancel and reschedule give the statuses the NATS service gives: cancelled (again:
    cancelled), too_late once fired, 404 for unknown ids; a rescheduled task fires at its new
    time, never before."""
    await api.start()
    now = datetime.now(UTC)
    drop = envelope(now + timedelta(seconds=30))
    move = envelope(now + timedelta(seconds=30))
    await api.publish(TARGET, drop)
    await api.publish(TARGET, move)
    await _pending(api, 2)
    for _ in range(2):
        r = await api.call("DELETE", f"/v1/delayed/{drop['id']}")
        assert r.status == 200 and r.body == {"id": drop["id"], "status": "cancelled"}
    nats_view = await client.cancel(api.nc, TARGET, drop["id"])
    assert nats_view["status"] == "cancelled"
    new_due = datetime.now(UTC) + timedelta(milliseconds=500)
    r = await api.call(
        "PATCH", f"/v1/delayed/{move['id']}", json_body={"delay_until": new_due.isoformat()}
    )
    assert r.status == 200 and r.body["status"] == "rescheduled"
    msgs = await api.read_stream("TASKS", quiet=1.5)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [move["id"]]
    fired_at = datetime.fromisoformat(msgs[0].headers["Mq-Fired-At"].replace("Z", "+00:00"))
    assert fired_at >= new_due.replace(microsecond=new_due.microsecond // 1000 * 1000)

    async def status() -> str:
        got: str = (await api.call("GET", f"/v1/delayed/{move['id']}", token=READ)).body["status"]
        return got

    await poll(status, lambda s: s == "fired")
    r = await api.call("DELETE", f"/v1/delayed/{move['id']}")
    assert r.status == 409 and r.body["code"] == "too_late"
    assert (await client.cancel(api.nc, TARGET, move["id"]))["status"] == "too_late"
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    r = await api.call("PATCH", f"/v1/delayed/{move['id']}", json_body={"delay_until": later})
    assert r.status == 409 and r.body["code"] == "too_late"


async def test_http_cancel_racing_a_firing_batch(api: ApiHarness) -> None:
    """HTTP cancels sent around the firing instant of 200 tasks: every task answered
    `cancelled` is absent from the target stream, every `too_late` one is in it, exactly once."""
    # all 200 cancels admitted at once (test_read_isolation covers the bound's 503)
    await api.start(api_max_concurrent=250, api_pool_size=10)
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    docs = [envelope(due) for _ in range(200)]
    for doc in docs:
        await api.publish(TARGET, doc)
    await _pending(api, 200)
    await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds() - 0.05))
    replies = await asyncio.gather(*(api.call("DELETE", f"/v1/delayed/{d['id']}") for d in docs))
    delivered = [m.headers["Nats-Msg-Id"] for m in await api.read_stream("TASKS", quiet=1.5)]
    assert len(delivered) == len(set(delivered))
    cancelled = 0
    for doc, reply in zip(docs, replies, strict=True):
        if reply.status == 200:
            assert reply.body["status"] == "cancelled"
            assert doc["id"] not in delivered
            cancelled += 1
        else:
            assert reply.status == 409 and reply.body["code"] == "too_late", reply
            assert doc["id"] in delivered
    assert cancelled + len(delivered) == 200


async def test_cancel_and_reschedule_by_target_reach_a_task_still_on_the_lane(
    api: ApiHarness,
) -> None:
    """While intake is held (another instance holds the lease), a task sits on the delay lane:
    without `target` the API cannot find it (404); with `target` the cancel answers `cancelled`
    and the reschedule `rescheduled`, and once intake runs the cancelled task never arrives and
    the moved one arrives at its new time. A target outside SCHEDULER_TARGET_ALLOW is 404
    naming `target` (no task can be there)."""
    from tests.integration.test_cancel_intents import hold_lease

    kv = await hold_lease(api.js, api.settings.with_overrides(lease_ttl=30.0))
    await api.start(lease_ttl=30.0)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    drop, move = envelope(soon), envelope(soon)
    await api.publish(TARGET, drop)
    await api.publish(TARGET, move)
    r = await api.call("DELETE", f"/v1/delayed/{drop['id']}")
    assert r.status == 404
    r = await api.call("DELETE", f"/v1/delayed/{drop['id']}", params={"target": TARGET})
    assert r.status == 200 and r.body == {"id": drop["id"], "status": "cancelled"}
    new_due = datetime.now(UTC) + timedelta(seconds=3)
    r = await api.call(
        "PATCH",
        f"/v1/delayed/{move['id']}",
        json_body={"delay_until": new_due.isoformat()},
        params={"target": TARGET},
    )
    assert r.status == 200 and r.body["status"] == "rescheduled", r
    r = await api.call("DELETE", f"/v1/delayed/{drop['id']}", params={"target": "$SYS.x"})
    assert r.status == 404 and r.body["detail"].startswith("target: target '$SYS.x'"), r
    await kv.delete("leader")  # the daemon takes office and drains the lane
    msgs = await api.read_stream("TASKS", quiet=4)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [move["id"]]
    fired_at = datetime.fromisoformat(msgs[0].headers["Mq-Fired-At"].replace("Z", "+00:00"))
    assert fired_at >= new_due - timedelta(milliseconds=1)
    r = await api.call("GET", f"/v1/delayed/{drop['id']}", token=READ)
    assert r.status == 200 and r.body["status"] == "cancelled"
