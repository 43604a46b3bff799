"""Small bounded-wait helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any, cast

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from scheduler.clock import Clock
from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from scheduler.store.postgres.epoch import OFFICE_OF_ONE, fenced


async def wait_until(predicate: Callable[[], bool], within: float = 3.0) -> None:
    """Poll `predicate` until it is true; fail the test after `within` seconds."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 (state owned by other libraries, no event to await)
            await asyncio.sleep(0.01)


class DaemonRunner:
    """Starts a Daemon in this event loop (waiting until it runs) and stops it, bounded."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.daemon: Daemon | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self, **overrides: Any) -> Daemon:
        settings = self.settings.with_overrides(**overrides) if overrides else self.settings
        self.daemon = Daemon(settings, clock=self.clock)
        self.task = asyncio.create_task(self.daemon.run())
        deadline = asyncio.get_running_loop().time() + 20
        while not self.daemon.started.is_set():
            if self.task.done():
                self.task.result()
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no start within 20 s: {stuck(self.daemon)}")
            await asyncio.sleep(0.01)
        return self.daemon

    async def stop(self) -> None:
        """Stop and wait (20 s); a daemon that does not stop is cancelled, and the error says
        where it waited."""
        if self.daemon is not None and self.task is not None:
            daemon, task = self.daemon, self.task
            self.daemon = self.task = None
            daemon.stop()
            done, _ = await asyncio.wait([task], timeout=20)
            if not done:
                where = stuck(daemon)
                task.cancel()
                await asyncio.wait([task], timeout=5)
                raise AssertionError(f"no stop within 20 s: {where}")
            task.result()


def stuck(daemon: Daemon) -> str:
    """Where a daemon that did not start or stop in time is: its phase and state, and where
    each other task of this loop waits (a CI log then names the await that hung)."""
    waits = []
    for task in asyncio.all_tasks():
        if task is asyncio.current_task():
            continue
        frames = task.get_stack(limit=3)
        where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
        waits.append(f"{task.get_name()} at {where or '?'}")
    return f"phase {daemon.phase!r}, state {daemon.state}; tasks: " + "; ".join(sorted(waits))


def http_text(url: str) -> str:
    """The body of GET `url` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


async def served_text(daemon: Daemon) -> str:
    """What /readyz, /v1/leader and /metrics serve, in one string."""
    assert daemon.endpoints.api is not None and daemon.endpoints.metrics is not None
    urls = [
        daemon.endpoints.api.url + "/readyz",
        daemon.endpoints.api.url + "/v1/leader",
        daemon.endpoints.metrics.url + "/metrics",
    ]
    return "\n".join([await asyncio.to_thread(http_text, u) for u in urls])


async def waiting_on_locks(pool: asyncpg.Pool, n: int, within: float = 5.0) -> None:
    """Wait (bounded) until `n` statements of this database wait on a lock."""
    async with asyncio.timeout(within):
        while (  # noqa: ASYNC110 (a server's state, no event)
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            < n
        ):
            await asyncio.sleep(0.01)


def connection_of(proxy: PoolConnectionProxy) -> asyncpg.Connection:
    """The pool's connection as the store's helpers take it: asyncpg-stubs types the proxy apart
    from Connection, though it forwards every Connection method (as PostgresStore.timed says)."""
    return cast(asyncpg.Connection, proxy)


@asynccontextmanager
async def holding_fenced_write(
    pool: asyncpg.Pool, epoch: int, partitions: Collection[int] | None = None
) -> AsyncIterator[asyncpg.Connection]:
    """A transaction that made a fenced write under `epoch` (a no-op naming `partitions`, or
    partition 0 under P = 1), so it holds their office rows FOR SHARE until the block ends:
    committed when it ends, rolled back when it raises. Yields the transaction's connection."""
    async with pool.acquire() as proxy:
        conn = connection_of(proxy)
        tx = conn.transaction()
        await tx.start()
        try:
            await fenced(
                conn,
                epoch,
                "noop AS (SELECT 1 FROM lead)",
                partitions=OFFICE_OF_ONE if partitions is None else partitions,
            )
            yield conn
        except BaseException:
            await tx.rollback()
            raise
        await tx.commit()
