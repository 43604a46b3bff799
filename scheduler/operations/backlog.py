"""Writes to PostgreSQL that must happen but could not when they were due, retried in the
background: the fire-log row of a manual trigger whose publish was acknowledged while PostgreSQL
was unreachable, the stored answer of an idempotent API call.

One owned loop (`run`, a task of the daemon's TaskGroup) retries the oldest first with backoff
(0.2 s doubling to 5 s) until each is written or the daemon stops. At stop it tries once more
within a short budget, then logs every write still left as `backlog.lost` with what it was
(so an operator can repair it by hand): those are lost with the process. The queue is bounded
(`LIMIT`): past it a new write is logged as lost at once instead of growing memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from scheduler.aio import first_of, wait_or_stop

log = logging.getLogger(__name__)

LIMIT = 10_000
FIRST_WAIT, MAX_WAIT = 0.2, 5.0
WRITE_TIMEOUT = 5.0
FINAL_BUDGET = 3.0
# What an unreachable or restarting PostgreSQL raises; anything else is a bug and raises.
# asyncpg's InternalClientError too: a pooled connection left mid-operation when PostgreSQL
# stopped under it ("cannot switch to state 11; another operation (2) is in progress", seen on a
# busy host as a manual trigger's fire-log confirm: the trigger answered 500 though published).
TRANSIENT = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


@dataclass(frozen=True, slots=True)
class Deferred:
    what: str  # for the logs: which row, with what an operator needs to write it by hand
    write: Callable[[], Awaitable[None]]


class WriteBacklog:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._items: deque[Deferred] = deque()
        self._wake = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def add(self, what: str, write: Callable[[], Awaitable[None]]) -> bool:
        """Queue `write`; False (and logged as lost) when the backlog is full or closed."""
        if self._closed:  # the daemon is stopping: no loop will run it
            log.error("backlog.lost reason=stopping what=%s", what)
            return False
        if len(self._items) >= self.limit:
            log.error("backlog.lost reason=full limit=%d what=%s", self.limit, what)
            return False
        self._items.append(Deferred(what, write))
        log.warning("backlog.deferred what=%s queued=%d", what, len(self._items))
        self._wake.set()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Retry until each write is done, until `stop`; then one last try, and log the rest."""
        wait = FIRST_WAIT
        while not stop.is_set():
            if not self._items:
                self._wake.clear()
                await first_of(self._wake.wait(), stop.wait())
                continue
            if await self.drain():
                wait = FIRST_WAIT
                continue
            await wait_or_stop(stop, wait)
            wait = min(wait * 2, MAX_WAIT)
        await self.close()

    async def drain(self) -> bool:
        """Write the queued rows oldest first; False at the first that still fails."""
        while self._items:
            item = self._items[0]
            try:
                await asyncio.wait_for(item.write(), WRITE_TIMEOUT)
            except TRANSIENT as exc:
                log.warning("backlog.retry what=%s error=%r", item.what, exc)
                return False
            self._items.popleft()
            log.info("backlog.written what=%s", item.what)
        return True

    async def close(self) -> None:
        """Last try within FINAL_BUDGET seconds; whatever is left is logged as lost, and so is
        any write added later."""
        self._closed = True
        try:
            async with asyncio.timeout(FINAL_BUDGET):
                await self.drain()
        except TimeoutError:
            pass  # what is left is logged just below
        while self._items:
            log.error("backlog.lost reason=stopping what=%s", self._items.popleft().what)
