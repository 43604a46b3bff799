"""The broker's contract, over the in-memory twin and nats-server alike."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.bus.memory import MemoryBroker, MemoryStreams
from scheduler.bus.nats.frames import delivery_block
from scheduler.records import ClaimedTask, Outcome, PubAck, PublishError

STREAM = "CONTRACT"
BUCKET = "contract_state"


@dataclass
class Side:
    broker: Any  # Publisher or MemoryBroker
    # (stream, seq) -> (subject, payload, headers) of a stored message
    read: Callable[[int], Any]
    # key -> the latest value of that key in BUCKET
    read_key: Callable[[str], Any]
    office: dict[str, bool] = field(default_factory=lambda: {"in": True})


@pytest.fixture
async def side(nats_server_url: str | None) -> AsyncIterator[Side]:
    office = {"in": True}
    if nats_server_url is None:
        streams = MemoryStreams()
        streams.add_stream(STREAM, ["contract.>"], duplicate_window=60)
        streams.add_stream(f"KV_{BUCKET}", [f"$KV.{BUCKET}.>"])
        broker = MemoryBroker(streams, fence=lambda: office["in"], timeout=2)

        async def read_memory(seq: int) -> tuple[str, bytes, dict[str, str]]:
            m = next(m for m in streams.messages(STREAM) if m.seq == seq)
            return m.subject, m.payload, m.headers

        async def read_memory_key(key: str) -> bytes:
            held = streams.messages(f"KV_{BUCKET}")
            return [m.payload for m in held if m.subject == f"$KV.{BUCKET}.{key}"][-1]

        yield Side(broker, read_memory, read_memory_key, office)
        await broker.close()
        return
    import nats
    from nats.js.api import KeyValueConfig, StreamConfig

    from scheduler.bus.nats.publisher import Publisher

    nc = await nats.connect(nats_server_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["contract.>"], duplicate_window=60))
    kv = await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=1))
    publisher = await Publisher(nc, timeout=2, fence=lambda: office["in"]).start()

    async def read_real(seq: int) -> tuple[str, bytes, dict[str, str]]:
        m = await js.get_msg(STREAM, seq)
        return m.subject, m.data or b"", dict(m.headers or {})

    try:

        async def read_real_key(key: str) -> bytes:
            return (await kv.get(key)).value or b""

        yield Side(publisher, read_real, read_real_key, office)
    finally:
        await publisher.close()
        await js.delete_stream(STREAM)
        await js.delete_key_value(BUCKET)
        await nc.close()


async def outcome_of(side: Side, subject: str, payload: bytes, msg_id: str) -> Outcome:
    fut = await side.broker.publish(subject, payload, {"Nats-Msg-Id": msg_id})
    try:
        async with asyncio.timeout(5):
            return await fut  # type: ignore[no-any-return]
    except PublishError as exc:
        return exc


async def test_a_message_id_is_stored_once_within_the_window(side: Side) -> None:
    """The first publish is stored; the same Nats-Msg-Id again is acked as a duplicate of
    the same sequence and not stored twice; another id gets the next sequence."""
    msg_id = uuid.uuid4().hex
    first = await outcome_of(side, "contract.a", b"one", msg_id)
    again = await outcome_of(side, "contract.a", b"one", msg_id)
    other = await outcome_of(side, "contract.b", b"two", uuid.uuid4().hex)
    assert first == PubAck(STREAM, 1, False)
    assert again == PubAck(STREAM, 1, True)
    assert other == PubAck(STREAM, 2, False)
    assert await side.read(1) == ("contract.a", b"one", {"Nats-Msg-Id": msg_id})


async def test_a_subject_no_stream_captures_fails_definitely(side: Side) -> None:
    """No stream: a PublishError that says so, not in doubt (nothing was stored)."""
    got = await outcome_of(side, "nowhere.x", b"{}", uuid.uuid4().hex)
    assert isinstance(got, PublishError)
    assert "no stream captures nowhere.x" in str(got)
    assert not got.in_doubt and not got.permanent


async def test_a_batch_gives_each_item_one_outcome_and_keeps_headers(side: Side) -> None:
    """Header blocks and header dicts alike arrive as sent, in order; each callback is called
    exactly once."""
    outcomes: dict[int, list[Outcome]] = {}
    items = []
    for i in range(6):
        headers: dict[str, str] | bytes
        if i % 2:
            headers = delivery_block(f"b-{i}".encode(), b"2026-11-24T00:00:00.000Z", b"x", 1)
        else:
            headers = {"Nats-Msg-Id": f"b-{i}", "X-Kind": "plain"}
        items.append(
            (f"contract.{i}", f"p{i}".encode(), headers, outcomes.setdefault(i, []).append)
        )
    await side.broker.publish_batch(items)
    async with asyncio.timeout(5):
        while sum(map(len, outcomes.values())) < len(items):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # no second call
    assert [got for got in outcomes.values()] == [[PubAck(STREAM, i + 1, False)] for i in range(6)]
    assert await side.read(2) == (
        "contract.1",
        b"p1",
        {
            "Nats-Msg-Id": "b-1",
            "Mq-Scheduled-For": "2026-11-24T00:00:00.000Z",
            "Mq-Fired-At": "x",
            "Mq-Attempt": "1",
        },
    )
    assert await side.read(1) == ("contract.0", b"p0", {"Nats-Msg-Id": "b-0", "X-Kind": "plain"})


async def test_tasks_are_delivered_with_their_delivery_headers(side: Side) -> None:
    """`publish_tasks` gives each task the design's delivery headers (the producer's, then
    Nats-Msg-Id = the task id, Mq-Scheduled-For, Mq-Fired-At, Mq-Attempt), with or without
    producer headers, and calls each task's callback exactly once."""
    due = datetime(2026, 11, 24, 0, 0, 0, 123000, tzinfo=UTC)
    fired_at = datetime(2026, 11, 24, 0, 0, 0, 125000, tzinfo=UTC)
    tasks = [
        ClaimedTask(
            id=f"t-{i}",
            target=f"contract.t{i}",
            payload=f"p{i}".encode(),
            headers=headers,
            priority=5,
            due_at=due,
            scheduled_for=due,
            expires_at=None,
            attempts=2,
            seq=i,
        )
        for i, headers in enumerate([{}, {"X-Trace": "abc"}])
    ]
    outcomes: list[list[Outcome]] = [[], []]
    await side.broker.publish_tasks(tasks, [o.append for o in outcomes], fired_at)
    async with asyncio.timeout(5):
        while sum(map(len, outcomes)) < len(tasks):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # no second call
    assert outcomes == [[PubAck(STREAM, 1, False)], [PubAck(STREAM, 2, False)]]
    ours = {
        "Mq-Scheduled-For": "2026-11-24T00:00:00.123Z",
        "Mq-Fired-At": "2026-11-24T00:00:00.125Z",
        "Mq-Attempt": "2",
    }
    assert await side.read(1) == ("contract.t0", b"p0", {"Nats-Msg-Id": "t-0", **ours})
    assert await side.read(2) == (
        "contract.t1",
        b"p1",
        {"X-Trace": "abc", "Nats-Msg-Id": "t-1", **ours},
    )


