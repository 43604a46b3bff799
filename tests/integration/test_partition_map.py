"""The partition map operators see (`GET /v1/leader`, `scheduler.v1.leader`, the edge's
gauges) against a real nats-server and PostgreSQL: read from the lease bucket, every value
checked (docs/leadership.md, "The partition map")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import nats
import pytest
from nats.aio.client import Client

from scheduler.bus.nats.connection import ensure_bucket
from scheduler.daemon.edge import MAP_CACHE
from scheduler.daemon.lifecycle import Daemon
from scheduler.leadership.partition_map import UNKNOWN, PartitionLease, read_partition_map
from scheduler.leadership.partitioned import PartitionedLeadership
from scheduler.settings import Settings
from tests.integration.test_daemon import aget
from tests.support.helpers import DaemonRunner
from tests.support.partitioned import partitioned_pool_fixture

P = 8


pool = partitioned_pool_fixture(P)


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    nc = await nats.connect(settings.nats_servers)
    yield nc
    await nc.close()


async def test_the_map_reads_every_lease_and_shows_a_malformed_one_as_unknown(
    settings: Settings, nc: Client
) -> None:
    """Leases written by hand, some not an engine's: partition 0 shows its owner, epoch and
    since; a value that is not JSON, not an object, names no printable instance, or is over
    the size bound shows owner `unknown`; a wrong epoch or since shows as none; keys of other
    partitions or no partition are left out; partitions without a key have no owner."""
    js = nc.jetstream()
    await ensure_bucket(js, "map_test", 60)
    kv = await js.key_value("map_test")
    good = {"instance": "eng-a", "epoch": 7, "since": "2026-12-01T10:00:00+01:00", "run": "x"}
    await kv.put("p.0", json.dumps(good).encode())
    await kv.put("p.1", b"\xff not json")
    await kv.put("p.2", b"[1, 2]")
    await kv.put("p.3", json.dumps({"instance": 42, "epoch": 3}).encode())
    await kv.put("p.4", json.dumps({"instance": "eng-a", "pad": "x" * 2000}).encode())
    odd = {"instance": "eng-b", "epoch": True, "since": "yesterday"}
    await kv.put("p.5", json.dumps(odd).encode())
    await kv.put("p.6", json.dumps({"instance": "eng-b\x1b[31m"}).encode())
    await kv.put("p.99", json.dumps(good).encode())  # not a partition of P = 8
    await kv.put("p.07", json.dumps(good).encode())  # not how a key is written
    await kv.put("leader", json.dumps(good).encode())  # P = 1's key
    read = await read_partition_map(kv, P)
    assert read.readable and read.count == P
    assert read.leases[0] == PartitionLease(0, "eng-a", 7, "2026-12-01T09:00:00.000Z")
    assert [lease.owner for lease in read.leases[1:5]] == [UNKNOWN] * 4
    assert read.leases[5] == PartitionLease(5, "eng-b", None, None)
    assert read.leases[6].owner == UNKNOWN and read.leases[7] == PartitionLease(7, None)
    assert read.engines() == {"eng-a": [0], "eng-b": [5], UNKNOWN: [1, 2, 3, 4, 6]}
    assert read.unowned() == [7]
    one = await read_partition_map(kv, 1)
    assert one.leases == (PartitionLease(0, "eng-a", 7, "2026-12-01T09:00:00.000Z"),)
    await kv.delete("p.0")
    assert (await read_partition_map(kv, P)).leases[0].owner is None


async def test_an_unreachable_bucket_gives_a_map_that_says_so(
    settings: Settings, nc: Client
) -> None:
    """A bucket that is gone answers a map marked unreadable, every owner none, not an error."""
    js = nc.jetstream()
    await ensure_bucket(js, "map_gone", 60)
    kv = await js.key_value("map_gone")
    await js.delete_key_value("map_gone")
    read = await read_partition_map(kv, P, timeout=0.5)
    assert not read.readable and read.unowned() == list(range(P))


def lead(d: Daemon) -> PartitionedLeadership:
    assert isinstance(d.leadership, PartitionedLeadership)
    return d.leadership


async def test_two_engines_show_their_terms_in_the_map_on_http_nats_and_metrics(
    settings: Settings, pool: asyncpg.Pool, nc: Client
) -> None:
    """Two daemons over P = 8: once shared out, `GET /v1/leader` on either names each
    partition's owner with its term's epoch, each engine's share as its term, no partition
    unowned and no single leader; `scheduler.v1.leader` answers the same; the edge's gauges
    count each owner's partitions and the engines' their own term and moves."""
    base = settings.with_overrides(partitions=P, horizon=timedelta(seconds=2))
    runners = [DaemonRunner(base.with_overrides(instance_id=f"map-{n}")) for n in "ab"]
    try:
        a, b = [await r.start() for r in runners]
        daemons = {d.settings.instance_id: d for d in (a, b)}
        assert a.endpoints.api is not None and a.endpoints.metrics is not None
        async with asyncio.timeout(10):
            while True:
                _, body = await aget(a.endpoints.api.url + "/v1/leader")
                doc = json.loads(body)
                terms = {i: sorted(lead(d).term) for i, d in daemons.items() if lead(d).may_act()}
                shown = {e["instance"]: e["partitions"] for e in doc["engines"]}
                epochs = {m["partition"]: m["epoch"] for m in doc["map"]}
                want = {p: lead(daemons[i]).epoch for i, ps in terms.items() for p in ps}
                if len(terms) == 2 and shown == terms and epochs == want:
                    break
                await asyncio.sleep(0.1)
        assert sorted(p for ps in shown.values() for p in ps) == list(range(P))
        assert doc["partitions"] == P and doc["unowned"] == [] and doc["map_readable"]
        assert doc["instance"] is None and doc["epoch"] is None and doc["since"] is None
        assert {e["instance"]: e["count"] for e in doc["engines"]} == {
            i: len(ps) for i, ps in terms.items()
        }
        # either engine's edge may answer, from a read of the map at most MAP_CACHE old (the
        # share-out takes milliseconds now that the first engine gives back in place: the
        # other edge may still serve the map it read as it started)
        async with asyncio.timeout(5):
            while True:
                reply = await nc.request("scheduler.v1.leader", b"", timeout=5)
                answer = json.loads(reply.data)["engines"]
                if {e["instance"]: e["partitions"] for e in answer} == terms:
                    break
                await asyncio.sleep(MAP_CACHE / 5)
        a.edge._map_at = -1e9  # the gauges follow the next read
        await a.edge.partition_map()
        _, metrics = await aget(a.endpoints.metrics.url + "/metrics")
        for instance, parts in terms.items():
            line = f'mq_scheduler_partitions_by_owner{{owner="{instance}"}} {len(parts)}.0'
            assert line.encode() in metrics
        assert b"mq_scheduler_partitions_unowned 0.0" in metrics
        held = f"mq_scheduler_partitions_held {len(terms['map-a'])}.0".encode()
        assert held in metrics
        moves = a.metrics.partition_moves._value.get()
        assert moves >= len(terms["map-a"])
    finally:
        await asyncio.gather(*(r.stop() for r in runners))
