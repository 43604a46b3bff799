"""The delay lane's `Source` and its `Delivery`s, over the twin and a JetStream consumer alike."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from scheduler.bus.memory import MemoryBroker, MemorySource, MemoryStreams
from scheduler.engine.ports import Broker, Delivery, Source

STREAM = "CONTRACT_LANE"
CONSUMER = "contract-intake"


@dataclass
class Side:
    # store a message on the lane, as a producer does
    put: Callable[[str, bytes, dict[str, str]], Awaitable[None]]
    # a fresh started source on the lane's durable consumer (its user closes it)
    source: Callable[[], Awaitable[Source]]
    broker: Broker  # acknowledges deliveries (`Broker.ack`)


@pytest.fixture
async def side(nats_server_url: str | None) -> AsyncIterator[Side]:
    if nats_server_url is None:
        streams = MemoryStreams()
        streams.add_stream(STREAM, ["lane.>"])

        async def put_memory(subject: str, payload: bytes, headers: dict[str, str]) -> None:
            streams.store(subject, payload, headers)

        async def source_memory() -> MemorySource:
            return await MemorySource(streams, STREAM, CONSUMER, 10).start()

        yield Side(put_memory, source_memory, MemoryBroker(streams))
        return
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    from scheduler.bus.nats.publisher import Publisher
    from scheduler.bus.nats.puller import Puller

    nc = await nats.connect(nats_server_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["lane.>"]))
    config = ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=1)
    await js.add_consumer(STREAM, config)
    broker = await Publisher(nc, timeout=2).start()

    async def put_real(subject: str, payload: bytes, headers: dict[str, str]) -> None:
        await js.publish(subject, payload, headers=headers)

    async def source_real() -> Puller:
        return await Puller(nc, STREAM, CONSUMER, 10, expires=1.0).start()

    try:
        yield Side(put_real, source_real, broker)
    finally:
        await broker.close()
        await js.delete_stream(STREAM)
        await nc.close()


async def take_all(source: Source, count: int, within: float = 5.0) -> list[Delivery]:
    got: list[Delivery] = []
    async with asyncio.timeout(within):
        while len(got) < count:
            got += await source.take(timeout=1.0)
    return got


async def test_take_gives_the_lane_messages_in_order_as_deliveries(side: Side) -> None:
    """Each stored message comes once, in stream order, with its subject, payload, headers,
    a reply subject to acknowledge it by and its delivery metadata."""
    ids = [uuid.uuid4().hex for _ in range(3)]
    for i, msg_id in enumerate(ids):
        await side.put(f"lane.t{i}", f"p{i}".encode(), {"Nats-Msg-Id": msg_id, "X-N": str(i)})
    source = await side.source()
    try:
        got = await take_all(source, 3)
        assert [(d.subject, d.data) for d in got] == [
            (f"lane.t{i}", f"p{i}".encode()) for i in range(3)
        ]
        assert [d.headers for d in got] == [
            {"Nats-Msg-Id": msg_id, "X-N": str(i)} for i, msg_id in enumerate(ids)
        ]
        assert all(d.reply for d in got) and len({d.reply for d in got}) == 3
        assert [d.metadata.sequence.stream for d in got] == [1, 2, 3]
        assert [d.metadata.num_delivered for d in got] == [1, 1, 1]
        assert {d.metadata.stream for d in got} == {STREAM}
        assert await source.take(timeout=0.2) == []
    finally:
        await source.close()


async def test_take_hands_at_most_its_limit_and_keeps_the_rest_in_order(side: Side) -> None:
    """`take(limit=n)` gives at most `n` deliveries; the others come with the next takes, in
    stream order, none lost or repeated."""
    for i in range(5):
        await side.put(f"lane.t{i}", f"p{i}".encode(), {"Nats-Msg-Id": uuid.uuid4().hex})
    source = await side.source()
    try:
        async with asyncio.timeout(5):
            first: list[Delivery] = []
            while not first:
                first = list(await source.take(timeout=1.0, linger=0.2, limit=2))
        assert 1 <= len(first) <= 2
        rest = await take_all(source, 5 - len(first))
        assert [d.data for d in first + rest] == [f"p{i}".encode() for i in range(5)]
        assert await source.take(timeout=0.2) == []
    finally:
        await source.close()


async def test_take_waits_for_a_message_then_returns_it(side: Side) -> None:
    """An empty lane: `take` waits up to its timeout and gives nothing; a message stored while
    it waits is returned before the timeout."""
    source = await side.source()
    try:
        started = time.monotonic()
        assert await source.take(timeout=0.3) == []
        assert time.monotonic() - started >= 0.25
        waiting = asyncio.ensure_future(source.take(timeout=5.0))
        await asyncio.sleep(0.05)
        await side.put("lane.late", b"late", {"Nats-Msg-Id": uuid.uuid4().hex})
        async with asyncio.timeout(3):
            got = await waiting
        assert [d.data for d in got] == [b"late"]
    finally:
        await source.close()


async def test_interrupt_wakes_a_take_in_progress(side: Side) -> None:
    """`interrupt` makes a waiting `take` return at once (the daemon is stopping)."""
    source = await side.source()
    try:
        waiting = asyncio.ensure_future(source.take(timeout=10.0))
        await asyncio.sleep(0.05)
        source.interrupt()
        async with asyncio.timeout(1):
            assert await waiting == []
    finally:
        await source.close()


async def test_what_was_neither_acked_nor_termed_comes_back(side: Side) -> None:
    """After the source closes, a delivery acknowledged through the broker or terminated
    (`term`) is not delivered again; one left alone comes back to the next source at once:
    on nats-server read back from the stream when the source starts (no ack subject: the
    consumer still counts it, scheduler/bus/nats/puller.py), then delivered again after the
    ack wait as its second delivery, which is the one acknowledged; the twin delivers it
    again at once."""
    for name in ("acked", "termed", "left"):
        await side.put(f"lane.{name}", name.encode(), {"Nats-Msg-Id": uuid.uuid4().hex})
    source = await side.source()
    acked, termed, left = await take_all(source, 3)
    await side.broker.ack([acked.reply])
    await termed.term()
    await source.close()
    again = await side.source()
    try:
        (back,) = await take_all(again, 1)
        assert (back.subject, back.data) == ("lane.left", b"left")
        assert back.metadata.sequence.stream == left.metadata.sequence.stream
        if not back.reply:  # read back: its delivery comes again after the ack wait
            assert back.metadata.num_delivered == 1
            (back,) = await take_all(again, 1)
            assert (back.subject, back.data) == ("lane.left", b"left")
        assert back.metadata.num_delivered == 2
        await side.broker.ack([back.reply])
        assert await again.take(timeout=1.5) == []
    finally:
        await again.close()


async def test_in_progress_keeps_a_delivery_from_coming_back(side: Side) -> None:
    """A delivery worked on past the ack wait, kept with `in_progress` and then acknowledged,
    is not delivered again."""
    await side.put("lane.slow", b"slow", {"Nats-Msg-Id": uuid.uuid4().hex})
    source = await side.source()
    try:
        (slow,) = await take_all(source, 1)
        for _ in range(4):  # 1.2 s in all, past the consumer's 1 s ack wait
            await asyncio.sleep(0.3)
            await slow.in_progress()
        await side.broker.ack([slow.reply])
        assert await source.take(timeout=1.5) == []
    finally:
        await source.close()
