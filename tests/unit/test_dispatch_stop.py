"""A stop ends the firing loop at once, whatever it is waiting for."""

from __future__ import annotations

import asyncio

from scheduler.clock import FakeClock
from tests.unit.test_armed import T0, firing


async def test_a_stop_ends_an_idle_claim_loop_without_the_clock_moving() -> None:
    """Nothing due: the claim loop sleeps up to a second of the clock between looks. A stop
    must end that sleep (every daemon's stop and every handover waited it out, up to 1 s);
    the fake clock never moves here, so only the stop can end the run."""
    clock = FakeClock(T0)
    f = firing(clock)
    stop = asyncio.Event()
    run = asyncio.create_task(f.run(1, stop))
    for _ in range(20):  # let it reach its wait
        await asyncio.sleep(0)
    assert not run.done()
    stop.set()
    async with asyncio.timeout(2):
        await run
    assert clock.now() == T0
