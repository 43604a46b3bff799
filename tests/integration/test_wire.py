"""The raw publish paths against a real nats-server: byte for byte what nats-py would send."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import nats
import nats.aio.msg
import pytest
from nats.errors import OutboundBufferLimitError
from nats.js.api import ConsumerConfig, StreamConfig

from scheduler.bus.nats.wire import Wire


async def test_wire_publish_arrives_exactly_as_client_publish(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        got: list[nats.aio.msg.Msg] = []

        async def collect(msg: nats.aio.msg.Msg) -> None:
            got.append(msg)

        await nc.subscribe("wire.test", cb=collect)
        wire = Wire(nc)
        assert wire.raw
        headers = {
            "Nats-Msg-Id": "t_1",
            "Mq-Scheduled-For": "2026-11-23T06:00:00.000Z",
            "X-Value": "ü",
        }
        payload = b'{"schema":"hanzo.mq.v1","data":"\\r\\n \xc3\xa9"}'
        await wire.publish("wire.test", payload, "reply.to", headers)
        await nc.publish("wire.test", payload, reply="reply.to", headers=headers)
        # A value with a line break cannot be framed raw: it falls back to nats-py (which
        # rewrites the break), so both again arrive alike.
        odd = {"Mq-Error": "line one\nline two"}
        await wire.publish("wire.test", b"", "", odd)
        await nc.publish("wire.test", b"", headers=odd)
        await nc.flush()
        async with asyncio.timeout(5):
            while len(got) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        raw, lib, raw_odd, lib_odd = got
        assert (raw.data, raw.reply, raw.headers) == (lib.data, lib.reply, lib.headers)
        assert raw.headers == headers
        assert (raw_odd.data, raw_odd.headers) == (lib_odd.data, lib_odd.headers)
        with pytest.raises(nats.errors.BadHeaderError):  # nats-py's own refusal, unchanged
            await wire.publish("wire.test", b"", "", {"X-É": "1"})
    finally:
        await nc.close()


async def test_empty_to_acks_jetstream_deliveries(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="WIRE", subjects=["wire.js.>"]))
        for i in range(50):
            await js.publish(f"wire.js.{i}", b"x")
        sub = await js.pull_subscribe("wire.js.>", "w", config=ConsumerConfig(ack_wait=30))
        msgs = await sub.fetch(50, timeout=5)
        assert len(msgs) == 50
        await Wire(nc).empty_to(m.reply for m in msgs)
        async with asyncio.timeout(5):
            while (info := await sub.consumer_info()).num_ack_pending:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert info.ack_floor is not None and info.ack_floor.stream_seq == 50
    finally:
        await nc.close()


async def test_wire_refuses_while_disconnected(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    wire = Wire(nc)
    await nc.close()
    with pytest.raises(OutboundBufferLimitError):
        await wire.publish("wire.test", b"x", "", {"A": "b"})


async def test_raw_subscribe_hands_over_subject_payload_and_headers(nats_url: str) -> None:
    """Raw deliveries skip nats-py's Msg; other subscriptions on the client are unaffected."""
    from scheduler.bus.nats.wire import raw_subscribe

    nc = await nats.connect(nats_url)
    try:
        raw: list[tuple[bytes, bytes, bytes | None]] = []
        normal: list[nats.aio.msg.Msg] = []

        async def collect(msg: nats.aio.msg.Msg) -> None:
            normal.append(msg)

        sub = await raw_subscribe(nc, "raw.>", lambda s, r, d, h: raw.append((s, d, h)))
        await nc.subscribe("plain.x", cb=collect)
        await nc.publish("raw.a", b"one")
        await nc.publish("raw.b", b"two", headers={"K": "v"})
        await nc.publish("plain.x", b"three")
        await nc.flush()
        async with asyncio.timeout(5):
            while len(raw) < 2 or not normal:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert raw[0] == (b"raw.a", b"one", None)
        assert raw[1][:2] == (b"raw.b", b"two") and b"K: v\r\n" in (raw[1][2] or b"")
        assert normal[0].data == b"three"
        await sub.unsubscribe()
        await nc.publish("raw.c", b"gone")
        await nc.flush()
        await asyncio.sleep(0.1)
        assert len(raw) == 2
    finally:
        await nc.close()


