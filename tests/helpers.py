"""Small bounded-wait helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_until(predicate: Callable[[], bool], within: float = 3.0) -> None:
    """Poll `predicate` until it is true; fail the test after `within` seconds."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 (state owned by other libraries, no event to await)
            await asyncio.sleep(0.01)
