"""The console's words and pictures: cron in plain words under our cron rules, relative times,
jitter, a dead letter's bytes as published, subjects that wrap at dots, the SVG bar charts, the
schedules summary, and the causes given for late fires."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.console.charts import HEIGHT, Bar, bars
from scheduler.console.cron_words import describe
from scheduler.console.display import ago, jitter, raw_text, subject_breaks
from scheduler.console.schedules import matches
from scheduler.console.trends import charts, summarize
from scheduler.operations.history import cause

NOW = datetime(2026, 11, 26, 14, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("*/5 * * * 1-5", "Every 5 minutes, on Monday through Friday"),
        ("* * * * * *", "Every second"),
        ("*/10 * * * * *", "Every 10 seconds"),
        ("30 2 * * *", "At 02:30"),
        ("0 * * * *", "Every hour"),
        ("@daily", "At 00:00"),
        ("@weekly", "At 00:00, on Sunday"),
        ("15,45 * * * *", "At 15 and 45 minutes past the hour"),
        ("5/15 * * * *", "Every 15 minutes, starting at 5 minutes past the hour"),
        ("0 9 * * mon-fri", "At 09:00, on Monday through Friday"),
        ("0 12 * jan,jul sun", "At 12:00, on Sunday, only in January and July"),
        # both day fields restricted, neither starting with `*`: OR (Debian cron, cronsim)
        ("0 0 1 * 1", "At 00:00, on day 1 of the month, or on Monday"),
        ("0 0 1,15 * 1-5", "At 00:00, on day 1 and 15 of the month, or on Monday through Friday"),
        ("0 0 1-31 * 1", "At 00:00"),  # OR with every day of the month: every day
        # a day field starting with `*` makes it AND (the library says "or" for the first)
        ("0 0 */2 * 1", "At 00:00, every 2 days, if that day is a Monday"),
        ("0 0 */1 * 1", "At 00:00, on Monday"),
        # day-of-week from our parse: 7 is Sunday, `1/2` runs to 7 (the library words neither)
        ("0 0 * * 0-7", "At 00:00"),
        ("0 0 * * 5-7", "At 00:00, on Friday through Sunday"),
        ("0 0 * * 1/2", "At 00:00, on Monday, Wednesday, Friday and Sunday"),
        ("0 0 * * 0,6", "At 00:00, on Saturday and Sunday"),
        ("0 0 29 2 *", "At 00:00, on day 29 of the month, only in February"),
    ],
)
def test_cron_in_plain_words_follows_our_cron_rules(cron: str, words: str) -> None:
    """Each expression reads as what our cron parser fires, day rules included."""
    assert describe(cron) == words


@pytest.mark.parametrize(
    "cron", ["0 0 L * *", "0 0 * * 5#2", "H * * * *", "nonsense", "", "x" * 300]
)
def test_an_expression_our_parser_refuses_gets_no_words(cron: str) -> None:
    """`L`, `#`, `H` and malformed or oversized text get no words: the page shows the cron."""
    assert describe(cron) is None


def test_relative_times_say_in_and_ago() -> None:
    """Future instants read `in ...`, past ones `... ago`, under a second either way too."""
    assert ago(NOW + timedelta(minutes=2, seconds=5), NOW) == "in 2 min"
    assert ago(NOW - timedelta(seconds=12), NOW) == "12 s ago"
    assert ago(NOW + timedelta(hours=5), NOW) == "in 5 h"
    assert ago(NOW + timedelta(milliseconds=300), NOW) == "in under 1 s"
    assert ago(NOW, NOW) == "just now"


def test_jitter_is_the_offset_after_the_occurrence() -> None:
    """A job's fixed jitter shows as the delay after its occurrence, ms below a second."""
    assert jitter("2026-11-26T14:00:00.250Z", "2026-11-26T14:00:00Z") == "+250 ms"
    assert jitter("2026-11-26T14:00:01.500Z", "2026-11-26T14:00:00Z") == "+1.500 s"
    assert jitter(None, "2026-11-26T14:00:00Z") == "—"


def test_a_dead_letter_shows_its_bytes_as_published() -> None:
    """Stored bytes read back as published (key order, spacing); a cut one ends in U+FFFD;
    bytes that are not UTF-8, or none, give no text."""
    published = b'{"z": 1,   "id": "t1", "a": [2]}'
    doc = {"raw_base64": base64.b64encode(published).decode(), "payload": {"a": [2]}}
    assert raw_text(doc) == published.decode()
    cut = "héé".encode()[:-1]
    assert (
        raw_text({"raw_base64": base64.b64encode(cut).decode(), "raw_truncated": True})
        == "hé\ufffd"
    )
    assert raw_text({"raw_base64": base64.b64encode(cut).decode()}) is None
    assert raw_text({"raw_base64": None, "payload": {}}) is None


def test_subjects_wrap_only_after_dots_and_stay_escaped() -> None:
    """A subject is one unbreakable box per token, its dot kept with it; markup stays text."""
    assert str(subject_breaks("mq.tasks.<b>")) == (
        '<span class="tok">mq.</span><wbr><span class="tok">tasks.</span><wbr>'
        '<span class="tok">&lt;b&gt;</span>'
    )


def heights(svg: str) -> list[tuple[str, float]]:
    return [(k, float(h)) for k, h in re.findall(r'<rect class="(\w+)"[^>]*height="([\d.]+)"', svg)]


