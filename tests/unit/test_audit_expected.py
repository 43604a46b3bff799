"""Expected cron occurrences for the drift audit: DST days, jitter, history windows, pausing."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pytest

from scheduler.audit.expected import JobVersion, expand, from_us, to_us
from scheduler.audit.window import AuditWindow
from scheduler.cron.jobs import jitter_for, load_text


def day_of(version: JobVersion, day: date) -> list[str]:
    window = AuditWindow.of_day(day)
    scheduled, _ = expand(version, to_us(window.start), to_us(window.end))
    return [from_us(t).strftime("%H:%M") for t in scheduled]


@pytest.mark.parametrize(
    ("cron", "zone", "day", "expected"),
    [
        # Lisbon springs forward at 01:00 on 2026-03-29: 00:30 local is 00:30Z, and the next
        # day's 00:30 (now UTC+1) is 23:30Z of the same UTC day: two runs in one UTC day ...
        ("30 0 * * *", "Europe/Lisbon", date(2026, 3, 29), ["00:30", "23:30"]),
        # ... and none on the day it falls back
        ("30 0 * * *", "Europe/Lisbon", date(2026, 10, 25), []),
        # New York: 02:30 does not exist on 2026-03-08; a fixed-time job fires at 03:00 EDT
        ("30 2 * * *", "America/New_York", date(2026, 3, 8), ["07:00"]),
        # a real-time job has nothing to fire in the skipped hour
        ("*/30 2 * * *", "America/New_York", date(2026, 3, 8), []),
        # 01:xx happens twice on 2026-11-01: fixed-time fires in the first pass only ...
        ("30 1 * * *", "America/New_York", date(2026, 11, 1), ["05:30"]),
        # ... real-time in both
        (
            "*/30 1 * * *",
            "America/New_York",
            date(2026, 11, 1),
            ["05:00", "05:30", "06:00", "06:30"],
        ),
    ],
)
def test_dst_days_expect_what_debian_cron_fires(
    cron: str, zone: str, day: date, expected: list[str]
) -> None:
    """Expected occurrences in a UTC day follow the daemon's DST rules (hand-checked)."""
    assert day_of(JobVersion("j", "mq.x", cron, zone), day) == expected


def test_every_quarter_hour_on_a_dst_day_is_96_runs_of_real_time() -> None:
    """A real-time job in a DST zone fires every 15 real minutes through the change: 96."""
    assert (
        len(day_of(JobVersion("j", "mq.x", "*/15 * * * *", "Europe/Berlin"), date(2026, 3, 29)))
        == 96
    )


def test_due_time_adds_the_jobs_fixed_jitter() -> None:
    """With jitter, an occurrence is due at its instant plus the daemon's fixed jitter."""
    job = load_text(
        'scheduled_jobs:\n  - {name: jit, subject: mq.x, cron: "0 * * * *", jitter: 30s}\n'
    ).jobs[0]
    window = AuditWindow.of_day(date(2026, 11, 21))
    scheduled, due = expand(JobVersion.of_job(job), to_us(window.start), to_us(window.end))
    assert len(scheduled) == 24
    for s, d in zip(scheduled, due, strict=True):
        offset = jitter_for("jit", from_us(s), timedelta(seconds=30))
        assert d - s == offset // timedelta(microseconds=1)
        assert 0 <= d - s < 30_000_000
    assert len(set(d - s for s, d in zip(scheduled, due, strict=True))) > 1


def test_history_window_expects_runs_after_the_sync_and_before_removal() -> None:
    """A version in force from 10:00:00.5 to 15:00:00.5 expects 10:01..15:00 of a per-minute job;
    a paused version expects nothing."""
    since = datetime(2026, 11, 21, 10, 0, 0, 500_000, tzinfo=UTC)
    until = datetime(2026, 11, 21, 15, 0, 0, 500_000, tzinfo=UTC)
    doc = {"name": "m", "subject": "mq.m", "cron": "* * * * *", "timezone": "UTC"}
    version = JobVersion.of_definition(json.dumps(doc), since, until)
    runs = day_of(version, date(2026, 11, 21))
    assert (runs[0], runs[-1], len(runs)) == ("10:01", "15:00", 300)
    paused = JobVersion.of_definition({**doc, "paused": True}, since, None)
    assert day_of(paused, date(2026, 11, 21)) == []
