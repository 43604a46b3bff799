"""Term numbers unique across partitions (migration 0028, `partitioning.term_hwm`) and a
running term's in-place gain of partitions at its own number (`grow_office`): the fence is
equality, so a gain fences every former owner of the gained partitions
(docs/leadership.md, "Term numbers")."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from scheduler.errors import FencedError
from scheduler.store.postgres.epoch import fenced, grow_office, take_office
from tests.support.helpers import connection_of, holding_fenced_write, waiting_on_locks
from tests.support.partitioned import MARK, partitioned_pool_fixture

P = 8

pool = partitioned_pool_fixture(P)


async def epochs(pool: asyncpg.Pool) -> dict[int, int]:
    rows = await pool.fetch("SELECT partition, epoch FROM partition_offices")
    return {r["partition"]: r["epoch"] for r in rows}


async def test_concurrent_takes_over_disjoint_partitions_get_distinct_numbers(
    pool: asyncpg.Pool,
) -> None:
    """Four takes at once over disjoint pairs of partitions, all at epoch 0, get four different
    numbers, each above every number issued before; the mark holds the highest."""
    first = await take_office(pool, "z", partitions=[7])
    for _ in range(5):  # several rounds: the race is a matter of luck each time
        got = await asyncio.gather(
            *(take_office(pool, f"e{i}", partitions=[2 * i, 2 * i + 1]) for i in range(4))
        )
        assert len(set(got)) == 4 and min(got) > first
        assert await pool.fetchval("SELECT term_hwm FROM partitioning") == max(got)
        first = max(got)


async def test_a_number_is_never_issued_again_after_gains_lowered_the_partitions_epochs(
    pool: asyncpg.Pool,
) -> None:
    """A term that gains partitions in place sets them to its own number, below the newer
    term's it takes them from: the highest partition epoch goes down, and the next take is
    still above every number issued (the mark, not the partitions, says what was)."""
    older = await take_office(pool, "a", partitions=[0, 1])
    newer = await take_office(pool, "b", partitions=range(2, P))
    assert await grow_office(pool, "a", older, kept=[0, 1], gained=range(2, P))
    assert max((await epochs(pool)).values()) == older < newer
    assert await take_office(pool, "c", partitions=[5]) == newer + 1


async def test_a_gain_fences_the_former_owner_and_lets_the_gaining_term_write(
    pool: asyncpg.Pool,
) -> None:
    """After term a gains partition 2 in place, its former owner b (its own number, its office
    still holding 2) is fenced there, alone or with its other partition, nothing written; b
    writes on in partition 3, which it keeps; a writes in 2 and in its kept partitions."""
    a = await take_office(pool, "a", partitions=[0, 1])
    b = await take_office(pool, "b", partitions=[2, 3])
    assert await grow_office(pool, "a", a, kept=[0, 1], gained=[2])
    async with pool.acquire() as proxy:
        conn = connection_of(proxy)
        for written in ([2], [2, 3]):
            with pytest.raises(FencedError):
                await fenced(conn, b, MARK, "b wrote", partitions=written, office=[2, 3])
        await fenced(conn, b, MARK, "b wrote", partitions=[3], office=[2, 3])
        await fenced(conn, a, MARK, "a wrote", partitions=[0, 1, 2], office=[0, 1, 2])
    rows = await pool.fetch("SELECT partition, epoch, instance FROM partition_offices")
    seen = {r["partition"]: (r["epoch"], r["instance"]) for r in rows}
    assert [seen[p] for p in range(4)] == [(a, "a wrote")] * 3 + [(b, "b wrote")]


async def test_a_gain_waits_for_the_former_owners_write_in_flight(pool: asyncpg.Pool) -> None:
    """A former owner's fenced write in flight on the gained partition holds the gain back
    until it commits: no older write can land after the gain returns."""
    a = await take_office(pool, "a", partitions=[0])
    b = await take_office(pool, "b", partitions=[1])
    async with holding_fenced_write(pool, b, partitions=[1]):
        growing = asyncio.create_task(grow_office(pool, "a", a, kept=[0], gained=[1]))
        await waiting_on_locks(pool, 1)
        assert not growing.done()
    async with asyncio.timeout(3):
        assert await growing
    assert (await epochs(pool))[1] == a


async def test_a_gain_refuses_when_the_term_no_longer_holds_its_own_partitions(
    pool: asyncpg.Pool,
) -> None:
    """A term one of whose partitions another has taken since cannot grow (False, nothing
    written), nor at a number that another partition holds (a previous version's take
    could issue one again), nor at a number never issued."""
    a = await take_office(pool, "a", partitions=[0, 1])
    b = await take_office(pool, "b", partitions=[1])
    assert not await grow_office(pool, "a", a, kept=[0, 1], gained=[2])
    assert (await epochs(pool))[2] == 0
    await pool.execute("UPDATE partition_offices SET epoch = $1 WHERE partition = 5", b)
    assert not await grow_office(pool, "b", b, kept=[1], gained=[2])
    assert not await grow_office(pool, "c", b + 10, kept=[], gained=[2])
    assert (await epochs(pool))[2] == 0
    await pool.execute("UPDATE partition_offices SET epoch = 0 WHERE partition = 5")
    assert await grow_office(pool, "b", b, kept=[1], gained=[2])
    assert (await epochs(pool))[2] == b
