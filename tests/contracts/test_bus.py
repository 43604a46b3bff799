"""The bus's contract (the JetStream questions the engine asks), over the twin and nats-server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from scheduler.bus.memory import MemoryBus, MemoryStreams
from scheduler.metrics import Metrics
from scheduler.settings import Settings

STREAM = "CONTRACT_BUS"


@dataclass
class Side:
    bus: Any  # NatsBus or MemoryBus
    # (subject, payload) stored in STREAM, as a producer's publish does
    put: Callable[[str, bytes], Awaitable[None]]


@pytest.fixture
async def side(nats_server_url: str | None) -> AsyncIterator[Side]:
    if nats_server_url is None:
        streams = MemoryStreams()
        streams.add_stream(STREAM, ["busc.>"], duplicate_window=30)

        async def put_memory(subject: str, payload: bytes) -> None:
            streams.store(subject, payload, {"Nats-Msg-Id": uuid.uuid4().hex})

        yield Side(MemoryBus(streams), put_memory)
        return
    from nats.js.api import StreamConfig

    from scheduler.bus.nats.connection import NatsBus

    bus = NatsBus(Settings(nats_url=nats_server_url, instance_id="contract"), Metrics())
    await bus.connect(5)
    assert bus.js is not None
    js = bus.js
    await js.add_stream(StreamConfig(name=STREAM, subjects=["busc.>"], duplicate_window=30))

    async def put_real(subject: str, payload: bytes) -> None:
        await js.publish(subject, payload, headers={"Nats-Msg-Id": uuid.uuid4().hex})

    try:
        yield Side(bus, put_real)
    finally:
        await js.delete_stream(STREAM)
        await bus.close()


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
