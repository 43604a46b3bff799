"""Leadership against a real nats-server KV bucket and the PostgreSQL epoch (lease TTL 3 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import nats
import pytest
from nats.aio.client import Client

from scheduler.bus.nats.connection import ensure_bucket
from scheduler.clock import SystemClock
from scheduler.errors import FencedError
from scheduler.leadership.election import Leadership
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.postgres.connect import create_pool
from scheduler.store.postgres.epoch import fenced, take_office
from tests.support.helpers import connection_of, holding_fenced_write


class Cluster:
    """Instances of `Leadership`, each on its own NATS connection, sharing one database."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings, self.pool = settings, pool
        self.stop = asyncio.Event()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.conns: list[Client] = []

    async def start(self, instance: str) -> Leadership:
        nc = await nats.connect(self.settings.nats_servers)
        self.conns.append(nc)
        js = nc.jetstream()
        await ensure_bucket(js, self.settings.leader_bucket, self.settings.lease_ttl)
        kv = await js.key_value(self.settings.leader_bucket)
        settings = self.settings.with_overrides(instance_id=instance)
        lead = Leadership(kv, self.pool, settings, SystemClock(), Metrics())
        self.tasks[instance] = asyncio.create_task(lead.run(self.stop), name=instance)
        return lead

    async def close(self) -> None:
        self.stop.set()
        async with asyncio.timeout(5):
            results = await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for nc in self.conns:
            await nc.close()
        errors = [r for r in results if r is not None and not isinstance(r, asyncio.CancelledError)]
        assert errors == []


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url)
    yield pool
    await pool.close()


@pytest.fixture
async def cluster(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Cluster]:
    cluster = Cluster(settings, pool)
    yield cluster
    await cluster.close()


async def first_leader(*members: Leadership, within: float = 3.0) -> Leadership:
    """The member that takes office first; fails after `within` seconds."""
    waits = {asyncio.ensure_future(m.wait_for_office()): m for m in members}
    try:
        done, _ = await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in waits:
            fut.cancel()
    assert done, f"nobody took office within {within} s"
    return waits[done.pop()]


async def watching(standby: Leadership, leader: Leadership) -> None:
    """Wait until the standby's watcher has seen the leader's lease (so it is subscribed)."""
    async with asyncio.timeout(3):
        while standby.info()["leader"] != leader.instance:  # noqa: ASYNC110 (no event to await)
            await asyncio.sleep(0.01)


async def leadership_row(pool: asyncpg.Pool) -> tuple[int, str]:
    row = await pool.fetchrow("SELECT epoch, instance FROM leadership WHERE id = 1")
    assert row is not None
    return int(row["epoch"]), str(row["instance"])


@pytest.mark.slow
async def test_exactly_one_leader(cluster: Cluster, pool: asyncpg.Pool) -> None:
    """Two instances: one takes office with epoch 1, the other stays standby while it renews."""
    a, b = await cluster.start("a"), await cluster.start("b")
    leader = await first_leader(a, b)
    other = b if leader is a else a
    assert leader.epoch == 1 and await leadership_row(pool) == (1, leader.instance)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(other.wait_for_office(), timeout=cluster.settings.lease_ttl + 1)
    assert leader.may_act() and leader.epoch == 1 and not other.may_act()
    assert isinstance(leader.events, Metrics)
    assert leader.events.registry.get_sample_value("mq_scheduler_lease_renew_seconds_count")


