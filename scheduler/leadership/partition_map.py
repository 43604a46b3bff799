"""The partition map as the lease bucket says: which engine holds each partition's lease, with
the epoch and since the holder wrote into it. Read for display only (`GET /v1/leader`, the
console, `scheduler status`): leadership is decided by revision-checked writes, never by a read.

Under P = 1 the map has one partition, 0, read from the key `leader`; under P > 1 partition
`n` from the key `p.<n>` (`scheduler.leadership.partitioned`). A lease value is JSON written by
an engine, but the bucket is writable by anyone with the credentials: every value is checked
here, and one that is not what an engine writes shows its owner as `unknown` (the key exists,
so somebody holds it) with no epoch and no since, never an error.

`since` is what the holder wrote: under P = 1 the start of its term; under P > 1 the time it
took the key until its next renew, then the start of the term that includes the partition (a
term begins whenever the engine's set of partitions changes), so it says since when the
partition is held in its current term, not since when the engine has held it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from scheduler.clock import to_rfc3339
from scheduler.leadership.lease import LEASE_KEY
from scheduler.leadership.partitioned import KEY_PREFIX

UNKNOWN = "unknown"  # the owner of a partition whose lease value is not one an engine writes
MAX_VALUE = 1024  # bytes: an engine's lease value is ~150
MAX_INSTANCE = 253  # characters of an instance id shown (a host name's bound)
MAX_EPOCH = 2**63 - 1  # PostgreSQL's bigint
READ_TIMEOUT = 1.0  # s for the whole read of the bucket
EMPTY_GRACE = 0.1  # s a read waits for a key after a first caught-up marker


@dataclass(frozen=True, slots=True)
class PartitionLease:
    """One partition as its lease says: `owner` None when nobody holds it."""

    partition: int
    owner: str | None
    epoch: int | None = None
    since: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "owner": self.owner,
            "epoch": self.epoch,
            "since": self.since,
        }


@dataclass(frozen=True, slots=True)
class PartitionMap:
    """Every partition of the deployment with its lease; `readable` False when the bucket could
    not be read (every partition then shows no owner, which is not known)."""

    count: int
    leases: tuple[PartitionLease, ...]
    readable: bool = True

    def engines(self) -> dict[str, list[int]]:
        """Each owner (`unknown` included) with the partitions it holds, in partition order."""
        owned: dict[str, list[int]] = {}
        for lease in self.leases:
            if lease.owner is not None:
                owned.setdefault(lease.owner, []).append(lease.partition)
        return dict(sorted(owned.items()))

    def unowned(self) -> list[int]:
        return [lease.partition for lease in self.leases if lease.owner is None]

    def to_json(self) -> dict[str, Any]:
        """The map's part of `GET /v1/leader`."""
        return {
            "partitions": self.count,
            "map": [lease.to_json() for lease in self.leases],
            "engines": [
                {"instance": owner, "count": len(parts), "partitions": parts}
                for owner, parts in self.engines().items()
            ],
            "unowned": self.unowned(),
            "map_readable": self.readable,
        }


def partition_of_key(key: str, count: int) -> int | None:
    """The partition whose lease `key` is, among `count`; None for any other key."""
    if count == 1:
        return 0 if key == LEASE_KEY else None
    digits = key[len(KEY_PREFIX) :] if key.startswith(KEY_PREFIX) else ""
    if not (digits.isascii() and digits.isdigit()) or (len(digits) > 1 and digits[0] == "0"):
        return None
    partition = int(digits)
    return partition if partition < count else None


def parse_lease(partition: int, value: bytes | None) -> PartitionLease:
    """A present key's value as a lease: owner `unknown` unless it names an instance."""
    doc = _json_object(value)
    owner = _instance(doc.get("instance")) if doc is not None else None
    if doc is None or owner is None:
        return PartitionLease(partition, UNKNOWN)
    return PartitionLease(partition, owner, _epoch(doc.get("epoch")), _since(doc.get("since")))


def build_map(count: int, values: Mapping[str, bytes | None]) -> PartitionMap:
    """The map from the bucket's present keys and their values; keys that are no partition's
    lease of this deployment (another P's, or anyone's) are left out."""
    found: dict[int, PartitionLease] = {}
    for key, value in values.items():
        partition = partition_of_key(key, count)
        if partition is not None:
            found[partition] = parse_lease(partition, value)
    leases = tuple(found.get(p) or PartitionLease(p, None) for p in range(count))
    return PartitionMap(count, leases)


def unreadable(count: int) -> PartitionMap:
    return PartitionMap(count, tuple(PartitionLease(p, None) for p in range(count)), False)


async def read_partition_map(
    kv: KeyValue, count: int, timeout: float = READ_TIMEOUT
) -> PartitionMap:
    """The map as the bucket `kv` holds it now: one watcher over the lease keys, stopped once it
    has delivered every present key's last value; `unreadable` when that takes over `timeout`
    or NATS refuses."""
    subject = LEASE_KEY if count == 1 else f"{KEY_PREFIX}*"
    try:
        async with asyncio.timeout(timeout):
            values = await _snapshot(kv, subject, count)
    except Exception:  # NATS away or slow: the map says it could not be read
        return unreadable(count)
    return build_map(count, values)


async def _snapshot(kv: KeyValue, subject: str, count: int) -> dict[str, bytes | None]:
    """Every present lease key's last value. The watcher's first `None` (nats-py's "caught
    up") is not trusted alone: it is put first when the consumer's info, read after the
    server had already sent the keys, counts none pending (seen under load: a map with no
    owner while every partition had one). So the read ends at the entry that leaves nothing
    pending (`delta` 0, deletes included), and a `None` before any entry ends it only when
    nothing follows within EMPTY_GRACE."""
    watcher = await kv.watch(subject)
    values: dict[str, bytes | None] = {}
    seen = False
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=EMPTY_GRACE if not seen else 3600.0)
            except (TimeoutError, nats.errors.TimeoutError):
                if seen:
                    raise
                break  # a caught-up marker and nothing after it: no key
            if entry is None:
                if seen:
                    break
                continue
            seen = True
            if entry.operation in (KV_DEL, KV_PURGE):
                values.pop(entry.key, None)
            elif len(values) <= count:  # at most the partitions' keys (and one stray) kept
                values[entry.key] = entry.value
            if not entry.delta:
                break
    finally:
        await watcher.stop()
    return values


def _json_object(value: bytes | None) -> dict[str, Any] | None:
    if not value or len(value) > MAX_VALUE:
        return None
    try:
        doc = json.loads(value)
    except ValueError:  # not JSON (or not UTF-8): not an engine's value
        return None
    return doc if isinstance(doc, dict) else None


def _instance(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_INSTANCE and value.isprintable():
        return value
    return None


def _epoch(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_EPOCH:
        return value
    return None


def _since(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        return None
    return to_rfc3339(instant) if instant.tzinfo is not None else None