async def test_nothing_is_sent_out_of_office_or_before_revalidation(side: Side) -> None:
    """With the fence down, or after a lost link until `release()`, a publish fails as not
    sent and the stream stores nothing; afterwards the next message gets the next sequence."""
    side.office["in"] = False
    assert not side.broker.may_send()
    fenced = await outcome_of(side, "contract.a", b"x", uuid.uuid4().hex)
    assert isinstance(fenced, PublishError) and "not sent" in str(fenced)
    side.office["in"] = True
    side.broker.on_link_lost()
    assert side.broker.refusal() is not None
    held = await outcome_of(side, "contract.a", b"x", uuid.uuid4().hex)
    assert isinstance(held, PublishError) and not held.in_doubt
    side.broker.release()
    assert side.broker.may_send()
    assert await outcome_of(side, "contract.a", b"y", uuid.uuid4().hex) == PubAck(STREAM, 1, False)


async def test_a_message_over_max_payload_is_refused_for_good(side: Side) -> None:
    """Too large for the server: a permanent PublishError with reason too_large, nothing sent,
    and the broker keeps working."""
    big = b"x" * (side.broker.max_payload + 1)
    got = await outcome_of(side, "contract.big", big, uuid.uuid4().hex)
    assert isinstance(got, PublishError) and got.permanent and got.reason == "too_large"
    assert await outcome_of(side, "contract.a", b"ok", uuid.uuid4().hex) == PubAck(STREAM, 1, False)


async def test_a_kv_put_is_a_fenced_publish_to_the_bucket(side: Side) -> None:
    """`kv_put` writes the key as a message on the bucket's stream (the value readable as the
    key's latest), and like any publish is not sent out of office."""
    put = await side.broker.kv_put(BUCKET, "cron.job-a", b'{"n": 1}')
    async with asyncio.timeout(5):
        ack = await put
    assert ack.stream == f"KV_{BUCKET}" and not ack.duplicate
    assert await side.read_key("cron.job-a") == b'{"n": 1}'
    side.office["in"] = False
    fenced = await side.broker.kv_put(BUCKET, "cron.job-a", b'{"n": 2}')
    with pytest.raises(PublishError, match="not sent"):
        async with asyncio.timeout(5):
            await fenced
    assert await side.read_key("cron.job-a") == b'{"n": 1}'
