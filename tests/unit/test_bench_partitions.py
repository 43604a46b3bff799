"""bench/partitions.py's pure read-outs: when the partition map has settled, the cron check, the
fault windows and the verdict."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from scheduler.leadership.partition_map import PartitionLease, PartitionMap
from scheduler.partitions import partition_of

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def pb() -> Iterator[ModuleType]:
    """The script, imported the way it imports its neighbours."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("partitions")
    finally:
        sys.path.remove(str(BENCH))


def _map(owners: list[tuple[str | None, int | None]]) -> PartitionMap:
    leases = tuple(PartitionLease(p, o, e) for p, (o, e) in enumerate(owners))
    return PartitionMap(len(owners), leases)


def test_settled_wants_every_partition_in_office_within_fair_shares(pb: ModuleType) -> None:
    """The map has settled once every partition is held in office by the named engines, each
    holding one at least and none above ceil(P / engines)."""
    even = _map([("a", 1), ("a", 1), ("b", 2), ("b", 2)])
    assert pb.settled(even, {"a", "b"})
    assert not pb.settled(even, {"a", "b", "c"})  # c holds nothing yet
    assert not pb.settled(_map([("a", 1), ("a", 1), ("a", 1), ("b", 2)]), {"a", "b"})  # 3 > 2
    assert not pb.settled(_map([("a", 1), ("a", None), ("b", 2), ("b", 2)]), {"a", "b"})
    assert not pb.settled(_map([("a", 1), (None, None), ("b", 2), ("b", 2)]), {"a", "b"})


def _deliveries(seen: dict[str, list[tuple[float, float]]]) -> Any:
    return SimpleNamespace(seen=seen)


def test_cron_summary_tells_lost_from_unlogged(pb: ModuleType) -> None:
    """An occurrence never delivered is lost; one delivered without a fire_log row is
    unlogged; two rows for one occurrence are doubled."""
    seen = {"job-0@100": [(100.01, 100.0)], "job-0@101": [(101.02, 101.0)]}
    rows = [{"key": "job-0", "at": 100.0, "instance": "pe-1"}] * 2
    out = pb.cron_summary(_deliveries(seen), rows, jobs=1, lo=100.0, hi=102.0)
    assert (out["lost"], out["unlogged"], out["doubled_fire_log"]) == (1, 1, 1)
    assert out["store_lateness_ms"]["early"] == 0


def test_a_kill_window_splits_the_victims_partitions_from_the_others(pb: ModuleType) -> None:
    """Tasks due inside a kill's window are judged apart: the victim's partitions by their
    longest wait, the others' by their lateness; tasks due outside the window are left out."""
    ids = [f"t-{i}" for i in range(40)]
    victim = {partition_of(ids[0], 8)}
    dues = {t: 10.0 + i * 0.1 for i, t in enumerate(ids)}
    seen = {t: [(d + (3.2 if partition_of(t, 8) in victim else 0.005), d)] for t, d in dues.items()}
    seen["t-39"] = [(dues["t-39"] + 9.0, dues["t-39"])]  # due after the window: not counted
    event = {"event": "kill", "engine": "pe-2", "at": 11.0, "settled_at": 8.5,
             "partitions": sorted(victim)}  # fmt: skip
    (w,) = pb.windows([event], _deliveries(seen), dues, 8)
    assert w["own_longest_wait_s"] == 3.2
    assert w["others"]["max"] == 5.0
    assert w["own"]["count"] + w["others"]["count"] == w["all"]["count"] == 36  # due 10.0-13.5


def _scenario(engines: dict[str, dict[str, Any]], **windows: Any) -> dict[str, Any]:
    tasks = {"lost": 0, "doubled_delivered": 0, "doubled_fire_log": 0, "early": 0}
    cron = {"lost": 0, "unlogged": 0, "doubled_fire_log": 0, "doubled_delivered": 0,
            "store_lateness_ms": {"early": 0}}  # fmt: skip
    return {"complete": True, "tasks": tasks, "cron": cron, "engines": engines,
            "producer": {"unacked": 0, "errors": 0}, "windows": list(windows.values())}  # fmt: skip


def test_verdict_takes_ratios_to_the_single_engine_and_shares_of_a_third(pb: ModuleType) -> None:
    """Each engine's CPU per task over the single engine's, at most 1.2x; each share within
    10 % (relative) of 1/N; the kill's others' p99 and the victim's longest wait."""
    a = argparse.Namespace(engines=3, ttl=3.0)
    single = _scenario({"pe-1": {"cpu_us_per_task": 100.0, "share": 1.0}})

    def steady(shares: list[float], cpu: float) -> dict[str, Any]:
        es = {f"pe-{i}": {"cpu_us_per_task": cpu, "share": s} for i, s in enumerate(shares)}
        return _scenario(es)

    kill = {"event": "kill", "others": {"p99": 20.0}, "own_longest_wait_s": 4.1}
    res = {"single": single, "steady": steady([0.34, 0.33, 0.33], 119.0),
           "kill": _scenario({}, kill=kill)}  # fmt: skip
    checks = pb.verdict(res, a)
    assert checks["steady_cpu_ratio"] and checks["steady_share"] and checks["kill_others_p99"]
    assert not checks["kill_own_wait"]  # 4.1 s > TTL + 1
    assert res["steady"]["engines"]["pe-0"]["cpu_ratio_to_single"] == 1.19
    checks = pb.verdict({"single": single, "steady": steady([0.37, 0.33, 0.30], 121.0)}, a)
    assert not checks["steady_cpu_ratio"] and not checks["steady_share"]


def test_office_gap_integrates_partitions_in_no_office_between_fault_and_settling(
    pb: ModuleType,
) -> None:
    """Each sample's count of partitions in no office holds until the next sample; only the
    part between the fault and the settling counts."""
    timeline = [
        (0.0, {"a": {0, 1}, "b": {2, 3}}),
        (10.0, {"a": {0, 1}}),  # b's two partitions in no office from 10 s
        (11.0, {"a": {0, 1, 2}}),
        (12.5, {"a": {0, 1, 2, 3}}),
    ]
    assert pb.office_gap(timeline, 9.0, 13.0, 4) == {"max_partitions": 2, "partition_seconds": 3.5}
    assert pb.office_gap(timeline, 10.5, 11.5, 4) == {"max_partitions": 2, "partition_seconds": 1.5}


def test_office_gap_counts_a_killed_engines_partitions_as_in_no_office(pb: ModuleType) -> None:
    """After a kill the victim's leases outlive it: its partitions count as in no office until
    another engine takes them."""
    timeline = [(0.0, {"a": {0, 1}, "b": {2, 3}}), (3.0, {"a": {0, 1}}), (4.0, {"a": {0, 1, 2, 3}})]
    assert pb.office_gap(timeline, 0.0, 5.0, 4, dead="b") == {
        "max_partitions": 2,
        "partition_seconds": 8.0,
    }
