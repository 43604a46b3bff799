"""Claims by partition (migration 0024; docs/decisions/2026-12-06-partition-ownership.md, step
2): the loader, the sweep and the orphan sweep read only the office's partitions, one range of
the ready index (partition, due_at, priority, seq) per partition."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from scheduler.metrics import Metrics
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.tasks import LOAD_SQL, SWEEP_SQL, TaskStore
from tests.support.partitioned import partitioned_pool_fixture

P = 4
ROWS = 20_000


async def spread(pool: asyncpg.Pool, partitions: int, n: int = ROWS) -> None:
    """`n` pending tasks, one a second from an hour ago, task i in partition i mod `partitions`,
    with every 7th in doubt; the table analyzed."""
    await pool.execute(
        "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, status, "
        "partition) SELECT 't_' || i, 'mq.tasks.x', '{}', now() - interval '1 hour' + i * "
        "interval '1 second', now(), CASE WHEN i % 7 = 0 THEN 'in_doubt' ELSE 'pending' END, "
        "i % $2 FROM generate_series(1, $1) AS i",
        n,
        partitions,
    )
    await pool.execute("ANALYZE delayed_messages")


pool = partitioned_pool_fixture(P)


def scans(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(node type, index, index condition) of every read of an index in a plan (an index scan
    or a bitmap's), and of every sequential scan of `delayed_messages`."""
    found = []
    if "Index Name" in plan or plan.get("Node Type") == "Seq Scan":
        found.append((plan["Node Type"], plan.get("Index Name", ""), plan.get("Index Cond", "")))
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


async def explained(pool: asyncpg.Pool, sql: str, *args: Any) -> list[tuple[str, str, str]]:
    async with pool.acquire() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")  # as a pooled statement
        plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        await conn.execute("RESET plan_cache_mode")
    return scans(json.loads(plan)[0]["Plan"])


@pytest.mark.parametrize("owned", [[0], [1, 3], [0, 1, 2, 3]])
async def test_the_loader_and_the_sweep_read_one_index_range_per_owned_partition(
    pool: asyncpg.Pool, owned: list[int]
) -> None:
    """Over 20,000 ready tasks in 4 partitions, the loader's and the sweep's plans read each
    status's index by partition with the partition in the index condition (no sequential scan,
    no other index), and what they return is the owned partitions' tasks in firing order."""
    await spread(pool, P)
    now = datetime.now(UTC)
    start = datetime(1970, 1, 1, tzinfo=UTC)
    for sql, args in ((LOAD_SQL, (start, 0, 0, now, 100, owned)), (SWEEP_SQL, (now, 100, owned))):
        plan = await explained(pool, sql, *args)
        assert {index for _, index, _ in plan} == {
            "delayed_messages_pending_due",
            "delayed_messages_in_doubt_due",
        }, plan
        assert all("partition" in cond and "Index" in node for node, _, cond in plan), plan
        # the pending tasks' range read in order: no sort of a partition's whole range
        assert ("Index Scan", "delayed_messages_pending_due") in [(n, i) for n, i, _ in plan]
    tasks = TaskStore(PostgresStore(pool, Metrics()), partitions=P)
    tasks.office = owned
    page = await tasks.load_page((-1, 0, 0), now, 500)
    swept = await tasks.overdue(now, 500)
    expected = [f"t_{i}" for i in range(1, ROWS + 1) if i % P in owned][:500]
    assert [t.task_id for t in page] == expected
    assert [t.task_id for t in swept] == expected


async def test_under_one_partition_the_loader_reads_the_index_in_order(
    database_url: str,
) -> None:
    """Under P = 1 the loader's plan is one range of each status's index (partition 0), and a
    page is the first tasks in firing order, as before partitions."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        await spread(pool, 1)
        now = datetime.now(UTC)
        plan = await explained(pool, LOAD_SQL, now - timedelta(hours=2), 0, 0, now, 100, [0])
        assert [index for _, index, _ in plan] == [
            "delayed_messages_pending_due",
            "delayed_messages_in_doubt_due",
        ], plan
        assert all("partition" in cond for _, _, cond in plan), plan
        page = await TaskStore(PostgresStore(pool, Metrics())).load_page((-1, 0, 0), now, 10)
        assert [t.task_id for t in page] == [f"t_{i}" for i in range(1, 11)]
    finally:
        await pool.close()


async def test_the_orphan_sweep_takes_over_only_the_office_s_claims(pool: asyncpg.Pool) -> None:
    """Claims an earlier term left in partitions 0..3: a term whose office is {1, 2} takes over
    those of partitions 1 and 2 only."""
    tasks = TaskStore(PostgresStore(pool, Metrics()), partitions=P)
    await spread(pool, P, n=40)
    old = await take_office(pool, "a", partitions=range(P))
    await pool.execute("UPDATE delayed_messages SET claimed_epoch = $1, claimed_at = now()", old)
    new = await take_office(pool, "b", partitions=[1, 2])
    tasks.office = [1, 2]
    taken = await tasks.reclaim_orphans(new, limit=100)
    assert sorted(t.id for t in taken.ready) == sorted(
        f"t_{i}" for i in range(1, 41) if i % P in (1, 2)
    )
