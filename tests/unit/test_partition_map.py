"""The partition map as operators see it, without servers: lease keys and values checked
(`scheduler.leadership.partition_map`), runs of partitions written compactly, `GET /v1/leader`
on the twins, and `scheduler status` over a map."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any, cast

import nats.errors
import pytest
from nats.js.kv import KeyValue

from scheduler.cli import ops
from scheduler.console.display import partition_spans
from scheduler.leadership.partition_map import (
    UNKNOWN,
    PartitionLease,
    build_map,
    parse_lease,
    partition_of_key,
    read_partition_map,
    unreadable,
)
from scheduler.partitions import spans
from tests.support.edge_twins import EdgeOnTwins


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        ([], ""),
        ([5], "5"),
        ([0, 1, 2, 3], "0-3"),
        ([9, 0, 1, 7, 10, 11, 12, 3, 2, 1], "0-3, 7, 9-12"),
        ([4, 6, 8], "4, 6, 8"),
    ],
)
def test_spans_write_runs_as_ranges(parts: list[int], text: str) -> None:
    """Partitions are shown sorted, once each, runs as `a-b`."""
    assert spans(parts) == text


def test_the_console_filter_shows_what_is_not_a_list_of_partitions_as_it_came() -> None:
    """A list of ints becomes runs (a dash for none); anything else is shown, not raised."""
    assert partition_spans([3, 1, 2]) == "1-3"
    assert partition_spans([]) == "—"
    assert partition_spans(["a", 1]) == "['a', 1]"
    assert partition_spans(None) == "None"


@pytest.mark.parametrize(
    ("key", "count", "partition"),
    [
        ("leader", 1, 0),
        ("p.0", 1, None),
        ("p.0", 8, 0),
        ("p.7", 8, 7),
        ("p.8", 8, None),
        ("p.07", 8, None),
        ("p.-1", 8, None),
        ("p.", 8, None),
        ("p.٣", 8, None),  # a digit, but not an ASCII one
        ("leader", 8, None),
        ("p.1.2", 8, None),
    ],
)
def test_only_the_keys_an_engine_writes_name_a_partition(
    key: str, count: int, partition: int | None
) -> None:
    """`leader` under P = 1, `p.<n>` (decimal, no leading zero, below P) under P > 1."""
    assert partition_of_key(key, count) == partition


@pytest.mark.parametrize(
    ("value", "lease"),
    [
        (
            {"instance": "a", "epoch": 3, "since": "2026-12-01T00:00:00Z", "run": "r"},
            PartitionLease(1, "a", 3, "2026-12-01T00:00:00.000Z"),
        ),
        ({"instance": "a", "epoch": None, "since": None}, PartitionLease(1, "a")),
        ({"instance": "a", "epoch": 0}, PartitionLease(1, "a")),
        ({"instance": "a", "epoch": 2**63}, PartitionLease(1, "a")),
        ({"instance": "a", "epoch": 1.5}, PartitionLease(1, "a")),
        ({"instance": "a", "since": "2026-12-01T00:00:00"}, PartitionLease(1, "a")),  # naive
        ({"instance": "a", "since": ["x"]}, PartitionLease(1, "a")),
        ({"instance": ""}, PartitionLease(1, UNKNOWN)),
        ({"instance": None, "epoch": 4}, PartitionLease(1, UNKNOWN)),
        ({"instance": "x" * 254}, PartitionLease(1, UNKNOWN)),
        ({"epoch": 4}, PartitionLease(1, UNKNOWN)),
        ("just text", PartitionLease(1, UNKNOWN)),
    ],
)
def test_a_lease_value_is_checked_field_by_field(value: Any, lease: PartitionLease) -> None:
    """An owner only from a printable instance id of bounded length (else `unknown`); an epoch
    only a positive bigint; a since only an aware RFC 3339 instant, shown in UTC."""
    assert parse_lease(1, json.dumps(value).encode()) == lease


def test_the_map_lists_every_partition_and_each_engines_share() -> None:
    """Every partition in order; engines sorted by id with their partitions; unowned listed."""
    value = json.dumps({"instance": "b", "epoch": 2}).encode()
    held = build_map(4, {"p.3": value, "p.0": value, "p.1": b"{", "p.9": value})
    assert held.to_json() == {
        "partitions": 4,
        "map": [
            {"partition": 0, "owner": "b", "epoch": 2, "since": None},
            {"partition": 1, "owner": UNKNOWN, "epoch": None, "since": None},
            {"partition": 2, "owner": None, "epoch": None, "since": None},
            {"partition": 3, "owner": "b", "epoch": 2, "since": None},
        ],
        "engines": [
            {"instance": "b", "count": 2, "partitions": [0, 3]},
            {"instance": UNKNOWN, "count": 1, "partitions": [1]},
        ],
        "unowned": [2],
        "map_readable": True,
    }
    assert unreadable(2).to_json()["map_readable"] is False


async def test_leader_answers_the_map_and_the_document_describes_it(api: EdgeOnTwins) -> None:
    """`GET /v1/leader` (no token) carries the map, `unknown` owners included, and keeps the
    P = 1 fields; the API document names the map's fields."""
    value = json.dumps({"instance": "eng-a", "epoch": 9, "since": "2026-12-01T00:00:00Z"})
    api.backend.partition_map = build_map(4, {"p.0": value.encode(), "p.2": b"\x00"})
    reply = await api.call("GET", "/v1/leader", token=None)
    assert reply.status == 200
    body = reply.body
    assert set(body) >= {"instance", "epoch", "since", "self"}
    assert body["map"][0] == {
        "partition": 0,
        "owner": "eng-a",
        "epoch": 9,
        "since": "2026-12-01T00:00:00.000Z",
    }
    assert body["map"][2]["owner"] == UNKNOWN and body["unowned"] == [1, 3]
    doc = (await api.call("GET", "/openapi.json", token=None)).body
    view = doc["components"]["schemas"]["LeaderView"]["properties"]
    assert {"partitions", "map", "engines", "unowned", "map_readable"} <= set(view)
    assert "PartitionOwner" in doc["components"]["schemas"]


