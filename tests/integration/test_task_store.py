"""TaskStore against real PostgreSQL: statistics kept fresh after a burst of inserts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from scheduler.metrics import Metrics
from scheduler.store.postgres import PostgresStore, create_pool
from scheduler.store.tasks import NewTask, TaskStore


def batch(n: int, due: datetime) -> list[NewTask]:
    return [
        NewTask(f"t_{uuid.uuid4().hex}", "mq.tasks.x", b"{}", {}, 5, due, due, None)
        for _ in range(n)
    ]


async def test_analyze_runs_once_enough_rows_arrived(database_url: str) -> None:
    """A table filled by a burst is analyzed once (row estimate from 0 to the real count), not
    again until it has grown by half; a redelivered batch stored nothing and counts nothing."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    due = datetime.now(UTC) + timedelta(hours=1)
    try:

        async def estimate() -> int:
            return int(
                await pool.fetchval(
                    "SELECT reltuples FROM pg_class WHERE oid = 'delayed_messages'::regclass"
                )
            )

        assert await tasks.analyze_if_stale(min_rows=100) is False  # nothing inserted yet
        first = batch(300, due)
        await tasks.insert(first)
        assert await tasks.insert(first) == []  # stored once, not counted twice
        assert tasks.inserted == 300
        assert await estimate() <= 0  # never analyzed: the planner thinks the table is empty
        assert await tasks.analyze_if_stale(min_rows=100) is True
        assert await estimate() == 300
        assert await tasks.analyze_if_stale(min_rows=100) is False  # nothing new since
        await tasks.insert(batch(120, due))  # grown by less than half of 300
        assert await tasks.analyze_if_stale(min_rows=100) is False
        await tasks.insert(batch(40, due))  # 160 new rows: more than half
        assert await tasks.analyze_if_stale(min_rows=100) is True
        assert await estimate() == 460
    finally:
        await pool.close()
