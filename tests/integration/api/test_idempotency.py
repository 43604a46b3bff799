"""`Idempotency-Key` on every mutating call of a running daemon: a retry with the same key
answers the first outcome again and changes nothing more; the same key on another request is
refused. These need tasks and dead letters the engine makes; what the API does with a key alone
(a retried or concurrent trigger, a malformed key) runs on the twins:
tests/unit/test_idempotency_api.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.integration.api.harness import (
    READ,
    TARGET,
    ApiHarness,
    Reply,
    envelope,
    poll,
    replayed,
)

KEY = "Idempotency-Key"
TRIGGER = "/v1/schedules/frozen/trigger"


async def _synced(api: ApiHarness) -> None:
    async def names() -> list[str]:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return [j["name"] for j in r.body["items"]]

    await poll(names, lambda n: len(n) == 3)


async def _manual_msgs(api: ApiHarness, job: str = "frozen", quiet: float = 0.5) -> list[Any]:
    return await api.read_stream("SCHEDULED", subject=f"mq.scheduled.{job}", quiet=quiet)


def _reused(reply: Reply) -> None:
    assert reply.status == 422, reply
    assert reply.body["code"] == "idempotency_key_reused"
    assert KEY in reply.body["detail"]


async def test_a_key_reused_on_another_target_or_body_is_refused(api: ApiHarness) -> None:
    """The same key on another job, task or dead letter (pause, cancel, replay), on another
    route (trigger) or with another body (reschedule, resolve, batch replay) answers 422
    naming the header, and the second request has no effect."""
    await api.start(max_attempts=1)
    await _synced(api)
    paused = await api.call("POST", "/v1/schedules/nightly/pause", headers={KEY: "p"})
    assert paused.status == 200, paused
    _reused(await api.call("POST", "/v1/schedules/every-second/pause", headers={KEY: "p"}))
    shown = (await api.call("GET", "/v1/schedules/every-second", token=READ)).body
    assert shown["paused"] is False
    _reused(await api.call("POST", TRIGGER, headers={KEY: "p"}))  # another route, same key
    assert await _manual_msgs(api) == []

    doc = envelope(datetime.now(UTC) + timedelta(days=1))
    await api.publish(TARGET, doc)
    await _task_stored(api, doc["id"])
    path = f"/v1/delayed/{doc['id']}"
    day2 = (datetime.now(UTC) + timedelta(days=2)).isoformat(timespec="milliseconds")
    day3 = (datetime.now(UTC) + timedelta(days=3)).isoformat(timespec="milliseconds")
    moved = await api.call("PATCH", path, json_body={"delay_until": day2}, headers={KEY: "r"})
    assert moved.status == 200, moved
    _reused(await api.call("PATCH", path, json_body={"delay_until": day3}, headers={KEY: "r"}))
    task = (await api.call("GET", path, token=READ)).body
    assert datetime.fromisoformat(task["due_at"]) == datetime.fromisoformat(day2)

    other = envelope(datetime.now(UTC) + timedelta(days=1))
    await api.publish(TARGET, other)
    await _task_stored(api, other["id"])
    gone = await api.call("DELETE", path, headers={KEY: "c"})
    assert gone.status == 200, gone
    _reused(await api.call("DELETE", f"/v1/delayed/{other['id']}", headers={KEY: "c"}))
    kept = (await api.call("GET", f"/v1/delayed/{other['id']}", token=READ)).body
    assert kept["status"] == "pending"

    for _ in range(2):
        await api.publish("mq.nowhere.x", envelope(None))
    dead, spare = await _dead(api, 2)
    dpath = f"/v1/dead-letters/{dead['id']}"
    done = await api.call("PATCH", dpath, json_body={"resolved": True}, headers={KEY: "d"})
    assert done.status == 200 and done.body["resolved"] is True, done
    _reused(await api.call("PATCH", dpath, json_body={"resolved": False}, headers={KEY: "d"}))
    assert (await api.call("GET", dpath, token=READ)).body["resolved"] is True
    one = await api.call("POST", f"{dpath}/replay", headers={KEY: "o"})
    assert one.status == 200, one
    _reused(await api.call("POST", f"/v1/dead-letters/{spare['id']}/replay", headers={KEY: "o"}))
    none = {"reason": "no_such_reason", "limit": 1}
    batch = await api.call("POST", "/v1/dead-letters/replay", json_body=none, headers={KEY: "b"})
    assert batch.status == 200 and batch.body["replayed"] == 0, batch
    every = {"limit": 2}
    _reused(await api.call("POST", "/v1/dead-letters/replay", json_body=every, headers={KEY: "b"}))
    spared = (await api.call("GET", f"/v1/dead-letters/{spare['id']}", token=READ)).body
    assert spared["resolved"] is False and spared["replayed_at"] is None


async def test_every_mutating_route_replays_its_first_answer(api: ApiHarness) -> None:
    """Pause, resume, cancel, reschedule, resolve, replay one and replay a batch, each sent
    twice with its key: the second answer is the first one replayed, nothing changes twice."""
    await api.start(max_attempts=1)
    await _synced(api)
    for action in ("pause", "resume"):
        await _twice(api, "POST", f"/v1/schedules/nightly/{action}", f"{action}-1")

    doc = envelope(datetime.now(UTC) + timedelta(days=1))
    await api.publish(TARGET, doc)
    await _task_stored(api, doc["id"])
    day2 = {"delay_until": (datetime.now(UTC) + timedelta(days=2)).isoformat()}
    await _twice(api, "PATCH", f"/v1/delayed/{doc['id']}", "move-1", day2)
    cancelled = await _twice(api, "DELETE", f"/v1/delayed/{doc['id']}", "cancel-1")
    assert cancelled.body["status"] == "cancelled"

    for _ in range(3):
        await api.publish("mq.nowhere.x", envelope(None))
    dead = await _dead(api, 3)
    await api.js.add_stream(name="NOWHERE", subjects=["mq.nowhere.>"], duplicate_window=120)
    one = await _twice(api, "POST", f"/v1/dead-letters/{dead[0]['id']}/replay", "replay-1")
    assert one.body["status"] == "replayed"
    resolve = {"resolved": True}
    await _twice(api, "PATCH", f"/v1/dead-letters/{dead[1]['id']}", "resolve-1", resolve)
    batch = await _twice(api, "POST", "/v1/dead-letters/replay", "batch-1", {"limit": 10})
    assert batch.body["replayed"] == 1  # the one neither replayed nor resolved
    msgs = await api.read_stream("NOWHERE", quiet=1.0)
    assert sorted(m.headers["Nats-Msg-Id"] for m in msgs) == sorted(
        [dead[0]["original_id"], dead[2]["original_id"]]
    )


async def _twice(api: ApiHarness, method: str, path: str, key: str, body: Any = None) -> Reply:
    first = await api.call(method, path, json_body=body, headers={KEY: key})
    assert first.status == 200, (method, path, first)
    replayed(first, await api.call(method, path, json_body=body, headers={KEY: key}))
    return first


async def _task_stored(api: ApiHarness, task_id: str) -> None:
    async def status() -> int:
        return (await api.call("GET", f"/v1/delayed/{task_id}", token=READ)).status

    await poll(status, lambda s: s == 200, within=10)


async def _dead(api: ApiHarness, count: int) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]]:
        r = await api.call("GET", "/v1/dead-letters", token=READ, params={"resolved": "false"})
        return list(r.body["items"])

    return await poll(listed, lambda items: len(items) >= count, within=10)
