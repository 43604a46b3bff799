"""partition_of: stable across processes and releases, in range, spread evenly."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest

from scheduler.partitions import MAX_PARTITIONS, partition_of

# Stored rows keep these values: a change of the rule moves every task of a deployment.
PINNED = [
    ("01JF3Z8Q6W5N4XKJ7Y2V9B0C1D", (0, 1, 31, 3807)),
    ("task-1", (0, 0, 6, 838)),
    ("credit-reconciliation", (0, 1, 3, 1219)),
    ("é€😀", (0, 0, 18, 1682)),  # UTF-8 bytes, not code points
    ("", (0, 0, 2, 1090)),
]


@pytest.mark.parametrize(("key", "expected"), PINNED)
def test_values_are_pinned(key: str, expected: tuple[int, ...]) -> None:
    """Each key's partition among 1, 2, 64 and 4096 is the one pinned here."""
    assert tuple(partition_of(key, n) for n in (1, 2, 64, MAX_PARTITIONS)) == expected


def test_another_process_computes_the_same() -> None:
    """A fresh interpreter, whose `hash()` has another salt, gives the same partitions."""
    code = (
        "from scheduler.partitions import partition_of\n"
        "print([partition_of(k, 64) for k in ('task-1', 'credit-reconciliation')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(
        [partition_of("task-1", 64), partition_of("credit-reconciliation", 64)]
    )


def test_every_partition_is_in_range() -> None:
    """Partitions lie in 0..count-1 for counts from 1 to the bound; under 1 all are 0."""
    keys = [f"k{i}" for i in range(200)]
    for count in (1, 2, 3, 7, 64, 1000, MAX_PARTITIONS):
        assert {partition_of(k, count) for k in keys} <= set(range(count))
    assert {partition_of(k, 1) for k in keys} == {0}


@pytest.mark.parametrize("kind", ["random", "sequential"])
def test_ids_spread_evenly(kind: str) -> None:
    """100,000 ids (random ULID-like, or sequential with a common prefix) fill each of 64
    partitions within 15 % of an even share (6 standard deviations)."""
    rng = random.Random(37)
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    if kind == "random":
        ids = ["".join(rng.choices(alphabet, k=26)) for _ in range(100_000)]
    else:
        ids = [f"order-{i:08d}" for i in range(100_000)]
    counts = Counter(partition_of(i, 64) for i in ids)
    share = len(ids) / 64
    assert len(counts) == 64
    assert all(abs(c - share) < 0.15 * share for c in counts.values()), counts
