"""Delayed tasks through the management API: find, inspect, cancel, reschedule, and the race
between an HTTP cancel and a firing batch."""

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


async def test_list_filters_by_subject_org_status_and_due_window(api: ApiHarness) -> None:
    """Each filter narrows the list: subject (exact or `.>` prefix), org_id from the envelope,
    status, and a due window; results come in firing order."""
    await api.start()
    base = datetime.now(UTC) + timedelta(hours=2)
    a = envelope(base, org_id="org-a")
    b = envelope(base + timedelta(minutes=1), org_id="org-b")
    c = envelope(base + timedelta(minutes=2), org_id="org-a")
    await api.publish(TARGET, a)
    await api.publish(TARGET, b)
    await api.publish("mq.tasks.other", c)
    await _pending(api, 3)

    async def ids(**params: object) -> list[str]:
        r = await api.call("GET", "/v1/delayed", token=READ, params=params)
        assert r.status == 200, r
        return [t["id"] for t in r.body["items"]]

    assert await ids() == [a["id"], b["id"], c["id"]]
    assert await ids(subject=TARGET) == [a["id"], b["id"]]
    assert await ids(subject="mq.tasks.>") == [a["id"], b["id"], c["id"]]
    assert await ids(org_id="org-a") == [a["id"], c["id"]]
    assert await ids(status="pending", org_id="org-b") == [b["id"]]
    assert await ids(status="fired") == []
    window = {"due_after": (base + timedelta(seconds=30)).isoformat()}
    window["due_before"] = (base + timedelta(seconds=90)).isoformat()
    assert await ids(**window) == [b["id"]]


async def test_detail_shows_envelope_headers_and_deliveries(api: ApiHarness) -> None:
    """A task's detail has its envelope and state while it waits and, once fired (its row
    deleted, its bytes gone), its state and delivery from the tombstone and the log."""
    await api.start()
    doc = envelope(datetime.now(UTC) + timedelta(milliseconds=1500), org_id="org-x")
    await api.publish(TARGET, doc)

    async def detail() -> dict:
        r = await api.call("GET", f"/v1/delayed/{doc['id']}", token=READ)
        return r.body if r.status == 200 else {}

    waiting = await poll(detail, bool)
    assert waiting["status"] == "pending" and waiting["target"] == TARGET
    assert waiting["envelope"]["org_id"] == "org-x" and waiting["payload_base64"] is None
    shown = await poll(detail, lambda d: bool(d.get("deliveries")))
    assert shown["status"] == "fired" and shown["target"] == TARGET
    assert shown["fired_at"] is not None and shown["envelope"] is None
    assert shown["deliveries"][0]["stream"] == "TASKS" and shown["deliveries"][0]["attempt"] == 1


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
        return (await api.call("GET", f"/v1/delayed/{move['id']}", token=READ)).body["status"]

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
    await api.start()
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
