"""The audit on a DST-change day (hand-checked truth) and through JDBC from a real PostgreSQL
over TCP, with the schedule history of jobs added, removed and paused mid-day."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from scheduler.audit.expected import to_us
from tests.spark.conftest import run_audit
from tests.spark.test_audit import assert_matches_truth
from tests.support.synth import JobPlan, Rates, generate, load_postgres

pytestmark = pytest.mark.spark

DST_DAY = "2026-03-29"  # Lisbon goes from UTC+0 to UTC+1 at 01:00, Berlin from +1 to +2 at 02:00
DST_JOBS = """\
scheduled_jobs:
  - {name: lisbon, subject: mq.scheduled.pt, cron: "30 0 * * *", timezone: Europe/Lisbon}
  - {name: berlin-gap, subject: mq.scheduled.de, cron: "30 2 * * *", timezone: Europe/Berlin}
  - {name: berlin-real, subject: mq.scheduled.de, cron: "*/30 2 * * *", timezone: Europe/Berlin}
"""


def record(key: str, subject: str, scheduled: str, fired: str) -> str:
    doc = {"kind": "cron", "key": key, "subject": subject, "scheduled_for": scheduled}
    return json.dumps({**doc, "fired_at": fired, "attempt": 1, "epoch": 1, "instance": "i"})


def test_dst_change_day_expects_what_the_daemon_fires(spark: Any, tmp_path: Path) -> None:
    """On Europe's spring-forward day a Lisbon 00:30 job runs twice in the UTC day, Berlin's
    02:30 runs once at 03:00 CEST (01:00Z) and Berlin's */30 in hour 2 has nothing: a missing
    run, a double and a run that should not exist are each counted once."""
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "dst.yaml").write_text(DST_JOBS)
    lines = [
        record("lisbon", "mq.scheduled.pt", "2026-03-29T00:30:00Z", "2026-03-29T00:30:00.020Z"),
        # the 23:30Z run (00:30 WEST on the 30th) never came
        record("berlin-gap", "mq.scheduled.de", "2026-03-29T01:00:00Z", "2026-03-29T01:00:00.005Z"),
        record("berlin-gap", "mq.scheduled.de", "2026-03-29T01:00:00Z", "2026-03-29T01:00:01.500Z"),
        # 02:30 CET does not exist: the daemon must never fire this
        record(
            "berlin-real", "mq.scheduled.de", "2026-03-29T01:30:00Z", "2026-03-29T01:30:00.001Z"
        ),
    ]
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    run = run_audit(
        tmp_path / "out",
        "--date",
        DST_DAY,
        "--input",
        str(tmp_path / "log.jsonl"),
        "--schedules",
        str(tmp_path / "schedules"),
    )
    assert run.code == 0, run.stderr
    got = {
        name: (s["expected"], s["fired"], s["missed"], s["doubled"], s["unexpected"])
        for name, s in run.summary["schedules"].items()
    }
    assert got == {
        "lisbon": (2, 1, 1, 0, 0),
        "berlin-gap": (1, 2, 0, 1, 0),
        "berlin-real": (0, 1, 0, 0, 1),
    }
    assert run.summary["schedules"]["berlin-gap"]["lateness_ms"]["max"] == 5  # first delivery
    occ = spark.read.parquet(str(tmp_path / "out" / "occurrences"))
    missed = occ.filter("missed").selectExpr("key", "unix_micros(scheduled_for) AS at").collect()
    assert [(r["key"], r["at"]) for r in missed] == [
        ("lisbon", to_us(datetime(2026, 3, 29, 23, 30, tzinfo=UTC)))
    ]


AT = datetime(2026, 11, 21, tzinfo=UTC)


def at(hour: int, minute: int = 0, ms: int = 500) -> datetime:
    return AT.replace(hour=hour, minute=minute, microsecond=ms * 1000)


HISTORY_JOBS = [
    JobPlan("steady", "mq.scheduled.a", "*/10 * * * *"),
    JobPlan("added", "mq.scheduled.a", "* * * * *", windows=((at(10), None, False),)),
    JobPlan("removed", "mq.scheduled.b", "*/5 * * * *", windows=((None, at(15), False),)),
    JobPlan(
        "paused-at-noon",
        "mq.scheduled.b",
        "0 * * * *",
        windows=((None, at(12), False), (at(12), at(13), True), (at(13), None, False)),
    ),
]


async def execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def test_jdbc_reads_fire_log_history_and_unfired_tasks_over_tcp(
    spark: Any, tcp_database: str, tmp_path: Path
) -> None:
    """Through JDBC (PostgreSQL over TCP): counts and percentiles equal the planted truth, jobs
    added, removed and paused mid-day expect only their hours from schedule_history (not the
    YAML), tasks still pending or claimed are overdue, dead and expired ones counted, and the
    partition count comes from the database's `partitioning` row."""
    synth = generate(
        AT.date(),
        jobs=HISTORY_JOBS,
        tasks=1500,
        seed=11,
        rates=Rates(0.02, 0.01, 0.01, 0.02),
        unfired=8,
    )
    asyncio.run(load_postgres(tcp_database, synth))
    asyncio.run(execute(tcp_database, "UPDATE partitioning SET partitions = 4"))
    stale = tmp_path / "yaml"  # what the repo holds today: it must not decide the expectations
    stale.mkdir()
    (stale / "jobs.yaml").write_text(
        'scheduled_jobs:\n  - {name: steady, subject: mq.scheduled.a, cron: "* * * * *"}\n'
    )
    run = run_audit(
        tmp_path / "out",
        "--date",
        "2026-11-21",
        "--input",
        tcp_database,
        "--schedules",
        str(stale),
    )
    assert run.code == 0, run.stderr
    summary = run.summary
    assert summary["expected_from"] == "schedule_history"
    expected = {name: s["expected"] for name, s in summary["schedules"].items()}
    assert expected == {"steady": 144, "added": 839, "removed": 181, "paused-at-noon": 23}
    assert_matches_truth(summary, synth.truth)
    overdue = {n: s["overdue"] for n, s in summary["subjects"].items() if s["overdue"]}
    assert sum(overdue.values()) == 4 and summary["totals"]["delayed"]["dead"] == 2
    assert summary["totals"]["delayed"]["expired"] == 2
    assert summary["input"]["invalid"] == 0  # PostgreSQL holds only valid records
    handovers = summary["handovers"]  # the partition count recorded by the deployment
    assert (handovers["partitions"], handovers["partitions_from"]) == (4, "partitioning table")
    assert (handovers["terms"], handovers["count"]) == (1, 0)  # synth's one term, epoch 7
    assert "jdbc:postgresql://127.0.0.1:" in (tmp_path / "out" / "report.html").read_text()