async def test_publisher_reports_a_subject_no_stream_captures(nats_url: str) -> None:
    from scheduler.bus.nats.publisher import Publisher
    from scheduler.records import PublishError

    nc = await nats.connect(nats_url)
    try:
        publisher = await Publisher(nc, timeout=2).start()
        try:
            with pytest.raises(PublishError, match=r"no stream captures wire\.none"):
                await (await publisher.publish("wire.none", b"x", {"Nats-Msg-Id": "1"}))
        finally:
            await publisher.close()
    finally:
        await nc.close()


async def test_message_of_parses_headers_as_nats_py_does(nats_url: str) -> None:
    from scheduler.bus.nats.wire import message_of, raw_subscribe, status_of

    nc = await nats.connect(nats_url)
    try:
        raw: list[nats.aio.msg.Msg] = []
        normal: list[nats.aio.msg.Msg] = []

        async def collect(msg: nats.aio.msg.Msg) -> None:
            normal.append(msg)

        def on_raw(s: bytes, r: bytes, d: bytes, h: bytes | None) -> None:
            assert status_of(h) is None
            raw.append(message_of(nc, s, r, d, h))

        await raw_subscribe(nc, "both.x", on_raw)
        await nc.subscribe("both.x", cb=collect)
        headers = {"Nats-Msg-Id": "a", "Trace": "x y", "Mq-Priority": "3"}
        await nc.publish("both.x", b"body", reply="r.1", headers=headers)
        await nc.publish("both.x", b"bare")
        await nc.flush()
        async with asyncio.timeout(5):
            while len(raw) < 2 or len(normal) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        for a, b in zip(raw, normal, strict=True):
            assert (a.subject, a.reply, a.data, a.headers) == (
                b.subject,
                b.reply,
                b.data,
                b.headers,
            )
        assert status_of(b"NATS/1.0 408 Request Timeout\r\n\r\n") == "408"
    finally:
        await nc.close()


async def test_publish_batch_delivers_every_item_once_with_its_outcome(nats_url: str) -> None:
    """More items than the in-flight limit, header blocks and header dicts mixed, a subject no
    stream captures and a repeated message id: every callback is called once with the right
    outcome, and the stream holds exactly the messages, in order, with their headers."""
    from scheduler.bus.nats.frames import DELIVERY_BLOCK as _BLOCK
    from scheduler.bus.nats.publisher import Publisher
    from scheduler.records import PubAck, PublishError

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="BATCH", subjects=["wire.batch.>"]))
        publisher = await Publisher(nc, timeout=5, max_inflight=16).start()
        outcomes: dict[int, list[PubAck | PublishError]] = {}
        items = []
        for i in range(100):
            subject = "wire.none" if i == 50 else f"wire.batch.{i % 3}"
            headers: dict[str, str] | bytes
            if i % 2:
                headers = _BLOCK % (f"id-{i}".encode(), b"2026-11-24T00:00:00.000Z", b"f", 1)
            else:
                headers = {"Nats-Msg-Id": f"id-{i}", "X-Odd": "ü" if i == 10 else "plain"}
            items.append(
                (subject, f"payload {i}".encode(), headers, outcomes.setdefault(i, []).append)
            )
        # the same id again: the duplicate window drops it and the ack says so
        items.append(
            ("wire.batch.0", b"again", {"Nats-Msg-Id": "id-0"}, outcomes.setdefault(100, []).append)
        )
        try:
            await publisher.publish_batch(items)
            async with asyncio.timeout(10):
                while sum(map(len, outcomes.values())) < len(items):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # no second call for anyone
        finally:
            await publisher.close()
        assert all(len(got) == 1 for got in outcomes.values())
        failed = {i for i, (o,) in outcomes.items() if isinstance(o, PublishError)}
        assert failed == {50}
        assert "no stream captures wire.none" in str(outcomes[50][0])
        acks = [outcomes[i][0] for i in range(100) if i != 50]
        assert [a.seq for a in acks] == list(range(1, 100))  # type: ignore[union-attr]
        assert not any(a.duplicate for a in acks)  # type: ignore[union-attr]
        again = outcomes[100][0]
        assert isinstance(again, PubAck) and again.duplicate and again.seq == 1
        sub = await js.pull_subscribe("wire.batch.>", "check", stream="BATCH")
        msgs = await sub.fetch(200, timeout=2)
        assert len(msgs) == 99
        for m, i in zip(msgs, [i for i in range(100) if i != 50], strict=True):
            assert m.data == f"payload {i}".encode()
            assert m.headers is not None and m.headers["Nats-Msg-Id"] == f"id-{i}"
            if i % 2:
                assert m.headers["Mq-Attempt"] == "1"
            else:
                assert m.headers["X-Odd"] == ("ü" if i == 10 else "plain")
    finally:
        await nc.close()


