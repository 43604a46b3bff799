"""A value read once and shared by every caller for a few seconds (`SharedRead`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from scheduler.clock import Clock

__all__ = ["SLOW_FACTOR", "SharedRead"]

T = TypeVar("T")
SLOW_FACTOR = 10.0


class SharedRead(Generic[T]):
    """One value read at a time and kept for `max_age` seconds (or SLOW_FACTOR times as long
    as the read took): callers meanwhile await the read in flight or take the kept value. A
    caller that gives up does not cancel the read the others await; a failed read is kept by
    nobody (every caller waiting on it gets its error, the next caller reads again)."""

    def __init__(self, clock: Clock, max_age: float) -> None:
        self.clock = clock
        self.max_age = max_age
        self.reads = 0  # rounds actually read (for tests and metrics)
        self._value: T | None = None
        self._fresh_until = 0.0
        self._pending: asyncio.Future[T] | None = None

    async def get(self, read: Callable[[], Awaitable[T]]) -> T:
        if self._value is not None and self.clock.monotonic() < self._fresh_until:
            return self._value
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._read(read))
            # retrieved here so that a read every caller gave up on logs no "never retrieved"
            self._pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(self._pending)

    async def _read(self, read: Callable[[], Awaitable[T]]) -> T:
        started = self.clock.monotonic()
        try:
            value = await read()
        finally:
            self._pending = None
        took = self.clock.monotonic() - started
        self.reads += 1
        self._value = value
        self._fresh_until = self.clock.monotonic() + max(self.max_age, SLOW_FACTOR * took)
        return value
