"""The operator half's bus port (`scheduler.operations.ports.BusWriter`): the twin
(`MemoryWriter`) and the adapter on nats-py (`NatsWriter`) give the same answers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from scheduler.bus.memory import MemoryBus, MemoryStreams, MemoryWriter
from scheduler.operations.ports import BusWriter, NoStream, Refused
from tests.support.cluster import wait_for_capture, wait_for_leader

Listen = Callable[[str], Awaitable[asyncio.Queue[bytes]]]


@dataclass
class Side:
    writer: BusWriter
    prefix: str  # the subjects the side's stream captures: `<prefix>.>`
    stream: str
    listen: Listen  # a queue of the core messages sent to a subject


@pytest.fixture
async def side(nats_server_url: str | None, replicas: int) -> AsyncIterator[Side]:
    tag = uuid.uuid4().hex[:10]
    prefix, stream = f"bw{tag}", f"CONTRACT_WRITER_{tag}"
    if nats_server_url is None:
        streams = MemoryStreams()
        streams.add_stream(stream, [f"{prefix}.>"], duplicate_window=30)
        bus = MemoryBus(streams)

        async def listen_twin(subject: str) -> asyncio.Queue[bytes]:
            got: asyncio.Queue[bytes] = asyncio.Queue()

            async def on(data: bytes) -> None:
                got.put_nowait(data)

            await bus.listen(subject, on)
            return got

        yield Side(MemoryWriter(streams, bus, max_payload=1 << 20), prefix, stream, listen_twin)
        return
    import nats
    from nats.aio.msg import Msg
    from nats.js.api import StreamConfig

    from scheduler.bus.nats.writer import NatsWriter

    nc = await nats.connect(nats_server_url)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=stream, subjects=[f"{prefix}.>"], duplicate_window=30, num_replicas=replicas
        )
    )
    if replicas > 1:
        await wait_for_leader(js, stream)
        await wait_for_capture(nc, f"{prefix}.probe")

    async def listen_real(subject: str) -> asyncio.Queue[bytes]:
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on(msg: Msg) -> None:
            got.put_nowait(msg.data)

        await nc.subscribe(subject, cb=on)
        await nc.flush()
        return got

    try:
        yield Side(NatsWriter(nc), prefix, stream, listen_real)
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_a_store_is_acknowledged_with_its_stream_and_sequence(side: Side) -> None:
    w, subject = side.writer, f"{side.prefix}.a"
    first = await w.store(subject, b"one", {"Nats-Msg-Id": "m1"})
    second = await w.store(subject, b"two")
    assert (first.stream, first.seq, first.duplicate) == (side.stream, 1, False)
    assert (second.stream, second.seq, second.duplicate) == (side.stream, 2, False)
    assert await w.held(subject) == 2
    assert await w.held(f"{side.prefix}.b") == 0


async def test_a_message_id_seen_within_the_window_is_a_duplicate_not_stored_again(
    side: Side,
) -> None:
    w, subject = side.writer, f"{side.prefix}.a"
    first = await w.store(subject, b"one", {"Nats-Msg-Id": "same"})
    again = await w.store(subject, b"other bytes", {"Nats-Msg-Id": "same"})
    assert again.duplicate and again.seq == first.seq and not first.duplicate
    assert await w.held(subject) == 1


async def test_a_subject_no_stream_captures_is_no_stream_and_nothing_stored(side: Side) -> None:
    w = side.writer
    with pytest.raises(NoStream) as caught:
        await w.store(f"nostream{uuid.uuid4().hex[:8]}.x", b"x", timeout=2.0)
    assert not caught.value.maybe_stored
    assert await w.held(f"nostream{uuid.uuid4().hex[:8]}.x") is None


async def test_a_body_over_max_payload_is_refused_before_it_is_sent(side: Side) -> None:
    w, subject = side.writer, f"{side.prefix}.big"
    assert w.max_payload >= 1024
    with pytest.raises(Refused) as caught:
        await w.store(subject, b"x" * (w.max_payload + 1))
    assert not caught.value.maybe_stored and "max_payload" in str(caught.value)
    assert await w.held(subject) == 0


async def test_a_notice_reaches_whoever_listens_on_its_subject(side: Side) -> None:
    subject = f"{side.prefix}notice.changed"
    got = await side.listen(subject)
    await side.writer.notify(subject, b"job-1")
    assert await asyncio.wait_for(got.get(), 5) == b"job-1"
    assert got.empty()
    assert await side.writer.held(subject) is None  # a core message: no stream holds it
