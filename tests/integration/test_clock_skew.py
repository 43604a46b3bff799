"""A leader whose wall clock runs ahead of PostgreSQL's would fire early: it refuses office."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import nats.aio.client
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from scheduler import client
from scheduler.clock import SystemClock
from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from tests.support.helpers import DaemonRunner, wait_until

TARGET = "mq.tasks.skew"


class SkewedClock(SystemClock):
    """The real clock, with the wall clock moved by `offset` seconds (the monotonic clock,
    which leases use, is left alone)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[nats.aio.client.Client]:
    nc = await nats.connect(settings.nats_servers)
    await nc.jetstream().add_stream(name="SKEW", subjects=["mq.tasks.>"], duplicate_window=120)
    yield nc
    await nc.close()


async def publish(nc: nats.aio.client.Client, due: datetime, count: int) -> dict[str, datetime]:
    due = due.replace(microsecond=due.microsecond // 1000 * 1000)
    sent: dict[str, datetime] = {}
    for _ in range(count):
        doc: dict[str, Any] = {
            "schema": "hanzo.mq.v1",
            "id": f"s_{uuid.uuid4().hex}",
            "type": "test.skew",
            "source": "tests",
            "timestamp": datetime.now(UTC).isoformat(),
            "delay_until": due.isoformat(),
            "data": {},
        }
        await client.publish_delayed(nc.jetstream(), TARGET, doc)
        sent[doc["id"]] = due
    return sent


async def arrivals(nc: nats.aio.client.Client, count: int, within: float) -> dict[str, datetime]:
    """Store time of each message in SKEW, once `count` are there (or `within` passes)."""
    js = nc.jetstream()
    psub = await js.pull_subscribe(
        ">", durable=None, stream="SKEW", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    out: dict[str, datetime] = {}
    try:
        async with asyncio.timeout(within):
            while len(out) < count:
                try:
                    for m in await psub.fetch(100, timeout=0.5):
                        out[(m.headers or {})["Nats-Msg-Id"]] = m.metadata.timestamp
                except TimeoutError:
                    continue
    except TimeoutError:
        pass
    finally:
        await psub.unsubscribe()
    return out


def role(d: Daemon) -> str:
    return "leader" if d.office is not None and d.office.may_act() else "standby"


async def test_an_instance_whose_clock_runs_ahead_never_takes_office(
    settings: Settings, producer: nats.aio.client.Client
) -> None:
    """Two instances, the first to start with its clock 2 s ahead: it never leads (it would
    deliver 2 s early), says why in `/readyz`, its log and a metric; the healthy one leads
    and delivers every task on time."""
    ahead = DaemonRunner(settings.with_overrides(instance_id="ahead"), clock=SkewedClock(2.0))
    right = DaemonRunner(settings.with_overrides(instance_id="right"))
    try:
        fast = await ahead.start()
        await asyncio.sleep(1.0)  # alone, it would have taken office by now
        sane = await right.start()
        await wait_until(lambda: "leader" in (role(fast), role(sane)), within=10)
        sent = await publish(producer, datetime.now(UTC) + timedelta(seconds=2.5), 20)
        got = await arrivals(producer, len(sent), within=10)
        ready, body = fast.readiness()
        was_leader, sane_role = role(fast), role(sane)
    finally:
        await right.stop()
        await ahead.stop()
    early = [i for i, at in got.items() if at < sent[i]]
    assert early == [], f"{len(early)} delivered early"
    assert set(got) == set(sent)
    assert (was_leader, sane_role) == ("standby", "leader")
    clock_warnings = [w for w in body["warnings"] if w.startswith("clock: ")]
    assert ready and len(clock_warnings) == 1, body["warnings"]
    assert "ms off PostgreSQL's" in clock_warnings[0]
    assert "SCHEDULER_MAX_CLOCK_SKEW" in clock_warnings[0]
    assert fast.metrics.clock_skew_exceeded._value.get() == 1
    assert 1.8 < fast.metrics.clock_skew._value.get() < 2.2


async def test_a_leader_whose_clock_jumps_ahead_steps_down_and_returns_when_fixed(
    settings: Settings, producer: nats.aio.client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader's clock jumps 2 s ahead while tasks are pending: it leaves office at once (the
    step shows against the monotonic clock), so nothing goes out early, and the measurement
    that follows confirms the skew; once the clock is right again it takes office back and
    delivers them on time."""
    from scheduler.leadership import skew

    monkeypatch.setattr(skew, "CHECK_EVERY", 0.2)
    clock = SkewedClock(0.0)
    runner = DaemonRunner(settings, clock=clock)
    try:
        daemon = await runner.start()
        await wait_until(lambda: role(daemon) == "leader", within=10)
        sent = await publish(producer, datetime.now(UTC) + timedelta(seconds=3), 20)
        clock.offset = 2.0
        await wait_until(lambda: role(daemon) == "standby", within=2)  # at once: a step
        exceeded = daemon.metrics.clock_skew_exceeded
        await wait_until(lambda: exceeded._value.get() == 1, within=2)  # then measured
        await asyncio.sleep(1.5)
        clock.offset = 0.0
        await wait_until(lambda: role(daemon) == "leader", within=10)
        got = await arrivals(producer, len(sent), within=10)
    finally:
        await runner.stop()
    assert set(got) == set(sent)
    assert [i for i, at in got.items() if at < sent[i]] == []
    assert daemon.metrics.clock_skew_exceeded._value.get() == 0
