"""Epochs per partition in PostgreSQL (migration 0023, `partition_offices`): taking office over
a set of partitions and the fence of every write by its rows' partitions
(docs/decisions/2026-12-06-partition-ownership.md, step 1)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.partitions import partition_of
from scheduler.records import Advance, CronFailure, NewTask
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.epoch import fenced, take_office
from scheduler.store.postgres.tasks import TaskStore
from tests.support.helpers import connection_of, holding_fenced_write, waiting_on_locks
from tests.support.partitioned import MARK, partitioned_pool_fixture
from tests.support.stores import claim, insert

P = 4
ALL = range(P)


pool = partitioned_pool_fixture(P)


async def offices(pool: asyncpg.Pool) -> dict[int, tuple[int, str | None]]:
    rows = await pool.fetch("SELECT partition, epoch, instance FROM partition_offices")
    return {r["partition"]: (r["epoch"], r["instance"]) for r in rows}


def keys_in(partition: int, prefix: str, n: int = 1) -> list[str]:
    """`n` keys (task ids, job names) that fall in `partition` of P."""
    found = (f"{prefix}{i}" for i in itertools.count())
    return list(itertools.islice((k for k in found if partition_of(k, P) == partition), n))


async def test_a_former_owner_is_fenced_only_on_the_partitions_taken_from_it(
    pool: asyncpg.Pool,
) -> None:
    """After a new owner takes office over partition 1, the former owner of all four partitions
    is fenced on partition 1 (nothing written there, nor in a write that also names partition
    0) while its writes to partitions 0, 2 and 3 go through."""
    old = await take_office(pool, "a", partitions=ALL)
    assert await take_office(pool, "b", partitions=[1]) == old + 1
    async with pool.acquire() as proxy:
        conn = connection_of(proxy)
        with pytest.raises(FencedError) as caught:
            await fenced(conn, old, MARK, "a wrote", partitions=[1])
        assert caught.value.epoch == old
        with pytest.raises(FencedError):
            await fenced(conn, old, MARK, "a wrote", partitions=[0, 1])
        assert all(instance != "a wrote" for _, instance in (await offices(pool)).values())
        await fenced(conn, old, MARK, "a wrote", partitions=[0, 2, 3])
        await fenced(conn, old + 1, MARK, "b wrote", partitions=[1])
    assert await offices(pool) == {
        0: (old, "a wrote"),
        1: (old + 1, "b wrote"),
        2: (old, "a wrote"),
        3: (old, "a wrote"),
    }


async def test_take_office_raises_each_partition_above_every_number_issued_and_the_floor(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """take_office gives every partition it takes one epoch above the highest of theirs, every
    number issued before (over any partition) and the floor (saying so when the floor is
    higher, a restored backup), and leaves the others."""
    await pool.executemany(
        "UPDATE partition_offices SET epoch = $2 WHERE partition = $1",
        [(0, 5), (1, 9), (2, 2), (3, 4)],
    )
    assert await take_office(pool, "a", partitions=[0, 2]) == 6
    assert "epoch_behind" not in caplog.text
    assert {p: e for p, (e, _) in (await offices(pool)).items()} == {0: 6, 1: 9, 2: 6, 3: 4}
    assert await take_office(pool, "b", floor=20, partitions=[3, 1]) == 21
    assert "leader.epoch_behind" in caplog.text and "database_epoch=9 seen=20" in caplog.text
    assert await take_office(pool, "c", floor=3, partitions=[2]) == 22  # above 21, issued
    assert await offices(pool) == {0: (6, "a"), 1: (21, "b"), 2: (22, "c"), 3: (21, "b")}


async def test_take_office_waits_only_for_writes_to_the_partitions_it_takes(
    pool: asyncpg.Pool,
) -> None:
    """A transaction holding a fenced write to partition 1 makes take_office over partition 1
    wait until it ends, and no other partition's take_office."""
    old = await take_office(pool, "a", partitions=ALL)
    async with holding_fenced_write(pool, old, partitions=[1]):
        async with asyncio.timeout(3):
            assert await take_office(pool, "b", partitions=[0, 2]) == old + 1
        taking = asyncio.create_task(take_office(pool, "c", partitions=[1, 3]))
        await waiting_on_locks(pool, 1)  # it waits on partition 1's row, not a guess of time
        assert not taking.done()
    async with asyncio.timeout(3):
        assert await taking == old + 2  # the next number issued
    assert {p: e for p, (e, _) in (await offices(pool)).items()} == {
        0: old + 1,
        1: old + 2,
        2: old + 1,
        3: old + 2,
    }


