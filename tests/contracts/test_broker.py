"""The broker's contract, over the in-memory twin and both NATS adapters on nats-server.

The twin runs without a server (`[memory-twin]`); on nats-server every test runs on the wire
adapter (`scheduler.bus.nats.publisher.Publisher`, `SCHEDULER_PUBLISH_PATH=wire`) and on the
plain nats-py one (`scheduler.bus.nats.plain.PlainPublisher`, `nats_py`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.js.errors import ServiceUnavailableError

from scheduler.bus.memory import MemoryBroker, MemoryStreams
from scheduler.engine.ports import Broker
from scheduler.messages.prepared import PreparedMessage, StampedMessage
from scheduler.records import ClaimedTask, Outcome, PubAck, PublishError
from tests.support.cluster import wait_for_capture, wait_for_leader

STREAM = "CONTRACT"
BUCKET = "contract_state"


@pytest.fixture(params=["twin", "wire", "nats_py"])
def adapter(request: pytest.FixtureRequest) -> str:
    """Which implementation: the twin runs only without a server, the adapters only with one
    (tests/contracts/conftest.py deselects the other pairs)."""
    return str(request.param)


@dataclass
class Side:
    broker: Broker  # Publisher, PlainPublisher or MemoryBroker
    # (stream, seq) -> (subject, payload, headers) of a stored message
    read: Callable[[int], Any]
    # key -> the latest value of that key in BUCKET
    read_key: Callable[[str], Any]
    # a JetStream delivery of a fresh message on STREAM: its reply subject (to ack)
    deliver: Callable[[], Awaitable[str]]
    # whether the delivery with that reply subject is acknowledged
    acked: Callable[[str], Awaitable[bool]]
    # another broker of the same kind on the same connection (another term's)
    another: Callable[[], Awaitable[Broker]]
    office: dict[str, bool] = field(default_factory=lambda: {"in": True})


@pytest.fixture
async def side(nats_server_url: str | None, adapter: str, replicas: int) -> AsyncIterator[Side]:
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

        async def deliver_memory() -> str:
            return f"$JS.ACK.{STREAM}.c.1.{uuid.uuid4().int % 1000}.1.0.0"

        async def acked_memory(reply: str) -> bool:
            return reply in broker.acked

        async def another_memory() -> MemoryBroker:
            return MemoryBroker(streams, fence=lambda: office["in"], timeout=2)

        yield Side(
            broker,
            read_memory,
            read_memory_key,
            deliver_memory,
            acked_memory,
            another_memory,
            office,
        )
        await broker.close()
        return
    import nats
    from nats.js.api import ConsumerConfig, KeyValueConfig, StreamConfig

    from scheduler.bus.nats.plain import PlainPublisher
    from scheduler.bus.nats.publisher import Publisher

    kind = Publisher if adapter == "wire" else PlainPublisher
    nc = await nats.connect(nats_server_url)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=STREAM, subjects=["contract.>"], duplicate_window=60, num_replicas=replicas
        )
    )
    kv = await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=1, replicas=replicas))
    for stream in (STREAM, f"KV_{BUCKET}") if replicas > 1 else ():
        await wait_for_leader(js, stream)
    if replicas > 1:
        await wait_for_capture(nc, "contract.probe")
        await wait_for_capture(nc, f"$KV.{BUCKET}.probe")
    publisher = await kind(nc, timeout=2, fence=lambda: office["in"]).start()
    others: list[Broker] = []

    async def read_real(seq: int) -> tuple[str, bytes, dict[str, str]]:
        m = await js.get_msg(STREAM, seq)
        return m.subject or "", m.data or b"", dict(m.headers or {})

    async def read_real_key(key: str) -> bytes:
        return (await kv.get(key)).value or b""

    async def deliver_real() -> str:
        await js.publish("contract.delivered", b"d", headers={"Nats-Msg-Id": uuid.uuid4().hex})
        name = f"c{uuid.uuid4().hex[:8]}"
        config = ConsumerConfig(durable_name=name, ack_wait=30)
        sub = None
        async with asyncio.timeout(10):
            while True:  # on the cluster a new consumer's create, and its first pull, may be
                try:  # answered 503 while its group elects a leader: asked again (same name)
                    if sub is None:
                        sub = await js.pull_subscribe(
                            "contract.delivered", name, stream=STREAM, config=config
                        )
                    (msg,) = await sub.fetch(1, timeout=5)
                    return str(msg.reply)
                except ServiceUnavailableError:
                    await asyncio.sleep(0.1)

    async def acked_real(reply: str) -> bool:
        name = reply.split(".")[3]
        async with asyncio.timeout(5):
            while (await js.consumer_info(STREAM, name)).num_ack_pending:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        return True

    async def another_real() -> Broker:
        other = await kind(nc, timeout=2, fence=lambda: office["in"]).start()
        others.append(other)
        return other

    try:
        yield Side(
            publisher, read_real, read_real_key, deliver_real, acked_real, another_real, office
        )
    finally:
        for other in others:
            await other.close()
        await publisher.close()
        await js.delete_stream(STREAM)
        await js.delete_key_value(BUCKET)
        await nc.close()


async def outcome_of(side: Side, subject: str, payload: bytes, msg_id: str) -> Outcome:
    fut = await side.broker.publish(subject, payload, {"Nats-Msg-Id": msg_id})
    try:
        async with asyncio.timeout(5):
            return await fut
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


def claimed(i: int, headers: dict[str, str], due: datetime) -> ClaimedTask:
    return ClaimedTask(
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


async def test_a_batch_gives_each_item_one_outcome_and_keeps_headers(side: Side) -> None:
    """Tasks with and without producer headers (a header block built at once, and a header
    dict) arrive as sent, in order; each callback is called exactly once."""
    due = datetime(2026, 11, 24, 0, 0, 0, 0, tzinfo=UTC)
    fired_at = datetime(2026, 11, 24, 0, 0, 1, 0, tzinfo=UTC)
    tasks = [claimed(i, {"X-Kind": "plain"} if i % 2 == 0 else {}, due) for i in range(6)]
    outcomes: list[list[Outcome]] = [[] for _ in tasks]
    await side.broker.publish_tasks(tasks, [o.append for o in outcomes], fired_at)
    async with asyncio.timeout(5):
        while sum(map(len, outcomes)) < len(tasks):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # no second call
    assert outcomes == [[PubAck(STREAM, i + 1, False)] for i in range(6)]
    ours = {
        "Mq-Scheduled-For": "2026-11-24T00:00:00.000Z",
        "Mq-Fired-At": "2026-11-24T00:00:01.000Z",
        "Mq-Attempt": "2",
    }
    assert await side.read(2) == ("contract.t1", b"p1", {"Nats-Msg-Id": "t-1", **ours})
    assert await side.read(1) == (
        "contract.t0",
        b"p0",
        {"X-Kind": "plain", "Nats-Msg-Id": "t-0", **ours},
    )


async def test_tasks_are_delivered_with_their_delivery_headers(side: Side) -> None:
    """`publish_tasks` gives each task the design's delivery headers (the producer's, then
    Nats-Msg-Id = the task id, Mq-Scheduled-For, Mq-Fired-At, Mq-Attempt), with or without
    producer headers, and calls each task's callback exactly once."""
    due = datetime(2026, 11, 24, 0, 0, 0, 123000, tzinfo=UTC)
    fired_at = datetime(2026, 11, 24, 0, 0, 0, 125000, tzinfo=UTC)
    tasks = [claimed(i, headers, due) for i, headers in enumerate([{}, {"X-Trace": "abc"}])]
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


