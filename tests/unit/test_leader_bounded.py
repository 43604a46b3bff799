"""The bounded lease and office calls both offices make (`scheduler.leadership.bounded`)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import asyncpg
import pytest
from nats.js.kv import KeyValue

from scheduler.clock import SystemClock
from scheduler.leadership.bounded import CLEANUP_WAIT
from scheduler.leadership.election import Leadership
from scheduler.leadership.partitioned import PartitionedLeadership
from scheduler.metrics import Metrics
from scheduler.settings import Settings


async def stubborn(finished: asyncio.Event) -> int:
    """A call that ignores its first cancellation and runs on for 2.5 s (a client library
    unwinding slowly): the caller must not wait for it beyond the cleanup bound."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        await asyncio.sleep(2.5)
    finished.set()
    return 1


def offices() -> list[Leadership | PartitionedLeadership]:
    kv, pool, clock = cast(KeyValue, None), cast(asyncpg.Pool, None), SystemClock()
    single = Settings(instance_id="a", lease_ttl=3)
    parted = single.with_overrides(partitions=4)
    return [
        Leadership(kv, pool, single, clock, Metrics()),
        PartitionedLeadership(kv, pool, parted, clock, Metrics()),
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["single", "partitioned"])
async def test_a_call_past_its_deadline_is_given_up_within_the_cleanup_bound(which: int) -> None:
    """Either office's bounded call raises TimeoutError at its deadline, and a call that does
    not stop when cancelled holds it at most CLEANUP_WAIT more, not until it finishes."""
    office = offices()[which]
    finished = asyncio.Event()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2.4):
            if isinstance(office, Leadership):
                await office._bounded(stubborn(finished), within=0.1)
            else:
                await office._bounded(stubborn(finished), time.monotonic() + 0.1)
    took = time.monotonic() - t0
    assert took < 0.1 + CLEANUP_WAIT + 0.3, f"held {took:.2f} s"
    assert not finished.is_set()
    await asyncio.wait_for(finished.wait(), 3)  # (it ends on its own, within the test)