def test_bars_scale_to_the_largest_and_mark_missing_and_abnormal() -> None:
    """Bars are proportional to the largest value; a missing value is a faint full slot, an
    abnormal one has its own class, a tiny positive one stays visible; labels are escaped."""
    svg = str(
        bars(
            [Bar(10, "a"), Bar(5, "b"), Bar(None, "c"), Bar(40, "d <x>", True), Bar(0.01, "e")],
            "Lateness <p99>",
        )
    )
    assert heights(svg) == [
        ("bar", HEIGHT / 4), ("bar", HEIGHT / 8), ("none", HEIGHT), ("abnormal", HEIGHT),
        ("bar", 1.0),
    ]  # fmt: skip
    assert 'aria-label="Lateness &lt;p99&gt;"' in svg and "<title>d &lt;x&gt;</title>" in svg
    assert "style=" not in svg, "the CSP forbids inline styles"
    assert heights(str(bars([Bar(0, "z")], "empty"))) == [("bar", 0.0)]


def bucket(
    i: int, n: int | None, p99: float | None = None, abnormal: bool = False
) -> dict[str, Any]:
    start = (NOW + timedelta(minutes=i)).isoformat()
    return {
        "start": start, "deliveries": n, "per_minute": n, "p50_ms": p99, "p99_ms": p99,
        "max_ms": p99, "abnormal": abnormal, "dead_letters": 0 if n is not None else None,
    }  # fmt: skip


def test_history_charts_show_empty_buckets_as_on_time_and_unread_ones_as_missing() -> None:
    """A bucket without deliveries charts as zero lateness, one not read as missing; an
    abnormal bucket is counted and coloured."""
    history = {
        "window": "1h",
        "buckets": [bucket(0, None), bucket(1, 0), bucket(2, 3, 7341.0, True), bucket(3, 5, 2.0)],
    }
    drawn = charts(history)
    kinds = [k for k, _ in heights(str(drawn.lateness))]
    assert kinds == ["none", "bar", "abnormal", "bar"] and drawn.abnormal == 1
    assert "14:02 UTC: p50 7,341 ms" in str(drawn.lateness)
    assert drawn.dead is not None


def test_the_summary_counts_states_and_finds_the_next_active_fire() -> None:
    """Active, paused and failed jobs are counted; the next fire is the soonest active job's."""
    jobs: list[dict[str, Any]] = [
        {"name": "hourly", "cron": "0 * * * *", "timezone": "UTC"},
        {"name": "soon", "cron": "*/5 * * * *", "timezone": "UTC"},
        {"name": "held", "cron": "* * * * *", "timezone": "UTC", "paused": True},
        {"name": "broken", "cron": "* * * * *", "timezone": "UTC", "failed": True},
    ]
    s = summarize(jobs, NOW + timedelta(minutes=1), partial=False)
    assert (s.active, s.paused, s.failed) == (2, 1, 1)
    assert s.next_job == "soon" and s.next_at == NOW + timedelta(minutes=5)


def test_the_search_matches_name_subject_or_description_and_state() -> None:
    """The schedules search is a case-blind substring of name, subject or description, and the
    state filter keeps only jobs in that state (failed before paused)."""
    job = {"name": "nightly", "subject": "mq.Reports.daily", "description": "The big one"}
    assert matches(job, {"q": "REPORTS", "state": ""})
    assert matches(job, {"q": "big", "state": "active"})
    assert not matches(job, {"q": "weekly", "state": ""})
    assert not matches(job, {"q": "", "state": "paused"})
    assert matches({**job, "paused": True, "failed": True}, {"q": "", "state": "failed"})


FIRE = {"scheduled_for": "2026-11-26T14:00:00+00:00", "attempt": 1, "epoch": 8, "instance": "b"}


def test_a_late_fire_is_blamed_on_a_retry_or_a_change_of_leader_only_when_the_log_says() -> None:
    """A later attempt is a retry; a fire whose epoch took office, or first delivered, after it
    was due while an earlier epoch delivered before is a leader change; else no cause."""
    epochs = [
        {"epoch": 7, "instance": "a", "first_at": "2026-11-26T13:00:00+00:00",
         "last_at": "2026-11-26T13:59:58+00:00"},
        {"epoch": 8, "instance": "b", "first_at": "2026-11-26T14:00:07+00:00",
         "last_at": "2026-11-26T14:30:00+00:00"},
    ]  # fmt: skip
    assert (cause({**FIRE, "attempt": 3}, epochs, {}) or "").startswith(
        "retried: delivered at attempt 3"
    )
    by_gap = cause(FIRE, epochs, {})
    assert by_gap is not None
    assert "epoch 7 (a) delivered last at 2026-11-26 13:59:58.000 UTC" in by_gap
    office = {"epoch": 8, "since": datetime(2026, 11, 26, 14, 0, 6, tzinfo=UTC)}
    by_office = cause(FIRE, epochs[1:], office)
    assert by_office is not None and "took office at 2026-11-26 14:00:06.000 UTC" in by_office
    assert cause(FIRE, epochs[1:], {"epoch": 8, "since": NOW - timedelta(hours=1)}) is None
    steady = [{**epochs[1], "first_at": "2026-11-26T13:00:00+00:00"}]
    assert cause(FIRE, epochs[:1] + steady, {}) is None