async def test_no_publish_path_sends_a_frame_over_max_payload(nats_url: str) -> None:
    """A message whose headers and payload together pass max_payload is refused on every
    publish path as a permanent `too_large` PublishError, never sent: the server would refuse
    it and nats-py would close the connection for good (it counts the payload alone)."""
    from scheduler.bus.nats.publisher import Publisher
    from scheduler.messages.prepared import StampedMessage
    from scheduler.records import PubAck, PublishError

    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name="BIG", subjects=["wire.big.>"]))
        publisher = await Publisher(nc, timeout=5).start()
        body = b"x" * (nc.max_payload - 100)  # fits alone, not with the headers below
        big = {"Nats-Msg-Id": "big", "X-Pad": "y" * 200}
        outcomes: list[PubAck | PublishError] = []
        try:
            with pytest.raises(PublishError) as err:
                await (await publisher.publish("wire.big.a", body, big))
            assert err.value.permanent and err.value.reason == "too_large"
            block = b"NATS/1.0\r\nNats-Msg-Id: b\r\nX-Pad: " + b"y" * 200 + b"\r\n\r\n"
            await publisher.publish_batch(
                [
                    ("wire.big.b", body, big, outcomes.append),
                    ("wire.big.c", body, block, outcomes.append),
                    ("wire.big.d", b"small", {"Nats-Msg-Id": "d"}, outcomes.append),
                ]
            )
            ahead = publisher.prepare(StampedMessage("wire.big.e", body[:100], body[124:], big))
            (fut,) = await publisher.publish_prepared([ahead], datetime.now(UTC))
            with pytest.raises(PublishError, match="cannot fit"):
                await fut
            async with asyncio.timeout(5):
                while len(outcomes) < 3:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        finally:
            await publisher.close()
        too_large = [o for o in outcomes if isinstance(o, PublishError)]
        assert [o.reason for o in too_large] == ["too_large", "too_large"]
        assert sum(isinstance(o, PubAck) for o in outcomes) == 1
        await nc.flush()
        assert nc.is_connected and not nc.is_closed
    finally:
        await nc.close()


async def test_frames_are_written_to_the_socket_in_the_same_step_not_left_for_the_flusher(
    nats_url: str,
) -> None:
    """What the wire hands over is written to the socket before the call returns, together
    with what the client queued before it, never left in the client's buffer for its flusher
    task: a process frozen right after (SIGSTOP, a starved host) would find it there on waking
    and the flusher, ready before any timer, would send it before the lease check could see
    that office ended."""
    nc = await nats.connect(nats_url)
    try:
        got: list[nats.aio.msg.Msg] = []

        async def collect(msg: nats.aio.msg.Msg) -> None:
            got.append(msg)

        await nc.subscribe("wire.step.>", cb=collect)
        await nc.flush()
        wire = Wire(nc)
        await nc.publish("wire.step.first", b"queued by nats-py")  # in its buffer until flushed
        frame = wire.frame("wire.step.second", b"ours", "", {"Nats-Msg-Id": "s1"})
        assert frame is not None
        await wire.send_frames([frame], 4)
        assert nc._pending == [] and nc._pending_data_size == 0
        await nc.flush()
        async with asyncio.timeout(5):
            while len(got) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert [m.subject for m in got] == ["wire.step.first", "wire.step.second"]
    finally:
        await nc.close()
