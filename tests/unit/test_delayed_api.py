"""Delayed tasks through the management API, in-process on the twins (tests/support/edge_twins.py):
the listing's filters and pages, held and fired, and a task's detail before and after it fired.
Tasks are stored as the intake stores them and fired as the leader fires them, through the
engine's twin (`EdgeOnTwins.store_task`, `EdgeOnTwins.fire`); what needs the engine or NATS
itself (cancel and reschedule racing a firing batch or the lane, the NATS service) stays on real
servers (tests/integration/api/test_delayed_api.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.api.models import TASK_STATUSES
from tests.integration.api.harness import TARGET, envelope, poll
from tests.support.edge_twins import READ, EdgeOnTwins


async def _pending(api: EdgeOnTwins, count: int) -> None:
    async def stored() -> int:
        r = await api.call("GET", "/v1/delayed", token=READ, params={"limit": 500})
        return len(r.body["items"])

    await poll(stored, lambda n: n >= count)


async def test_list_filters_by_subject_org_status_and_due_window(api: EdgeOnTwins) -> None:
    """Each filter narrows the list: subject (exact or `.>` prefix), org_id from the envelope,
    status, and a due window; results come in firing order."""
    base = datetime.now(UTC) + timedelta(hours=2)
    a = envelope(base, org_id="org-a")
    b = envelope(base + timedelta(minutes=1), org_id="org-b")
    c = envelope(base + timedelta(minutes=2), org_id="org-a")
    await api.store_task(TARGET, a)
    await api.store_task(TARGET, b)
    await api.store_task("mq.tasks.other", c)
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


async def test_detail_shows_envelope_headers_and_deliveries(api: EdgeOnTwins) -> None:
    """A task's detail has its envelope and state while it waits and, once fired (its row
    deleted, its bytes gone), its state and delivery from the tombstone and the log."""
    doc = envelope(datetime.now(UTC) + timedelta(milliseconds=1500), org_id="org-x")
    task = await api.store_task(TARGET, doc)

    async def detail() -> dict[str, Any]:
        r = await api.call("GET", f"/v1/delayed/{doc['id']}", token=READ)
        return r.body if r.status == 200 else {}

    waiting = await poll(detail, bool)
    assert waiting["status"] == "pending" and waiting["target"] == TARGET
    assert waiting["envelope"]["org_id"] == "org-x" and waiting["payload_base64"] is None
    await api.fire((task.id, task.due_at))
    shown = await poll(detail, lambda d: bool(d.get("deliveries")))
    assert shown["status"] == "fired" and shown["target"] == TARGET
    assert shown["fired_at"] is not None and shown["envelope"] is None
    assert shown["deliveries"][0]["stream"] == "TASKS" and shown["deliveries"][0]["attempt"] == 1


async def _pages(api: EdgeOnTwins, limit: int, **params: object) -> list[dict[str, Any]]:
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


async def test_fired_tasks_are_listed_from_their_tombstones(api: EdgeOnTwins) -> None:
    """After deliveries, `status=fired` lists each fired task once, in the order they
    fired, with its delivery's due time and fired_at, filtered by subject and due window and
    paged by keyset; without a status they follow the held tasks; org_id is refused with it."""
    now = datetime.now(UTC)
    fired = [envelope(now + timedelta(milliseconds=400 + 150 * i)) for i in range(4)]
    other = envelope(now + timedelta(milliseconds=500))
    later = [envelope(now + timedelta(hours=1, minutes=i), org_id="org-a") for i in range(2)]
    due_now = [await api.store_task(TARGET, doc) for doc in fired]
    due_now.append(await api.store_task("mq.tasks.other", other))
    for doc in later:
        await api.store_task(TARGET, doc)
    # each delivered at its due time, as the leader delivers
    await api.fire(*sorted(((t.id, t.due_at) for t in due_now), key=lambda f: f[1]))
    want = {d["id"] for d in fired} | {other["id"]}

    async def listed() -> list[dict[str, Any]]:
        return await _pages(api, 500, status="fired")

    shown = await poll(listed, lambda items: {t["id"] for t in items} >= want, within=10)
    assert {t["id"] for t in shown} == want and len(shown) == len(want)
    # in the order they fired: compared as instants (a whole second's text has no fraction,
    # `...:35Z`, and sorts after `...:35.050000Z` as a string)
    order = [(datetime.fromisoformat(t["fired_at"].replace("Z", "+00:00")), t["id"]) for t in shown]
    assert order == sorted(order)
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
