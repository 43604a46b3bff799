"""Cron expressions and their occurrences, with Debian cron's time-zone rules.

Pure maths: no I/O, no clock reads. An expression is matched against local wall-clock time in a
zone; each matching wall time then becomes zero, one or two UTC instants:

- A *fixed-time* job (neither the minute nor the hour field starts with `*`; a 6-field
  expression's seconds field does not count) fires once per matching wall time: in the first pass
  of a repeated hour, and at the first valid instant after a skipped one (02:30 on a
  spring-forward night fires at 03:00).
- Every other job follows real time: both passes of a repeated hour, nothing in a skipped one.

This is what Debian cron does and what `cronsim` implements; the unit tests check it against
cronsim. Day-of-month and day-of-week combine with OR unless either field starts with `*`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from itertools import takewhile

__all__ = [
    "MACROS",
    "CronExpr",
    "CronSyntaxError",
    "NoOccurrenceError",
    "next_after",
    "occurrences",
    "occurrences_between",
]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
SEARCH_YEARS = 50  # an expression that parses always fires within this (leap day on a weekday: 40)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MAX_DAY = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)


class CronSyntaxError(ValueError):
    """A cron expression is malformed or can never fire; the message names the field."""


class NoOccurrenceError(ValueError):
    """An expression has no occurrence within `SEARCH_YEARS` of the instant asked about."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0

    def value(self, token: str, field_text: str) -> int:
        if token.lower() in self.names:
            return self.names.index(token.lower()) + self.name_base
        if not (token.isascii() and token.isdigit()):  # "²".isdigit() is True
            raise self.error(field_text, f"{token!r} is not a number{self._name_hint()}")
        number = int(token) if len(token) <= 9 else self.high + 1  # int() of 5,000 digits raises
        if not self.low <= number <= self.high:
            raise self.error(field_text, f"value out of range {self.low}-{self.high}")
        return number

    def error(self, field_text: str, problem: str) -> CronSyntaxError:
        return CronSyntaxError(f"{self.name} field {field_text!r}: {problem}")

    def _name_hint(self) -> str:
        return f" or a name ({self.names[0]}..{self.names[-1]})" if self.names else ""


_FIELDS = (
    _Field("second", 0, 59),
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTHS, 1),
    _Field("day-of-week", 0, 7, _DAYS, 0),
)


def _parse_term(field: _Field, term: str, field_text: str) -> set[int]:
    base, slash, step_text = term.partition("/")
    step = 1
    if slash:
        digits = step_text.isascii() and step_text.isdigit() and len(step_text) <= 9
        if not digits or int(step_text) == 0:
            raise field.error(field_text, f"step {step_text!r} must be a whole number >= 1")
        step = int(step_text)
    if base == "*":
        low, high = field.low, field.high
    elif "-" in base:
        start, _, end = base.partition("-")
        low, high = field.value(start, field_text), field.value(end, field_text)
        if low > high:
            raise field.error(field_text, f"range {base!r} runs backwards")
    else:
        low = field.value(base, field_text)
        high = field.high if slash else low  # `5/15` means 5, 20, 35, 50 (as in cronsim)
    return set(range(low, high + 1, step))


