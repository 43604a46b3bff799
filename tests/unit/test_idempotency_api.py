"""`Idempotency-Key` on the API, in-process on the twins (tests/support/edge_twins.py): a retry
with the same key answers the first outcome again and publishes once, even with the stored
answer gone; a concurrent duplicate waits its turn (409, Retry-After) and never runs; a
malformed key is refused naming the header. What needs tasks or dead letters made by the
engine stays on real servers (tests/integration/api/test_idempotency.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.integration.api.harness import header, replayed
from tests.support.edge_twins import READ, EdgeOnTwins

KEY = "Idempotency-Key"
TRIGGER = "/v1/schedules/frozen/trigger"


async def _synced(api: EdgeOnTwins) -> None:
    r = await api.call("GET", "/v1/schedules", token=READ)
    assert len(r.body["items"]) == 3, r


async def _manual_msgs(api: EdgeOnTwins, job: str = "frozen") -> list[Any]:
    return await api.read_stream("SCHEDULED", subject=f"mq.scheduled.{job}")


async def test_trigger_retried_with_the_same_key_publishes_once(api: EdgeOnTwins) -> None:
    """A trigger sent twice with one key publishes once and answers the first outcome again;
    its Nats-Msg-Id comes from the job and the key, so even with the stored outcome gone the
    retry's publish is dropped by the stream's duplicate window and the answer stays true."""
    await _synced(api)
    first = await api.call("POST", TRIGGER, headers={KEY: "trigger-1"})
    again = await api.call("POST", TRIGGER, headers={KEY: "trigger-1"})
    assert first.status == 200, first
    assert len(await _manual_msgs(api)) == 1
    replayed(first, again)
    api.idempotency.rows.clear()  # the first outcome never stored (a crash after the publish)
    lost = await api.call("POST", TRIGGER, headers={KEY: "trigger-1"})
    fires = [f for f in api.schedules.fire_log if f["key"] == "frozen"]
    assert lost.status == 200, lost
    assert lost.body["msg_id"] == first.body["msg_id"] and lost.body["seq"] == first.body["seq"]
    msgs = await _manual_msgs(api)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [first.body["msg_id"]]
    assert [r["stream_seq"] for r in fires] == [first.body["seq"]]
    other = await api.call("POST", TRIGGER, headers={KEY: "trigger-2"})
    assert other.status == 200 and other.body["msg_id"] != first.body["msg_id"]
    assert len(await _manual_msgs(api)) == 2


async def test_a_concurrent_duplicate_is_refused_while_the_first_runs(
    api: EdgeOnTwins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two triggers with one key at once: the second answers 409 with Retry-After while the
    first is still publishing, never publishes; the first answers `triggered`, and a later
    retry gets that answer replayed. One message in the stream."""
    await _synced(api)
    entered, release = asyncio.Queue[None](), asyncio.Event()
    with _gated_manual_publish(api, monkeypatch, entered, release):
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
    assert int(header(busy, "Retry-After") or 0) >= 1
    assert ok.status == 200, ok
    replayed(ok, await api.call("POST", TRIGGER, headers={KEY: "race"}))
    assert len(await _manual_msgs(api)) == 1


@pytest.mark.parametrize("key", ["", "x" * 201, "has space", "caf\u00e9"])
async def test_a_malformed_key_is_refused_naming_the_header(api: EdgeOnTwins, key: str) -> None:
    """An empty, over-long or non-printable-ASCII key answers 400 naming the header, and the
    call has no effect."""
    await _synced(api)
    raw = key.encode("utf-8").decode("latin-1")  # sent as latin-1, as aiohttp sends headers
    r = await api.call("POST", TRIGGER, headers={KEY: raw})
    assert r.status == 400, r
    assert r.body["code"] == "bad_idempotency_key" and KEY in r.body["detail"]
    assert await _manual_msgs(api) == []


@contextmanager
def _gated_manual_publish(
    api: EdgeOnTwins,
    monkeypatch: pytest.MonkeyPatch,
    entered: asyncio.Queue[None],
    gate: asyncio.Event,
) -> Iterator[None]:
    """Manual triggers' stores report to `entered`, then wait for `gate`."""
    original = api.writer.store

    async def gated(subject: str, body: bytes, headers: Any = None, *args: Any) -> Any:
        if (headers or {}).get("Mq-Manual"):
            entered.put_nowait(None)
            await gate.wait()
        return await original(subject, body, headers, *args)

    with monkeypatch.context() as patch:
        patch.setattr(api.writer, "store", gated)
        try:
            yield
        finally:
            gate.set()
