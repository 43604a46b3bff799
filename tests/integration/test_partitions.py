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
from scheduler.store.postgres.partitioning import check_partitions
from tests.support.processes import cli_env, scheduler

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