async def test_resign_hands_over_at_once(
    cluster: Cluster, pool: asyncpg.Pool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resigning leader deletes its lease; the watching standby takes office well under 1 s."""
    a = await cluster.start("a")
    async with asyncio.timeout(3):
        assert await a.wait_for_office() == 1
    b = await cluster.start("b")
    await watching(b, a)
    started = time.monotonic()
    await a.resign()
    assert not a.may_act() and a.lost.is_set()
    async with asyncio.timeout(1):
        assert await b.wait_for_office() == 2
    took = time.monotonic() - started
    assert took < 1.0 and await leadership_row(pool) == (2, "b")
    with capsys.disabled():
        print(f"\n  resign takeover: {took * 1000:.0f} ms")


@pytest.mark.slow
async def test_crashed_leader_replaced_after_ttl(
    cluster: Cluster, pool: asyncpg.Pool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A leader that stops without resigning is replaced once its lease expires, epoch + 1."""
    a = await cluster.start("a")
    async with asyncio.timeout(3):
        assert await a.wait_for_office() == 1
    b = await cluster.start("b")
    await watching(b, a)
    started = time.monotonic()
    cluster.tasks["a"].cancel()
    async with asyncio.timeout(cluster.settings.lease_ttl + 1.5):
        assert await b.wait_for_office() == 2
    took = time.monotonic() - started
    assert not a.may_act() and await leadership_row(pool) == (2, "b")
    assert took > 1.0  # it waited for the lease to expire: nobody deleted it
    with capsys.disabled():
        print(f"\n  crash takeover: {took:.2f} s")


async def test_a_fenced_write_fails_under_an_older_epoch(pool: asyncpg.Pool) -> None:
    """After a new leader takes office, a statement fenced by the old epoch raises FencedError
    and writes nothing; the new epoch's goes through."""
    old = await take_office(pool, "a")
    async with pool.acquire() as proxy:
        conn = connection_of(proxy)
        await fenced(conn, old, TOUCH, "a")
        assert await take_office(pool, "b") == old + 1
        with pytest.raises(FencedError) as caught:
            await fenced(conn, old, TOUCH, "a")
        assert caught.value.epoch == old
        assert await leadership_row(pool) == (old + 1, "b")  # the old epoch wrote nothing
        await fenced(conn, old + 1, TOUCH, "b")


async def test_take_office_never_reissues_an_epoch_seen_in_use(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """With the epoch row behind an epoch seen in use (a restored backup), take_office goes
    above that epoch, says so in a warning, and the old holder's writes stay fenced."""
    for _ in range(5):
        held = await take_office(pool, "before the restore")
    await pool.execute("UPDATE leadership SET epoch = 2")  # what an older backup holds
    await pool.execute("UPDATE partitioning SET term_hwm = 2")  # (and its numbers issued)
    assert await take_office(pool, "after", floor=held) == held + 1
    assert "leader.epoch_behind" in caplog.text and f"database_epoch=2 seen={held}" in caplog.text
    async with pool.acquire() as proxy:
        conn = connection_of(proxy)
        with pytest.raises(FencedError):
            await fenced(conn, held, TOUCH, "stale")
    caplog.clear()
    assert await take_office(pool, "next", floor=held + 1) == held + 2
    assert "epoch_behind" not in caplog.text  # the row was not behind: nothing to say


# A write fenced by the epoch: the leadership row's instance set again (`$2`)
TOUCH = "w AS (UPDATE leadership l SET instance = $2 FROM lead WHERE l.id = 1 RETURNING 1)"


async def test_fenced_transaction_blocks_take_office(pool: asyncpg.Pool) -> None:
    """take_office waits for a transaction holding the epoch FOR SHARE, so it cannot commit late."""
    old = await take_office(pool, "a")
    async with holding_fenced_write(pool, old) as conn:
        taking = asyncio.create_task(take_office(pool, "b"))
        await blocked_on_lock(pool)
        assert not taking.done()
        await conn.execute("UPDATE leadership SET since = since WHERE id = 1 AND epoch = $1", old)
    async with asyncio.timeout(3):
        assert await taking == old + 1


async def blocked_on_lock(pool: asyncpg.Pool) -> None:
    """Wait until some backend's take_office waits for a row lock."""
    async with asyncio.timeout(3):
        while not await pool.fetchval(  # noqa: ASYNC110 (PostgreSQL has no event to await)
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'WITH counted AS (SELECT 1 FROM partitioning%'"
        ):
            await asyncio.sleep(0.02)
