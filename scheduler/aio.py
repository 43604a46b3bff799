"""Small asyncio helpers shared by the loops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar


async def first_of(*waits: Awaitable[object]) -> None:
    """Wait until any of `waits` finishes, then cancel the others."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in futures:
            fut.cancel()


class Backoff:
    """Waits between attempts to reach a service at start: 0.2 s doubling to 5 s, within a
    budget of `budget` seconds counted from creation."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.attempt = 0
        self._delay = 0.2
        self._deadline = asyncio.get_running_loop().time() + budget

    @property
    def left(self) -> float:
        """Seconds of the budget left (0 or less: spent)."""
        return self._deadline - asyncio.get_running_loop().time()

    @property
    def next_wait(self) -> float:
        return max(0.0, min(self._delay, self.left))

    async def wait(self) -> None:
        await asyncio.sleep(self.next_wait)
        self._delay = min(self._delay * 2, 5.0)


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds` (event-loop time), or less when `stop` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass


# -- how long a piece of work held PostgreSQL connections -----------------------------------
# Measured by the store (`scheduler.store.postgres.connect.PostgresStore.timed`), read by whoever
# asked for the work (a management API listing pays for it: `scheduler.api.gate`); here, not in
# the store, so that the operator half reads it without importing the store (test_layers).


class ConnectionUse:
    """Seconds pooled connections were held (waiting for one not counted) by the code that
    measured it and the tasks it started (`measuring_use`)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


_use: ContextVar[ConnectionUse | None] = ContextVar("postgres_connection_use", default=None)


@contextmanager
def measuring_use() -> Iterator[ConnectionUse]:
    """Within: every connection use the store reports (`held`) from this task, or from the
    tasks it starts, adds to the yielded `ConnectionUse`: what a management API listing is
    charged for, so neither its wait for a connection nor its work outside its queries
    counts."""
    used = ConnectionUse()
    token = _use.set(used)
    try:
        yield used
    finally:
        _use.reset(token)


def held(seconds: float) -> None:
    """A connection was held for `seconds` (its wait for it left out): added to the measure
    open in this context, if any."""
    used = _use.get()
    if used is not None:
        used.seconds += seconds
