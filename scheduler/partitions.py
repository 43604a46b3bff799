"""Partitions: the fixed count P of shards a deployment's work is split into, and which one a
task (by its id) or a cron job (by its name) belongs to.

`partition_of` is the one rule, pure and stable across processes, hosts and Python versions:
the first four bytes of the SHA-256 digest of the key's UTF-8 bytes, read big-endian, modulo P
(Python's `hash()` is salted per process, so two engines would disagree). Every stored row
keeps the partition it got under the deployment's P, so the rule may never change under a
deployment: tests/unit/test_partitions.py pins its values. SHA-256 because PostgreSQL computes
it too (`sha256(convert_to(key, 'UTF8'))`, also in FIPS mode, where `md5()` fails), so the
statement that moves rows to a new P does it in SQL (`scheduler partitions set`,
scheduler/store/postgres/repartition.py).

P = 1 (every row in partition 0) is one leader, as before; under P > 1 each engine holds a
fair share of the partitions (scheduler/leadership/partitioned.py). What exists, and what is
still to come, is in docs/leadership.md, "Partitions".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

MAX_PARTITIONS = 4096  # SCHEDULER_PARTITIONS' bound; a partition fits PostgreSQL's SMALLINT


def partition_of(key: str, count: int) -> int:
    """The partition, in 0..count-1, of a task id or a cron job's name among `count`."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") % count


def spans(partitions: Iterable[int]) -> str:
    """Partitions written compactly for a person: runs as ranges, `0-3, 7, 9-12` ("" for none)."""
    ordered = sorted(set(partitions))
    runs: list[str] = []
    start = prev = None
    for p in [*ordered, None]:
        if p is not None and prev is not None and p == prev + 1:
            prev = p
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = p
    return ", ".join(runs)
