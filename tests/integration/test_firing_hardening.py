"""The firing engine under duress, on real PostgreSQL and nats-server: re-armed duplicates,
acks that never come, a full armed set."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import nats
import pytest

from scheduler.settings import Settings
from scheduler.store.tasks import to_ms
from tests.faults.proxy import FaultProxy
from tests.integration.engine_parts import (
    STREAM,
    Parts,
    early,
    ids_of,
    make_parts,
    run_for,
    soon,
)


@pytest.fixture
async def parts(settings: Settings) -> AsyncIterator[Parts]:
    async for p in make_parts(settings):
        yield p


async def test_rearmed_claims_go_out_once_and_never_early(parts: Parts) -> None:
    """Claimed tasks armed again by a reclaim (same rows) and by a second claim (the first
    one's reply lost, so a higher attempt) among later ones: all arrive once, none early."""
    dues = [soon(600 + (i * 7) % 300) for i in range(300)]
    rows = await parts.insert(dues)
    due = {t.id: t.due_at for t in rows}
    ids = [t.id for t in rows]
    firing = parts.firing()
    firing.arm(await parts.tasks.claim(parts.epoch, ids, soon(5000)))
    firing.arm((await parts.tasks.reclaim_orphans(parts.epoch, timedelta(0))).ready)
    await parts.pool.execute(
        "UPDATE delayed_messages SET status = 'pending' WHERE id = ANY($1)", ids[::5]
    )
    firing.arm(await parts.tasks.claim(parts.epoch, ids[::5], soon(5000)))
    await run_for(firing, parts.epoch, parts.until_stored(len(rows)))
    msgs = await parts.stored(count=len(rows))
    assert ids_of(msgs) == dict.fromkeys(ids, 1)
    assert early(msgs, due) == []


@pytest.fixture
async def proxied(settings: Settings, nats_url: str) -> AsyncIterator[tuple[Parts, FaultProxy]]:
    """Parts whose publishes go through a fault proxy; acks time out after one second."""
    port = int(nats_url.rsplit(":", 1)[1])
    proxy = await FaultProxy("127.0.0.1", port).start()
    try:
        s = settings.with_overrides(nats_url=proxy.url, backoff=timedelta(milliseconds=300))
        async for p in make_parts(s, publish_timeout=1.0):
            p.heap.loaded([], to_ms(soon(3_600_000)))  # as if loaded: retries go on the heap
            yield p, proxy
    finally:
        await proxy.close()


async def test_an_unacknowledged_delivery_is_in_doubt_not_pending(
    proxied: tuple[Parts, FaultProxy], nats_url: str
) -> None:
    """Two deliveries reach the stream but their acks are lost (the link goes silent right
    after they pass): both tasks are in doubt, so a cancel answers `in_flight` (never
    `cancelled`: they are stored) and a reschedule answers `in_flight` (never moved, so never
    delivered twice). Once the link heals they are republished with the same ids, the stream
    drops the repeats, and both end `fired`, once each in the stream."""
    parts, proxy = proxied

    def cut_after_delivery(connection: int, data: bytes) -> None:
        if b"HPUB mq.eng." in data:
            proxy.blackhole()  # this chunk still goes through; the acks will not come back
            proxy.tap = None

    proxy.tap = cut_after_delivery
    keep, move = await parts.insert([soon(300), soon(300)], heap=True)
    firing = parts.firing()

    async def answers() -> tuple[str, str]:
        await parts.wait_status(keep.id, "claimed")
        await parts.wait_status(keep.id, "pending", "in_doubt")  # the ack timed out: booked
        await parts.wait_status(move.id, "pending", "in_doubt")
        cancelled = await parts.tasks.cancel(keep.id, keep.target)
        moved, _ = await parts.tasks.reschedule(move.id, move.target, soon(200))
        proxy.heal()
        await parts.wait_status(keep.id, "fired", "cancelled")
        await parts.wait_status(move.id, "fired")
        return cancelled, moved

    stop = asyncio.Event()
    runner = asyncio.create_task(firing.run(parts.epoch, stop))
    try:
        async with asyncio.timeout(20):
            cancelled, moved = await answers()
    finally:
        stop.set()
        firing.wake.set()
        await asyncio.wait_for(runner, 10)
    assert (cancelled, moved) == ("in_flight", "in_flight")
    msgs = await _read(nats_url)
    assert ids_of(msgs) == {keep.id: 1, move.id: 1}
    assert parts.metrics.publish_in_doubt._value.get() >= 2


async def _read(nats_url: str) -> list[Any]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        count = (await js.stream_info(STREAM)).state.messages
        psub = await js.pull_subscribe(">", stream=STREAM)
        try:
            return list(await psub.fetch(count, timeout=2)) if count else []
        finally:
            await psub.unsubscribe()
    finally:
        await nc.close()
