"""A database set up for P partitions (tests of the partition offices and claims by partition)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

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


def partitioned_pool_fixture(partitions: int) -> Callable[..., Any]:
    """The `pool` fixture of a test module on a database recording `partitions` partitions:
    `pool = partitioned_pool_fixture(P)` at the module's top level."""

    @pytest.fixture
    async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
        opened = await partitioned_pool(database_url, partitions)
        yield opened
        await opened.close()

    return pool