def _parse_field(field: _Field, text: str) -> tuple[int, ...]:
    values: set[int] = set()
    for term in text.split(","):
        if not term:
            raise field.error(text, "empty list item")
        values |= _parse_term(field, term, text)
    if field.name == "day-of-week" and 7 in values:
        values = (values - {7}) | {0}  # 7 is another spelling of Sunday
    return tuple(sorted(values))


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the allowed values of each field, sorted."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    day_or: bool  # day-of-month OR day-of-week (neither field starts with `*`)
    fixed_time: bool  # neither minute nor hour starts with `*`: Debian's DST special case
    has_seconds: bool

    @classmethod
    def parse(cls, text: str) -> CronExpr:
        """Parse 5 fields, 6 with seconds first, or a macro; raise CronSyntaxError if invalid."""
        stripped = " ".join(text.split())
        parts = _expand(stripped).split()
        has_seconds = len(parts) == 6
        if not has_seconds:
            parts.insert(0, "0")
        sets = [_parse_field(field, part) for field, part in zip(_FIELDS, parts, strict=True)]
        day_or = not (parts[3].startswith("*") or parts[5].startswith("*"))
        fixed = not (parts[1].startswith("*") or parts[2].startswith("*"))
        seconds, minutes, hours, days, months, weekdays = sets
        expr = cls(
            stripped,
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            day_or=day_or,
            fixed_time=fixed,
            has_seconds=has_seconds,
        )
        _check_possible(expr, parts)
        return expr

    def matches_day(self, day: date) -> bool:
        """True when `day` satisfies the day-of-month and day-of-week fields (month not checked)."""
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        return (dom or dow) if self.day_or else (dom and dow)

    def __str__(self) -> str:
        return self.text


def _expand(text: str) -> str:
    if not text:
        raise CronSyntaxError("empty cron expression")
    if text.startswith("@"):
        body = MACROS.get(text.lower())
        if body is None:
            raise CronSyntaxError(f"unknown macro {text!r} (known: {', '.join(MACROS)})")
        return body
    count = len(text.split())
    if count not in (5, 6):
        raise CronSyntaxError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) "
            f"or 6 with seconds first, got {count} in {text!r}"
        )
    return text


def _check_possible(expr: CronExpr, parts: list[str]) -> None:
    # Every valid (month, day) date falls on every weekday within 400 years, so only
    # day-of-month against month can make an AND-combined expression impossible.
    if expr.day_or or any(day <= _MAX_DAY[m] for m in expr.months for day in expr.days):
        return
    raise _FIELDS[3].error(
        parts[3], f"no day {expr.days[0]}+ in month field {parts[4]!r}: the job would never fire"
    )


# --- Matching local wall-clock time -------------------------------------------------------------


def _ceil(values: tuple[int, ...], x: int) -> int | None:
    i = bisect_left(values, x)
    return values[i] if i < len(values) else None


def _next_month(expr: CronExpr, wall: datetime) -> datetime:
    month = _ceil(expr.months, wall.month + 1)
    if month is None:
        return datetime(wall.year + 1, expr.months[0], 1)
    return datetime(wall.year, month, 1)


def _next_wall(expr: CronExpr, wall: datetime) -> datetime:
    """The first naive wall time at or after `wall` that matches every field."""
    limit = wall.year + SEARCH_YEARS
    while wall.year <= limit:
        if wall.month not in expr.months:
            wall = _next_month(expr, wall)
        elif not expr.matches_day(wall.date()):
            wall = datetime.combine(wall.date() + _DAY, datetime.min.time())
        elif (hour := _ceil(expr.hours, wall.hour)) is None:
            wall = datetime.combine(wall.date() + _DAY, datetime.min.time())
        elif hour != wall.hour:
            wall = wall.replace(hour=hour, minute=0, second=0)
        elif (minute := _ceil(expr.minutes, wall.minute)) is None:
            wall = wall.replace(minute=0, second=0) + timedelta(hours=1)
        elif minute != wall.minute:
            wall = wall.replace(minute=minute, second=0)
        elif (second := _ceil(expr.seconds, wall.second)) is None:
            wall = wall.replace(second=0) + _MINUTE
        else:
            return wall.replace(second=second)
    raise NoOccurrenceError(f"cron {expr.text!r} does not fire within {SEARCH_YEARS} years")


def _offsets(wall: datetime, tz: tzinfo) -> tuple[timedelta, timedelta]:
    """UTC offsets of `wall` read as the first (fold=0) and the second (fold=1) pass.

    Equal: an ordinary wall time. First > second: a repeated (ambiguous) one. First < second:
    a wall time skipped by a forward jump (PEP 495 gives the offsets either side of the gap).
    """
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    assert first is not None and second is not None, "tz must give an offset"
    return first, second


