"""summary.json of the drift audit: the design's fields, the SLO verdict and its reasons, the
handovers' block."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from scheduler.audit.summary import (
    LISTED_HANDOVERS,
    Partitioning,
    Slo,
    build,
    handover_summary,
)


def row(key: str, **counts: Any) -> dict[str, Any]:
    base = {"key": key, "subject": "mq.scheduled.x", "p50": 3.0, "p95": 9.0, "p99": 40.0}
    return {**base, "max": 1200, "mean": 5.25, "expected": 96, "fired": 96, **counts}


def subject(name: str, **counts: Any) -> dict[str, Any]:
    base = {"subject": name, "p50": 2.0, "p95": 5.0, "p99": 9.0, "max": 30, "mean": 2.5}
    return {**base, "fired": 1000, "cron": 96, "delayed": 904, **counts}


def test_summary_has_the_design_fields() -> None:
    """date, slo (p99, late_ms, ok, breaches) and per-schedule and per-subject counts and
    lateness, exactly as docs/drift-audit.md names them."""
    doc = build("2026-11-21", Slo(1000, 1000), [row("a", missed=0)], [subject("mq.x")], [], {})
    assert doc["date"] == "2026-11-21"
    assert doc["slo"] == {
        "lateness_p99_ms": 1000,
        "late_ms": 1000,
        "ok": True,
        "breaches": [],
        "reasons": {},
    }
    entry = doc["schedules"]["a"]
    assert {k: entry[k] for k in ("expected", "fired", "missed", "doubled", "early", "late")} == {
        "expected": 96,
        "fired": 96,
        "missed": 0,
        "doubled": 0,
        "early": 0,
        "late": 0,
    }
    assert entry["lateness_ms"] == {"p50": 3, "p95": 9, "p99": 40, "max": 1200, "mean": 5.25}
    sub = doc["subjects"]["mq.x"]
    assert (sub["fired"], sub["early"], sub["late"]) == (1000, 0, 0)
    assert sub["lateness_ms"]["p99"] == 9


def test_breaches_name_each_schedule_and_subject_with_reasons() -> None:
    """p99 over the SLO, missed, doubled or early runs and overdue tasks are breaches."""
    schedules = [row("slow", p99=1500.5), row("lossy", missed=2, doubled=1), row("fine")]
    subjects = [subject("mq.late", overdue=3), subject("mq.ok")]
    doc = build("2026-11-21", Slo(1000, 1000), schedules, subjects, [], {})
    assert doc["slo"]["ok"] is False
    assert doc["slo"]["breaches"] == ["lossy", "slow", "mq.late"]
    assert doc["slo"]["reasons"] == {
        "lossy": ["2 missed", "1 doubled"],
        "slow": ["lateness p99 1500.5 ms > 1000 ms"],
        "mq.late": ["3 overdue"],
    }


def test_jobs_without_runs_are_listed_as_zeros() -> None:
    """A job that expected nothing in the window still appears, with zero counts and no lateness."""
    doc = build("2026-11-21", Slo(), [], [], [], {}, jobs={"idle": "mq.idle"})
    assert doc["schedules"]["idle"]["expected"] == 0
    assert doc["schedules"]["idle"]["subject"] == "mq.idle"
    assert doc["schedules"]["idle"]["lateness_ms"]["p99"] is None
    assert doc["slo"]["ok"] is True


US = 1_000_000
T0 = 1_795_219_200 * US  # 2026-11-21T00:00:00Z
DAY_US = 86_400 * US


def handover_row(partition: int, at_s: int, **extra: Any) -> dict[str, Any]:
    base = {"partition": partition, "from_instance": "a", "from_epoch": 1, "to_instance": "b"}
    base |= {"to_epoch": 2, "last_fired_us": T0 + (at_s - 3) * US, "first_fired_us": T0 + at_s * US}
    return base | {"gap_ms": 3000, "moved": True, "suspect": False, "late_near": 1} | extra


def handover_tables(listed: list[dict[str, Any]], **counts: Any) -> dict[str, Any]:
    count_row = {"handovers": len(listed), "moves": 1, "suspect": 0, "terms": 3}
    count_row |= {"unattributed": 2, "gap_p50_ms": 1500.0, "gap_max_ms": 3000} | counts
    return {
        "counts": [count_row],
        "faults": [{"late": 10, "missed": 4, "doubled": 0, "late_near": 7, "missed_near": 4}],
        "covered": [{"covered_us": 864 * US}],
        "hours": [{"hour_us": T0 + 3600 * US, "handovers": len(listed)}],
        "listed": listed,
    }


def test_handover_block_under_one_partition_counts_leader_changes() -> None:
    """Under P = 1 every handover is a leader change; moves and term restarts split them, the
    share of time near a handover is the covered partition-time over P x the window, and
    each listed handover carries its times as RFC 3339 and the faults near it."""
    listed = [handover_row(0, 3605), handover_row(0, 3700, moved=False, to_instance="a")]
    block = handover_summary(Partitioning(), timedelta(seconds=10), DAY_US, handover_tables(listed))
    assert (block["partitions"], block["partitions_from"]) == (1, "default")
    assert (block["count"], block["leader_changes"]) == (2, 2)
    assert (block["moves"], block["term_restarts"], block["suspect"]) == (1, 1, 0)
    assert (block["terms"], block["unattributed"]) == (3, 2)
    assert block["gap_ms"] == {"p50": 1500, "max": 3000}
    assert block["per_hour"] == {"2026-11-21T01:00Z": 2}
    assert block["near"] == {
        "margin_seconds": 10.0,
        "share_of_time": 0.01,
        "late": {"near": 7, "all": 10},
        "missed": {"near": 4, "all": 4},
        "doubled": {"near": 0, "all": 0},
    }
    first = block["list"][0]
    assert first["last_fired_at"] == "2026-11-21T01:00:02.000Z"
    assert first["first_fired_at"] == "2026-11-21T01:00:05.000Z"
    assert (first["late_near"], first["missed_near"], first["moved"]) == (1, 0, True)
    assert block["unlisted"] == 0


def test_handover_block_over_partitions_has_no_leader_and_lists_the_first_thousand() -> None:
    """Under P > 1 nobody leads alone (leader_changes is null), the share of time is over
    P partitions, and past LISTED_HANDOVERS handovers the rest are counted, not listed."""
    listed = [handover_row(i % 8, 60 + i) for i in range(LISTED_HANDOVERS + 5)]
    tables = handover_tables(listed, moves=LISTED_HANDOVERS + 5)
    block = handover_summary(Partitioning(8, "--partitions"), timedelta(0), DAY_US, tables)
    assert block["leader_changes"] is None and block["count"] == LISTED_HANDOVERS + 5
    assert len(block["list"]) == LISTED_HANDOVERS and block["unlisted"] == 5
    assert block["near"]["share_of_time"] == 0.00125
    assert block["term_restarts"] == 0
