"""The audited interval: a UTC day (or a part of it) and the grace around it for deliveries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from scheduler.errors import AuditInputError

DAY = timedelta(days=1)
DEFAULT_GRACE = timedelta(hours=1)


def parse_day(text: str, today: date) -> date:
    """`YYYY-MM-DD`, `today` or `yesterday` (UTC days)."""
    word = text.strip().lower()
    if word == "today":
        return today
    if word == "yesterday":
        return today - DAY
    try:
        return date.fromisoformat(text.strip()) if len(text.strip()) == 10 else _bad_day(text)
    except ValueError:
        return _bad_day(text)


def _bad_day(text: str) -> date:
    raise AuditInputError("--date", f"{text!r} is not a date (YYYY-MM-DD, today or yesterday)")


def parse_instant(option: str, text: str) -> datetime:
    """An RFC 3339 instant with an offset or Z, as aware UTC."""
    try:
        value = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise AuditInputError(option, f"{text!r} is not an RFC 3339 time") from None
    if value.tzinfo is None:
        raise AuditInputError(option, f"{text!r} needs an offset or Z (e.g. 2026-11-21T06:00Z)")
    return value.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class AuditWindow:
    """Occurrences due in `[start, end)` are audited; deliveries count when `fired_at` lies in
    `[start - grace, end + grace)` (a delivery later than that is as good as missed)."""

    day: date
    start: datetime
    end: datetime
    grace: timedelta = DEFAULT_GRACE

    @classmethod
    def of_day(
        cls,
        day: date,
        since: datetime | None = None,
        until: datetime | None = None,
        grace: timedelta = DEFAULT_GRACE,
    ) -> AuditWindow:
        """The whole UTC day, or the part of it between `since` and `until`."""
        day_start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        start, end = since or day_start, until or day_start + DAY
        if not day_start <= start < day_start + DAY:
            raise AuditInputError("--from", f"{start.isoformat()} is not inside {day.isoformat()}")
        if not day_start < end <= day_start + DAY:
            raise AuditInputError("--until", f"{end.isoformat()} is not inside {day.isoformat()}")
        if end <= start:
            raise AuditInputError("--until", "must be later than --from")
        if grace < timedelta(0):
            raise AuditInputError("--grace", "must not be negative")
        return cls(day, start, end, grace)

    @property
    def fired_from(self) -> datetime:
        return self.start - self.grace

    @property
    def fired_until(self) -> datetime:
        return self.end + self.grace
