"""The drift audit's options and inputs, checked before Spark starts."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from scheduler.audit.inputs import classify, fired_at_slices, jdbc_jar, jdbc_source
from scheduler.audit.record import column_problems
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
    assert w.fired_from == w.start - timedelta(hours=1) and w.whole_day
    part = AuditWindow.of_day(date(2026, 11, 21), w.start + timedelta(hours=2))
    assert part.start.hour == 2 and not part.whole_day
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
    from scheduler.cli import main

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
