"""summary.json of the drift audit: the design's fields, the SLO verdict and its reasons."""

from __future__ import annotations

from typing import Any

from scheduler.audit.summary import Slo, build


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
