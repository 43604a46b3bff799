"""`Idempotency-Key` on every mutating call: a retry with the same key answers the first outcome
again and changes nothing more; the same key on another request is refused; a concurrent
duplicate waits its turn (409, Retry-After) and never runs twice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from nats.js.client import JetStreamContext

from tests.integration.api.harness import READ, TARGET, ApiHarness, Reply, envelope, poll

KEY = "Idempotency-Key"
REPLAYED = "Idempotency-Replayed"
TRIGGER = "/v1/schedules/frozen/trigger"


async def _synced(api: ApiHarness) -> None:
    async def names() -> list[str]:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return [j["name"] for j in r.body["items"]]

    await poll(names, lambda n: len(n) == 3)


async def _manual_msgs(api: ApiHarness, job: str = "frozen", quiet: float = 0.5) -> list[Any]:
    return await api.read_stream("SCHEDULED", subject=f"mq.scheduled.{job}", quiet=quiet)


def _replayed(first: Reply, again: Reply) -> None:
    """`again` is the first answer served again: same status and body, marked replayed."""
    assert again.status == first.status, (first, again)
    assert again.body == first.body
    assert _header(again, REPLAYED) == "true", again.headers
    assert _header(first, REPLAYED) is None


def _header(reply: Reply, name: str) -> str | None:
    return {k.lower(): v for k, v in reply.headers.items()}.get(name.lower())


def _reused(reply: Reply) -> None:
    assert reply.status == 422, reply
    assert reply.body["code"] == "idempotency_key_reused"
    assert KEY in reply.body["detail"]


async def test_trigger_retried_with_the_same_key_publishes_once(
    api: ApiHarness, database_url: str
) -> None:
    """A trigger sent twice with one key publishes once and answers the first outcome again;
    its Nats-Msg-Id comes from the job and the key, so even with the stored outcome gone the
    retry's publish is dropped by the stream's duplicate window and the answer stays true."""
    await api.start()
    await _synced(api)
    first = await api.call("POST", TRIGGER, headers={KEY: "trigger-1"})
    again = await api.call("POST", TRIGGER, headers={KEY: "trigger-1"})
    assert first.status == 200, first
    assert len(await _manual_msgs(api)) == 1
    _replayed(first, again)
    conn = await asyncpg.connect(database_url)
    try:  # the first outcome never stored (a crash between the publish and the store)
        await conn.execute("DELETE FROM api_idempotency")
        lost = await api.call("POST", TRIGGER, headers={KEY: "trigger-1"})
        fires = await conn.fetch("SELECT stream_seq FROM fire_log WHERE key = 'frozen'")
    finally:
        await conn.close()
    assert lost.status == 200, lost
    assert lost.body["msg_id"] == first.body["msg_id"] and lost.body["seq"] == first.body["seq"]
    msgs = await _manual_msgs(api)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [first.body["msg_id"]]
    assert [r["stream_seq"] for r in fires] == [first.body["seq"]]
    other = await api.call("POST", TRIGGER, headers={KEY: "trigger-2"})
    assert other.status == 200 and other.body["msg_id"] != first.body["msg_id"]
    assert len(await _manual_msgs(api)) == 2


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


async def test_a_concurrent_duplicate_is_refused_while_the_first_runs(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two triggers with one key at once: the second answers 409 with Retry-After while the
    first is still publishing, never publishes; the first answers `triggered`, and a later
    retry gets that answer replayed. One message in the stream."""
    await api.start()
    await _synced(api)
    entered, release = asyncio.Queue[None](), asyncio.Event()
    with _gated_manual_publish(monkeypatch, entered, release):
        first = asyncio.create_task(api.call("POST", TRIGGER, headers={KEY: "race"}))
        async with asyncio.timeout(5):
            await entered.get()
        second = asyncio.create_task(api.call("POST", TRIGGER, headers={KEY: "race"}))
        reached = asyncio.create_task(entered.get())
        async with asyncio.timeout(5):
            await asyncio.wait({second, reached}, return_when=asyncio.FIRST_COMPLETED)
        assert not reached.done(), "the duplicate reached the publish while the first ran"
        reached.cancel()
        busy = await second
        release.set()
        ok = await first
    assert busy.status == 409, busy
    assert busy.body["code"] == "idempotency_key_in_use"
    assert int(_header(busy, "Retry-After") or 0) >= 1
    assert ok.status == 200, ok
    _replayed(ok, await api.call("POST", TRIGGER, headers={KEY: "race"}))
    assert len(await _manual_msgs(api)) == 1


@pytest.mark.parametrize("key", ["", "x" * 201, "has space", "caf\u00e9"])
async def test_a_malformed_key_is_refused_naming_the_header(api: ApiHarness, key: str) -> None:
    """An empty, over-long or non-printable-ASCII key answers 400 naming the header, and the
    call has no effect."""
    await api.start()
    await _synced(api)
    raw = key.encode("utf-8").decode("latin-1")  # aiohttp sends header values as latin-1
    r = await api.call("POST", TRIGGER, headers={KEY: raw})
    assert r.status == 400, r
    assert r.body["code"] == "bad_idempotency_key" and KEY in r.body["detail"]
    assert await _manual_msgs(api) == []


async def _twice(api: ApiHarness, method: str, path: str, key: str, body: Any = None) -> Reply:
    first = await api.call(method, path, json_body=body, headers={KEY: key})
    assert first.status == 200, (method, path, first)
    _replayed(first, await api.call(method, path, json_body=body, headers={KEY: key}))
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


@contextmanager
def _gated_manual_publish(
    monkeypatch: pytest.MonkeyPatch, entered: asyncio.Queue[None], gate: asyncio.Event
) -> Iterator[None]:
    """Manual triggers' publishes report to `entered`, then wait for `gate`."""
    original = JetStreamContext.publish

    async def gated(js: JetStreamContext, subject: str, *args: Any, **kw: Any) -> Any:
        if (kw.get("headers") or {}).get("Mq-Manual"):
            entered.put_nowait(None)
            await gate.wait()
        return await original(js, subject, *args, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(JetStreamContext, "publish", gated)
        try:
            yield
        finally:
            gate.set()
