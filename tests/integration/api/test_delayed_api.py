"""Delayed tasks through the management API: find, inspect, cancel, reschedule, and the race
between an HTTP cancel and a firing batch."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler import client
from scheduler.api.models import TASK_STATUSES
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
    r = await api.call("GET", "/v1/delayed", token=READ, params={"status": "bogus"})
    assert r.status == 400 and r.body["code"] == "bad_status", r
    assert r.body["errors"] == [{"field": "query.status", "message": r.body["detail"]}]
    assert "'bogus'" in r.body["detail"] and ", ".join(TASK_STATUSES) in r.body["detail"]


async def test_detail_shows_envelope_headers_and_deliveries(api: ApiHarness) -> None:
    """A task's detail has its envelope and state while it waits and, once fired (its row
    deleted, its bytes gone), its state and delivery from the tombstone and the log."""
    await api.start()
    doc = envelope(datetime.now(UTC) + timedelta(milliseconds=1500), org_id="org-x")
    await api.publish(TARGET, doc)

    async def detail() -> dict[str, Any]:
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


async def _pages(api: ApiHarness, limit: int, **params: object) -> list[dict[str, Any]]:
    """Every item of a listing, followed page by page through `next_cursor`."""
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(50):
        query = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        r = await api.call("GET", "/v1/delayed", token=READ, params=query)
        assert r.status == 200, r
        assert len(r.body["items"]) <= limit
        items += r.body["items"]
        cursor = r.body["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("the cursor never ran out")


async def test_fired_tasks_are_listed_from_their_tombstones(api: ApiHarness) -> None:
    """After real deliveries, `status=fired` lists each fired task once, in the order they
    fired, with its delivery's due time and fired_at, filtered by subject and due window and
    paged by keyset; without a status they follow the held tasks; org_id is refused with it."""
    await api.start()
    now = datetime.now(UTC)
    fired = [envelope(now + timedelta(milliseconds=400 + 150 * i)) for i in range(4)]
    other = envelope(now + timedelta(milliseconds=500))
    later = [envelope(now + timedelta(hours=1, minutes=i), org_id="org-a") for i in range(2)]
    for doc in fired:
        await api.publish(TARGET, doc)
    await api.publish("mq.tasks.other", other)
    for doc in later:
        await api.publish(TARGET, doc)
    want = {d["id"] for d in fired} | {other["id"]}

    async def listed() -> list[dict[str, Any]]:
        return await _pages(api, 500, status="fired")

    shown = await poll(listed, lambda items: {t["id"] for t in items} >= want, within=10)
    assert {t["id"] for t in shown} == want and len(shown) == len(want)
    assert [(t["fired_at"], t["id"]) for t in shown] == sorted(
        (t["fired_at"], t["id"]) for t in shown
    )
    due = {d["id"]: datetime.fromisoformat(d["delay_until"]) for d in [*fired, other]}
    for t in shown:
        assert t["status"] == "fired" and t["priority"] is None and t["attempts"] == 1
        assert t["due_at"] == t["scheduled_for"] and t["fired_at"] is not None
        scheduled = datetime.fromisoformat(t["scheduled_for"].replace("Z", "+00:00"))
        assert abs(scheduled - due[t["id"]]) < timedelta(milliseconds=1)
    assert [t["id"] for t in await _pages(api, 2, status="fired")] == [t["id"] for t in shown]
    on_target = await _pages(api, 1, status="fired", subject=TARGET)
    assert [t["id"] for t in on_target] == [t["id"] for t in shown if t["id"] != other["id"]]
    assert [t["id"] for t in await _pages(api, 5, status="fired", subject="mq.tasks.>")] == [
        t["id"] for t in shown
    ]
    window = {"due_after": due[fired[1]["id"]].isoformat()}
    window["due_before"] = due[fired[3]["id"]].isoformat()
    in_window = [t["id"] for t in await _pages(api, 5, status="fired", **window)]
    assert sorted(in_window) == sorted([fired[1]["id"], fired[2]["id"]])

    expected = [d["id"] for d in later] + [t["id"] for t in shown]
    for limit in (2, 3):  # a page ends with the last held task, or holds both kinds
        assert [t["id"] for t in await _pages(api, limit)] == expected
    held_of_org = await _pages(api, 1, org_id="org-a")
    assert [t["id"] for t in held_of_org] == [d["id"] for d in later]

    r = await api.call("GET", "/v1/delayed", token=READ, params={"status": "fired", "org_id": "x"})
    assert r.status == 422 and r.body["errors"][0]["field"] == "org_id", r
    first = await api.call("GET", "/v1/delayed", token=READ, params={"status": "fired", "limit": 1})
    fired_cursor = first.body["next_cursor"]
    for params in ({"status": "pending"}, {"org_id": "org-a"}):
        r = await api.call(
            "GET", "/v1/delayed", token=READ, params=params | {"cursor": fired_cursor}
        )
        assert r.status == 400 and r.body["code"] == "bad_cursor", r
    held = await api.call("GET", "/v1/delayed", token=READ, params={"limit": 1})
    params = {"status": "fired", "cursor": held.body["next_cursor"]}
    r = await api.call("GET", "/v1/delayed", token=READ, params=params)
    assert r.status == 400 and r.body["code"] == "bad_cursor", r


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
