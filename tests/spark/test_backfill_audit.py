"""A backfill's `fire_log` rows (manual, `scheduled_for` the occurrence) in the drift audit:
counted as manual, never as doubled, early or late, and a missed occurrence stays missed."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.audit.transforms import EXPECTED_SCHEMA, classify, occurrences, per_schedule
from tests.spark.test_transforms import WINDOW, t

pytestmark = pytest.mark.spark
LOG_SCHEMA = (
    "kind string, key string, subject string, scheduled_for timestamp, fired_at timestamp, "
    "manual boolean"
)


def test_backfilled_occurrences_count_as_manual_only(spark: Any) -> None:
    """Two occurrences, one fired on time and one missed, both backfilled hours later: the job
    has 1 fired, 1 missed, 2 manual, and nothing doubled, early or late."""
    expected = spark.createDataFrame(
        [("job", "mq.a", t(1), t(1)), ("job", "mq.a", t(2), t(2))], EXPECTED_SCHEMA
    )
    log = spark.createDataFrame(
        [
            ("cron", "job", "mq.a", t(1), t(1, 0, 0, 3), False),
            ("cron", "job", "mq.a", t(1), t(20), True),  # backfilled 19 h late
            ("cron", "job", "mq.a", t(2), t(20, 0, 0, 2), True),
        ],
        LOG_SCHEMA,
    )
    occ = classify(occurrences(log, expected, None), WINDOW, late_ms=1000)
    row = per_schedule(occ).collect()[0].asDict()
    got = {k: row[k] for k in ("expected", "fired", "missed", "doubled", "early", "late")}
    assert got == {"expected": 2, "fired": 1, "missed": 1, "doubled": 0, "early": 0, "late": 0}
    assert row["manual"] == 2 and row["max"] == 3
