"""Expected cron occurrences, from the daemon's own cron code. Pure; runs on Spark executors.

A job *version* is one definition of a job over the part of the day it was in force: the whole
window for jobs read from YAML, or the interval between two syncs for jobs read from the
`schedule_history` table. A version expects every occurrence strictly after `active_from` (the
daemon starts a new job's cursor at the sync instant and fires what comes after it) and before
`active_until`; a paused version expects none. Each occurrence is due at its scheduled instant
plus the job's fixed per-occurrence jitter (`scheduler.cron.jobs.jitter_for`), exactly as the
daemon fires it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from scheduler.cron.expression import CronExpr, occurrences_between
from scheduler.cron.jobs import Job, jitter_for

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
BATCH_ROWS = 65_536


def to_us(instant: datetime) -> int:
    """Microseconds since the epoch of an aware instant."""
    return (instant - _EPOCH) // _US


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True, slots=True)
class JobVersion:
    """One definition of a cron job and the interval it was in force (µs since the epoch;
    None: open)."""

    name: str
    subject: str
    cron: str
    timezone: str
    jitter_us: int = 0
    paused: bool = False
    active_from_us: int | None = None
    active_until_us: int | None = None

    @classmethod
    def of_job(cls, job: Job) -> JobVersion:
        """A YAML job, in force over the whole window."""
        return cls(
            job.name, job.subject, job.cron.text, job.timezone.key, job.jitter // _US, job.paused
        )

    @classmethod
    def of_definition(
        cls, definition: dict[str, Any] | str, since: datetime, until: datetime | None
    ) -> JobVersion:
        """A `schedule_history` row: the stored `Job.definition()` and its interval."""
        doc = json.loads(definition) if isinstance(definition, str) else definition
        jitter = timedelta(seconds=float(doc.get("jitter_seconds") or 0))
        return cls(
            name=doc["name"],
            subject=doc["subject"],
            cron=doc["cron"],
            timezone=doc.get("timezone") or "UTC",
            jitter_us=jitter // _US,
            paused=bool(doc.get("paused", False)),
            active_from_us=to_us(since),
            active_until_us=None if until is None else to_us(until),
        )

    def row(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=256)
def _occurrences_us(cron: str, timezone: str, start_us: int, end_us: int) -> tuple[int, ...]:
    """Occurrences in [start, end) as µs; shared by every job with the same expression and zone."""
    found = occurrences_between(
        CronExpr.parse(cron), from_us(start_us), from_us(end_us), ZoneInfo(timezone)
    )
    return tuple(to_us(instant) for instant in found)


def expand(version: JobVersion, start_us: int, end_us: int) -> tuple[list[int], list[int]]:
    """(scheduled_for, due_at) in µs of every occurrence `version` expects in [start, end)."""
    if version.paused:
        return [], []
    scheduled = _occurrences_us(version.cron, version.timezone, start_us, end_us)
    low, high = version.active_from_us, version.active_until_us
    if low is not None or high is not None:
        low = start_us - 1 if low is None else low
        high = end_us if high is None else high
        scheduled = tuple(t for t in scheduled if low < t < high)
    if not version.jitter_us:
        return list(scheduled), list(scheduled)
    jitter = timedelta(microseconds=version.jitter_us)
    due = [t + jitter_for(version.name, from_us(t), jitter) // _US for t in scheduled]
    return list(scheduled), due


def expand_arrow(batches: Iterable[Any], start_us: int, end_us: int) -> Iterator[Any]:
    """`mapInArrow` body: job-version batches in, Arrow batches of expected occurrences out.

    Columns: key, subject, scheduled_for, due_at (timestamps, µs, UTC)."""
    import numpy as np
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    for batch in batches:
        for row in batch.to_pylist():
            scheduled, due = expand(JobVersion(**row), start_us, end_us)
            for at in range(0, len(scheduled), BATCH_ROWS):
                s = np.asarray(scheduled[at : at + BATCH_ROWS], dtype=np.int64)
                d = np.asarray(due[at : at + BATCH_ROWS], dtype=np.int64)
                picks = np.zeros(len(s), dtype=np.int64)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([row["name"]], pa.string()).take(picks),
                        pa.array([row["subject"]], pa.string()).take(picks),
                        pa.array(s, ts),
                        pa.array(d, ts),
                    ],
                    names=["key", "subject", "scheduled_for", "due_at"],
                )
