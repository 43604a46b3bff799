"""The engine's `Office`, over the single-instance stand-in and the JetStream KV lease alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from scheduler.engine.office import FixedOffice, Office
from tests.support.cluster import wait_for_capture, wait_for_leader

BUCKET = "contract_leader"


@pytest.fixture
async def office(
    nats_server_url: str | None, database: str | None, replicas: int
) -> AsyncIterator[Office]:
    if nats_server_url is None or database is None:
        yield FixedOffice(7)
        return
    import nats

    from scheduler.bus.nats.connection import ensure_bucket
    from scheduler.clock import SystemClock
    from scheduler.leadership.election import Leadership
    from scheduler.metrics import Metrics
    from scheduler.settings import Settings
    from scheduler.store.postgres.connect import create_pool

    settings = Settings(
        nats_url=nats_server_url, instance_id="contract", lease_ttl=3, leader_bucket=BUCKET
    )
    pool = await create_pool(database, min_size=1, max_size=2)
    nc = await nats.connect(nats_server_url)
    js = nc.jetstream()
    await ensure_bucket(js, BUCKET, settings.lease_ttl, replicas)
    if replicas > 1:
        await wait_for_leader(js, f"KV_{BUCKET}")
        await wait_for_capture(nc, f"$KV.{BUCKET}.probe")
    lead = Leadership(await js.key_value(BUCKET), pool, settings, SystemClock(), Metrics())
    stop = asyncio.Event()
    running = asyncio.create_task(lead.run(stop), name="contract-office")
    try:
        yield lead
    finally:
        stop.set()
        async with asyncio.timeout(5):
            with contextlib.suppress(asyncio.CancelledError):
                await running
        await js.delete_key_value(BUCKET)
        await nc.close()
        await pool.close()


async def test_in_office_the_epoch_is_held_and_acting_allowed(office: Office) -> None:
    """`wait_for_office` gives the term's epoch; while in office `epoch` is that epoch,
    `may_act()` is true and `lost` is not set."""
    async with asyncio.timeout(10):
        epoch = await office.wait_for_office()
    assert isinstance(epoch, int) and epoch > 0
    assert office.epoch == epoch
    assert office.may_act()
    assert not office.lost.is_set()
    async with asyncio.timeout(1):
        assert await office.wait_for_office() == epoch  # at once while held


async def test_depose_ends_the_term_at_once(office: Office) -> None:
    """After `depose` (a fenced write showed a newer leader), `may_act()` is false, `epoch`
    is None and `lost` is set, all at once; deposing again does no harm."""
    async with asyncio.timeout(10):
        await office.wait_for_office()
    office.depose()
    assert not office.may_act()
    assert office.epoch is None
    assert office.lost.is_set()
    office.depose()
    assert not office.may_act() and office.lost.is_set()


async def test_a_fenced_write_of_an_earlier_term_leaves_the_current_one(office: Office) -> None:
    """A term that ended and is still winding down gets a write fenced by the term this
    instance holds now: `depose(that epoch)` leaves the current term in office."""
    async with asyncio.timeout(10):
        epoch = await office.wait_for_office()
    office.depose(epoch - 1)
    assert office.may_act() and office.epoch == epoch and not office.lost.is_set()
    office.depose(epoch)
    assert not office.may_act() and office.lost.is_set()