async def test_overlapping_takes_never_share_an_epoch_of_a_partition(pool: asyncpg.Pool) -> None:
    """Two take_office calls queued on partition 1 (one over {1}, one over {0, 1}) get different
    epochs: the second one raises partition 1 above the epoch the first one gave it, not above
    the epoch it read before it waited."""
    old = await take_office(pool, "a", partitions=ALL)
    async with holding_fenced_write(pool, old, partitions=[1]):
        first = asyncio.create_task(take_office(pool, "b", partitions=[1]))
        await waiting_on_locks(pool, 1)
        second = asyncio.create_task(take_office(pool, "c", partitions=[0, 1]))
        await waiting_on_locks(pool, 2)
    async with asyncio.timeout(3):
        b, c = await first, await second
    assert (b, c) == (old + 1, old + 2)
    assert await offices(pool) == {
        0: (old + 2, "c"),
        1: (old + 2, "c"),
        2: (old, "a"),
        3: (old, "a"),
    }


def task(task_id: str, due: datetime) -> NewTask:
    return NewTask(task_id, "mq.tasks.x", b"{}", {}, 5, due, due, None)


async def test_claims_and_outcomes_are_fenced_by_each_task_s_partition(
    pool: asyncpg.Pool,
) -> None:
    """With partition 1 taken by a new owner, the former owner can no longer claim or book a
    task of partition 1 (FencedError, the row untouched) but still claims and books one of
    partition 0; the epoch it reads back over its office is no one term's (-1), over partition
    1 alone the newer one."""
    tasks = TaskStore(PostgresStore(pool, Metrics()), partitions=P)
    now = datetime.now(UTC)
    mine, taken = keys_in(0, "t0_")[0], keys_in(1, "t1_")[0]
    await insert(tasks, [task(mine, now), task(taken, now)])
    assert await pool.fetchval("SELECT partition FROM delayed_messages WHERE id = $1", taken) == 1
    old = await take_office(pool, "a", partitions=ALL)
    claimed = await claim(tasks, old, [mine, taken], now + timedelta(seconds=1))
    assert sorted(t.id for t in claimed) == sorted([mine, taken])
    await take_office(pool, "b", partitions=[1])
    # a task of partition 0 by its id whose row is in partition 1 (as a row moved to a new
    # count would be): a write by its id is fenced by partition 0, so it must not touch the row
    moved = keys_in(0, "t_moved_")[0]
    await insert(tasks, [task(moved, now)])
    await pool.execute("UPDATE delayed_messages SET partition = 1 WHERE id = $1", moved)
    assert await claim(tasks, old, [moved], now + timedelta(seconds=1)) == []
    await pool.execute("DELETE FROM delayed_messages WHERE id = $1", moved)
    with pytest.raises(FencedError):
        await tasks.expire(old, [taken])
    with pytest.raises(FencedError):
        await tasks.expire(old, [mine, taken])  # one statement: all its partitions or none
    statuses = "SELECT id, status FROM delayed_messages ORDER BY id"
    assert {r["id"]: r["status"] for r in await pool.fetch(statuses)} == {
        mine: "pending",
        taken: "pending",
    }
    await tasks.expire(old, [mine])
    assert {r["id"]: r["status"] for r in await pool.fetch(statuses)} == {
        mine: "expired",
        taken: "pending",
    }
    assert await tasks.current_epoch() == -1  # not one term's: the revalidation deposes it
    tasks.office = [1]
    assert await tasks.current_epoch() == old + 1


