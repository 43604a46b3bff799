"""Node losses on a 3-node JetStream cluster under load: two daemons (`scheduler run`) with
every stream and bucket at 3 replicas, a producer that resends a publish with no PubAck, probes
timing the broker's own outage (target stream, lease bucket, lane and its consumer); then the node
leading the delay lane, the target stream or the lease bucket is SIGKILLed, or the lane's leader
is SIGSTOPped. Nothing is lost, doubled or early, and tasks due more than a second after the
broker takes writes again are on time."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import nats
import pytest
from nats.js.api import StorageType, StreamConfig

from tests.faults.harness import Cluster
from tests.support.cluster import NatsCluster, Node
from tests.support.cluster_load import (
    ConsumerProbe,
    NodeProbes,
    Probe,
    Producer,
    lateness,
    p99,
)
from tests.support.timeline import read_trace, timeline

TARGET = "CLFAULTS"
RATE = 100.0  # tasks/s
LEAD = 1.5  # s between a task's publish and its due time
STOP_FOR = 6.0  # s a frozen node stays stopped
AFTER = 4.0  # s of load after the broker took writes again
# The target is p99 <= 25 ms on an idle host (bench/cluster_faults.py measures it); on
# the shared 2-core test host, with the daemons, three servers and the load on it, 20x that.
ADDED_P99_MS = 500.0
# A frozen node is not a dead one: its sockets stay open and answer nothing. The daemon's link
# watch (scheduler/bus/nats/link.py) leaves it a second into the silence; a lease renewal,
# publishes and lane deliveries that went out on it are sent again or read back on the new link
# (leadership/lease.py, bus/nats/publisher.py, bus/nats/puller.py), and a renewal the node
# forwards when it resumes is taken back rather than waited out. The frozen node is the one
# the leader's engine is on, the worst case (the probes and the producer are on the other two,
# so they time the broker's own outage, not their own link's). Measured 2026-12-03 (8 runs
# after those fixes, a busy host): 1.9-2.8 ms added p99; before them 2 runs in 8 were 8.5 s
# late (lost deliveries back only after the lane's 10 s ack wait). Same bound as the others.
# Issue 36, 2026-12-03, host at load 6-7 (another developer's Spark beside it): when the frozen
# node also led the lease bucket the standby's campaign waited nats-py's 5 s timeout on it
# (1,784 ms), and an old term's fenced write deposed the new one (1,572 ms); with both fixed,
# 30, 56, 351 and 24 ms in four runs (the 351: the lane deliveries handed to the frozen node
# read back 0.74 s after the new term began). The daemons run at DEBUG, so a failure prints
# where the late tasks waited (tests/support/timeline.py).
# 2026-12-07 (CI): after the frozen node's thaw the daemons' lease writes were answered 503 for
# 4-5 s while the probes saw no outage at all: the old term lapsed, a new one began once the
# bucket answered, and the test called 3.6 s of the broker's outage ours. A thawed node can
# make a raft group elect again as it resumes (seen on a plain cluster here: 0.15-0.66 s in 4
# of 6 freezes, in groups it did not lead), and a node's clients can see an outage a client
# of another node does not. The probes now also run on a connection pinned to each node
# (`NodeProbes`), and the outage counted is the longest seen by the cluster-wide probes and by
# those of the nodes the daemons' engines are on at the end. Not proven to be CI's case: the
# failure output now says which node each engine is on, when each node's probes were answered
# again, and what the nodes logged.
STREAMS = ("MQ_DELAY", TARGET, "KV_scheduler_leader")
SHOW_LATE = 30  # late tasks whose timeline a failure prints

StartCluster = Callable[..., Awaitable[Cluster]]


async def _fault(cluster: NatsCluster, fault: str, frozen: Node | None) -> float:
    """Kill the node leading the fault's stream, or freeze `frozen` for STOP_FOR s; the wall
    time the fault took effect (a probe sent before it may still succeed, so `at` is after the
    signal)."""
    if frozen is None:
        stream = {"lane": "MQ_DELAY", "target": TARGET}.get(fault, "KV_scheduler_leader")
        cluster.kill(await asyncio.to_thread(cluster.stream_leader, stream))
        return time.time()
    node = frozen
    cluster.freeze(node)
    at = time.time()
    await asyncio.sleep(STOP_FOR)
    cluster.thaw(node)
    return at


async def _recovered(
    producer: Producer, probes: list[Probe], at: float, within: float = 25.0
) -> None:
    """Wait until the target stream, the lease bucket and the lane's consumer (the probes) answer
    and the lane (the producer) took writes again after `at`."""
    async with asyncio.timeout(within):
        while True:
            if None not in [p.first_after(at) for p in probes] + [producer.first_ack_after(at)]:
                return
            await asyncio.sleep(0.05)


def _outage_end(producer: Producer, probes: list[Probe], at: float) -> float:
    """The end of the broker's own outage: the last of the probes' and the lane's returns."""
    times = [p.back_after(at) for p in probes] + [producer.back_after(at)]
    return max(t for t in times if t is not None)


