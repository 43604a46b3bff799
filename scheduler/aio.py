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
