"""A lease or office call bounded by a deadline on the monotonic clock (both offices use it).

Every write that decides leadership (create, update, delete, `take_office`) is awaited only
until a deadline: the self-fence deadline for a renew, a fraction of the TTL for a campaign. At
the deadline the call is cancelled and the caller sees `TimeoutError`; the cancelled call gets
at most `CLEANUP_WAIT` to unwind (a call that ignores its cancellation must not hold the
leadership loop, and with it every renewal, for good).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from scheduler.clock import Clock

T = TypeVar("T")
CLEANUP_WAIT = 1.0  # s at most for a cancelled call to unwind


async def bounded(clock: Clock, aw: Awaitable[T], until: float) -> T:
    """Await `aw`; cancel it and raise TimeoutError at the monotonic instant `until`."""
    task = asyncio.ensure_future(aw)
    timer = asyncio.ensure_future(clock.sleep(until - clock.monotonic()))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        await asyncio.wait({task}, timeout=CLEANUP_WAIT)  # let the cancelled call clean up
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: it failed while it was being cancelled
        raise TimeoutError("deadline passed before the call finished")
    return task.result()
