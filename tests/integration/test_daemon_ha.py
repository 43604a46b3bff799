"""Two daemons on one NATS and one database: one leads, the other stands by and takes over.

In-process (one event loop), real nats-server and PostgreSQL, lease TTL 3 s. The multi-process
fault cases (SIGKILL, SIGSTOP, outages) live in tests/faults/.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.js.api import StreamConfig

from scheduler.daemon.lifecycle import Daemon
from scheduler.errors import ConfigError
from scheduler.settings import Settings
from tests.integration.test_daemon import aget
from tests.integration.test_delayed import envelope
from tests.support.helpers import DaemonRunner


@pytest.fixture
async def pair(settings: Settings) -> AsyncIterator[tuple[DaemonRunner, DaemonRunner]]:
    a = DaemonRunner(settings.with_overrides(instance_id="ha-a"))
    b = DaemonRunner(settings.with_overrides(instance_id="ha-b"))
    yield a, b
    await asyncio.gather(a.stop(), b.stop())


async def leader_of(*daemons: Daemon, within: float = 5.0) -> Daemon:
    async with asyncio.timeout(within):
        while True:
            leading = [d for d in daemons if d.leadership and d.leadership.role == "leader"]
            if leading:
                assert len(leading) == 1, "two daemons lead at once"
                return leading[0]
            await asyncio.sleep(0.01)


async def test_one_leads_the_other_stands_by_and_both_are_ready(
    pair: tuple[DaemonRunner, DaemonRunner],
) -> None:
    """Both answer /readyz 200 with their role; /v1/leader names the same leader on both."""
    a, b = pair
    da, db = await a.start(), await b.start()
    leader = await leader_of(da, db)
    standby = db if leader is da else da
    await asyncio.sleep(0.6)  # a campaign round later, still one leader
    assert leader.leadership is not None and leader.leadership.role == "leader"
    for d, role in ((leader, "leader"), (standby, "standby")):
        assert d.endpoints.api is not None and d.endpoints.metrics is not None
        status, body = await aget(d.endpoints.api.url + "/readyz")
        doc = json.loads(body)
        assert status == 200 and doc["ready"] is True
        assert doc["role"] == role
        status, body = await aget(d.endpoints.api.url + "/v1/leader")
        doc = json.loads(body)
        assert status == 200
        assert doc["instance"] == leader.settings.instance_id
        assert leader.office is not None and doc["epoch"] == leader.office.epoch
        assert doc["self"]["role"] == role
        _, metrics = await aget(d.endpoints.metrics.url + "/metrics")
        flag = b"1.0" if role == "leader" else b"0.0"
        assert b"mq_scheduler_is_leader " + flag in metrics
    # The heartbeat of each instance lands in the state bucket.
    nc = await nats.connect(leader.settings.nats_servers)
    try:
        kv = await nc.jetstream().key_value(leader.settings.state_bucket)

        async def beats() -> dict[str, str]:
            out = {}
            for name in ("ha-a", "ha-b"):
                try:
                    out[name] = json.loads((await kv.get(f"instances.{name}")).value or b"")["role"]
                except Exception:
                    pass
            return out

        async with asyncio.timeout(10):
            while sorted((seen := await beats()).values()) != ["leader", "standby"]:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert seen[leader.settings.instance_id] == "leader"
    finally:
        await nc.close()


async def test_graceful_stop_hands_over_fast_and_nothing_is_lost_or_doubled(
    pair: tuple[DaemonRunner, DaemonRunner], settings: Settings
) -> None:
    """Stopping the leader deletes its lease; the standby leads within a second and delivers
    the tasks that fall due after the handover, each exactly once."""
    a, b = pair
    da, db = await a.start(), await b.start()
    leader = await leader_of(da, db)
    standby = db if leader is da else da
    nc = await nats.connect(settings.nats_servers)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="HA", subjects=["mq.ha.>"], duplicate_window=120))
        now = datetime.now(UTC)
        ids = []
        for i in range(60):  # due from 0.5 s to 3.45 s from now, across the handover
            doc = envelope(now + timedelta(seconds=0.5 + i * 0.05))
            ids.append(doc["id"])
            await js.publish("mq.delay.ha.work", json.dumps(doc).encode())
        await asyncio.sleep(1.0)
        runner = a if leader is da else b
        t0 = time.monotonic()
        await runner.stop()
        new = await leader_of(standby, within=3.0)
        took = time.monotonic() - t0
        assert new is standby
        assert took < 1.5, f"handover took {took:.2f} s"
        async with asyncio.timeout(15):
            while (await js.stream_info("HA")).state.messages < len(ids):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a late duplicate would show up now
        sub = await js.subscribe("mq.ha.>", ordered_consumer=True)
        got = []
        try:
            for _ in range(len(ids)):
                msg = await sub.next_msg(timeout=5)
                got.append((msg.headers or {})["Nats-Msg-Id"])
                due = datetime.fromisoformat((msg.headers or {})["Mq-Scheduled-For"])
                fired = datetime.fromisoformat((msg.headers or {})["Mq-Fired-At"])
                assert fired >= due, "delivered early"
        finally:
            await sub.unsubscribe()
        assert sorted(got) == sorted(ids)
        assert (await js.stream_info("HA")).state.messages == len(ids)
    finally:
        await nc.close()


async def test_bucket_ttl_shorter_than_the_lease_is_refused(settings: Settings) -> None:
    """A lease bucket whose TTL is shorter than the lease TTL would let two leaders act."""
    nc = await nats.connect(settings.nats_servers)
    try:
        await nc.jetstream().create_key_value(bucket=settings.leader_bucket, ttl=1.0, history=1)
    finally:
        await nc.close()
    with pytest.raises(ConfigError, match="SCHEDULER_LEASE_TTL"):
        await Daemon(settings).run()
