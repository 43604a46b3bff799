"""The bus's contract (the JetStream questions the engine asks, the term's publisher), over the twin
and nats-server (with either publish path)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduler.bus.memory import MemoryBus, MemoryStreams
from scheduler.engine.ports import Bus
from scheduler.metrics import Metrics
from scheduler.records import PublishError
from scheduler.settings import Settings
from tests.support.cluster import wait_for_capture, wait_for_leader
from tests.support.compat import NatsServerOf, Servers

STREAM = "CONTRACT_BUS"
CONSUMER = "contract-bus"


@dataclass
class Side:
    bus: Bus  # NatsBus or MemoryBus
    # (subject, payload) stored in STREAM, as a producer's publish does
    put: Callable[[str, bytes], Awaitable[None]]
    # (subject, payload) sent as a core message, as `scheduler.operations` notices are
    notify: Callable[[str, bytes], Awaitable[None]]


@pytest.fixture(params=["twin", "wire", "nats_py"])
def adapter(request: pytest.FixtureRequest) -> str:
    """The twin without a server; on nats-server, `NatsBus` with each `SCHEDULER_PUBLISH_PATH`
    (tests/contracts/conftest.py deselects the other pairs)."""
    return str(request.param)


@pytest.fixture
async def side(nats_server_url: str | None, adapter: str, replicas: int) -> AsyncIterator[Side]:
    if nats_server_url is None:
        streams = MemoryStreams()
        streams.add_stream(STREAM, ["busc.>"], duplicate_window=30)

        async def put_memory(subject: str, payload: bytes) -> None:
            streams.store(subject, payload, {"Nats-Msg-Id": uuid.uuid4().hex})

        bus = MemoryBus(streams)
        yield Side(bus, put_memory, bus.notify)
        return
    from nats.js.api import ConsumerConfig, StreamConfig

    from scheduler.bus.nats.connection import NatsBus

    settings = Settings(nats_url=nats_server_url, instance_id="contract", publish_path=adapter)
    real = NatsBus(settings, Metrics())
    await real.connect(5)
    assert real.js is not None
    js = real.js
    await js.add_stream(
        StreamConfig(name=STREAM, subjects=["busc.>"], duplicate_window=30, num_replicas=replicas)
    )
    if replicas > 1:
        await wait_for_leader(js, STREAM)
        assert real.nc is not None
        await wait_for_capture(real.nc, "busc.probe")
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=CONSUMER, ack_wait=5))

    async def put_real(subject: str, payload: bytes) -> None:
        await js.publish(subject, payload, headers={"Nats-Msg-Id": uuid.uuid4().hex})

    async def notify_real(subject: str, payload: bytes) -> None:
        assert real.nc is not None
        await real.nc.publish(subject, payload)

    try:
        yield Side(real, put_real, notify_real)
    finally:
        await js.delete_stream(STREAM)
        await real.close()


async def test_messages_held_counts_one_subject_of_the_capturing_stream(side: Side) -> None:
    """What `concurrency: forbid` asks: the messages held on exactly that subject (not its
    neighbours'), 0 for a captured subject with none, an error for one no stream captures."""
    await side.put("busc.job.a", b"1")
    await side.put("busc.job.a", b"2")
    await side.put("busc.job.b", b"3")
    assert await side.bus.messages_held("busc.job.a") == 2
    assert await side.bus.messages_held("busc.job.b") == 1
    assert await side.bus.messages_held("busc.job.c") == 0
    with pytest.raises(Exception):  # noqa: B017 - each side raises its own lookup error
        await side.bus.messages_held("nowhere.job.a")


async def test_duplicate_window_is_the_streams(side: Side) -> None:
    """A stream's duplicate window, in seconds."""
    assert await side.bus.duplicate_window(STREAM) == pytest.approx(30)


async def test_a_publisher_opened_for_a_term_sends_only_while_its_fence_holds(side: Side) -> None:
    """`open_publisher` gives a started broker with the given ack timeout that stores what it
    publishes while `fence()` holds and sends nothing once it fails; the server's limit is the
    bus's."""
    office = {"in": True}
    broker = await side.bus.open_publisher(2.0, lambda: office["in"])
    try:
        assert broker.timeout == 2.0 and broker.max_payload == side.bus.max_payload > 1024
        ack = await (await broker.publish("busc.term.a", b"x", {"Nats-Msg-Id": "t-1"}))
        assert (ack.stream, ack.duplicate) == (STREAM, False)
        office["in"] = False
        refused = await broker.publish("busc.term.a", b"y", {"Nats-Msg-Id": "t-2"})
        with pytest.raises(PublishError, match="not sent"):
            async with asyncio.timeout(5):
                await refused
        assert await side.bus.messages_held("busc.term.a") == 1
    finally:
        await broker.close()


async def test_a_listener_hears_core_messages_until_it_unsubscribes(side: Side) -> None:
    """`listen` calls the handler with the payload of every core message on the subject (a
    wildcard too), and no more after `unsubscribe`."""
    heard: list[bytes] = []
    arrived = asyncio.Event()

    async def handler(data: bytes) -> None:
        heard.append(data)
        arrived.set()

    sub = await side.bus.listen("busc.notice.*", handler)
    await side.notify("busc.notice.a", b"one")
    await side.notify("busc.other", b"not for it")
    async with asyncio.timeout(5):
        await arrived.wait()
    await sub.unsubscribe()
    await side.notify("busc.notice.b", b"after")
    await asyncio.sleep(0.1)  # what would arrive, were it still subscribed
    assert heard == [b"one"]


async def test_notify_sends_a_core_message_that_listeners_hear(side: Side) -> None:
    """`notify` sends a core message that every listener on its subject, a wildcard too,
    hears."""
    heard: list[tuple[str, bytes]] = []
    both = asyncio.Event()

    def on(name: str) -> Callable[[bytes], Awaitable[None]]:
        async def handler(data: bytes) -> None:
            heard.append((name, data))
            if len(heard) == 2:
                both.set()

        return handler

    subs = [
        await side.bus.listen("buscn.told.3", on("one")),
        await side.bus.listen("buscn.told.*", on("all")),
    ]
    try:
        await side.bus.notify("buscn.told.3", b"notice")
        async with asyncio.timeout(5):
            await both.wait()
        assert sorted(heard) == [("all", b"notice"), ("one", b"notice")]
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def test_the_intake_source_takes_from_the_named_consumer(side: Side) -> None:
    """`intake_source` gives the delay lane's source on a stream's durable consumer: once
    started, it takes what the stream holds."""
    await side.put("busc.lane.a", b"task")
    source = await side.bus.intake_source(STREAM, CONSUMER, 10).start()
    try:
        got: list[Any] = []
        async with asyncio.timeout(5):
            while not got:
                got = list(await source.take(timeout=1.0))
        assert [(d.subject, d.data) for d in got] == [("busc.lane.a", b"task")]
    finally:
        await source.close()


async def test_the_publish_path_setting_picks_the_adapter(side: Side, adapter: str) -> None:
    """`SCHEDULER_PUBLISH_PATH` decides which adapter a term's publisher is: the wire one by
    default, nats-py's public API with `nats_py`."""
    expected = {"twin": "MemoryBroker", "wire": "Publisher", "nats_py": "PlainPublisher"}
    broker = await side.bus.open_publisher(2.0, lambda: True)
    try:
        assert type(broker).__name__ == expected[adapter]
    finally:
        await broker.close()


@dataclass
class Link:
    bus: Bus  # NatsBus or MemoryBus
    drop: Callable[[], Awaitable[None]]  # the connection is lost (the server goes away)
    restore: Callable[[], Awaitable[None]]  # it can be made again (the server is back)


@pytest.fixture
async def link(servers: Servers | None, tmp_path: Path) -> AsyncIterator[Link]:
    """A bus whose connection the test can take away: the twin's `link()`, or a nats-server
    of the bus's own, killed and started again on its port."""
    if servers is None:
        bus = MemoryBus(MemoryStreams())

        async def drop_memory() -> None:
            bus.link(False)

        async def restore_memory() -> None:
            bus.link(True)

        yield Link(bus, drop_memory, restore_memory)
        return
    from scheduler.bus.nats.connection import NatsBus

    server = NatsServerOf(tmp_path / "nats", servers.nats_binary).start()
    real = NatsBus(Settings(nats_url=server.url, instance_id="contract"), Metrics())
    await real.connect(5)

    async def drop_real() -> None:
        server.kill()

    async def restore_real() -> None:
        await asyncio.to_thread(server.start)

    try:
        yield Link(real, drop_real, restore_real)
    finally:
        await real.close()
        server.stop()


async def test_link_listeners_hear_the_link_drop_and_come_back(link: Link) -> None:
    """Every callable in `link_listeners` is called with False when the connection drops and
    with True when it is back."""
    heard: list[bool] = []
    link.bus.link_listeners.append(heard.append)
    await link.drop()
    async with asyncio.timeout(10):
        while heard != [False]:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    await link.restore()
    async with asyncio.timeout(15):
        while heard != [False, True]:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
