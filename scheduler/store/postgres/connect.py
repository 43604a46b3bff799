"""PostgreSQL: the system of record. Connections and a pool opened with bounded retries (the one
point where connection errors become errors that name SCHEDULER_DATABASE_URL), and the store's
statements."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from scheduler.aio import Backoff, held
from scheduler.errors import ConfigError, ServiceUnavailableError
from scheduler.settings import redact_url
from scheduler.store.postgres.events import StoreEvents

log = logging.getLogger(__name__)

T = TypeVar("T")

SLOW_STATEMENT = 0.1  # s of a statement (pool wait included) a DEBUG line reports


class _Connection(asyncpg.Connection):
    """No reset statement on release to the pool: the scheduler keeps no session state (no
    LISTEN, SET, session advisory locks or cursors), and asyncpg's default reset costs a round
    trip per acquire. An open transaction is still rolled back on release."""

    def get_reset_query(self) -> str:
        return ""


async def connect(dsn: str, budget: float = 60.0, **kwargs: Any) -> asyncpg.Connection:
    """One connection, opened as `create_pool` opens its first (retried, errors translated)."""
    return await _retrying(
        dsn, budget, lambda timeout: asyncpg.connect(dsn, timeout=timeout, **kwargs)
    )


async def create_pool(
    dsn: str,
    budget: float = 60.0,
    min_size: int = 2,
    max_size: int = 10,
    statement_timeout: float | None = None,
    custom_plans: bool = False,
) -> asyncpg.Pool:
    """Open a pool, retrying an unreachable server with backoff for `budget` seconds. With
    `statement_timeout` (seconds) PostgreSQL cancels any statement of the pool's sessions that
    runs longer (SQLSTATE 57014, asyncpg's QueryCanceledError), and the client gives up a
    second after that should the cancel not come back.

    Every session runs without JIT compilation: the scheduler's statements are short, and
    PostgreSQL's default (`jit=on` above a cost of 100,000) compiled a listing that reads
    every partition (`generate_series`, estimated at 1,000 rows) for 200 ms to run 20 ms of
    it. With `custom_plans` (the management API's pool) each statement is planned with its
    parameters' values (`plan_cache_mode=force_custom_plan`): a listing's filters are `$n IS
    NULL OR ...` pairs, which a generic plan cannot leave out, so an `org_id` that matches
    nothing read every pending row in firing order (277 ms at 200,000 tasks) where its index
    answers in under a millisecond; the planning costs a fraction of a millisecond."""
    server_settings = {"jit": "off"}
    if custom_plans:
        server_settings["plan_cache_mode"] = "force_custom_plan"
    command_timeout = 30.0
    if statement_timeout is not None:
        server_settings["statement_timeout"] = str(max(1, round(statement_timeout * 1000)))
        command_timeout = statement_timeout + 1.0

    def open_pool(timeout: float) -> Awaitable[asyncpg.Pool]:
        return asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            timeout=timeout,
            connection_class=_Connection,
            server_settings=server_settings,
        )

    return await _retrying(dsn, budget, open_pool)


async def _retrying(dsn: str, budget: float, open_: Callable[[float], Awaitable[T]]) -> T:
    """`open_(timeout)` until it succeeds. A refused, timed-out or unresolvable server is
    retried with backoff and logged each time with the URL (password hidden); past `budget`
    seconds: ServiceUnavailableError. A refusal that retrying cannot cure (credentials,
    unknown database, TLS) raises ConfigError at once."""
    backoff = Backoff(budget)
    while True:
        backoff.attempt += 1
        try:
            return await open_(min(10.0, max(backoff.left, 2.0)))
        except Exception as exc:
            problem = connect_problem(exc, dsn)
            if problem is None:
                raise
            cause, retryable = problem
            if not retryable:
                raise refused(dsn, cause) from None
            if backoff.left <= 0:
                raise unavailable(dsn, cause, budget) from None
            log.warning(
                'postgres.unreachable url=%s error="%s" attempt=%d retry_in=%.1fs '
                "(check SCHEDULER_DATABASE_URL; giving up in %.0fs)",
                redact_url(dsn),
                cause,
                backoff.attempt,
                backoff.next_wait,
                backoff.left,
            )
            await backoff.wait()


def refused(dsn: str, cause: str) -> ConfigError:
    """PostgreSQL at `dsn` refused us for `cause`, which retrying cannot cure."""
    return ConfigError("SCHEDULER_DATABASE_URL", f"{redact_url(dsn)}: {cause}")


def unavailable(dsn: str, cause: str, budget: float) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        "PostgreSQL",
        f"{redact_url(dsn)}: {cause}; retried for {budget:g}s. Check SCHEDULER_DATABASE_URL "
        "and that PostgreSQL runs there",
    )


# SQLSTATEs that retrying cannot cure, with what to do about them.
_PERMANENT_HINTS: dict[type[Exception], str] = {
    asyncpg.InvalidPasswordError: (
        "; check the user and password in the URL (or SCHEDULER_DATABASE_PASSWORD_FILE)"
    ),
    asyncpg.InvalidAuthorizationSpecificationError: "; check the user in the URL (and pg_hba.conf)",
    asyncpg.InvalidCatalogNameError: "; create it (CREATE DATABASE) or fix the name in the URL",
}


def connect_problem(exc: BaseException, dsn: str = "") -> tuple[str, bool] | None:
    """(cause in a few words, whether a retry may help) for a failed connect to `dsn`, or None
    when `exc` is no connection problem (a bug: let it raise)."""
    for kind, hint in _PERMANENT_HINTS.items():
        if isinstance(exc, kind):
            return f"{exc}{hint}", False
    if "rejected SSL upgrade" in str(exc) and not _tls_required(dsn):
        return "no PostgreSQL answers there (the reply is another protocol's)", False
    if isinstance(exc, ssl.SSLError) or "SSL" in str(exc):
        return f"TLS failed: {exc}; check sslmode and the certificates in the URL", False
    if isinstance(exc, asyncpg.CannotConnectNowError | asyncpg.TooManyConnectionsError):
        return str(exc), True
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused", True
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})", True
    if isinstance(exc, TimeoutError):
        return "timed out (nothing answered)", True
    if isinstance(exc, OSError):
        return (exc.strerror or str(exc)).lower(), True
    if isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.InterfaceError):
        return str(exc), True
    if isinstance(exc, asyncpg.PostgresError):
        return str(exc), False
    return None


def _tls_required(dsn: str) -> bool:
    return any(f"sslmode={mode}" in dsn for mode in ("require", "verify-ca", "verify-full"))


class PostgresStore:
    """Statements against the scheduler's tables, each timed (`StoreEvents.statement_timed`)."""

    def __init__(
        self, pool: asyncpg.Pool, events: StoreEvents, acquire_timeout: float | None = None
    ) -> None:
        self.pool = pool
        self._events = events
        self.acquire_timeout = acquire_timeout  # past it, waiting for a connection: TimeoutError

    @asynccontextmanager
    async def timed(self, op: str) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection whose use is recorded as operation `op`."""
        start = time.perf_counter()
        async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
            got = time.perf_counter()
            # asyncpg-stubs types the pool's PoolConnectionProxy apart from Connection, though it
            # forwards every Connection method; the store's helpers all take a Connection
            yield conn  # type: ignore[misc]
        end = time.perf_counter()
        self._events.statement_timed(op, end - start)
        held(end - got)
        if end - start > SLOW_STATEMENT:  # a diagnostic at DEBUG: pool wait apart from use
            log.debug(
                "postgres.slow op=%s acquire_ms=%d use_ms=%d", op, (got - start) * 1000,
                (end - got) * 1000,
            )  # fmt: skip

    async def ping(self) -> bool:
        """True when PostgreSQL answers within two seconds."""
        try:
            async with self.timed("ping") as conn:
                answer: int | None = await conn.fetchval("SELECT 1", timeout=2)
                return answer == 1
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("postgres.ping_failed error=%r", exc)
            return False

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
