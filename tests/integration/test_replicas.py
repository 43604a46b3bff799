"""Replicas of what the daemon provisions: SCHEDULER_STREAM_REPLICAS, the start check naming
what differs, and `scheduler provision --replicas N` moving an existing deployment."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext

from scheduler.bus.nats.connection import NatsBus, provision
from scheduler.bus.nats.replicas import provisioned_streams
from scheduler.cli.main import main
from scheduler.cli.provision import provision_replicas
from scheduler.daemon.preflight import check_replicas
from scheduler.errors import ConfigError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from tests.support.cluster import NatsCluster


async def _replicas(js: JetStreamContext, settings: Settings) -> dict[str, int]:
    names = provisioned_streams(settings, embedded=True)
    return {n: int((await js.stream_info(n)).config.num_replicas or 1) for n in names}


async def _bus(settings: Settings) -> NatsBus:
    bus = NatsBus(settings, Metrics())
    await bus.connect(budget=10)
    return bus


async def test_provisioning_makes_every_stream_and_bucket_with_the_replicas_set(
    nats_cluster: NatsCluster,
) -> None:
    """With SCHEDULER_STREAM_REPLICAS=3 on a 3-node cluster the lane, its sealed source, the
    dead letters, the embedded work stream and both buckets are made with 3 replicas, and the
    start check has nothing to say."""
    settings = Settings(nats_url=nats_cluster.url, instance_id="t", stream_replicas=3)
    bus = await _bus(settings)
    try:
        await provision(bus, embedded=True)
        assert bus.js is not None
        assert set((await _replicas(bus.js, settings)).values()) == {3}
        assert await check_replicas(bus, settings, embedded=True) is None
    finally:
        await bus.close()


async def test_the_start_check_names_what_differs_and_provision_moves_it(
    nats_cluster: NatsCluster,
) -> None:
    """A deployment provisioned at 1 replica, started with 3, is warned about by name (each
    stream and bucket); `provision_replicas` (the `scheduler provision --replicas 3` verb)
    moves each in place, keeping its messages, and the warning is gone."""
    one = Settings(nats_url=nats_cluster.url, instance_id="t")
    three = one.model_copy(update={"stream_replicas": 3})
    bus = await _bus(one)
    try:
        await provision(bus, embedded=False)
        assert bus.js is not None
        await bus.js.publish("mq.dlq.x", b"kept")
        warning = await check_replicas(bus, three, embedded=False)
        assert warning is not None
        for name in ("stream MQ_DELAY has 1", "stream MQ_DLQ has 1", "stream MQ_DELAY_NODEDUP"):
            assert name in warning
        assert "bucket scheduler_leader has 1" in warning
        assert "bucket scheduler_state has 1" in warning
        assert "scheduler provision --replicas 3" in warning
        lines = await provision_replicas(three)
        assert "stream MQ_DLQ: 1 -> 3 replicas" in lines
        assert "bucket scheduler_leader: 1 -> 3 replicas" in lines
        assert await check_replicas(bus, three, embedded=False) is None
        assert (await bus.js.stream_info("MQ_DLQ")).state.messages == 1
        again = await provision_replicas(three)
        assert "stream MQ_DLQ: 3 replicas, unchanged" in again
    finally:
        await bus.close()


async def test_more_replicas_than_nodes_is_refused_naming_the_setting(
    nats_cluster: NatsCluster,
) -> None:
    """Asking a 3-node cluster for 5 replicas fails with a ConfigError naming --replicas and
    the stream, which keeps its replicas."""
    settings = Settings(nats_url=nats_cluster.url, instance_id="t")
    await provision_replicas(settings)
    with pytest.raises(ConfigError, match=r"--replicas: 5: nats-server refused it for stream"):
        await provision_replicas(settings.model_copy(update={"stream_replicas": 5}))


async def test_replicas_on_a_single_server_are_refused_naming_the_setting(nats_url: str) -> None:
    """SCHEDULER_STREAM_REPLICAS=3 against one nats-server (no cluster) stops provisioning with
    a ConfigError naming the setting, not a JetStream API error."""
    settings = Settings(nats_url=nats_url, instance_id="t", stream_replicas=3)
    bus = await _bus(settings)
    try:
        with pytest.raises(ConfigError, match="SCHEDULER_STREAM_REPLICAS: 3, but"):
            await provision(bus, embedded=False)
    finally:
        await bus.close()


@pytest.mark.parametrize(
    ("value", "problem"),
    [("0", "0 is out of range: JetStream allows 1 to 5"), ("three", "'three' is not a whole")],
)
def test_the_verb_refuses_a_bad_replica_count(
    value: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scheduler provision --replicas` takes 1 to 5 and says what is wrong otherwise (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(["provision", "--replicas", value])
    assert exit_.value.code == 2
    assert problem in capsys.readouterr().err


def test_the_setting_is_bounded() -> None:
    """SCHEDULER_STREAM_REPLICAS outside 1..5 fails at start naming the variable."""
    with pytest.raises(Exception, match="stream_replicas"):
        Settings(stream_replicas=0)