def _local_wall(instant: datetime, tz: tzinfo) -> datetime:
    return instant.replace(tzinfo=UTC).astimezone(tz).replace(tzinfo=None, microsecond=0)


# --- Occurrences ----------------------------------------------------------------------------------


def _fixed_time(expr: CronExpr, after: datetime, tz: tzinfo) -> Iterator[datetime]:
    """Fixed-time jobs: one instant per matching wall time (first pass; skipped -> gap end)."""
    cursor = _local_wall(after, tz)
    while True:
        wall = _next_wall(expr, cursor + _SECOND)
        first, second = _offsets(wall, tz)
        if first >= second:
            instant, cursor = wall - first, wall
        else:
            instant = _gap_end(wall, tz)
            cursor = _local_wall(instant, tz)  # later wall times inside the gap are absorbed
        if instant > after:
            yield instant


def _gap_end(wall: datetime, tz: tzinfo) -> datetime:
    """The first valid whole minute after the gap `wall` falls in, as a naive UTC instant."""
    probe = wall.replace(second=0)
    for _ in range(2 * 24 * 60):
        probe += _MINUTE
        first, second = _offsets(probe, tz)
        if first >= second:
            return probe - first
    raise NoOccurrenceError(f"no end found to the time-zone gap around {wall.isoformat()}")


def _real_time(expr: CronExpr, after: datetime, tz: tzinfo) -> Iterator[datetime]:
    """Other jobs: every instant whose local wall time matches, in order."""
    wall = _local_wall(after, tz) - _fall_back_ahead(after, tz)
    second_pass: list[datetime] = []  # repeated-hour instants wait until their turn
    while True:
        wall = _next_wall(expr, wall)
        first, second = _offsets(wall, tz)
        if first > second:
            heapq.heappush(second_pass, wall - second)
        if first >= second:
            heapq.heappush(second_pass, wall - first)
            while second_pass and second_pass[0] <= wall - first:
                instant = heapq.heappop(second_pass)
                if instant > after:
                    yield instant
        wall += _SECOND


def _fall_back_ahead(after: datetime, tz: tzinfo) -> timedelta:
    """How far the clock goes back within 3 hours of `after` (0 if it does not).

    Wall times that early can still have a second-pass instant later than `after`.
    """
    now = after.replace(tzinfo=UTC).astimezone(tz).utcoffset()
    later = (after + timedelta(hours=3)).replace(tzinfo=UTC).astimezone(tz).utcoffset()
    assert now is not None and later is not None, "tz must give an offset"
    return max(now - later, timedelta(0))


def occurrences(expr: CronExpr, after: datetime, tz: tzinfo) -> Iterator[datetime]:
    """Aware UTC instants strictly after `after` at which `expr` fires in `tz`, in order."""
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError(f"after must be timezone-aware, got naive {after.isoformat()}")
    start = after.astimezone(UTC).replace(tzinfo=None)
    engine = _fixed_time if expr.fixed_time else _real_time
    return (instant.replace(tzinfo=UTC) for instant in engine(expr, start, tz))


def next_after(expr: CronExpr, after: datetime, tz: tzinfo) -> datetime:
    """The first instant strictly after `after` at which `expr` fires in `tz` (aware UTC)."""
    return next(occurrences(expr, after, tz))


def occurrences_between(
    expr: CronExpr, start: datetime, end: datetime, tz: tzinfo
) -> Iterator[datetime]:
    """Instants in [start, end) at which `expr` fires in `tz` (aware UTC), in order."""
    if end.tzinfo is None or end.utcoffset() is None:
        raise ValueError(f"end must be timezone-aware, got naive {end.isoformat()}")
    found = occurrences(expr, start - timedelta(microseconds=1), tz)
    return takewhile(lambda instant: instant < end, found)
