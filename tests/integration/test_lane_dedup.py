"""The delay lane keeps no duplicate window (issue 25 item 6): a task one producer publishes is
delivered or visibly refused, whatever another producer published before it under the same
`Nats-Msg-Id`. nats-server 2.14+ accepts `duplicate_window: 0` on a stream with `sources`; older
servers get the shortest window (100 ms) and a warning (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.js import api as js_api

from scheduler.bus.nats.connection import (
    FALLBACK_WINDOW,
    NODEDUP_DETAIL,
    NatsBus,
    lane_window_warning,
    nodedup_stream,
    provision,
)
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from tests.integration.test_cancel_intents import TARGET, delivered, envelope
from tests.support.helpers import DaemonRunner

LANE_SUBJECT = f"mq.delay.{TARGET[3:]}"


async def dead_lettered(runner: DaemonRunner, task_id: str, reason: str) -> int:
    """How many dead letters `task_id` has for `reason`, once there is one (bounded)."""
    assert runner.daemon is not None and runner.daemon.tasks is not None
    pool = runner.daemon.tasks.db.pool
    found = 0
    async with asyncio.timeout(10):
        while not found:  # the daemon writes it after the lane's ack: poll, bounded
            found = await pool.fetchval(
                "SELECT count(*) FROM dead_letters WHERE original_id = $1 AND reason = $2",
                task_id,
                reason,
            )
            await asyncio.sleep(0.05)
    return int(found)


async def test_two_producers_with_the_same_msg_id_each_reach_the_daemon(
    settings: Settings,
) -> None:
    """A and B both set `Nats-Msg-Id: X` on their own task X: B's PubAck is not a duplicate,
    B's task is dead-lettered `duplicate_id`, A's is delivered once. (A server that cannot
    turn the window off drops B for 100 ms: B is then stored once that has passed.)"""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    runner = DaemonRunner(settings)
    try:
        daemon = await runner.start()
        assert daemon.bus is not None
        first = envelope(datetime.now(UTC) + timedelta(milliseconds=500))
        second = {**first, "data": {"n": 2}}
        header = {"Nats-Msg-Id": first["id"]}
        ack_a = await js.publish(LANE_SUBJECT, json.dumps(first).encode(), headers=header)
        ack_b = await js.publish(LANE_SUBJECT, json.dumps(second).encode(), headers=header)
        assert not ack_a.duplicate
        if not daemon.bus.can_disable_dedup():  # the documented fallback: 100 ms of exposure
            assert ack_b.duplicate
            await asyncio.sleep(FALLBACK_WINDOW + 0.05)
            ack_b = await js.publish(LANE_SUBJECT, json.dumps(second).encode(), headers=header)
        assert not ack_b.duplicate  # stored on the lane: the daemon judges it
        assert ack_b.seq != ack_a.seq
        assert await dead_lettered(runner, first["id"], "duplicate_id") == 1
        got = await delivered(js, within=2)
        assert list(got) == [first["id"]]
    finally:
        await runner.stop()
        await nc.close()


async def test_a_producers_exact_resend_with_its_msg_id_is_delivered_once(
    settings: Settings,
) -> None:
    """A producer retrying after a lost PubAck resends the same bytes with the same header:
    the lane stores both, the daemon's id rule makes the second a no-op, one delivery."""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    runner = DaemonRunner(settings)
    try:
        daemon = await runner.start()
        assert daemon.bus is not None
        doc = envelope(datetime.now(UTC) + timedelta(milliseconds=500))
        raw, header = json.dumps(doc).encode(), {"Nats-Msg-Id": doc["id"]}
        acks = [await js.publish(LANE_SUBJECT, raw, headers=header) for _ in range(2)]
        if daemon.bus.can_disable_dedup():
            assert [a.duplicate for a in acks] == [None, None]
        got = await delivered(js, within=2)
        assert list(got) == [doc["id"]]
        pool = daemon.tasks.db.pool
        assert await pool.fetchval("SELECT count(*) FROM dead_letters") == 0
    finally:
        await runner.stop()
        await nc.close()


