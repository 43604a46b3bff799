"""Hardening against outages, on real processes: a nats-server restart under intake, a leader
cut off long enough for its client to reconnect, a leader whose clock runs ahead."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import nats

from scheduler.embedded import NatsServer
from tests.faults.conftest import StartCluster
from tests.faults.harness import add_target_stream, check, publish_load, wait_delivered


async def restart_right_after_a_renew(server: NatsServer, bucket: str = "scheduler_leader") -> None:
    """Restart nats-server just after the leader renewed its lease, so the outage (about a
    second) falls between two renews and the leader keeps office through it."""
    nc = await nats.connect(server.url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        watcher = await kv.watch("leader")
        try:
            async with asyncio.timeout(30):
                async for entry in watcher:
                    if entry is not None and entry.delta == 0 and entry.revision > 2:
                        break  # a live update (a renew), not the initial value
        finally:
            await watcher.stop()
    finally:
        await nc.close()
    await asyncio.to_thread(server.stop)
    await asyncio.to_thread(server.start)


async def test_intake_resumes_at_once_after_a_nats_server_restart(
    own_nats: NatsServer, database_url: str, start_cluster: StartCluster
) -> None:
    """nats-server restarts under a leader whose intake is idle (lease TTL 10 s, so it keeps
    office through the restart): its pull requests vanish with the old connection. Tasks
    published after the restart, due at once, are delivered within a few seconds (the intake
    re-issues its pulls on reconnect), and the outage never crashes the intake."""
    cluster = await start_cluster([own_nats.url], database_url, SCHEDULER_LEASE_TTL="10")
    await add_target_stream(own_nats.url)
    leader = await cluster.leader()
    epoch = (await leader.readyz() or {}).get("epoch")
    await asyncio.sleep(1.0)  # intake idle, its long poll outstanding
    await restart_right_after_a_renew(own_nats)
    async with asyncio.timeout(10):
        while "nats.reconnected" not in leader.log_text():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    started = time.monotonic()
    expected = await publish_load(own_nats.url, datetime.now(UTC), 50, 0.0)
    held = await wait_delivered(own_nats.url, len(expected), within=25)
    took = time.monotonic() - started
    verdict = await check(own_nats.url, expected, late_after=25)
    assert held == len(expected), f"{held} of {len(expected)} delivered\n{cluster.logs()}"
    assert (await leader.readyz() or {}).get("epoch") == epoch, "office changed hands"
    assert took < 4.0, f"intake stalled {took:.1f} s after the restart\n{cluster.logs()}"
    assert verdict.lost == [] and verdict.doubled == [] and verdict.early == []
    log = leader.log_text()
    assert "intake.failed" not in log and "engine.term_failed" not in log, cluster.logs()