async def _enough_after(
    producer: Producer, probes: list[Probe], at: float, within: float = 30.0
) -> None:
    """Keep the load on until RATE * AFTER tasks are due over a second after the outage's end as
    measured so far: a probe gap late in the load (a loaded host) moves that end later, and
    the load planned from the expected end left too few tasks to judge (110 of 200, seen)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        end = _outage_end(producer, probes, at) + 1.0
        due = [t + producer.lead for t in producer.first_sent.values()]
        if sum(d > end for d in due) >= RATE * AFTER:
            return
        await asyncio.sleep(0.25)


async def _delivered(urls: list[str], ids: set[str], within: float = 20.0) -> dict[str, Any]:
    """What the target stream holds once every id in `ids` is in (or `within` passed)."""
    deadline = time.monotonic() + within
    while True:
        seen = await lateness(urls, TARGET)
        if ids <= set(seen) or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("fault", ["lane", "target", "kv", "sigstop"])
async def test_a_node_loss_costs_no_more_than_the_brokers_own_outage(
    fault: str,
    nats_cluster: NatsCluster,
    database_url: str,
    start_cluster: StartCluster,
) -> None:
    """Through the fault every accepted task is delivered once and none early; those due over
    a second after the broker took writes again are late by at most ADDED_P99_MS at p99."""
    cluster = nats_cluster
    setup = await nats.connect(cluster.urls)
    await setup.jetstream().add_stream(
        StreamConfig(name=TARGET, subjects=["mq.clfault.>"], num_replicas=3,
                     storage=StorageType.FILE, duplicate_window=120)
    )  # fmt: skip
    await setup.close()
    daemons = await start_cluster(  # DEBUG: each task's steps (scheduler.engine.delayed.trace)
        [cluster.url, cluster.url], database_url, SCHEDULER_STREAM_REPLICAS="3",
        SCHEDULER_LOG_LEVEL="DEBUG",
    )  # fmt: skip
    frozen = None
    if fault == "sigstop":
        leader = await daemons.leader()
        name = f"mq-scheduler {leader.name} engine"
        frozen = await asyncio.to_thread(cluster.client_node, name)
    urls = [n.url for n in cluster.nodes if n is not frozen]
    nc = await nats.connect(urls, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
    stop = asyncio.Event()
    loops: list[asyncio.Task[None]] = []
    pinned: dict[str, NodeProbes] = {}
    try:
        for node in cluster.nodes:
            if node is not frozen:
                pinned[node.name] = await NodeProbes.open(
                    node.name, node.url, ["mq.clfault.probe", "$KV.scheduler_leader.probe"],
                    ("MQ_DELAY", "scheduler-intake"),
                )  # fmt: skip
        js = nc.jetstream()
        for stream in STREAMS:
            await asyncio.to_thread(cluster.replicas_current, stream)
        producer = await Producer(nc, "mq.delay.clfault.work", RATE, LEAD).start()
        probes = [
            Probe(js, "mq.clfault.probe"),
            Probe(js, "$KV.scheduler_leader.probe"),
            ConsumerProbe(js, "MQ_DELAY", "scheduler-intake"),
        ]
        each_node = [p for node in pinned.values() for p in node.probes]
        loops = [asyncio.create_task(p.run(stop)) for p in probes + each_node]
        loops.append(asyncio.create_task(producer.run(stop)))
        await asyncio.sleep(2.0)
        at = await _fault(cluster, fault, frozen)
        await _recovered(producer, probes, at)
        await asyncio.sleep(AFTER)
        await _enough_after(producer, probes + each_node, at)
        stop.set()
        await asyncio.gather(*loops)
        # the broker's outage as the daemons' nodes saw it too: their links are on one node each
        linked = await asyncio.to_thread(_engine_nodes, cluster, daemons)
        seen_there = [p for name in linked if name in pinned for p in pinned[name].probes]
        recovered = _outage_end(producer, probes + seen_there, at)
        per_node = {name: node.back_after(at) for name, node in pinned.items()}
        assert await producer.settle(10) == 0
        await asyncio.to_thread(cluster.heal)
        seen = await _delivered(cluster.urls, producer.accepted)
    finally:
        stop.set()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await nc.close()
        for probed in pinned.values():
            await probed.close()
    lost = [t for t in producer.accepted if t not in seen]
    assert lost == [], f"{len(lost)} accepted tasks never delivered: {lost[:5]}"
    doubled = [t for t in producer.accepted if len(seen[t][1]) > 1]
    early = [t for t in producer.accepted if min(seen[t][1]) < 0]
    judged = [t for t in producer.accepted if seen[t][0] > recovered + 1.0]
    after = [seen[t][1][0] for t in judged]
    outage = recovered - at
    assert doubled == [] and early == [], f"doubled {doubled[:5]}, early {early[:5]}"
    assert len(after) >= RATE * (AFTER - 2), f"only {len(after)} tasks due after the outage"
    added = p99(after)
    views = ", ".join(
        f"{name}{'*' if name in linked else ''} {'-' if end is None else f'+{end - at:.2f}'}"
        for name, end in per_node.items()
    )
    print(
        f"{fault}: broker out {outage:.2f} s (back per node, * engines on it: {views}); "
        f"added p99 {added:.1f} ms ({len(after)} tasks)"
    )
    late = ""
    if added > 25:
        late = _where_late(judged, seen, producer, daemons, at, recovered)
        late += "\n" + _where_linked(cluster, linked, at)
    if late:
        print(late)
    assert added <= ADDED_P99_MS, (
        f"{fault}: broker out {outage:.2f} s ({views}); tasks due after it p99 {added:.0f} ms "
        f"late\n{late}"
    )


def _where_late(
    judged: list[str],
    seen: dict[str, Any],
    producer: Producer,
    daemons: Cluster,
    at: float,
    recovered: float,
) -> str:
    """The timeline of the latest of the judged tasks (tests/support/timeline.py), with the
    fault's and the recovery's times, so a failure says where the time went."""
    worst = sorted(judged, key=lambda t: seen[t][1][0])[-SHOW_LATE:]
    shown = sorted(worst, key=lambda t: seen[t][0])
    due = {t: seen[t][0] for t in shown}
    stored = {t: seen[t][0] + seen[t][1][0] / 1000 for t in shown}
    trace = read_trace(m.log_path for m in daemons.members)
    table = timeline(shown, due, stored, trace, producer.first_sent, producer.ack_of, at)
    return (
        f"fault at {at:.3f}, broker back at {recovered:.3f} (+{recovered - at:.2f} s); the "
        f"{len(shown)} latest tasks due after +1 s, ms from each one's due time (the producer's "
        "send and PubAck, the lane's store, intake's take and commit, the claim, the hand-over "
        "to the publisher, its answer, the target's store; where: daemon:lane seq/consumer seq "
        f"(0: read back)/deliveries):\n{table}\n"
        f"the daemons' link, intake and puller lines from 1 s before the fault, s after it:\n"
        f"{_link_lines(daemons, at)}"
    )


_SERVER_STAMP = re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}) ")
_SERVER_NOISE = re.compile(r"\[DBG\]|\[TRC\]")


def _engine_nodes(cluster: NatsCluster, daemons: Cluster) -> dict[str, str]:
    """{node name: daemon names} of the nodes the daemons' engine connections are on now."""
    found = cluster.nodes_of(f"mq-scheduler {m.name} engine" for m in daemons.members)
    on: dict[str, str] = {}
    for client, node in found.items():
        name = client.split()[1]
        on[node] = f"{on[node]}, {name}" if node in on else name
    return on


