"""Hardening against outages, on real processes: a nats-server restart under intake, a leader
cut off long enough for its client to reconnect, a leader whose clock runs ahead."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest

from scheduler.daemon.embedded import NatsServer
from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from tests.faults.conftest import StartCluster
from tests.faults.harness import (
    TTL,
    add_target_stream,
    check,
    publish_load,
    wait_delivered,
)
from tests.faults.proxy import FaultProxy
from tests.support.helpers import DaemonRunner

# the lane and intake's consumer as a daemon names them by default (the runners keep them)
LANE_STREAM = str(Settings.model_fields["intake_stream"].default)
INTAKE_CONSUMER = str(Settings.model_fields["intake_consumer"].default)


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


_DELIVERY = re.compile(
    rb"HPUB mq\.fault\.\S+ \S+ \d+ \d+\r\nNATS/1\.0\r\nNats-Msg-Id: (\S+)\r\n"
    rb"Mq-Scheduled-For: \S+\r\nMq-Fired-At: (\S+)\r\n"
)


@dataclass
class DeliveryTap:
    """Deliveries a daemon sends through its proxy: (connection, forwarded at, id, fired at)."""

    seen: list[tuple[int, float, str, datetime]] = field(default_factory=list)
    _tails: dict[int, bytes] = field(default_factory=dict)

    def __call__(self, connection: int, data: bytes) -> None:
        text = self._tails.get(connection, b"") + data
        end = 0
        for m in _DELIVERY.finditer(text):
            fired = datetime.fromisoformat(m[2].decode().replace("Z", "+00:00"))
            self.seen.append((connection, time.monotonic(), m[1].decode(), fired))
            end = m.end()
        self._tails[connection] = text[max(end, len(text) - 400) :]


# nats-py leaves the socket of a reconnect attempt that timed out (the proxy accepted it but,
# blackholed, never sent INFO) unclosed; its writer warns when collected. Not ours to fix.
@pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning")
async def test_a_partitioned_leader_sends_nothing_after_its_lease_not_even_after_reconnect(
    own_nats: NatsServer, database_url: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Two daemons in this process (plain asyncio loop), each behind its own proxy; the
    leader's link has small socket buffers, as over a WAN, so a silent link backs up into the
    client within a second. The link goes silent under 300 tasks/s for long enough that the
    client gives the connection up and reconnects after the heal. Nothing the leader sends
    after the cut was built after its lease could have passed, and nothing at all goes out
    over the connection it opens after the heal (no buffered delivery flushed on reconnect);
    every task arrives once, none early."""
    proxies = [await FaultProxy("127.0.0.1", own_nats.port, 4096, 4096).start() for _ in range(2)]
    # the case under test is a silence the client has not noticed when office ends: with the
    # link watch on (bus/nats/link.py) the link is left a second in, before the lease ends,
    # and nothing is queued then; off, as with SCHEDULER_NATS_STALE_AFTER=0, it is
    runners = [
        DaemonRunner(
            settings.with_overrides(
                nats_url=p.url, instance_id=f"d{i}", lease_ttl=TTL, nats_stale_after=0
            )
        )
        for i, p in enumerate(proxies)
    ]
    try:
        daemons = [await r.start() for r in runners]
        await _partition_the_leader(own_nats, proxies, daemons)
        said = [r.getMessage() for r in caplog.records]
        # the case under test happened: deliveries were queued in the client when office ended
        # (in its socket's buffer, written there at once; or in nats-py's, before that change)
        queued = ("publisher.dropped_unsent", "publisher.cut_backlog")
        assert any(m.startswith(queued) for m in said), said
    finally:
        for r in runners:
            await r.stop()
        for proxy in proxies:
            await proxy.close()


async def _leader(daemons: list[Daemon], within: float) -> Daemon:
    async with asyncio.timeout(within):
        while True:
            leading = [d for d in daemons if d.office is not None and d.office.may_act()]
            if len(leading) == 1:
                return leading[0]
            await asyncio.sleep(0.02)


async def _partition_the_leader(
    own_nats: NatsServer, proxies: list[FaultProxy], daemons: list[Daemon]
) -> None:
    await add_target_stream(own_nats.url)
    leader = await _leader(daemons, 10)
    link = proxies[daemons.index(leader)]
    tap = DeliveryTap()
    link.tap = tap
    start = datetime.now(UTC) + timedelta(seconds=2)
    expected = await publish_load(own_nats.url, start, 3000, 1 / 300)  # 300/s for 10 s
    # The leader must hold the load before its link goes silent (intake pulls over that link
    # too): on a loaded host intake still took the lane when the cut came, the leader had
    # nothing left to send after it, and the case under test never happened.
    await _taken_in(own_nats.url, within=20)
    await asyncio.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds() + 2.0))
    left = (start + timedelta(seconds=10) - datetime.now(UTC)).total_seconds()
    assert left > TTL + 1, f"the load is nearly over before the cut ({left:.1f} s left)"
    # fault injection on the leader's own socket: a small send buffer, as on a WAN path
    sock = leader.bus.nc._transport._io_writer.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    connections_at_cut = link.connections
    cut_wall, cut = datetime.now(UTC), time.monotonic()
    link.blackhole()
    await _leader([d for d in daemons if d is not leader], 3 * TTL)
    await asyncio.sleep(max(0.0, 3 * TTL - (time.monotonic() - cut)))  # the client gives up
    link.heal()
    verdict = await _settle(own_nats.url, expected)
    assert verdict.lost == [] and verdict.doubled == [] and verdict.early == [], str(verdict)
    after_cut = [d for d in tap.seen if d[1] >= cut]
    built_late = [d for d in after_cut if d[3] > cut_wall + timedelta(seconds=TTL)]
    flushed_on_reconnect = [d for d in after_cut if d[0] > connections_at_cut]
    assert link.connections > connections_at_cut, "the zombie never reconnected"
    assert flushed_on_reconnect == [], (
        f"{len(flushed_on_reconnect)} deliveries flushed over the new connection"
    )
    assert built_late == [], f"{len(built_late)} deliveries built after the lease"


async def _taken_in(nats_url: str, within: float) -> None:
    """Wait until intake stored (acknowledged) everything on the delay lane."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        async with asyncio.timeout(within):
            while True:
                info = await js.consumer_info(LANE_STREAM, INTAKE_CONSUMER)
                if info.num_pending == 0 and info.num_ack_pending == 0:
                    return
                await asyncio.sleep(0.05)
    finally:
        await nc.close()


async def _settle(nats_url: str, expected: dict[str, datetime]) -> Any:
    await wait_delivered(nats_url, len(expected), within=30)
    await asyncio.sleep(1.0)  # a late duplicate would be stored by now
    return await check(nats_url, expected, late_after=30)
