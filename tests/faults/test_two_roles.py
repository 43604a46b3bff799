"""The two roles of `scheduler run` as real processes: the engine (the process `scheduler run`
is) listens on no port; the edge (its child) serves HTTP and metrics; a SIGKILL of either is
survived: the edge comes back on its ports without touching firing, an engine's death takes
its edge with it and the standby leads; a stopped engine shows as such on its edge's /readyz."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from datetime import UTC, datetime, timedelta

import psutil

from scheduler.daemon.embedded import NatsServer
from scheduler.daemon.pair import STALE_AFTER
from tests.faults.conftest import StartCluster
from tests.faults.harness import DaemonProc, add_target_stream, check, publish_load, wait_delivered

# Bounds with their reasons: a restarted edge is a new Python process (imports ~1 s on a busy
# 2-core host); tasks due during the edge's absence are fired by the engine as usual, so their
# lateness bound is the fault suite's ordinary one.
EDGE_BACK_WITHIN = 15.0
LATE_AFTER = 1.0
# The orphaned edge gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops gracefully
# (1.5 s measured on a loaded 2-core host: the service, the pools, the NATS drain).
EDGE_GONE_WITHIN = 10.0


def gone(proc: psutil.Process) -> bool:
    """Ended (a zombie not yet reaped by whoever adopted it counts as ended)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def edge_of(member: DaemonProc, within: float = 10.0) -> psutil.Process:
    """The edge child of a `scheduler run` process (fails when there is none in time)."""
    parent = psutil.Process(member.pid)
    async with asyncio.timeout(within):
        while True:
            kids = [c for c in parent.children() if "--role" in c.cmdline()]
            if kids:
                return kids[0]
            await asyncio.sleep(0.05)


def listening_ports(proc: psutil.Process) -> set[int]:
    return {c.laddr.port for c in proc.net_connections(kind="inet") if c.status == "LISTEN"}


def fetch(url: str, host: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def test_the_engine_listens_on_nothing_and_the_edge_serves_both_roles(
    own_nats: NatsServer, database_url: str, start_cluster: StartCluster
) -> None:
    """The engine process has no listening socket; its edge child has the API and metrics
    ports, answers /readyz with both roles and /metrics with the engine's own series (role
    label), and refuses a Host the API would refuse on the metrics port too."""
    every = {"SCHEDULER_METRICS_EXPORT_INTERVAL": "0.5s"}
    cluster = await start_cluster([own_nats.url], database_url, **every)
    await add_target_stream(own_nats.url)
    (member,) = cluster.members
    expected = await publish_load(own_nats.url, datetime.now(UTC) + timedelta(seconds=1), 20, 0.01)
    assert await wait_delivered(own_nats.url, len(expected), 15) == len(expected)
    engine, edge = psutil.Process(member.pid), await edge_of(member)
    assert listening_ports(engine) == set(), "the engine must serve nothing"
    assert edge.nice() == engine.nice() + 10  # SCHEDULER_EDGE_NICE: below the engine's priority
    metrics_port = int(member.env["SCHEDULER_METRICS_PORT"])
    assert {member.port, metrics_port} <= listening_ports(edge)
    body = await member.readyz()
    assert body is not None and body["ready"] is True and body["role"] == "leader"
    assert body["roles"]["engine"]["pid"] == member.pid and body["roles"]["edge"]["ready"]
    await asyncio.sleep(1.0)  # one metrics export after the last delivery (0.5 s here)
    status, text = await asyncio.to_thread(fetch, f"http://127.0.0.1:{metrics_port}/metrics")
    assert status == 200
    fired = [
        line
        for line in text.decode().splitlines()
        if line.startswith('mq_scheduler_fired_total{role="engine",kind="delayed"}')
    ]
    assert fired and float(fired[0].split()[-1]) >= len(expected), fired
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    status, _ = await asyncio.to_thread(fetch, url, "rebound.example")
    assert status == 400  # open mode: the API's Host guard, on the metrics port as well


async def test_a_killed_edge_comes_back_on_its_ports_and_firing_never_waits(
    own_nats: NatsServer, database_url: str, start_cluster: StartCluster
) -> None:
    """SIGKILL of the edge while tasks fall due: every task is delivered once and on time by
    the engine, and `scheduler run` starts a new edge on the same ports."""
    cluster = await start_cluster([own_nats.url], database_url)
    await add_target_stream(own_nats.url)
    (member,) = cluster.members
    first = await edge_of(member)
    due = datetime.now(UTC) + timedelta(seconds=1)
    expected = await publish_load(own_nats.url, due, 200, 0.02)  # 4 s of tasks falling due
    await asyncio.sleep(1.5)
    first.send_signal(signal.SIGKILL)
    assert await wait_delivered(own_nats.url, len(expected), 20) == len(expected)
    verdict = await check(own_nats.url, expected, LATE_AFTER)
    assert (verdict.delivered, verdict.lost, verdict.doubled, verdict.early, verdict.late) == (
        len(expected),
        [],
        [],
        [],
        [],
    ), str(verdict)
    async with asyncio.timeout(EDGE_BACK_WITHIN):
        while True:
            body = await member.readyz()
            if body is not None and body.get("ready"):
                break
            await asyncio.sleep(0.1)
    second = await edge_of(member)
    assert second.pid != first.pid and member.alive()
    assert "edge.exited" in member.log_text()


async def test_a_killed_engine_takes_its_edge_with_it_and_the_standby_leads(
    own_nats: NatsServer, database_url: str, start_cluster: StartCluster
) -> None:
    """SIGKILL of the leading `scheduler run`: its edge child ends too (no orphan serving a
    dead engine's state), and the other instance takes office."""
    cluster = await start_cluster([own_nats.url] * 2, database_url)
    leader = await cluster.leader()
    edge = await edge_of(leader)
    leader.signal(signal.SIGKILL)
    async with asyncio.timeout(EDGE_GONE_WITHIN):
        while gone(edge) is False:  # noqa: ASYNC110 (another process, no event to await)
            await asyncio.sleep(0.05)
    successor = await cluster.leader(within=15, exclude=leader)
    assert successor is not leader


async def test_a_stopped_engine_shows_on_its_edge_then_recovers(
    own_nats: NatsServer, database_url: str, start_cluster: StartCluster
) -> None:
    """SIGSTOP of the engine: within STALE_AFTER its edge answers /readyz 503 with the engine
    unknown (never the last role it heard); after SIGCONT, 200 again."""
    cluster = await start_cluster([own_nats.url], database_url)
    (member,) = cluster.members
    member.signal(signal.SIGSTOP)
    try:
        async with asyncio.timeout(STALE_AFTER + 5):
            while True:
                body = await member.readyz()
                if body is not None and body["roles"]["engine"]["state"] == "unknown":
                    break
                await asyncio.sleep(0.1)
        assert body["ready"] is False and body["role"] == "unknown"
    finally:
        member.signal(signal.SIGCONT)
    # Ready again, and leading again: stopped past its lease, it first comes back a standby
    # (ready, seen on a busy host) and then takes office again.
    async with asyncio.timeout(10):
        while not (  # noqa: ASYNC110
            (body := await member.readyz()) and body.get("ready") and body["role"] == "leader"
        ):
            await asyncio.sleep(0.1)