def _where_linked(cluster: NatsCluster, linked: dict[str, str], at: float, most: int = 80) -> str:
    """Which node each daemon's engine connection was on at the end of the load (`linked`,
    `_engine_nodes`), and what the nodes' own logs say from a second before the fault on
    (leader elections, routes, stale clients): whether a daemon's 503s were the broker's
    everywhere or one node's."""
    on = [f"{who} on {node}" for node, who in linked.items()]
    out: list[tuple[float, str]] = []
    for node in cluster.nodes:
        try:
            text = (node.store / "nats-server.log").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            stamp = _SERVER_STAMP.match(line)
            if stamp is None or _SERVER_NOISE.search(line):
                continue
            t = datetime.strptime(stamp[1], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if t >= at - 1.0:
                out.append((t, f"{t - at:+7.3f} {node.name}: {line[stamp.end() :][:200]}"))
    out.sort()
    kept: list[str] = []
    last, alike = "", 0  # a line like the one before (the same but for numbers) is counted
    for _, line in out:
        shape = re.sub(r"\d+", "#", line[8:])
        if shape == last:
            alike += 1
            continue
        if alike:
            kept.append(f"        ... and {alike} more like it")
        kept.append(line)
        last, alike = shape, 0
    if alike:
        kept.append(f"        ... and {alike} more like it")
    lines = "\n".join(kept[:most]) or "(none)"
    return f"engine links: {', '.join(on)}; the nodes' logs, s after the fault:\n{lines}"


_LINK = re.compile(r"puller\.|intake\.|nats\.|link\.|leader\.|engine\.term")
_NOISE = re.compile(r"trace\.|puller\.pull ")  # a line per task or per pull: not the story
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _link_lines(daemons: Cluster, at: float, most: int = 120) -> str:
    """What the daemons' logs say about their link, intake's pulls and the lease from a second
    before the fault on (the test's failure says whether a pull waited out its expiry)."""
    out: list[tuple[float, str]] = []
    for member in daemons.members:
        try:
            text = member.log_path.read_text(errors="replace")
        except OSError:
            continue
        said = "\0"  # a campaign lost again for the same reason is not news
        for line in text.splitlines():
            stamp = _STAMP.match(line)
            if stamp is None or not _LINK.search(line) or _NOISE.search(line):
                continue
            if "leader.campaign_lost" in line:
                if line.endswith(said):
                    continue
                said = line[line.find("error=") :]
            else:
                said = "\0"
            t = datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t >= at - 1.0:
                out.append((t, f"{t - at:+7.3f} {member.name}: {line[stamp.end() :][:200]}"))
    out.sort()
    return "\n".join(line for _, line in out[:most]) or "(none)"