def stamped(subject: str, msg_id: str) -> StampedMessage:
    headers = {"Nats-Msg-Id": msg_id, "Mq-Fired-At": "", "Mq-Schedule": "job"}
    return StampedMessage(subject, b'{"timestamp":"', b'","n":1}', headers)


async def test_a_prepared_message_leaves_as_built_at_its_firing_time(side: Side) -> None:
    """`publish_prepared` sends each prepared message as `publish` of the message at the
    firing time would (payload and `Mq-Fired-At` filled in), a future each, in order; one
    prepared by another broker (an earlier term's) or by none is sent all the same."""
    fired_at = datetime(2026, 11, 24, 6, 0, 0, 7000, tzinfo=UTC)
    other = await side.another()
    ids = [uuid.uuid4().hex for _ in range(3)]
    messages = [
        side.broker.prepare(stamped("contract.p0", ids[0])),
        other.prepare(stamped("contract.p1", ids[1])),
        PreparedMessage(stamped("contract.p2", ids[2])),
    ]
    futures = await side.broker.publish_prepared(messages, fired_at)
    async with asyncio.timeout(5):
        acks = [await f for f in futures]
    assert sorted(a.seq for a in acks) == [1, 2, 3]  # the order they are stored in is free
    assert all(a.stream == STREAM and not a.duplicate for a in acks)
    for i, (ack, msg_id) in enumerate(zip(acks, ids, strict=True)):
        assert await side.read(ack.seq) == (
            f"contract.p{i}",
            b'{"timestamp":"2026-11-24T06:00:00.007Z","n":1}',
            {
                "Nats-Msg-Id": msg_id,
                "Mq-Fired-At": "2026-11-24T06:00:00.007Z",
                "Mq-Schedule": "job",
            },
        )


async def test_a_prepared_message_is_fenced_like_any_other(side: Side) -> None:
    """Out of office, or after `on_office_lost`, a prepared message fails as not sent and
    nothing is stored; back in office it goes out."""
    ready = side.broker.prepare(stamped("contract.p", uuid.uuid4().hex))
    side.office["in"] = False
    side.broker.on_office_lost()
    (fut,) = await side.broker.publish_prepared([ready], datetime.now(UTC))
    with pytest.raises(PublishError, match="not sent") as err:
        async with asyncio.timeout(5):
            await fut
    assert not err.value.in_doubt
    assert await outcome_of(side, "contract.a", b"x", uuid.uuid4().hex) != PubAck(STREAM, 1, False)
    side.office["in"] = True
    (fut,) = await side.broker.publish_prepared([ready], datetime.now(UTC))
    async with asyncio.timeout(5):
        assert await fut == PubAck(STREAM, 1, False)


async def test_an_ack_acknowledges_the_delivery(side: Side) -> None:
    """`ack` acknowledges JetStream deliveries by their reply subjects."""
    reply = await side.deliver()
    await side.broker.ack([reply])
    assert await side.acked(reply)


async def test_acks_are_waited_for_the_brokers_timeout(side: Side) -> None:
    """`timeout` is the seconds an ack is waited for (what the broker was opened with)."""
    assert side.broker.timeout == 2
    assert side.broker.max_payload > 1024


async def test_nothing_is_sent_after_close(side: Side) -> None:
    """A publish answered before `close` keeps its outcome; after it nothing is sent (a
    definite failure) and the broker says so."""
    before = await outcome_of(side, "contract.a", b"x", uuid.uuid4().hex)
    assert before == PubAck(STREAM, 1, False)
    await side.broker.close()
    assert not side.broker.may_send() and side.broker.refusal() is not None
    after = await outcome_of(side, "contract.a", b"y", uuid.uuid4().hex)
    assert isinstance(after, PublishError) and "not sent" in str(after) and not after.in_doubt
    assert await outcome_of(side, "contract.b", b"z", uuid.uuid4().hex) != PubAck(STREAM, 2, False)
