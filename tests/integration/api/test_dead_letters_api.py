"""Dead letters through the management API: list, show, resolve, and replays that go back
through the normal path and never deliver a task twice."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.integration.api.harness import READ, ApiHarness, envelope, poll


async def _dead(api: ApiHarness, count: int, **params: Any) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]]:
        r = await api.call("GET", "/v1/dead-letters", token=READ, params=params)
        return list(r.body["items"])

    return await poll(listed, lambda items: len(items) >= count, within=10)


async def test_firing_dead_letter_replayed_twice_at_once_is_delivered_once(
    api: ApiHarness,
) -> None:
    """A task dead after its publish attempts is replayed by two concurrent calls: one answers
    `replayed`, the other `already_replayed`; the task arrives once, same id, attempt 1."""
    await api.start(max_attempts=1)
    doc = envelope(None)
    await api.publish("mq.nowhere.x", doc)
    [dead] = await _dead(api, 1, stage="firing")
    assert dead["original_id"] == doc["id"] and dead["reason"] == "publish_failed"
    assert dead["target"] == "mq.nowhere.x" and not dead["resolved"]
    shown = (await api.call("GET", f"/v1/dead-letters/{dead['id']}", token=READ)).body
    assert shown["payload"]["id"] == doc["id"] and "no stream" in shown["error"]
    await api.js.add_stream(name="NOWHERE", subjects=["mq.nowhere.>"], duplicate_window=120)
    path = f"/v1/dead-letters/{dead['id']}/replay"
    first, second = await asyncio.gather(api.call("POST", path), api.call("POST", path))
    answers = sorted([first, second], key=lambda r: r.status)
    assert answers[0].status == 200, answers
    assert answers[0].body == {
        "id": dead["id"],
        "status": "replayed",
        "task_id": doc["id"],
        "via": "firing",
    }
    assert answers[1].status == 409 and answers[1].body["code"] == "already_replayed"
    msgs = await api.read_stream("NOWHERE", quiet=1.5)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [doc["id"]]
    assert msgs[0].headers["Mq-Attempt"] == "1"
    shown = (await api.call("GET", f"/v1/dead-letters/{dead['id']}", token=READ)).body
    assert shown["resolved"] and shown["replayed_at"] is not None
    assert shown["resolved_by"].startswith("admin@")
    again = await api.call("POST", path)
    assert again.status == 409 and again.body["code"] == "already_replayed"
    assert len(await api.read_stream("NOWHERE", quiet=0.5)) == 1


async def test_intake_dead_letters_replay_only_when_valid_and_allowed_now(
    api: ApiHarness,
) -> None:
    """Bad input is validated again on replay: unparseable bytes stay refused; a target refused
    by the allow-list stays refused until the allow-list admits it, then the replay goes
    through the delay lane and is delivered once."""
    await api.start(target_allow=["mq.tasks.>"])
    await api.js.publish("mq.delay.tasks.work", b"{not json", headers={"Nats-Msg-Id": "junk-1"})
    doc = envelope(None)
    await api.publish("mq.elsewhere.y", doc)
    dead = {d["reason"]: d for d in await _dead(api, 2, stage="intake")}
    assert set(dead) == {"unparseable", "target_refused"}
    r = await api.call("POST", f"/v1/dead-letters/{dead['unparseable']['id']}/replay")
    assert r.status == 409 and r.body["code"] == "still_invalid", r
    refused = dead["target_refused"]["id"]
    r = await api.call("POST", f"/v1/dead-letters/{refused}/replay")
    assert r.status == 409 and r.body["code"] == "target_refused"
    assert "SCHEDULER_TARGET_ALLOW" in r.body["detail"]
    await api.stop()
    await api.js.add_stream(name="ELSEWHERE", subjects=["mq.elsewhere.>"], duplicate_window=120)
    await api.start(target_allow=["mq.>"])
    r = await api.call("POST", f"/v1/dead-letters/{refused}/replay")
    assert r.status == 200 and r.body["via"] == "intake" and r.body["task_id"] == doc["id"]
    msgs = await api.read_stream("ELSEWHERE", quiet=1.5)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [doc["id"]]
    r = await api.call("POST", f"/v1/dead-letters/{refused}/replay")
    assert r.status == 409 and r.body["code"] == "already_replayed"


async def test_batch_replay_is_bounded_and_resolve_toggles(api: ApiHarness) -> None:
    """A filtered batch replays at most `limit` unresolved dead letters per call, each once;
    resolve marks one handled (and who did it) and reopen undoes it."""
    await api.start(max_attempts=1)
    docs = [envelope(None) for _ in range(3)]
    for doc in docs:
        await api.publish("mq.nowhere.z", doc)
    await _dead(api, 3, reason="publish_failed")
    await api.js.add_stream(name="NOWHERE", subjects=["mq.nowhere.>"], duplicate_window=120)
    body = {"reason": "publish_failed", "subject": "mq.nowhere.z", "limit": 2}
    first = await api.call("POST", "/v1/dead-letters/replay", json_body=body)
    assert first.status == 200 and first.body["replayed"] == 2 and first.body["refused"] == 0
    second = await api.call("POST", "/v1/dead-letters/replay", json_body=body)
    assert second.body["replayed"] == 1 and len(second.body["results"]) == 1
    third = await api.call("POST", "/v1/dead-letters/replay", json_body=body)
    assert third.body == {"replayed": 0, "refused": 0, "results": []}
    msgs = await api.read_stream("NOWHERE", quiet=1.5)
    assert sorted(m.headers["Nats-Msg-Id"] for m in msgs) == sorted(d["id"] for d in docs)
    r = await api.call("POST", "/v1/dead-letters/replay", json_body={"limit": 1001})
    assert r.status == 422 and r.body["errors"][0]["field"] == "body.limit"

    await api.js.delete_stream("NOWHERE")
    await api.publish("mq.nowhere.gone", envelope(None))
    [dead] = await _dead(api, 1, resolved="false")
    r = await api.call("PATCH", f"/v1/dead-letters/{dead['id']}", json_body={"resolved": True})
    assert r.status == 200 and r.body["resolved"] and r.body["resolved_by"].startswith("admin@")
    listed = await api.call("GET", "/v1/dead-letters", token=READ, params={"resolved": "false"})
    assert listed.body["items"] == []
    r = await api.call("PATCH", f"/v1/dead-letters/{dead['id']}", json_body={"resolved": False})
    assert r.status == 200 and not r.body["resolved"] and r.body["resolved_by"] is None
    r = await api.call("PATCH", f"/v1/dead-letters/{dead['id']}", json_body={"resolved": "yes"})
    assert r.status == 422 and r.body["errors"][0]["field"] == "body.resolved"


async def test_an_org_mismatch_stays_refused_on_replay(api: ApiHarness) -> None:
    """An envelope claiming another organisation than its subject names is dead-lettered
    `org_mismatch`, and an admin's replay answers `still_invalid` naming `org_id`: an admin
    token cannot move a task into another organisation."""
    await api.start()
    doc = envelope(None, org_id="globex")
    await api.publish("mq.org.acme.work", doc)
    [dead] = await _dead(api, 1, stage="intake")
    assert dead["reason"] == "org_mismatch" and dead["original_id"] == doc["id"]
    r = await api.call("POST", f"/v1/dead-letters/{dead['id']}/replay")
    assert r.status == 409 and r.body["code"] == "still_invalid", r
    assert r.body["detail"].startswith('org_id: "globex" disagrees with organisation')


async def test_a_dead_letter_of_an_id_that_fired_is_not_replayed(api: ApiHarness) -> None:
    """Another task reusing the id of a task that fired (its row deleted, its tombstone kept)
    is dead-lettered `duplicate_id`; its replay is refused `duplicate` (the id fired), and the
    target stream keeps the one delivery."""
    await api.start()
    doc = envelope(None)
    await api.publish("mq.tasks.work", doc)
    assert len(await api.read_stream("TASKS", quiet=1.0)) == 1

    async def fired() -> str:
        r = await api.call("GET", f"/v1/delayed/{doc['id']}", token=READ)
        return str(r.body.get("status"))

    await poll(fired, lambda s: s == "fired")
    other = json.dumps({**doc, "data": {"other": True}}).encode()  # past the lane's de-dup:
    await api.js.publish("mq.delay.tasks.work", other, headers={"Nats-Msg-Id": "other"})
    [dead] = await _dead(api, 1, stage="intake")
    assert dead["reason"] == "duplicate_id" and dead["original_id"] == doc["id"]
    r = await api.call("POST", f"/v1/dead-letters/{dead['id']}/replay")
    assert r.status == 409 and r.body["code"] == "duplicate", r
    assert "fired" in r.body["detail"]
    assert len(await api.read_stream("TASKS", quiet=1.0)) == 1
