"""Cron expressions: parsing, field semantics and occurrences in UTC."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice
from zoneinfo import ZoneInfo

import pytest

from scheduler.cron.expression import (
    CronExpr,
    CronSyntaxError,
    next_after,
    occurrences,
    occurrences_between,
)

Z = ZoneInfo("UTC")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def first(cron: str, start: str, count: int = 5) -> list[str]:
    """The next `count` UTC firing times of `cron` after `start`, as `YYYY-MM-DDTHH:MM:SS`."""
    found = islice(occurrences(CronExpr.parse(cron), utc(start), Z), count)
    return [f"{t:%Y-%m-%dT%H:%M:%S}" for t in found]


@pytest.mark.parametrize(
    ("text", "field", "values"),
    [
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("5/20 * * * *", "minutes", (5, 25, 45)),
        ("10-20/5 * * * *", "minutes", (10, 15, 20)),
        ("1,2,40-42 * * * *", "minutes", (1, 2, 40, 41, 42)),
        ("0 */7 * * *", "hours", (0, 7, 14, 21)),
        ("0 0 */10 * *", "days", (1, 11, 21, 31)),
        ("0 0 1 jan,Mar,DEC *", "months", (1, 3, 12)),
        ("0 0 1 feb-apr *", "months", (2, 3, 4)),
        ("0 0 * * 7", "weekdays", (0,)),
        ("0 0 * * 5-7", "weekdays", (0, 5, 6)),
        ("0 0 * * mon-fri", "weekdays", (1, 2, 3, 4, 5)),
        ("0 0 * * SUN,sat", "weekdays", (0, 6)),
        ("0 0 * * 1/3", "weekdays", (0, 1, 4)),
        ("0 0 * * *", "weekdays", (0, 1, 2, 3, 4, 5, 6)),
        ("*/20 0 0 * * *", "seconds", (0, 20, 40)),
        ("0 0 * * *", "seconds", (0,)),
    ],
)
def test_field_values(text: str, field: str, values: tuple[int, ...]) -> None:
    """Lists, ranges, steps, names and 7-as-Sunday expand to the expected sorted values."""
    assert getattr(CronExpr.parse(text), field) == values


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros(macro: str, equivalent: str) -> None:
    """Each macro means the same as its five-field spelling and keeps its own text."""
    parsed, plain = CronExpr.parse(macro), CronExpr.parse(equivalent)
    assert (parsed.minutes, parsed.hours, parsed.days) == (plain.minutes, plain.hours, plain.days)
    assert (parsed.months, parsed.weekdays, parsed.fixed_time) == (
        plain.months,
        plain.weekdays,
        plain.fixed_time,
    )
    assert str(parsed) == macro


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty cron expression"),
        ("* * * *", "expected 5 fields (minute hour day-of-month month day-of-week) or 6"),
        ("* * * * * * *", "got 7"),
        ("@reboot", "unknown macro '@reboot'"),
        ("60 * * * *", "minute field '60': value out of range 0-59"),
        ("* 24 * * *", "hour field '24': value out of range 0-23"),
        ("* * 0 * *", "day-of-month field '0': value out of range 1-31"),
        ("* * 32 * *", "day-of-month field '32': value out of range 1-31"),
        ("* * * 13 *", "month field '13': value out of range 1-12"),
        ("* * * * 8", "day-of-week field '8': value out of range 0-7"),
        ("60 * * * * *", "second field '60': value out of range 0-59"),
        ("* * * foo *", "month field 'foo': 'foo' is not a number or a name (jan..dec)"),
        ("* * * * mon-xyz", "day-of-week field 'mon-xyz': 'xyz' is not a number or a name"),
        ("jan * * * *", "minute field 'jan': 'jan' is not a number"),
        ("*/0 * * * *", "minute field '*/0': step '0' must be a whole number >= 1"),
        ("*/x * * * *", "minute field '*/x': step 'x' must be a whole number >= 1"),
        ("1/ * * * *", "minute field '1/': step '' must be a whole number >= 1"),
        ("30-10 * * * *", "minute field '30-10': range '30-10' runs backwards"),
        ("1,,2 * * * *", "minute field '1,,2': empty list item"),
        ("-5 * * * *", "minute field '-5': '' is not a number"),
        ("L * * * *", "minute field 'L': 'L' is not a number"),
        ("0 0 30 2 *", "day-of-month field '30': no day 30+ in month field '2'"),
        ("0 0 31 4,6,9,11 *", "day-of-month field '31'"),
    ],
)
def test_syntax_errors(text: str, message: str) -> None:
    """A bad expression raises CronSyntaxError whose message names the field and the problem."""
    with pytest.raises(CronSyntaxError) as caught:
        CronExpr.parse(text)
    assert message in str(caught.value)


def test_syntax_error_is_a_value_error() -> None:
    """CronSyntaxError is a ValueError, so pydantic and callers can treat it as one."""
    assert issubclass(CronSyntaxError, ValueError)


def test_possible_day_of_month_with_day_of_week_is_accepted() -> None:
    """`0 0 30 2 mon` fires on Mondays (OR rule), so it is not an impossible expression."""
    assert first("0 0 30 2 mon", "2026-01-01T00:00", 1) == ["2026-02-02T00:00:00"]


def test_whitespace_is_normalised() -> None:
    """Extra spaces and tabs between fields are accepted and normalised in the text."""
    assert CronExpr.parse("  0\t2  * * * ").text == "0 2 * * *"


@pytest.mark.parametrize(
    ("text", "fixed"),
    [
        ("0 2 * * *", True),
        ("0-59/5 2 * * *", True),
        ("*/5 2 * * *", False),
        ("0 */6 * * *", False),
        ("0 * * * *", False),
        ("@daily", True),
        ("@hourly", False),
        ("*/10 30 2 * * *", True),
        ("0 * 2 * * *", False),
    ],
)
def test_fixed_time(text: str, fixed: bool) -> None:
    """A job is fixed-time when neither minute nor hour starts with `*` (seconds do not count)."""
    assert CronExpr.parse(text).fixed_time is fixed


OCCURRENCES = [
    ("*/15 * * * *", "2026-01-01T00:07", ["00:15", "00:30", "00:45", "01:00", "01:15"]),
    ("0 */6 * * *", "2026-01-01T00:00", ["06:00", "12:00", "18:00", "00:00", "06:00"]),
    ("0 2 * * *", "2026-01-01T02:00", ["02:00"] * 5),
    ("5/20 9-10 * * *", "2026-01-01T00:00", ["09:05", "09:25", "09:45", "10:05", "10:25"]),
    ("59 23 31 12 *", "2026-06-01T00:00", ["23:59"] * 5),
]


@pytest.mark.parametrize(("cron", "start", "times"), OCCURRENCES)
def test_occurrence_times(cron: str, start: str, times: list[str]) -> None:
    """Occurrences in UTC land on the expected wall-clock times, in order."""
    assert [t[11:16] for t in first(cron, start)] == times


@pytest.mark.parametrize(
    ("cron", "start", "expected"),
    [
        ("0 0 13 * 5", "2026-02-01T00:00", ["2026-02-06", "2026-02-13", "2026-02-20"]),
        ("0 0 13 * *", "2026-02-01T00:00", ["2026-02-13", "2026-03-13", "2026-04-13"]),
        ("0 0 * * 5", "2026-02-01T00:00", ["2026-02-06", "2026-02-13", "2026-02-20"]),
        ("0 0 */13 * 5", "2026-02-01T00:00", ["2026-02-27", "2026-03-27", "2026-05-01"]),
        ("0 0 13 * */5", "2026-02-01T00:00", ["2026-02-13", "2026-03-13", "2026-09-13"]),
        ("0 0 29 2 *", "2026-01-01T00:00", ["2028-02-29", "2032-02-29", "2036-02-29"]),
        ("0 0 1 1 *", "2026-01-01T00:00", ["2027-01-01", "2028-01-01", "2029-01-01"]),
        ("0 0 31 * *", "2026-01-31T00:00", ["2026-03-31", "2026-05-31", "2026-07-31"]),
    ],
)
def test_day_rules(cron: str, start: str, expected: list[str]) -> None:
    """Day-of-month and day-of-week combine with OR, or with AND when either starts with `*`."""
    assert [t[:10] for t in first(cron, start, 3)] == expected


def test_longest_possible_wait_is_found() -> None:
    """A leap day on one weekday can be 40 years apart (2888 -> 2928); the search finds it."""
    expr = CronExpr.parse("0 0 29 2 */7")  # AND: the 29th of February that is a Sunday
    assert next_after(expr, utc("2888-02-29T00:00"), Z) == utc("2928-02-29T00:00")


def test_six_field_seconds() -> None:
    """A six-field expression fires on the seconds its first field names."""
    got = first("*/20 30 * * * *", "2026-01-01T00:00", 4)
    assert got == [
        "2026-01-01T00:30:00",
        "2026-01-01T00:30:20",
        "2026-01-01T00:30:40",
        "2026-01-01T01:30:00",
    ]


def test_next_after_is_strictly_after() -> None:
    """An occurrence exactly at `after` is not returned; the next one is."""
    expr = CronExpr.parse("0 * * * *")
    assert next_after(expr, utc("2026-01-01T05:00"), Z) == utc("2026-01-01T06:00")
    assert next_after(expr, utc("2026-01-01T04:59:59.999999"), Z) == utc("2026-01-01T05:00")


def test_next_after_with_microseconds() -> None:
    """Sub-second starts round correctly: the next whole second after 05:00:00.5 is 05:00:01."""
    expr = CronExpr.parse("* * * * * *")
    assert next_after(expr, utc("2026-01-01T05:00:00.5"), Z) == utc("2026-01-01T05:00:01")


def test_result_is_aware_utc() -> None:
    """Results are aware datetimes in UTC whatever the zone and the start's offset."""
    start = datetime(2026, 7, 1, 12, tzinfo=timezone(timedelta(hours=5)))
    got = next_after(CronExpr.parse("0 9 * * *"), start, ZoneInfo("Europe/Berlin"))
    assert got.tzinfo is UTC
    assert got == utc("2026-07-02T07:00")


