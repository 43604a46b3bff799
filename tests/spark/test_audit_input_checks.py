"""Inputs the audit refuses with exit 2 and one line naming the file, the record or column and
the problem: a Parquet folder whose files disagree on a column's type, a time without an offset
and a `manual` that is not a boolean anywhere in a JSON-lines log (not only on its first line)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.spark.conftest import AuditRun, run_audit

pytestmark = pytest.mark.spark

DAY = "2026-11-21"
AT = datetime(2026, 11, 21, 6, tzinfo=UTC)
JOBS = "scheduled_jobs:\n  - {name: six, subject: mq.scheduled.six, cron: '0 6 * * *'}\n"


def audit(folder: Path, log: Path) -> AuditRun:
    (folder / "schedules").mkdir(exist_ok=True)
    (folder / "schedules" / "jobs.yaml").write_text(JOBS)
    args = ["--date", DAY, "--input", str(log), "--schedules", str(folder / "schedules")]
    return run_audit(folder / "out", *args)


def one_line(run: AuditRun) -> str:
    assert run.code == 2, (run.code, run.stdout, run.stderr)
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("scheduler audit:")]
    assert len(errors) == 1 and errors[0].startswith("scheduler audit: --input: "), run.stderr
    return errors[0]


def parquet_part(path: Path, fired_at: pa.Array) -> None:
    ts = pa.array([AT], pa.timestamp("us", tz="UTC"))
    columns = {"kind": ["cron"], "key": ["six"], "subject": ["mq.scheduled.six"]}
    pq.write_table(pa.table({**columns, "scheduled_for": ts, "fired_at": fired_at}), path)


def test_parquet_file_with_other_column_types_is_named(spark: Any, tmp_path: Path) -> None:
    """A folder whose second Parquet file has `fired_at` as RFC 3339 text (the first: a UTC
    timestamp; each alone is a valid log) exits 2 before Spark reads it (it used to fail in Spark
    with exit 4), naming that file, the column, and the type found and expected."""
    log = tmp_path / "log"
    log.mkdir()
    parquet_part(log / "part-0.parquet", pa.array([AT], pa.timestamp("us", tz="UTC")))
    parquet_part(log / "part-1.parquet", pa.array(["2026-11-21T06:00:00.012Z"], pa.string()))
    line = one_line(audit(tmp_path, log))
    assert "part-1.parquet" in line and "'fired_at'" in line, line
    assert "string" in line and "timestamp[us, tz=UTC]" in line and "part-0.parquet" in line, line


RECORD = {"kind": "cron", "key": "six", "subject": "mq.scheduled.six"}
GOOD = {**RECORD, "scheduled_for": "2026-11-21T06:00:00Z", "fired_at": "2026-11-21T06:00:00.012Z"}


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        pytest.param(
            {**GOOD, "key": "t-naive", "kind": "delayed", "fired_at": "2026-11-21T06:00:00.5"},
            ("'t-naive'", "fired_at", "2026-11-21T06:00:00.5", "offset"),
            id="naive-time",
        ),
        pytest.param(
            {**GOOD, "key": "t-date", "kind": "delayed", "scheduled_for": "2026-11-21"},
            ("'t-date'", "scheduled_for", "2026-11-21", "offset"),
            id="date-only",
        ),
        pytest.param(
            {**GOOD, "key": "t-yes", "kind": "delayed", "manual": "yes"},
            ("'t-yes'", "manual", '"yes"', "true or false"),
            id="manual-yes",
        ),
    ],
)
def test_a_later_record_with_a_bad_time_or_manual_is_named(
    spark: Any, tmp_path: Path, bad: dict[str, Any], named: tuple[str, ...]
) -> None:
    """A JSON-lines log whose first record is fine and a later one has a time without an offset
    (read as UTC until now) or `manual: "yes"` (counted as a schedule named after the task) exits
    2 naming the file, the record's key, the field and the value."""
    log = tmp_path / "day.jsonl"
    lines = [GOOD, {**GOOD, "key": "t-ok", "kind": "delayed", "manual": False}, bad]
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    line = one_line(audit(tmp_path, log))
    assert "day.jsonl" in line, line
    for part in named:
        assert part in line, line
