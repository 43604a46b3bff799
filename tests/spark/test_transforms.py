"""The audit's DataFrame transforms on hand-made rows, compared with chispa."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest
from chispa import assert_df_equality

from scheduler.audit.transforms import EXPECTED_SCHEMA, classify, occurrences, per_schedule
from scheduler.audit.window import AuditWindow

pytestmark = pytest.mark.spark

WINDOW = AuditWindow.of_day(date(2026, 11, 21))
LOG_SCHEMA = "kind string, key string, subject string, scheduled_for timestamp, fired_at timestamp"
UNFIRED_SCHEMA = "key string, subject string, scheduled_for timestamp, state string"


def t(hour: int, minute: int = 0, second: int = 0, ms: int = 0) -> datetime:
    return datetime(2026, 11, 21, hour, minute, second, ms * 1000, tzinfo=UTC)


def test_occurrences_are_classified_once_each(spark: Any) -> None:
    """Expected runs, deliveries and undelivered tasks become one row per occurrence with the
    right flags: on time, missed, doubled (first delivery counts), early, unexpected, overdue."""
    expected = spark.createDataFrame(
        [
            ("job", "mq.a", t(1), t(1)),
            ("job", "mq.a", t(2), t(2)),
            ("job", "mq.a", t(3), t(3)),
            ("job", "mq.a", t(4), t(4, 0, 30)),  # 30 s of jitter
        ],
        EXPECTED_SCHEMA,
    )
    log = spark.createDataFrame(
        [
            ("cron", "job", "mq.a", t(1), t(1, 0, 0, 12)),
            ("cron", "job", "mq.a", t(3), t(3, 0, 0, 5)),
            ("cron", "job", "mq.a", t(3), t(3, 0, 2)),
            ("cron", "job", "mq.a", t(4), t(4, 0, 29, 999)),  # before its jittered due time
            ("cron", "job", "mq.a", t(5, 30), t(5, 30, 0, 1)),  # not a run of this job
            ("delayed", "task-1", "mq.t", t(6), t(6, 0, 1, 500)),
        ],
        LOG_SCHEMA,
    )
    unfired = spark.createDataFrame([("task-2", "mq.t", t(7), "pending")], UNFIRED_SCHEMA)
    occ = classify(occurrences(log, expected, unfired), WINDOW, late_ms=1000)
    got = occ.select(
        "kind",
        "key",
        "deliveries",
        "lateness_ms",
        "missed",
        "doubled",
        "early",
        "late",
        "unexpected",
        "overdue",
        "status",
        "hour",
    ).orderBy("kind", "key", "hour")
    want = spark.createDataFrame(
        [
            ("cron", "job", 1, 12, False, False, False, False, False, False, "ok", 1),
            ("cron", "job", 0, None, True, False, False, False, False, False, "missed", 2),
            ("cron", "job", 2, 5, False, True, False, False, False, False, "doubled", 3),
            ("cron", "job", 1, -1, False, False, True, False, False, False, "early", 4),
            ("cron", "job", 1, 1, False, False, False, False, True, False, "unexpected", 5),
            ("delayed", "task-1", 1, 1500, False, False, False, True, False, False, "late", 6),
            ("delayed", "task-2", 0, None, False, False, False, False, False, True, "overdue", 7),
        ],
        "kind string, key string, deliveries bigint, lateness_ms bigint, missed boolean, "
        "doubled boolean, early boolean, late boolean, unexpected boolean, overdue boolean, "
        "status string, hour int",
    )
    assert_df_equality(got, want, ignore_nullable=True)


def test_per_schedule_percentiles_are_exact(spark: Any) -> None:
    """p50/p95/p99 interpolate linearly between ranks of whole-millisecond lateness (numpy's
    default), max and mean over each job's first deliveries."""
    expected = spark.createDataFrame(
        [("job", "mq.a", t(h), t(h)) for h in range(10)], EXPECTED_SCHEMA
    )
    log = spark.createDataFrame(
        [("cron", "job", "mq.a", t(h), t(h, 0, 0, 10 * h)) for h in range(10)], LOG_SCHEMA
    )
    occ = classify(occurrences(log, expected, None), WINDOW, late_ms=1000)
    row = per_schedule(occ).collect()[0]
    assert (row["p50"], row["max"], row["mean"]) == (45.0, 90, 45.0)
    assert (row["p95"], row["p99"]) == (pytest.approx(85.5), pytest.approx(89.1))
    assert (row["expected"], row["fired"], row["missed"]) == (10, 10, 0)