def test_naive_after_is_rejected() -> None:
    """A naive start raises ValueError instead of guessing a zone."""
    with pytest.raises(ValueError, match="timezone-aware"):
        next_after(CronExpr.parse("* * * * *"), datetime(2026, 1, 1), Z)


def test_naive_end_is_rejected() -> None:
    """occurrences_between rejects a naive end at once, not on first iteration."""
    with pytest.raises(ValueError, match="timezone-aware"):
        occurrences_between(CronExpr.parse("* * * * *"), utc("2026-01-01"), datetime(2026, 1, 2), Z)


def test_occurrences_between_is_half_open() -> None:
    """occurrences_between includes an occurrence at start and excludes one at end."""
    expr = CronExpr.parse("0 * * * *")
    got = list(occurrences_between(expr, utc("2026-01-01T01:00"), utc("2026-01-01T04:00"), Z))
    assert got == [utc("2026-01-01T01:00"), utc("2026-01-01T02:00"), utc("2026-01-01T03:00")]


def test_occurrences_between_empty_window() -> None:
    """An empty or inverted window yields nothing."""
    expr = CronExpr.parse("* * * * *")
    start = utc("2026-01-01T01:00")
    assert list(occurrences_between(expr, start, start, Z)) == []
    assert list(occurrences_between(expr, start, start - timedelta(hours=1), Z)) == []


def test_cron_expr_is_frozen_and_hashable() -> None:
    """CronExpr is an immutable value: equal texts give equal, hashable objects."""
    a, b = CronExpr.parse("0 2 * * *"), CronExpr.parse("0 2 * * *")
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.text = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    ["* * * * *", "0 0 29 2 *", "59 23 31 12 *", "0 9-17 * * mon-fri", "*/10 * * * * *"],
)
def test_fifty_occurrences_are_fast(text: str) -> None:
    """Fifty occurrences take milliseconds, even for a job that fires once in four years."""
    expr, zone = CronExpr.parse(text), ZoneInfo("America/New_York")
    began = time.perf_counter()
    assert len(list(islice(occurrences(expr, utc("2027-11-06T12:00"), zone), 50))) == 50
    assert time.perf_counter() - began < 0.1
