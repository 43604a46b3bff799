"""PostgreSQL: the system of record. A pool with bounded retries, and the store's statements."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from scheduler.errors import ServiceUnavailableError
from scheduler.metrics import Metrics

log = logging.getLogger("scheduler.postgres")

_RETRYABLE = (OSError, asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError)


class _Connection(asyncpg.Connection):
    """No reset statement on release to the pool: the scheduler keeps no session state (no
    LISTEN, SET, session advisory locks or cursors), and asyncpg's default reset costs a round
    trip per acquire. An open transaction is still rolled back on release."""

    def get_reset_query(self) -> str:
        return ""


async def create_pool(
    dsn: str, attempts: int = 10, min_size: int = 2, max_size: int = 10
) -> asyncpg.Pool:
    """Open a pool, retrying refused or dropped connections with backoff up to `attempts` times."""
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            return await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=30,
                connection_class=_Connection,
            )
        except (*_RETRYABLE, asyncpg.PostgresConnectionError) as exc:
            if attempt == attempts:
                raise ServiceUnavailableError("PostgreSQL", repr(exc)) from exc
            log.warning("postgres.connect_failed attempt=%d error=%r", attempt, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


class PostgresStore:
    """Statements against the scheduler's tables, timed into the `db_seconds` histogram."""

    def __init__(self, pool: asyncpg.Pool, metrics: Metrics) -> None:
        self.pool = pool
        self.metrics = metrics

    @asynccontextmanager
    async def timed(self, op: str) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection whose use is recorded as operation `op`."""
        start = time.perf_counter()
        async with self.pool.acquire() as conn:
            yield conn
        self.metrics.db_seconds.labels(op).observe(time.perf_counter() - start)

    async def ping(self) -> bool:
        """True when PostgreSQL answers within two seconds."""
        try:
            async with self.timed("ping") as conn:
                return await conn.fetchval("SELECT 1", timeout=2) == 1
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("postgres.ping_failed error=%r", exc)
            return False

    async def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (None before the first migration)."""
        async with self.timed("schema") as conn:
            exists = await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
            if not exists:
                return None
            return await conn.fetchval("SELECT version_num FROM alembic_version")

    async def fire_log_upkeep(self, retention_days: int, ahead_days: int = 2) -> list[str]:
        """Create the fire log's daily partitions ahead and drop those past the retention."""
        async with self.timed("upkeep") as conn:
            rows = await conn.fetch(
                "SELECT action, partition_name FROM scheduler_fire_log_upkeep($1, $2)",
                retention_days,
                ahead_days,
            )
        return [f"{r['action']} {r['partition_name']}" for r in rows]

    async def close(self) -> None:
        await asyncio.wait_for(self.pool.close(), timeout=10)
