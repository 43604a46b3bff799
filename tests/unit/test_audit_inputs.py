"""The drift audit's options and inputs, checked before Spark starts."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler.audit.inputs import classify, fired_at_slices, jdbc_jar, jdbc_source
from scheduler.audit.record import column_problems, json_key_problems
from scheduler.audit.window import AuditWindow, parse_day
from scheduler.errors import AuditInputError

TODAY = date(2026, 11, 22)


def test_dates_accept_iso_today_and_yesterday() -> None:
    """--date takes YYYY-MM-DD, today and yesterday (UTC)."""
    assert parse_day("2026-03-29", TODAY) == date(2026, 3, 29)
    assert parse_day("yesterday", TODAY) == date(2026, 11, 21)
    assert parse_day("TODAY", TODAY) == TODAY
    for bad in ("2026-3-29", "29/03/2026", "2026-02-30", "tomorrow"):
        with pytest.raises(AuditInputError, match=r"--date: .* is not a date"):
            parse_day(bad, TODAY)


def test_window_bounds_and_grace() -> None:
    """The window is the UTC day (or part of it); deliveries count within the grace around it."""
    w = AuditWindow.of_day(date(2026, 11, 21))
    assert (w.start, w.end) == (
        datetime(2026, 11, 21, tzinfo=UTC),
        datetime(2026, 11, 22, tzinfo=UTC),
    )
    assert w.fired_from == w.start - timedelta(hours=1) and w.end - w.start == timedelta(days=1)
    part = AuditWindow.of_day(date(2026, 11, 21), w.start + timedelta(hours=2))
    assert part.start.hour == 2 and part.end - part.start != timedelta(days=1)
    with pytest.raises(AuditInputError, match="--until"):
        AuditWindow.of_day(date(2026, 11, 21), until=w.end + timedelta(hours=1))


def test_jdbc_urls_from_both_spellings() -> None:
    """postgresql://user:pw@host/db becomes a JDBC URL with user and password as properties."""
    src = jdbc_source("postgresql://audit:s%40cret@db.example:5433/mq?sslmode=require")
    assert src.location == "jdbc:postgresql://db.example:5433/mq?sslmode=require"
    assert src.properties["user"] == "audit" and src.properties["password"] == "s@cret"
    assert "cret" not in src.display
    direct = jdbc_source("jdbc:postgresql://127.0.0.1:5432/mq?user=a&password=b")
    assert direct.location == "jdbc:postgresql://127.0.0.1:5432/mq"
    assert (direct.properties["user"], direct.properties["password"]) == ("a", "b")
    with pytest.raises(AuditInputError, match="unix socket"):
        jdbc_source("postgresql://postgres@/mq?host=/tmp/sock")
    with pytest.raises(AuditInputError, match="only jdbc:postgresql"):
        jdbc_source("jdbc:mysql://h/db")


def test_fired_at_slices_cover_the_window_and_grace_once() -> None:
    """Parallel JDBC ranges tile [start - grace, end + grace) and bound scheduled_for."""
    w = AuditWindow.of_day(date(2026, 11, 21))
    slices = fired_at_slices(w, 4)
    assert len(slices) == 4
    assert slices[0].startswith("fired_at >= TIMESTAMPTZ '2026-11-20T23:00:00+00:00'")
    assert "fired_at < TIMESTAMPTZ '2026-11-22T01:00:00+00:00'" in slices[-1]
    assert all("scheduled_for >= TIMESTAMPTZ '2026-11-21T00:00:00+00:00'" in s for s in slices)


def test_local_inputs_are_checked(tmp_path: Path) -> None:
    """A missing path, an empty folder, a non-JSON first line and missing keys are refused."""
    with pytest.raises(AuditInputError, match="does not exist"):
        classify(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditInputError, match="holds no log files"):
        classify(str(tmp_path / "empty"))
    (tmp_path / "bad.jsonl").write_text("kind,key\n")
    with pytest.raises(AuditInputError, match="first line is not JSON"):
        classify(str(tmp_path / "bad.jsonl"))
    (tmp_path / "keys.jsonl").write_text(json.dumps({"kind": "cron", "key": "a"}) + "\n")
    with pytest.raises(AuditInputError, match="no column 'subject', 'scheduled_for', 'fired_at'"):
        classify(str(tmp_path / "keys.jsonl"))
    good = {"kind": "cron", "key": "a", "subject": "mq.a", "scheduled_for": "x", "fired_at": "y"}
    (tmp_path / "good.jsonl").write_text(json.dumps(good) + "\n")
    assert classify(str(tmp_path / "good.jsonl")).format == "json"


def test_column_types_are_checked() -> None:
    """A timestamp column must be a timestamp or text; counts must be integers."""
    base = {"kind": "string", "key": "string", "subject": "string"}
    ok = {**base, "scheduled_for": "timestamp", "fired_at": "string", "attempt": "int"}
    assert column_problems(ok, "log") == []
    bad = {**base, "scheduled_for": "boolean", "fired_at": "timestamp", "epoch": "double"}
    assert column_problems(bad, "log") == [
        "log: column 'scheduled_for' is boolean, expected a timestamp or an RFC 3339 string",
        "log: column 'epoch' is double, expected bigint",
    ]


