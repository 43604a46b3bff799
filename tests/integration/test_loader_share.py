"""The loader's and the sweep's page over several partitions read a share of the page from
each partition's range, not the whole page from each (docs/decisions/2026-12-06-partition-
ownership.md, Consequences), and still return exactly the first tasks in firing order, also
when the page's tasks all sit in one partition."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from scheduler.metrics import Metrics
from scheduler.records import TaskRef
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.tasks import TaskStore
from tests.support.partitioned import partitioned_pool_fixture

P = 8
ROWS = 4_000


pool = partitioned_pool_fixture(P)


async def stored(pool: asyncpg.Pool, skewed: int = 0) -> list[str]:
    """ROWS pending tasks two a second from an hour ago, in whole milliseconds as intake
    stores them (every 7th in doubt): the first
    `skewed` of them in partition 3, the others in partition i mod P; their ids in order."""
    await pool.execute(
        "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, status, "
        "partition) SELECT 't_' || i, 'mq.tasks.x', '{}', date_trunc('milliseconds', now()) "
        "- interval '1 hour' + i * interval '500 milliseconds', now(), "
        "CASE WHEN i % 7 = 0 THEN 'in_doubt' ELSE 'pending' END, "
        "CASE WHEN i <= $2 THEN 3 ELSE i % $3 END FROM generate_series(1, $1) AS i",
        ROWS,
        skewed,
        P,
    )
    await pool.execute("ANALYZE delayed_messages")
    return [f"t_{i}" for i in range(1, ROWS + 1)]


def store(pool: asyncpg.Pool) -> TaskStore:
    tasks = TaskStore(PostgresStore(pool, Metrics()), partitions=P)
    tasks.office = range(P)
    return tasks


async def paged(tasks: TaskStore, limit: int) -> list[TaskRef]:
    """Every task, page after page past the last one's key, as the loader's cursor moves."""
    out: list[TaskRef] = []
    after = (-1, 0, 0)
    async with asyncio.timeout(10):
        while page := await tasks.load_page(after, datetime.now(UTC), limit):
            out += page
            after = page[-1].key
    return out


@pytest.mark.parametrize("skewed", [0, 500])
async def test_a_page_is_the_first_tasks_in_firing_order_however_they_are_spread(
    pool: asyncpg.Pool, skewed: int
) -> None:
    """Spread over the eight partitions, or with the first 500 all in one: a page of 200 is
    the first 200 tasks, the sweep's likewise, and paging by the cursor returns every task
    once, in order."""
    ids = await stored(pool, skewed)
    tasks = store(pool)
    page = await tasks.load_page((-1, 0, 0), datetime.now(UTC), 200)
    assert [t.task_id for t in page] == ids[:200]
    swept = await tasks.overdue(datetime.now(UTC), 200)
    assert [t.task_id for t in swept] == ids[: len(swept)]
    assert len(swept) >= (50 if skewed else 200)  # at least one partition's share
    assert [t.task_id for t in await paged(tasks, 300)] == ids