async def test_provisioning_turns_an_older_lanes_window_off_in_place(nats_url: str) -> None:
    """A lane made by an older version (2-minute window, a message and the intake consumer on
    it) is updated in place: no window and a source on a sealed empty stream (2.14+), or the
    shortest window the server allows with a warning naming the version; the message and the
    consumer stay, and a publish to the empty stream is refused."""
    settings = Settings(nats_url=nats_url, instance_id="t")
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    bus = NatsBus(settings, Metrics())
    await bus.connect()
    try:
        await js.add_stream(
            name="MQ_DELAY",
            subjects=["mq.delay.>"],
            retention=js_api.RetentionPolicy.WORK_QUEUE,
            duplicate_window=120,
        )
        await js.publish("mq.delay.tasks.work", b"{}", headers={"Nats-Msg-Id": "old"})
        notes = {n.name: n for n in await provision(bus, embedded=False)}
        assert notes["MQ_DELAY"].status == "updated"
        info = await js.stream_info("MQ_DELAY")
        assert info.state.messages == 1
        assert info.config.retention == js_api.RetentionPolicy.WORK_QUEUE
        warning = await lane_window_warning(bus, "MQ_DELAY")
        if bus.can_disable_dedup():
            assert not info.config.duplicate_window
            assert [s.name for s in info.config.sources or []] == [nodedup_stream(settings)]
            assert warning is None
            empty = await js.stream_info(nodedup_stream(settings))
            assert empty.config.sealed and empty.state.messages == 0
            assert notes[nodedup_stream(settings)].detail == NODEDUP_DETAIL  # says why
            refused = await nc.request(nodedup_stream(settings), b"x", timeout=2)
            assert b"sealed" in refused.data
        else:
            assert info.config.duplicate_window == FALLBACK_WINDOW
            assert warning is not None and bus.server_version in warning
            assert "cannot turn it off" in warning
        again = {n.name: n for n in await provision(bus, embedded=False)}
        assert again["MQ_DELAY"].status == "exists"
        psub = await js.pull_subscribe_bind("scheduler-intake", "MQ_DELAY")
        (msg,) = await psub.fetch(1, timeout=3)
        assert msg.headers == {"Nats-Msg-Id": "old"}
    finally:
        await bus.close()
        for info in await js.streams_info():
            assert info.config.name is not None
            await js.delete_stream(info.config.name)
        await nc.close()


async def test_an_unprovisioned_lane_with_a_window_earns_a_warning(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """With SCHEDULER_PROVISION=false the daemon checks the lane an operator made and says,
    once, what its window exposes (in /readyz's warnings); it still starts. The deprecated
    SCHEDULER_INTAKE_DUPLICATE_WINDOW earns a warning that it is ignored."""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    runner = DaemonRunner(settings)
    try:
        await runner.start()  # provisions everything, then the lane is put back to a window
        await runner.stop()
        info = await js.stream_info("MQ_DELAY")
        info.config.duplicate_window, info.config.sources = 120, None
        await js.update_stream(info.config)
        daemon = await runner.start(provision=False, intake_duplicate_window="5m")
        (warning,) = [w for w in daemon.warnings if "duplicate window" in w]
        (ignored,) = [r for r in caplog.records if r.msg.startswith("settings.ignored")]
        assert "SCHEDULER_INTAKE_DUPLICATE_WINDOW" in ignored.getMessage()
        assert "120s" in warning and "MQ_DELAY" in warning
        assert daemon.bus is not None and daemon.bus.server_version in warning
    finally:
        try:
            await runner.stop()
        finally:
            await nc.close()


async def test_instances_provisioning_together_all_start(nats_url: str) -> None:
    """Instances starting at once race to create and seal the empty stream: one seals it between
    another's read and update (nats-server refuses that update, 10052) or creates it first
    (10058); every instance's provisioning still succeeds and the stream ends sealed and empty
    (on a server without a zero window, the lane ends with the shortest one)."""
    settings = Settings(nats_url=nats_url, instance_id="t")
    buses = [NatsBus(settings, Metrics()) for _ in range(4)]
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        for bus in buses:
            await bus.connect()
        async with asyncio.timeout(20):
            for _ in range(3):  # a fresh race each round
                results = await asyncio.gather(*(provision(b, embedded=False) for b in buses))
                assert all(results)
                lane = await js.stream_info("MQ_DELAY")
                if buses[0].can_disable_dedup():
                    empty = await js.stream_info(nodedup_stream(settings))
                    assert empty.config.sealed and empty.state.messages == 0
                    assert not lane.config.duplicate_window
                else:
                    assert lane.config.duplicate_window == FALLBACK_WINDOW
                for info in await js.streams_info():
                    assert info.config.name is not None
                    await js.delete_stream(info.config.name)
    finally:
        for bus in buses:
            await bus.close()
        for info in await js.streams_info():
            assert info.config.name is not None
            await js.delete_stream(info.config.name)
        await nc.close()