def test_missing_jdbc_jar_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the driver jar the error says to install libpostgresql-jdbc-java or pass it."""
    monkeypatch.delenv("SCHEDULER_JDBC_JAR", raising=False)
    with pytest.raises(AuditInputError, match="libpostgresql-jdbc-java or pass --jdbc-jar"):
        jdbc_jar("/nonexistent/postgresql.jar")


def test_unwritable_out_and_missing_java_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out under a file exits 2 naming --out; without java the audit says how to get it."""
    from scheduler.audit.cli import java_problem
    from scheduler.cli.main import main

    (tmp_path / "schedules").mkdir()
    (tmp_path / "log.jsonl").write_text("")
    (tmp_path / "file").write_text("")
    args = ["audit", "--date", "2026-11-21", "--input", str(tmp_path / "log.jsonl")]
    args += ["--schedules", str(tmp_path / "schedules")]
    assert main([*args, "--out", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scheduler audit: --out: cannot create")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert "openjdk-17-jre-headless" in (java_problem() or "")
    assert main([*args, "--out", str(tmp_path / "out")]) == 4
    assert "no Java runtime" in capsys.readouterr().err


GOOD = {
    "kind": "delayed",
    "key": "t-1",
    "subject": "mq.a",
    "scheduled_for": "2026-11-21T06:00:00+01:00",
    "fired_at": "2026-11-21T05:00:00.012Z",
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("scheduled_for", "2026-11-21"),
        ("fired_at", "2026-11-21T06:00:00"),
        ("fired_at", "2026-11-21 06:00:00.5"),
        ("fired_at", "2026-11-21T06:00:00+0100"),
        ("scheduled_for", "2026-11-21T06:00Z"),
    ],
)
def test_a_first_record_time_without_an_offset_is_refused(
    tmp_path: Path, field: str, value: str
) -> None:
    """A first record whose time is a date alone, has no offset or is not RFC 3339 (which Spark
    would read as UTC or drop) is refused before Spark starts, naming file, record and field."""
    log = tmp_path / "day.jsonl"
    log.write_text(json.dumps({**GOOD, field: value}) + "\n")
    with pytest.raises(AuditInputError) as caught:
        classify(str(log))
    assert str(caught.value) == (
        f"--input: {log}: record 't-1' (delayed): {field} {json.dumps(value)} is not an "
        "RFC 3339 time with an offset (like 2026-11-21T06:00:00.012Z)"
    )


def test_rfc3339_times_with_offsets_and_junk_pass_the_first_record_check(tmp_path: Path) -> None:
    """Times with Z, an offset, a space or lower-case t/z pass; text that is no date at all is
    left to be counted as an invalid record."""
    for value in (
        "2026-11-21T06:00:00Z",
        "2026-11-21 06:00:00.123456-05:30",
        "2026-11-21t06:00:00z",
    ):
        assert json_key_problems({**GOOD, "fired_at": value}, "log") == []
    assert json_key_problems({**GOOD, "fired_at": "yesterday"}, "log") == []


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, {"on": True}])
def test_a_manual_that_is_not_a_boolean_is_refused(value: object) -> None:
    """`manual` must be a JSON boolean (or null): a string, even "true", or a number is refused
    naming the record."""
    problems = json_key_problems({**GOOD, "manual": value}, "log")
    assert problems == [
        f"log: record 't-1' (delayed): manual is {json.dumps(value)}, expected true or false "
        "(a JSON boolean)"
    ]
    assert json_key_problems({**GOOD, "manual": False}, "log") == []
    assert json_key_problems({**GOOD, "manual": None}, "log") == []


def parquet(path: Path, **columns: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ts = pa.array([datetime(2026, 11, 21, 6, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    base = {"kind": ["cron"], "key": ["a"], "subject": ["mq.a"], "scheduled_for": ts}
    pq.write_table(pa.table({**base, "fired_at": ts, **columns}), path)


def test_every_parquet_file_is_checked_against_the_first(tmp_path: Path) -> None:
    """Each file of a Parquet folder must give the record's columns the first file's types
    (timestamp units and string widths may differ); `manual` must be boolean in every file."""
    import pyarrow as pa

    parquet(tmp_path / "a.parquet", attempt=pa.array([1], pa.int32()))
    ms = pa.array([datetime(2026, 11, 21, 6, tzinfo=UTC)], pa.timestamp("ms", tz="UTC"))
    parquet(tmp_path / "b.parquet", fired_at=ms, kind=pa.array(["cron"], pa.large_string()))
    assert classify(str(tmp_path)).format == "parquet"
    parquet(tmp_path / "c.parquet", attempt=pa.array([1], pa.int64()))
    with pytest.raises(AuditInputError) as caught:
        classify(str(tmp_path))
    assert str(caught.value) == (
        f"--input: {str(tmp_path / 'c.parquet')!r}: column 'attempt' is int64, expected int32 "
        f"as in {str(tmp_path / 'a.parquet')!r}"
    )
    (tmp_path / "c.parquet").unlink()
    parquet(tmp_path / "d.parquet", manual=pa.array(["yes"], pa.string()))
    with pytest.raises(
        AuditInputError, match=r"d\.parquet: column 'manual' is string, expected boolean"
    ):
        classify(str(tmp_path))
    (tmp_path / "d.parquet").unlink()
    (tmp_path / "e.parquet").write_text("not parquet")
    with pytest.raises(AuditInputError, match=r"e\.parquet' is not readable Parquet"):
        classify(str(tmp_path))
