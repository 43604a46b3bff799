"""`POST /v1/delayed`: a delayed task over HTTP, as the NATS `schedule` verb makes one (same
checks and answer), with an Idempotency-Key, and a cancel right after the answer that holds.
The refusals that publish nothing run on the twins: tests/unit/test_api_refusals.py."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler import client
from scheduler.clock import to_rfc3339_us
from scheduler.records import ceil_ms
from tests.integration.api.harness import READ, TARGET, ApiHarness, envelope, poll


async def _delivered(api: ApiHarness, quiet: float = 1.0) -> list[Any]:
    return await api.read_stream("TASKS", quiet=quiet)


async def test_short_form_is_delivered_at_its_time_with_a_written_envelope(
    api: ApiHarness,
) -> None:
    """The short form answers `scheduled` with id, target and due time, and the task arrives
    on its target no earlier than that time, in an envelope the daemon wrote."""
    await api.start()
    body = {"subject": TARGET, "in": "1s", "data": {"n": 7}, "org_id": "org-1"}
    r = await api.call("POST", "/v1/delayed", json_body=body)
    assert r.status == 200, r
    assert r.body["status"] == "scheduled" and r.body["target"] == TARGET
    due = datetime.fromisoformat(r.body["due_at"])
    msgs = await poll(lambda: _delivered(api, 0.3), bool, within=10)
    assert len(msgs) == 1
    doc = json.loads(msgs[0].data)
    assert doc["id"] == r.body["id"] and doc["data"] == {"n": 7} and doc["org_id"] == "org-1"
    assert doc["schema"] == "hanzo.mq.v1" and doc["source"] == "scheduler-api"
    assert datetime.fromisoformat(msgs[0].headers["Mq-Fired-At"]) >= due


async def test_envelope_form_answers_as_the_nats_verb_and_delivers_the_bytes(
    api: ApiHarness,
) -> None:
    """A whole envelope (target in `subject`) gets the answer the NATS `schedule` verb gives
    for it, and the very bytes sent are delivered."""
    await api.start()
    due = datetime.now(UTC) + timedelta(milliseconds=800)
    doc = envelope(due, org_id="org-1")
    raw = json.dumps(doc, separators=(",", ":")).encode()
    r = await api.call("POST", "/v1/delayed", data=raw, params={"subject": TARGET})
    assert r.status == 200, r
    other = envelope(due, org_id="org-1")
    verb = await client.schedule(api.nc, TARGET, other)
    assert set(r.body) == set(verb) and r.body["status"] == verb["status"] == "scheduled"
    assert r.body["id"] == doc["id"] and r.body["due_at"] == verb["due_at"] == to_rfc3339_us(
        ceil_ms(due)
    )
    msgs = await poll(lambda: _delivered(api, 0.3), lambda m: len(m) == 2, within=10)
    assert raw in [m.data for m in msgs]


async def test_a_retry_with_the_same_key_makes_one_task(api: ApiHarness) -> None:
    """Under one Idempotency-Key a retried short form gets the first answer again and makes
    no second task; the id is derived from the key."""
    await api.start()
    body = {"subject": TARGET, "in": "30s", "data": {}}
    headers = {"Idempotency-Key": "delayed-add-1"}
    first = await api.call("POST", "/v1/delayed", json_body=body, headers=headers)
    again = await api.call("POST", "/v1/delayed", json_body=body, headers=headers)
    assert first.status == again.status == 200, (first, again)
    assert again.body == first.body, (first.body, again.body)
    replayed = {k.lower(): v for k, v in again.headers.items()}.get("idempotency-replayed")
    assert replayed == "true", again.headers
    assert first.body["id"].startswith("key-")

    async def stored() -> list[Any]:
        got = await api.call("GET", "/v1/delayed", token=READ, params={"subject": TARGET})
        return [t["id"] for t in got.body["items"]]

    assert await poll(stored, bool) == [first.body["id"]]
    other = await api.call("POST", "/v1/delayed", json_body={**body, "in": "31s"}, headers=headers)
    assert (other.status, other.body["code"]) == (422, "idempotency_key_reused")


async def test_a_cancel_right_after_scheduled_holds(api: ApiHarness) -> None:
    """A cancel sent the moment `scheduled` is answered (the task may still be on the delay
    lane) answers `cancelled`, and no such task is ever delivered: with the target named, and
    without it on the instance that scheduled it."""
    await api.start()
    ids = []
    for i in range(20):
        body = {"subject": TARGET, "in": "1s", "data": {"i": i}}
        r = await api.call("POST", "/v1/delayed", json_body=body)
        assert r.status == 200, r
        params = {"target": TARGET} if i % 2 else None
        c = await api.call("DELETE", f"/v1/delayed/{r.body['id']}", params=params)
        assert (c.status, c.body["status"]) == (200, "cancelled"), (i, c)
        ids.append(r.body["id"])
    keep = await api.call("POST", "/v1/delayed", json_body={"subject": TARGET, "in": "1s"})
    msgs = await poll(lambda: _delivered(api, 0.5), bool, within=10)
    await asyncio.sleep(0)  # the kept task fired after every cancelled one was due
    assert [json.loads(m.data)["id"] for m in msgs] == [keep.body["id"]]


async def test_quota_is_judged_at_intake_after_scheduled(api: ApiHarness) -> None:
    """`scheduled` means the lane holds the task; an organisation over its quota sees it
    dead-lettered `quota_exceeded` by intake, never delivered."""
    await api.start(org_max_pending=1)
    body = {"subject": TARGET, "in": "1h", "org_id": "org-q"}
    first = await api.call("POST", "/v1/delayed", json_body=body)
    second = await api.call("POST", "/v1/delayed", json_body=body)
    assert first.status == second.status == 200 and first.body["status"] == "scheduled"

    async def dead() -> list[Any]:
        r = await api.call("GET", "/v1/dead-letters", token=READ)
        return [(d["original_id"], d["reason"]) for d in r.body["items"]]

    got = await poll(dead, bool, within=10)
    assert got in ([(second.body["id"], "quota_exceeded")], [(first.body["id"], "quota_exceeded")])
