"""The raw publish paths against a real nats-server: byte for byte what nats-py would send."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.errors import OutboundBufferLimitError
from nats.js.api import ConsumerConfig, StreamConfig

from scheduler.bus.wire import Wire


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
        assert info.ack_floor.stream_seq == 50
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
    from scheduler.bus.wire import raw_subscribe

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
    from scheduler.bus.publisher import Publisher, PublishError

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
    from scheduler.bus.wire import message_of, raw_subscribe, status_of

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
