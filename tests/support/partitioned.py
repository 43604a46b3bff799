"""A database set up for P partitions (tests of the partition offices and claims by partition)."""

from __future__ import annotations

import asyncpg

from scheduler.store.postgres.connect import create_pool

# A write fenced by the epoch of the partitions it names: a mark in each of their rows (`$2`)
MARK = (
    "w AS (UPDATE partition_offices o SET instance = $2 FROM lead "
    "WHERE o.partition = lead.partition RETURNING 1)"
)


async def partitioned_pool(database_url: str, partitions: int) -> asyncpg.Pool:
    """A pool on `database_url` recording `partitions` partitions, each with its office row
    (the migrations make partition 0's)."""
    pool = await create_pool(database_url)
    await pool.execute("UPDATE partitioning SET partitions = $1", partitions)
    await pool.execute(
        "INSERT INTO partition_offices (partition, epoch) SELECT p, 0 "
        "FROM generate_series(1, $1 - 1) AS p",
        partitions,
    )
    return pool
