"""The intake puller's bookkeeping of pull requests across reconnects, silences and outages."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from nats.errors import OutboundBufferLimitError

from scheduler.bus.nats import puller as puller_module
from scheduler.bus.nats.puller import Puller


class FakeClient:
    """Just what the puller's request path touches: stats, connection state, publish."""

    def __init__(self) -> None:
        self.stats = {"reconnects": 0}
        self.is_connected = True
        self.sent: list[dict[str, Any]] = []
        self.fail_with: Exception | None = None

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append(json.loads(payload))


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    return clock


def make(nc: FakeClient, now: list[float]) -> Puller:
    p = Puller(nc, "S", "C", batch=100, expires=5.0)  # type: ignore[arg-type]
    p._heard = now[0]
    return p


async def test_requests_are_asked_again_after_a_reconnect(now: list[float]) -> None:
    """Outstanding requests die with the old connection: after a reconnect the whole batch
    is requested again, although no status said the old requests ended."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100]
    nc.stats["reconnects"] = 1
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100, 100]


async def test_requests_are_asked_again_after_two_missed_heartbeats(now: list[float]) -> None:
    """Every request asks for idle heartbeats; no message and no status for two of them (a
    consumer leader that died or froze with the request) and the requests are taken as lost
    and asked again; a delivery or status in between keeps them."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    assert nc.sent[0]["idle_heartbeat"] == int(puller_module.HEARTBEAT * 1e9)
    silence = puller_module.HEARTBEAT * puller_module.MISSED_HEARTBEATS
    now[0] += silence - 0.05
    await p._top_up()
    assert len(nc.sent) == 1
    p._on_raw(b"inbox", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")  # heard something
    now[0] += silence - 0.05
    await p._top_up()
    assert len(nc.sent) == 1
    now[0] += 0.1
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100, 100]


async def test_a_request_nobody_took_is_sent_again_after_a_short_pause(now: list[float]) -> None:
    """A 503 (no server leads the consumer during its election) ends the requests: they are
    sent again once NO_LEADER_PAUSE has passed, not after a request's expiry."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    p._on_raw(b"inbox", b"", b"", b"NATS/1.0 503\r\n\r\n")
    assert p._requested == 0
    await p._top_up()
    assert len(nc.sent) == 1  # within the pause: no storm of requests
    assert p._next_check(1.0) == pytest.approx(puller_module.NO_LEADER_PAUSE)
    now[0] += puller_module.NO_LEADER_PAUSE
    await p._top_up()
    assert len(nc.sent) == 2 and p._requested == 100


async def test_a_waiting_take_wakes_when_a_heartbeat_is_missed(now: list[float]) -> None:
    """`take()` waits no longer than the missed-heartbeat deadline, so a lost request is
    replaced within two heartbeats even while the caller asks for a long wait."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    silence = puller_module.HEARTBEAT * puller_module.MISSED_HEARTBEATS
    assert p._next_check(30.0) == pytest.approx(silence + 0.01)
    now[0] += silence + 0.02
    assert await p.take(timeout=30.0) == []
    assert len(nc.sent) == 2


async def test_an_outage_is_back_pressure_not_an_error(now: list[float]) -> None:
    """While disconnected nothing is sent and nothing counted; a publish refused because the
    link dropped just then (OutboundBufferLimitError) is swallowed and asked again later."""
    nc = FakeClient()
    p = make(nc, now)
    nc.is_connected = False
    await p._top_up()
    assert nc.sent == [] and p._requested == 0
    nc.is_connected = True
    nc.fail_with = OutboundBufferLimitError()
    await p._top_up()
    assert nc.sent == [] and p._requested == 0
    nc.fail_with = None
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100] and p._requested == 100


def _deliver(p: Puller, n: int) -> None:
    for i in range(n):
        p._on_raw(b"mq.delay.x", f"$JS.ACK.S.C.1.{i}.{i}.1.0".encode(), b"{}", None)


async def test_a_batch_lingers_from_its_oldest_message_not_from_the_call(
    now: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages that came while the caller handled the last batch wait with the next ones until
    the oldest is `linger` old, so a handful is not committed alone; older ones go at once."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        slept.append(round(delay, 6))
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    nc = FakeClient()
    p = make(nc, now)
    p._requested = 100
    _deliver(p, 2)  # at 100.0
    now[0] += 0.004
    assert len(await p.take(timeout=1, linger=0.01)) == 2
    assert slept == [0.006]  # until the oldest is 10 ms old, not 10 ms more
    _deliver(p, 3)
    now[0] += 0.02  # already older than the linger: taken at once
    assert len(await p.take(timeout=1, linger=0.01)) == 3
    assert slept == [0.006]
    _deliver(p, 100)  # a whole batch is in: no linger at all
    assert len(await p.take(timeout=1, linger=0.01)) == 100
    assert slept == [0.006]
