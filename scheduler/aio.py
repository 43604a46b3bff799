"""Small asyncio helpers shared by the loops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


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