class Answers:
    """`ApiClient.call` answering from fixed documents."""

    def __init__(self, leader: dict[str, Any]) -> None:
        self.leader = leader

    def call(self, method: str, path: str, query: dict[str, Any] | None = None) -> Any:
        if path == "/v1/leader":
            return self.leader
        if path == "/v1/schedules":
            return {"items": [], "problems": []}
        lateness = {"p50": 1.0, "p99": 2.0, "samples": 3}
        return {
            "leader": {k: self.leader.get(k) for k in ("instance", "epoch", "since")},
            "epoch": 4,
            "pending": 0,
            "due": {"1m": 0},
            "lateness_ms": lateness,
            "dead_letters_unresolved": 0,
            "pending_by_subject": [],
            "at": "2026-12-01T00:00:00Z",
        }


def status(leader: dict[str, Any]) -> tuple[Any, str]:
    doc, out, code = ops._status(Answers(leader), argparse.Namespace())  # type: ignore[arg-type]
    assert code == 0
    return doc, out


def test_status_under_partitions_shows_each_engines_share_and_flags_the_unowned() -> None:
    """P = 8: a `partitions` line (held of P, by how many engines, how many without an owner)
    instead of the leader's, and a table of each engine's partitions and the unowned ones."""
    value = json.dumps({"instance": "eng-a", "epoch": 2}).encode()
    other = json.dumps({"instance": "eng-b", "epoch": 3}).encode()
    keys = {f"p.{p}": value for p in (0, 1, 2)} | {"p.4": other, "p.5": b"bad"}
    held = build_map(8, keys).to_json() | {"instance": None, "epoch": None, "since": None}
    doc, out = status(held)
    lines = out.splitlines()
    assert lines[0] == "partitions     5 of 8 held by 3 engines, 3 WITHOUT AN OWNER"
    table = lines[lines.index("ENGINE      PARTITIONS  WHICH") :]
    assert table[1:] == [
        "eng-a                3  0-2",
        "eng-b                1  4",
        "unknown              1  5",
        "(no owner)           3  3, 6-7",
    ]
    assert doc["partition_map"]["unowned"] == [3, 6, 7]


def test_status_under_one_partition_reads_as_before() -> None:
    """P = 1: the leader line as before and no partition table."""
    value = json.dumps({"instance": "solo", "epoch": 4, "since": "2026-12-01T00:00:00Z"})
    held = build_map(1, {"leader": value.encode()}).to_json()
    held |= {"instance": "solo", "epoch": 4, "since": "2026-12-01T00:00:00.000Z"}
    _, out = status(held)
    assert out.splitlines()[0] == "leader         solo (epoch 4, since 2026-12-01T00:00:00.000Z)"
    assert "PARTITIONS" not in out


class _Watcher:
    """A nats-py key watcher's `updates` over a fixed list (then silence)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    async def updates(self, timeout: float) -> Any:
        if not self.items:
            await asyncio.sleep(timeout)
            raise nats.errors.TimeoutError
        return self.items.pop(0)

    async def stop(self) -> None:
        pass


class _Bucket:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    async def watch(self, subject: str) -> _Watcher:
        return _Watcher(self.items)


def _entry(key: str, delta: int) -> KeyValue.Entry:
    value = json.dumps({"instance": "e1", "epoch": 3}).encode()
    return KeyValue.Entry("scheduler_leader", key, value, 1, delta, None, None)


async def test_a_caught_up_marker_before_the_keys_does_not_end_the_read() -> None:
    """nats-py may put its caught-up `None` before the keys it had already been sent (seen
    under load): the read goes on to the key that leaves nothing pending, so both partitions
    are owned (the read ended at the marker, every partition unowned: seen failing)."""
    bucket = _Bucket([None, _entry("p.0", 1), _entry("p.1", 0)])
    got = await read_partition_map(cast(KeyValue, bucket), 2)
    assert [(p.partition, p.owner) for p in got.leases] == [(0, "e1"), (1, "e1")]


async def test_a_marker_and_nothing_after_it_is_an_empty_bucket() -> None:
    """The marker alone, nothing within EMPTY_GRACE: a readable map with no owner."""
    got = await read_partition_map(cast(KeyValue, _Bucket([None])), 2)
    assert got.readable and [p.owner for p in got.leases] == [None, None]
