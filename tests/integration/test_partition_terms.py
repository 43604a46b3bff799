"""A new term whenever an engine's set of partitions changes (the shape step 4 chose:
docs/decisions/2026-12-06-partition-ownership.md): what the fence in PostgreSQL guarantees for
it, on a database of P = 4 partitions."""

from __future__ import annotations

from typing import cast

import asyncpg

from scheduler.errors import FencedError
from scheduler.store.postgres.epoch import fenced, take_office
from tests.support.partitioned import MARK, partitioned_pool_fixture

P = 4


pool = partitioned_pool_fixture(P)


async def write(
    pool: asyncpg.Pool, epoch: int, partitions: list[int], office: list[int] | None = None
) -> bool:
    """Whether a fenced write by `epoch` to `partitions` went through."""
    async with pool.acquire() as proxy:
        try:
            await fenced(
                cast(asyncpg.Connection, proxy),
                epoch,
                MARK,
                f"e{epoch}",
                partitions=partitions,
                office=office,
            )
        except FencedError:
            return False
    return True


async def test_a_term_over_a_grown_set_is_above_the_added_partitions_epoch(
    pool: asyncpg.Pool,
) -> None:
    """Engine A holds {0, 1} at a low epoch while B's terms over {2, 3} climb; when A gains
    partition 2 its next term takes an epoch above 2's, so B's late write to 2 is fenced, and
    so is A's previous term on the partitions it kept; B keeps writing to 3."""
    a1 = await take_office(pool, "a", partitions=[0, 1])
    b = 0
    for _ in range(3):
        b = await take_office(pool, "b", partitions=[2, 3])
    assert b > a1
    a2 = await take_office(pool, "a", partitions=[0, 1, 2])
    assert a2 > b
    assert not await write(pool, b, [2])
    assert not await write(pool, a1, [0])
    assert await write(pool, b, [3])
    assert await write(pool, a2, [0, 1, 2])


async def test_a_term_over_a_shrunk_set_fences_the_previous_term_everywhere(
    pool: asyncpg.Pool,
) -> None:
    """After A gives partition 3 back and takes office over {0, 1, 2} again, its previous
    term's writes fail on the partitions it kept; the released partition's next owner takes
    it above A's old epoch, fencing A's old term there too, and A's new term may not write
    there (outside its office)."""
    a1 = await take_office(pool, "a", partitions=range(P))
    a2 = await take_office(pool, "a", partitions=[0, 1, 2])
    assert not await write(pool, a1, [1])
    assert await write(pool, a1, [3])  # nobody took 3 yet: the lease alone keeps A off it
    c = await take_office(pool, "c", partitions=[3])
    assert c > a1
    assert not await write(pool, a1, [3])
    assert not await write(pool, a2, [3], office=[0, 1, 2])
    assert await write(pool, c, [3], office=[3])
    assert await write(pool, a2, [0, 1, 2], office=[0, 1, 2])
