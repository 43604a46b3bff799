"""Partitions in PostgreSQL (migration 0022): the recorded count and the engine's check of it,
and the rule as SQL computes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from scheduler.errors import ConfigError
from scheduler.partitions import partition_of
from scheduler.store.postgres.connect import create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.partitioning import check_partitions
from tests.support.processes import cli_env, scheduler

EXIT_CONFIG = 2
# scheduler/partitions.py's rule, in SQL
SQL_RULE = "('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 8))::bit(32)::bigint"


async def test_a_count_other_than_the_recorded_one_is_refused(database_url: str) -> None:
    """The database records 1; the check passes for 1 (choosing it) and then refuses 64 with
    an error naming SCHEDULER_PARTITIONS, both counts and why the count cannot simply
    change."""
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


async def test_the_first_engine_chooses_the_count_of_an_empty_deployment(
    database_url: str,
) -> None:
    """On a database storing no task and no cron job, the first engine's count is recorded
    (64, not the 1 migration 0022 wrote: refused before, seen failing) and kept: an engine
    configured with 8 afterwards is refused, naming 64."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await check_partitions(pool, 64)
        assert await pool.fetchval("SELECT partitions FROM partitioning") == 64
        assert await pool.fetchval("SELECT chosen_at IS NOT NULL FROM partitioning")
        with pytest.raises(ConfigError) as info:
            await check_partitions(pool, 8)
        assert "partition count of 64" in str(info.value)
    finally:
        await pool.close()


async def test_the_chosen_count_has_an_office_row_per_partition_to_take_office_over(
    database_url: str,
) -> None:
    """A new deployment's first engine at P = 8 finds an office row for each partition (the
    migrations made partition 0's only: take_office over the eight found one, and the engine
    never took office, seen with `scheduler run --role engine`), each at epoch 0, and takes
    office over all eight; a second check adds nothing and leaves the epochs alone."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await check_partitions(pool, 8)
        offices = "SELECT partition, epoch FROM partition_offices ORDER BY partition"
        assert [tuple(r) for r in await pool.fetch(offices)] == [(p, 0) for p in range(8)]
        epoch = await take_office(pool, "a", partitions=range(8))
        await check_partitions(pool, 8)
        assert [tuple(r) for r in await pool.fetch(offices)] == [(p, epoch) for p in range(8)]
    finally:
        await pool.close()


async def test_no_count_is_chosen_over_stored_rows(database_url: str) -> None:
    """A deployment from before the choice (none recorded as chosen) that stores a task keeps
    its count: 64 is refused, 1 passes and is then chosen."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await pool.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "VALUES ('kept', 'mq.tasks.x', '{}'::bytea, now(), now())"
        )
        with pytest.raises(ConfigError):
            await check_partitions(pool, 64)
        await check_partitions(pool, 1)
        assert await pool.fetchval("SELECT chosen_at IS NOT NULL FROM partitioning")
    finally:
        await pool.close()


async def test_two_engines_configured_differently_cannot_both_choose(database_url: str) -> None:
    """Two engines, 64 and 8, check at once on an empty database: one chooses, the other is
    refused, whichever came first."""
    pools = [await create_pool(database_url, min_size=1, max_size=1) for _ in range(2)]
    try:
        got = await asyncio.gather(
            check_partitions(pools[0], 64), check_partitions(pools[1], 8), return_exceptions=True
        )
        recorded = await pools[0].fetchval("SELECT partitions FROM partitioning")
    finally:
        for pool in pools:
            await pool.close()
    refused = [g for g in got if isinstance(g, ConfigError)]
    assert len(refused) == 1 and got.count(None) == 1, got
    assert recorded == (64 if got[0] is None else 8)


@pytest.mark.slow
async def test_the_engine_refuses_to_start_with_another_count(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    """`scheduler run` with SCHEDULER_PARTITIONS=4 on a database whose count of 1 is chosen
    ends at start with one line naming the setting and both counts, exit status 2, no
    traceback."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await check_partitions(pool, 1)  # an engine with the default count started before
    finally:
        await pool.close()
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
