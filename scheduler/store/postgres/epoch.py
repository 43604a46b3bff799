"""The fencing epoch in PostgreSQL: taking office, and the one fence every leader's write runs.

The `leadership` table has one row; its `epoch` is the fencing token. Every state change a
leader makes (claim, fired, retry, expire, dead, cron cursors and failures) is one statement
run by `fenced`: it reads that row `FOR SHARE` (the `lead` item of its WITH list) only while
the epoch is still the writer's, every write of the statement joins `lead`, and `fenced`
raises FencedError, nothing written, when it is not. `take_office` increments the epoch
(`UPDATE`, which needs the row exclusively), so it waits for every such statement in flight:
once it returns, no write fenced by an older epoch can still commit, and every later one finds
no `lead` and fails. This is the only place that SQL is written.

One statement, not a transaction that checks first: one round trip (the claim and the booking
of deliveries are the hot path), and no way to write outside the lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg

from scheduler.errors import FencedError, ServiceUnavailableError

# The epoch row, only while `$1` is the current epoch, locked until the statement's transaction
# ends: the first WITH item of every fenced statement.
_LEAD = "lead AS (SELECT epoch FROM leadership WHERE id = 1 AND epoch = $1 FOR SHARE)"
_NOTHING = "SELECT true AS fenced_row WHERE false"  # `rows` of a statement that returns none
_log = logging.getLogger(__name__)


async def take_office(pool: asyncpg.Pool, instance: str, floor: int = 0) -> int:
    """Raise the fencing epoch in PostgreSQL above both its own value and `floor` (the highest
    epoch the caller has seen in use) and return it: every older epoch is now fenced.

    `floor` keeps the epoch from going backwards when the database was restored from an older
    backup (docs/operations.md, "Backup and restore"): without it the restored value would be
    incremented into epochs a leader of before the restore held, whose late writes would pass
    the fence again. A restore found this way is logged (`leader.epoch_behind`)."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "UPDATE leadership AS l SET epoch = greatest(l.epoch, $2) + 1, instance = $1, "
            "since = now() FROM (SELECT epoch FROM leadership WHERE id = 1) AS was "
            "WHERE l.id = 1 RETURNING l.epoch, was.epoch AS was",
            instance,
            floor,
        )
    assert row is not None  # the migrations insert the one row; nothing deletes it
    epoch, was = int(row["epoch"]), int(row["was"])
    if was < floor:
        _log.warning(
            "leader.epoch_behind instance=%s database_epoch=%d seen=%d epoch=%d "
            "(restored from an older backup?)",
            instance,
            was,
            floor,
            epoch,
        )
    return epoch


async def fenced(
    conn: asyncpg.Connection, epoch: int, writes: str, *args: Any, rows: str | None = None
) -> list[asyncpg.Record]:
    """Run one statement that writes only while `epoch` is the current fencing epoch; raise
    FencedError, having written nothing, when a newer leader has taken office.

    `writes` are the statement's WITH items after `lead` (the epoch row, see `_LEAD`): each
    write joins `lead`, itself or through an item that does, so it touches no row once the
    epoch is stale. `rows`, a SELECT over those items, is what the statement returns (nothing
    without it). `$1` is `epoch`; `args` are `$2`, `$3`, ...

    The statement always yields a row (`in_office` left-joined to `rows`), so a fenced epoch
    is told apart from a write that matched nothing."""
    found = f"SELECT true AS fenced_row, r.* FROM ({rows}) AS r" if rows else _NOTHING
    result = await conn.fetch(
        f"WITH {_LEAD}, {writes} SELECT (SELECT count(*) FROM lead) AS in_office, f.* "
        f"FROM (SELECT 1) AS one LEFT JOIN ({found}) AS f ON true",
        epoch,
        *args,
    )
    if not result or result[0]["in_office"] == 0:
        raise FencedError(epoch)
    return [r for r in result if r["fenced_row"]]


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
