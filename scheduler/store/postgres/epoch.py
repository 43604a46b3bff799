"""The fencing epoch in PostgreSQL: taking office, and the check every leader's write runs.

The `leadership` table has one row; its `epoch` is the fencing token. A leader's every state
change runs in a transaction that reads the row `FOR SHARE` and aborts unless the epoch is still
its own (`check_epoch`, or `LEAD` inside a single statement). `take_office` increments the epoch
(`UPDATE`, which needs the row exclusively), so it waits for every such transaction in flight:
once it returns, no transaction that checked an older epoch can still commit, and every later
check sees the new epoch and fails. This is the only place that SQL is written.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from scheduler.errors import FencedError, ServiceUnavailableError

# A CTE for one-statement writes: yields the epoch row only while `$1` is the current epoch,
# locked until the statement's transaction ends. Use as `WITH {LEAD}, ...` and join on `lead`.
LEAD = "lead AS (SELECT epoch FROM leadership WHERE id = 1 AND epoch = $1 FOR SHARE)"


async def take_office(pool: asyncpg.Pool, instance: str) -> int:
    """Increment the fencing epoch in PostgreSQL and return it: every older epoch is now fenced."""
    async with pool.acquire() as conn:
        return int(
            await conn.fetchval(
                "UPDATE leadership SET epoch = epoch + 1, instance = $1, since = now() "
                "WHERE id = 1 RETURNING epoch",
                instance,
            )
        )


async def check_epoch(conn: asyncpg.Connection, epoch: int) -> None:
    """Raise FencedError unless `epoch` is the current one; call inside the writing transaction.

    Outside a transaction the lock would end with the statement, so that is refused.
    """
    if not conn.is_in_transaction():
        raise RuntimeError("check_epoch must run inside the transaction it fences")
    current = await conn.fetchval("SELECT epoch FROM leadership WHERE id = 1 FOR SHARE")
    if current != epoch:
        raise FencedError(epoch)


async def database_time(
    pool: asyncpg.Pool, now: Callable[[], datetime], timeout: float = 2
) -> tuple[datetime, datetime, datetime]:
    """(`now()` before asking, PostgreSQL's `clock_timestamp()`, `now()` after): the round trip
    measured around the query alone, on a connection already acquired. Raises
    ServiceUnavailableError (an OSError) when PostgreSQL cannot be asked, TimeoutError after
    `timeout` seconds."""
    try:
        async with pool.acquire() as conn:
            sent = now()
            theirs = await conn.fetchval("SELECT clock_timestamp()", timeout=timeout)
            back = now()
    except asyncpg.PostgresError as exc:
        raise ServiceUnavailableError("postgres", repr(exc)) from exc
    return sent, theirs, back