async def test_cron_cursors_and_failures_are_fenced_by_their_job_s_partition(
    pool: asyncpg.Pool,
) -> None:
    """With partition 2 taken by a new owner, the former owner moves no cursor and marks no
    failure of a job in partition 2, and still does both for a job in partition 3."""
    store = ScheduleStore(PostgresStore(pool, Metrics()), partitions=P)
    mine, taken = keys_in(3, "job-a-")[0], keys_in(2, "job-b-")[0]
    await pool.executemany(
        "INSERT INTO schedules (name, definition, fingerprint, partition) "
        "VALUES ($1, '{}', 'f', $2)",
        [(mine, 3), (taken, 2)],
    )
    old = await take_office(pool, "a", partitions=ALL)
    await take_office(pool, "b", partitions=[2])
    at = datetime(2026, 12, 6, 12, tzinfo=UTC)
    with pytest.raises(FencedError):
        await store.advance(old, [Advance(taken, "mq.x", at, at, "S", 1)], "a")
    with pytest.raises(FencedError):
        await store.fail(old, [CronFailure(taken, "f", "too_large", "e", at, at)])
    await store.advance(old, [Advance(mine, "mq.x", at, at, "S", 2)], "a")
    await store.fail(old, [CronFailure(mine, "f", "too_large", "e", at, at)])
    assert await store.cursors() == {mine: at}
    assert await store.failed() == frozenset({mine})
    logged = await pool.fetch("SELECT key, epoch FROM fire_log")
    assert [tuple(r) for r in logged] == [(mine, old)]


async def test_one_office_of_partition_0_is_the_leadership_row(database_url: str) -> None:
    """Under P = 1 the office is partition 0's row, which the `leadership` view shows: taking
    office there is what the leadership row reports."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        assert await pool.fetchval("SELECT count(*) FROM partition_offices") == 1
        epoch = await take_office(pool, f"i-{uuid.uuid4().hex[:6]}")
        row = await pool.fetchrow("SELECT id, epoch FROM leadership")
        assert row is not None and tuple(row) == (1, epoch)
    finally:
        await pool.close()


async def test_a_term_writes_only_in_the_partitions_it_took(pool: asyncpg.Pool) -> None:
    """Two terms over disjoint partitions holding the same epoch number (a previous version's
    take during a rolling upgrade could issue one again: max of the taken + 1); neither can
    claim a task or move a cron cursor in the other's partitions (FencedError, nothing
    written)."""
    assert await take_office(pool, "a", partitions=[0, 1]) == 1
    # the previous version's take over partitions 2 and 3 (no high-water mark, migration 0028)
    await pool.execute("UPDATE partition_offices SET epoch = 1 WHERE partition IN (2, 3)")
    db = PostgresStore(pool, Metrics())
    tasks, schedules = TaskStore(db, partitions=P), ScheduleStore(db, partitions=P)
    tasks.office = schedules.office = [0, 1]
    now = datetime.now(UTC)
    theirs = keys_in(2, "t2_")[0]
    await insert(tasks, [task(theirs, now)])
    with pytest.raises(FencedError):
        await claim(tasks, 1, [theirs], now + timedelta(seconds=1))
    claimed = "SELECT claimed_epoch FROM delayed_messages WHERE id = $1"
    assert await pool.fetchval(claimed, theirs) is None
    job = keys_in(3, "job-c-")[0]
    await pool.execute(
        "INSERT INTO schedules (name, definition, fingerprint, partition) "
        "VALUES ($1, '{}', 'f', 3)",
        job,
    )
    with pytest.raises(FencedError):
        await schedules.advance(1, [Advance(job, "mq.x", now, now, "S", 1)], "a")
    assert await schedules.cursors() == {}
