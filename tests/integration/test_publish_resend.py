"""The publisher resends a publish answered 503 while its stream has no leader (an election):
the same frame, fenced, within the publish's deadline; a subject no stream ever took still
fails at once."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.js.api import StreamConfig

from scheduler.bus.nats.publisher import Publisher
from scheduler.bus.nats.resend import MAX_PAUSE
from scheduler.records import PublishError

STREAM = StreamConfig(name="RESEND", subjects=["resend.>"], duplicate_window=120)


async def test_a_publish_during_an_election_goes_out_once_the_stream_answers(
    nats_url: str,
) -> None:
    """A stream that took a subject vanishes (as during its election: 503 no responders) and
    comes back 0.6 s later: the publish sent meanwhile is stored once, within MAX_PAUSE of the
    stream's return, under its own Nats-Msg-Id."""
    nc = await nats.connect(nats_url)
    publisher = await Publisher(nc, timeout=5.0).start()
    try:
        js = nc.jetstream()
        await js.add_stream(STREAM)
        await (await publisher.publish("resend.x", b"first", {"Nats-Msg-Id": "a"}))
        await js.delete_stream("RESEND")
        pending = await publisher.publish("resend.x", b"second", {"Nats-Msg-Id": "b"})
        await asyncio.sleep(0.6)
        assert not pending.done()
        await js.add_stream(STREAM)
        back = time.monotonic()
        async with asyncio.timeout(2):
            ack = await pending
        assert time.monotonic() - back <= MAX_PAUSE + 0.2
        assert ack.stream == "RESEND" and not ack.duplicate
        msg = await js.get_last_msg("RESEND", "resend.x")
        assert msg.data == b"second" and (msg.headers or {}).get("Nats-Msg-Id") == "b"
        assert (await js.stream_info("RESEND")).state.messages == 1
    finally:
        await publisher.close()
        await nc.close()


async def test_a_subject_no_stream_ever_took_fails_at_once(nats_url: str) -> None:
    """No stream has acknowledged the subject: the 503 means nothing captures it, and the
    publish fails at once (to be retried, then dead-lettered, by the engine)."""
    nc = await nats.connect(nats_url)
    publisher = await Publisher(nc, timeout=5.0).start()
    try:
        started = time.monotonic()
        with pytest.raises(PublishError, match=r"no stream captures resend\.never"):
            await (await publisher.publish("resend.never", b"x", {"Nats-Msg-Id": "n"}))
        assert time.monotonic() - started < 0.5
    finally:
        await publisher.close()
        await nc.close()


async def test_a_resend_is_fenced(nats_url: str) -> None:
    """Office ends while a publish waits to be resent: it fails as not sent (a 503 stored
    nothing) and never reaches the stream when it comes back."""
    office = [True]
    nc = await nats.connect(nats_url)
    publisher = await Publisher(nc, timeout=5.0, fence=lambda: office[0]).start()
    try:
        js = nc.jetstream()
        await js.add_stream(STREAM)
        await (await publisher.publish("resend.x", b"first", {"Nats-Msg-Id": "a"}))
        await js.delete_stream("RESEND")
        pending = await publisher.publish("resend.x", b"second", {"Nats-Msg-Id": "b"})
        await asyncio.sleep(0.2)
        office[0] = False
        with pytest.raises(PublishError, match="not sent: this instance is not in office"):
            async with asyncio.timeout(2):
                await pending
        await js.add_stream(STREAM)
        await asyncio.sleep(MAX_PAUSE * 2)
        assert (await js.stream_info("RESEND")).state.messages == 0
    finally:
        await publisher.close()
        await nc.close()
