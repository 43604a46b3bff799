"""Partitions in PostgreSQL (migration 0022): the recorded count and the engine's check of it,
the rule as SQL computes it, and today's statements left on their own indexes."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from scheduler.errors import ConfigError
from scheduler.metrics import Metrics
from scheduler.partitions import partition_of
from scheduler.records import Fired, NewTask
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.overview import OverviewStore
from scheduler.store.postgres.partitioning import check_partitions
from scheduler.store.postgres.tasks import TaskStore
from tests.support.processes import cli_env, scheduler
from tests.support.stores import claim, insert

EXIT_CONFIG = 2
# scheduler/partitions.py's rule, in SQL
SQL_RULE = "('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 8))::bit(32)::bigint"


async def test_a_count_other_than_the_recorded_one_is_refused(database_url: str) -> None:
    """The database records 1; the check passes for 1 and refuses 64 with an error naming
    SCHEDULER_PARTITIONS, both counts and why the count cannot simply change."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        assert await pool.fetchval("SELECT partitions FROM partitioning") == 1
        await check_partitions(pool, 1)
        with pytest.raises(ConfigError) as info:
            await check_partitions(pool, 64)
    finally:
        await pool.close()
    assert info.value.variable == "SCHEDULER_PARTITIONS"
    message = str(info.value)
    assert message.startswith("SCHEDULER_PARTITIONS: is 64, but ")
    assert "partition count of 1" in message and "moving every row" in message
    assert message.endswith("start with SCHEDULER_PARTITIONS=1")


@pytest.mark.slow
async def test_the_engine_refuses_to_start_with_another_count(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    """`scheduler run` with SCHEDULER_PARTITIONS=4 on a database recording 1 ends at start with
    one line naming the setting and both counts, exit status 2, no traceback."""
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_url,
        SCHEDULER_DATABASE_URL=database_url,
        SCHEDULER_PARTITIONS="4",
    )
    with scheduler(["run"], env) as proc:
        code = await asyncio.to_thread(proc.wait_exit, 30)
    assert code == EXIT_CONFIG, proc.transcript()
    last = proc.last_err_line()
    assert last.startswith("scheduler: configuration error: SCHEDULER_PARTITIONS: is 4, "), last
    assert "partition count of 1" in last, last
    assert "Traceback" not in "\n".join(proc.err), proc.transcript()


async def test_postgresql_computes_the_same_partitions(database_url: str) -> None:
    """SHA-256 in SQL gives `partition_of`'s partitions, for ASCII ids and other UTF-8 alike
    (a later statement may move rows to a new count in SQL)."""
    keys = [f"01JF{i:022d}" for i in range(300)] + ["é€😀", "", "credit-reconciliation"]
    conn = await asyncpg.connect(database_url)
    try:
        for count in (2, 64, 4096):
            got = await conn.fetch(
                f"SELECT ({SQL_RULE.replace('$1::text', 'k')} % $2)::int AS p "
                "FROM unnest($1::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n",
                keys,
                count,
            )
            assert [r["p"] for r in got] == [partition_of(k, count) for k in keys]
    finally:
        await conn.close()


INDEX_SCANS = (
    "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'delayed_messages'"
)


async def _index_scans(conn: asyncpg.Connection) -> dict[str, int]:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return {r["indexrelname"]: r["idx_scan"] for r in await conn.fetch(INDEX_SCANS)}


async def _store_analysed(tasks: TaskStore, now: datetime) -> list[NewTask]:
    """6,000 tasks due from 100 s ago, a second apart, stored and analysed."""
    batch = []
    for i in range(6000):
        due = now + timedelta(seconds=i - 100)
        batch.append(NewTask(f"p-{uuid.uuid4().hex}", "mq.t.x", b"{}", {}, 5, due, due, None))
    for start in range(0, len(batch), 1000):
        await insert(tasks, batch[start : start + 1000])
    await tasks.db.pool.execute("ANALYZE delayed_messages")
    return batch


async def test_todays_statements_keep_to_their_own_indexes(database_url: str) -> None:
    """On 6,000 analysed tasks (P = 1) the loader, the sweep, a claim, a booking, the counts
    and the forecast read the indexes they read before, never the partition index."""
    now = datetime.now(UTC)
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        db = PostgresStore(pool, Metrics())
        tasks = TaskStore(db)
        batch = await _store_analysed(tasks, now)
        epoch = await take_office(pool, "t")
        await tasks.load_page((-1, 0, 0), now + timedelta(minutes=5), 500)
        await tasks.overdue(now, 500)
        claimed = await claim(tasks, epoch, [t.id for t in batch[:50]], now)
        await tasks.mark_fired(epoch, [Fired(c, now, "MQ_TASKS", 1) for c in claimed], "t")
        await tasks.pending_count()
        await tasks.pending_by_org()
        overview = OverviewStore(db)
        await overview.forecast(now)
        await overview.pending_by_subject(20)
    finally:
        await pool.close()  # its backend exits, which flushes its statistics
    conn = await asyncpg.connect(database_url)
    try:
        async with asyncio.timeout(10):
            # the closed pool's backend flushes them as it exits: no event to await
            while not (await _index_scans(conn)).get("delayed_messages_pending_due"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        scans = await _index_scans(conn)
    finally:
        await conn.close()
    assert scans["delayed_messages_partition_due"] == 0, scans


async def test_the_partition_index_gives_one_partition_in_firing_order(database_url: str) -> None:
    """With tasks spread over 64 partitions, one partition's unclaimed ready tasks in firing
    order (what a claim by partition will read) come from the partition index, unsorted."""
    now = datetime.now(UTC)
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await _store_analysed(TaskStore(PostgresStore(pool, Metrics()), partitions=64), now)
        plan = await pool.fetchval(
            "EXPLAIN (FORMAT JSON) SELECT id FROM delayed_messages WHERE partition = $1 "
            "AND status IN ('pending', 'in_doubt') AND claimed_epoch IS NULL AND due_at <= $2 "
            "ORDER BY due_at, priority, seq LIMIT 10",
            5,
            now + timedelta(hours=2),
        )
    finally:
        await pool.close()
    assert '"delayed_messages_partition_due"' in plan, plan
    assert '"Sort"' not in plan, plan