def test_jdbc_connection_refused_exits_2_naming_the_input(spark: Any, tmp_path: Path) -> None:
    """A JDBC URL nobody answers exits 2 with one line from the PostgreSQL driver."""
    from scheduler.daemon.embedded import free_port

    (tmp_path / "schedules").mkdir()
    url = f"jdbc:postgresql://127.0.0.1:{free_port()}/nothing?user=postgres"
    run = run_audit(
        tmp_path / "out",
        "--date",
        "2026-11-21",
        "--input",
        url,
        "--schedules",
        str(tmp_path / "schedules"),
        "--schedules-from",
        "yaml",
    )
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("scheduler audit:")]
    assert run.code == 2, run.stderr
    assert len(lines) == 1 and "--input: cannot read jdbc:postgresql://127.0.0.1:" in lines[0]
    assert "Connection" in lines[0] or "connect" in lines[0]


def test_synth_days_are_reproducible() -> None:
    """The generator is seeded: the same arguments give the same records and truth."""
    a = generate(date(2026, 3, 29), jobs=6, tasks=200, seed=5)
    b = generate(date(2026, 3, 29), jobs=6, tasks=200, seed=5)
    assert a.truth == b.truth and (a.records["fired_at"] == b.records["fired_at"]).all()
    assert generate(date(2026, 3, 29), jobs=6, tasks=200, seed=6).truth != a.truth
