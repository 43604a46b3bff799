"""The NATS connection and provisioning against a real nats-server."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from nats.errors import OutboundBufferLimitError
from nats.js import api as js_api

from scheduler.bus.nats.connection import NatsBus, provision
from scheduler.daemon.embedded import NatsServer
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from tests.support.helpers import wait_until


async def test_provision_creates_streams_consumer_and_buckets(settings: Settings) -> None:
    """First provisioning creates MQ_DELAY, MQ_DLQ, MQ_TASKS, the consumer and both buckets."""
    bus = NatsBus(settings, Metrics())
    await bus.connect()
    try:
        notes = await provision(bus, embedded=True)
        dedup_off = bus.can_disable_dedup()  # nats-server 2.14+: the lane keeps no window
        empty = {("stream", "MQ_DELAY_NODEDUP", "created")} if dedup_off else set()
        assert {(n.kind, n.name, n.status) for n in notes} == empty | {
            ("stream", "MQ_DELAY", "created"),
            ("stream", "MQ_DLQ", "created"),
            ("stream", "MQ_TASKS", "created"),
            ("consumer", "MQ_DELAY/scheduler-intake", "created"),
            ("bucket", "scheduler_leader", "created"),
            ("bucket", "scheduler_state", "created"),
        }
        assert bus.js is not None
        delay = await bus.js.stream_info("MQ_DELAY")
        assert delay.config.retention == js_api.RetentionPolicy.WORK_QUEUE
        assert (delay.config.duplicate_window or 0) == (0 if dedup_off else 0.1)
        assert [x.name for x in delay.config.sources or []] == (
            ["MQ_DELAY_NODEDUP"] if dedup_off else []
        )
        leader = await bus.js.stream_info("KV_scheduler_leader")
        assert leader.config.max_age == settings.lease_ttl
        consumer = await bus.js.consumer_info("MQ_DELAY", "scheduler-intake")
        assert consumer.config.ack_wait == 10
        assert consumer.config.filter_subject is None  # the lane's own stream: no filter
        again = await provision(bus, embedded=True)
        assert {n.status for n in again} == {"exists"}
        assert bus.version_problem() is None
    finally:
        await bus.close()


async def test_existing_stream_covering_the_lane_is_reported(settings: Settings) -> None:
    """When a stream already captures `mq.>`, provisioning reports it instead of failing."""
    nc = await nats.connect(settings.nats_servers)
    try:
        await nc.jetstream().add_stream(name="HANZO_MQ", subjects=["mq.>"])
        bus = NatsBus(settings, Metrics())
        await bus.connect()
        try:
            notes = {n.name: n for n in await provision(bus, embedded=False)}
        finally:
            await bus.close()
        assert notes["MQ_DELAY"].status == "covered"
        assert notes["MQ_DELAY"].detail == "HANZO_MQ"
        assert notes["MQ_DLQ"].status == "covered"
        assert notes["HANZO_MQ/scheduler-intake"].status == "created"
        consumer = await nc.jetstream().consumer_info("HANZO_MQ", "scheduler-intake")
        assert consumer.config.filter_subject == "mq.delay.>"
    finally:
        await nc.close()


async def test_a_filtered_intake_consumer_on_the_lane_stream_loses_its_filter(
    settings: Settings,
) -> None:
    """An intake consumer made with a filter on the lane's own stream is updated to none:
    nats-server never hands a filtered consumer a subject holding a DEL byte, which would
    otherwise stay on the lane, never judged."""
    from scheduler.bus.nats.connection import ensure_consumer, ensure_stream, stream_configs
    from tests.support.rawclient import RawClient

    bus = NatsBus(settings, Metrics())
    await bus.connect()
    try:
        assert bus.js is not None
        await ensure_stream(bus.js, stream_configs(settings, embedded=False)[0])
        await ensure_consumer(bus.js, "MQ_DELAY", "scheduler-intake", "mq.delay.>", 10)
        notes = {n.name: n for n in await provision(bus, embedded=False)}
        assert notes["MQ_DELAY/scheduler-intake"].status == "updated"
        consumer = await bus.js.consumer_info("MQ_DELAY", "scheduler-intake")
        assert consumer.config.filter_subject is None and consumer.config.ack_wait == 10
        async with RawClient(settings.nats_url or "") as raw:
            assert "seq" in await raw.publish(b"mq.delay.a\x7fb", b"{}")
        psub = await bus.js.pull_subscribe_bind("scheduler-intake", "MQ_DELAY")
        (msg,) = await psub.fetch(1, timeout=3)
        assert msg.subject == "mq.delay.a\x7fb"
    finally:
        await bus.close()


async def test_a_changed_intake_ack_wait_reaches_the_existing_consumer(settings: Settings) -> None:
    """`SCHEDULER_INTAKE_ACK_WAIT` changed on a deployment whose consumer exists updates the
    consumer at start (it decides when a dead engine's lane messages come back); unchanged, the
    consumer is left alone."""
    from datetime import timedelta

    bus = NatsBus(settings, Metrics())
    await bus.connect()
    try:
        assert bus.js is not None
        await provision(bus, embedded=True)
        info = await bus.js.consumer_info("MQ_DELAY", "scheduler-intake")
        assert info.config.ack_wait == settings.intake_ack_wait.total_seconds()
        bus.settings = settings.model_copy(update={"intake_ack_wait": timedelta(seconds=2)})
        notes = {n.name: n for n in await provision(bus, embedded=True)}
        assert notes["MQ_DELAY/scheduler-intake"].status == "updated"
        info = await bus.js.consumer_info("MQ_DELAY", "scheduler-intake")
        assert info.config.ack_wait == 2
        notes = {n.name: n for n in await provision(bus, embedded=True)}
        assert notes["MQ_DELAY/scheduler-intake"].status == "exists"
    finally:
        await bus.close()


async def test_publish_while_disconnected_fails_instead_of_buffering(tmp_path: Path) -> None:
    """With the reconnect buffer disabled, a publish during an outage raises at once."""
    server = NatsServer(tmp_path / "nats").start()
    metrics = Metrics()
    bus = NatsBus(Settings(nats_url=server.url, instance_id="t"), metrics)
    await bus.connect()
    try:
        assert metrics.connected.labels("nats")._value.get() == 1
        server.kill()
        assert bus.nc is not None
        await wait_until(lambda: not bus.connected.is_set())
        with pytest.raises(OutboundBufferLimitError):
            await bus.nc.publish("mq.tasks.x", b"stale")
        assert metrics.connected.labels("nats")._value.get() == 0
    finally:
        await bus.close()
        server.stop()


async def test_connect_gives_up_after_bounded_attempts() -> None:
    """A connect to a port nobody serves gives up after its budget with the service named."""
    from scheduler.daemon.embedded import free_port
    from scheduler.errors import ServiceUnavailableError

    bus = NatsBus(Settings(nats_url=f"nats://127.0.0.1:{free_port()}", instance_id="t"), Metrics())
    with pytest.raises(ServiceUnavailableError, match="NATS unavailable"):
        await bus.connect(budget=0.5)


async def test_embedded_work_stream_from_an_older_data_dir_gains_the_platform_queues(
    settings: Settings,
) -> None:
    """An MQ_TASKS made by an older version (mq.tasks.>, mq.scheduled.> only) is extended to
    the platform's queues, so the docs' mq.inference.chat examples arrive somewhere."""
    nc = await nats.connect(settings.nats_servers)
    try:
        await nc.jetstream().add_stream(
            name="MQ_TASKS",
            subjects=["mq.tasks.>", "mq.scheduled.>"],
            retention=js_api.RetentionPolicy.WORK_QUEUE,
        )
        bus = NatsBus(settings, Metrics())
        await bus.connect()
        try:
            await provision(bus, embedded=True)
        finally:
            await bus.close()
        info = await nc.jetstream().stream_info("MQ_TASKS")
        assert set(info.config.subjects or []) == {
            "mq.tasks.>",
            "mq.scheduled.>",
            "mq.inference.>",
            "mq.batch.>",
            "mq.notify.>",
        }
        assert info.config.retention == js_api.RetentionPolicy.WORK_QUEUE
    finally:
        await nc.close()
