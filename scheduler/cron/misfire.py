"""What a cron job fires now: its occurrences since the cursor, after downtime policies. Pure.

`plan(job, cursor, now)` looks at the occurrences in (cursor, now] whose fire time (occurrence
plus the job's fixed per-occurrence jitter) has come, and decides by `misfire`:

| policy | fires |
|---|---|
| `skip` | only an occurrence that is on time (less than `ON_TIME` late) |
| `fire_once` | the latest occurrence inside `catchup_window`, once |
| `fire_all` | every occurrence inside `catchup_window`, at most `MAX_CATCHUP` (the latest) |

Occurrences older than `catchup_window` are never fired late. The cursor moves past everything
considered, fired or not, so nothing is considered twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler.cron.expression import occurrences
from scheduler.cron.jobs import Job, Misfire, jitter_for

ON_TIME = timedelta(seconds=1)
MAX_CATCHUP = 10
SCAN_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Plan:
    """Occurrences to fire now (oldest first), how many were skipped, and the new cursor."""

    fire: tuple[datetime, ...]
    skipped: int
    cursor: datetime


def fire_time(job: Job, occurrence: datetime) -> datetime:
    """When an occurrence is published: the occurrence plus its fixed jitter."""
    return occurrence + jitter_for(job.name, occurrence, job.jitter)


def plan(job: Job, cursor: datetime, now: datetime) -> Plan:
    """Decide what `job` fires at `now`, given it has handled every occurrence up to `cursor`."""
    # Nothing older than the catch-up window can fire: start scanning there (bounded work
    # after a long outage, even for an every-second job).
    start = max(cursor, now - job.catchup_window - job.jitter - ON_TIME)
    due: list[datetime] = []
    for occurrence in occurrences(job.cron, start, job.timezone):
        if fire_time(job, occurrence) > now or len(due) >= SCAN_LIMIT:
            break
        due.append(occurrence)
    skipped_before = _count_before(job, cursor, start)
    if not due:
        return Plan((), skipped_before, max(cursor, start) if skipped_before else cursor)
    fire = _choose(job, due, now)
    return Plan(tuple(fire), skipped_before + len(due) - len(fire), due[-1])


def _choose(job: Job, due: list[datetime], now: datetime) -> list[datetime]:
    window = [o for o in due if now - fire_time(job, o) <= job.catchup_window]
    if job.misfire is Misfire.SKIP:
        return [o for o in window if now - fire_time(job, o) < ON_TIME]
    if job.misfire is Misfire.FIRE_ONCE:
        return window[-1:]
    return window[-MAX_CATCHUP:]


def _count_before(job: Job, cursor: datetime, start: datetime) -> int:
    """Occurrences in (cursor, start]: skipped unseen because they fell outside the window."""
    if start <= cursor:
        return 0
    count = 0
    for occurrence in occurrences(job.cron, cursor, job.timezone):
        if occurrence > start or count >= SCAN_LIMIT:
            break
        count += 1
    return count


def next_fire(job: Job, cursor: datetime) -> datetime:
    """The next time `job` has something to fire after `cursor`."""
    for occurrence in occurrences(job.cron, cursor, job.timezone):
        return fire_time(job, occurrence)
    raise AssertionError("a parsed cron expression always has a next occurrence")
