"""Lane deliveries lost on the way (handed to an inbox whose node froze or died) are read back
from the stream at once, not after the consumer's ack wait (scheduler/bus/nats/puller.py)."""

from __future__ import annotations

import asyncio
import time

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from scheduler.bus.nats.puller import Puller
from scheduler.bus.nats.wire import RecoveredMsg

STREAM, CONSUMER = "LANEREC", "lanerec"
ACK_WAIT = 30.0  # s: far longer than the test, so only a read-back can bring the lost ones


async def _lane(nc: Client) -> JetStreamContext:
    """A work-queue lane with its durable consumer, as the daemon provisions them."""
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name=STREAM, subjects=["lanerec.>"], retention=RetentionPolicy.WORK_QUEUE)
    )
    await js.add_consumer(
        STREAM,
        ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT),
    )
    return js


async def test_a_new_puller_reads_back_what_the_last_one_was_handed_and_never_acked(
    nats_url: str,
) -> None:
    """A puller that took five messages and vanished (a leader on a frozen node) left them
    pending for the ack wait; the next puller reads them back from the stream when it starts,
    with the stream's sequence and store time, and gets the rest as usual: all ten at once."""
    nc = await nats.connect(nats_url)
    try:
        js = await _lane(nc)
        for i in range(10):
            await js.publish(f"lanerec.t{i}", f"task {i}".encode())
        gone = await js.pull_subscribe_bind(CONSUMER, STREAM)
        lost = await gone.fetch(5, timeout=5)  # handed over, never acked
        seen = {m.metadata.sequence.stream: m.metadata.timestamp for m in lost}
        await gone.unsubscribe()

        started = time.monotonic()
        puller = await Puller(nc, STREAM, CONSUMER, batch=100).start()
        got: list[Msg] = []
        async with asyncio.timeout(10):
            while len(got) < 10:
                got += await puller.take(timeout=1, linger=0)
        took = time.monotonic() - started
        await puller.close()
    finally:
        await nc.close()
    back = [m for m in got if isinstance(m, RecoveredMsg)]
    assert sorted(m.data for m in got) == sorted(f"task {i}".encode() for i in range(10))
    assert {m.metadata.sequence.stream: m.metadata.timestamp for m in back} == seen
    assert all(m.reply == "" for m in back) and puller.recovered == 5
    assert took < ACK_WAIT / 3, f"the lost five came after {took:.1f} s"


async def test_nothing_is_read_back_when_nothing_was_lost(nats_url: str) -> None:
    """A clean start (every earlier delivery acked) reads nothing back."""
    nc = await nats.connect(nats_url)
    try:
        js = await _lane(nc)
        for i in range(3):
            await js.publish(f"lanerec.t{i}", b"x")
        first = await js.pull_subscribe_bind(CONSUMER, STREAM)
        for msg in await first.fetch(3, timeout=5):
            await msg.ack_sync()
        await first.unsubscribe()
        puller = await Puller(nc, STREAM, CONSUMER, batch=100).start()
        assert await puller.take(timeout=0.3, linger=0) == []
        await puller.close()
    finally:
        await nc.close()
    assert puller.recovered == 0


async def test_a_closing_puller_hands_back_what_the_server_sent_before_its_unsubscribe(
    nats_url: str,
) -> None:
    """Two pullers share the lane's consumer (every engine's intake under P > 1) while tasks
    flow; one closes (its engine left on SIGTERM). What the server handed its requests before
    it took the unsubscribe arrives after `close()` began: nak'ed, it goes to the other puller
    at once, not after the ack wait (tasks 8 s late in bench/partitions.py's rolling restart,
    which the shared puller does not read back). Each of several rounds closes mid-flow."""
    nc = await nats.connect(nats_url)
    total = 0
    try:
        js = await _lane(nc)
        stay = await Puller(nc, STREAM, CONSUMER, batch=100, shared=True).start()
        for round_ in range(5):
            leave = await Puller(nc, STREAM, CONSUMER, batch=100, shared=True).start()
            sent = [f"r{round_}t{i}".encode() for i in range(400)]
            total += len(sent)
            publishing = asyncio.gather(
                *(js.publish(f"lanerec.r{round_}.{i}", body) for i, body in enumerate(sent))
            )
            took = await leave.take(timeout=5, linger=0)  # the flow has begun
            for msg in took:
                await msg.ack()
            await leave.close()
            closed = time.monotonic()
            await publishing
            got = {m.data for m in took}
            async with asyncio.timeout(ACK_WAIT / 3):
                while not set(sent) <= got:
                    for msg in await stay.take(timeout=1, linger=0):
                        got.add(msg.data)
                        await msg.ack()
            assert time.monotonic() - closed < ACK_WAIT / 6, f"round {round_}"
        await stay.close()
    finally:
        await nc.close()
    assert total == 2000
