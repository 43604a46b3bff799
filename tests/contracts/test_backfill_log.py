"""The backfill's claims (`scheduler.operations.stores.BackfillLog`), over the in-memory twin
and PostgreSQL alike: an occurrence is claimed by one backfill, taken over only once its claim
is stale, confirmed once with its manual fire-log row, and given back while unconfirmed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.metrics import Metrics
from scheduler.operations.stores import BackfillLog, ScheduleReads
from scheduler.store.memory_schedules import MemoryBackfills, MemorySchedules

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
HOURS = [T0 - timedelta(hours=n) for n in (3, 2, 1)]
STALE = timedelta(seconds=60)


@dataclass
class Log:
    backfills: BackfillLog
    reads: ScheduleReads  # where the manual fire-log rows show


@pytest.fixture
async def log(database: str | None) -> AsyncIterator[Log]:
    if database is None:
        schedules = MemorySchedules()
        yield Log(MemoryBackfills(schedules), schedules)
        return
    from scheduler.store.postgres.backfill import BackfillStore
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.overview import OverviewStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        db = PostgresStore(pool, Metrics())
        yield Log(BackfillStore(db), OverviewStore(db))
    finally:
        await pool.close()


def _ids(occurrences: list[datetime]) -> list[str]:
    return [f"hourly@backfill-{at.isoformat()}" for at in occurrences]


async def _claim(
    log: Log, occurrences: list[datetime], now: datetime, who: str = "i-1"
) -> set[datetime]:
    return await log.backfills.claim(
        "hourly", occurrences, _ids(occurrences), who, now, now - STALE
    )


async def test_one_claim_per_occurrence_until_it_is_stale(log: Log) -> None:
    """A claim takes the occurrences nobody holds; a second backfill gets only the others;
    once a claim is older than `stale_before` another backfill takes it over, but never one
    that was confirmed."""
    assert await _claim(log, HOURS[:2], T0) == set(HOURS[:2])
    assert await _claim(log, HOURS, T0 + timedelta(seconds=59), "i-2") == {HOURS[2]}
    await log.backfills.confirm("hourly", "mq.s.h", HOURS[0], T0, "S", 1, "i-1")
    late = T0 + timedelta(seconds=61)
    assert await _claim(log, HOURS, late, "i-2") == {HOURS[1]}
    assert await _claim(log, HOURS, late + timedelta(seconds=1), "i-3") == set()
    assert await log.backfills.fired("hourly", HOURS) == {HOURS[0]}
    assert await log.backfills.fired("other", HOURS) == set()


async def test_a_confirmation_writes_one_manual_row(log: Log) -> None:
    """Confirming a claim marks it fired and writes its manual fire-log row at the occurrence
    (stream, sequence, acknowledgement time, instance); a repeat, or a confirmation of an
    occurrence never claimed, writes nothing."""
    await _claim(log, HOURS, T0)
    acked = T0 + timedelta(milliseconds=5)
    await log.backfills.confirm("hourly", "mq.s.h", HOURS[1], acked, "S", 7, "i-1")
    await log.backfills.confirm("hourly", "mq.s.h", HOURS[1], acked, "S", 8, "i-1")
    await log.backfills.confirm("hourly", "mq.s.h", T0, acked, "S", 9, "i-1")
    rows = await log.reads.fires("hourly", 10)
    assert rows == [
        {
            "scheduled_for": HOURS[1], "fired_at": acked, "attempt": 1, "epoch": 0,
            "instance": "i-1", "stream": "S", "stream_seq": 7, "manual": True,
        }
    ]  # fmt: skip
    assert await log.backfills.fired("hourly", HOURS) == {HOURS[1]}


async def test_a_release_gives_back_only_unconfirmed_claims(log: Log) -> None:
    """Released occurrences can be claimed at once by another backfill; a confirmed one stays
    fired."""
    await _claim(log, HOURS, T0)
    await log.backfills.confirm("hourly", "mq.s.h", HOURS[0], T0, "S", 1, "i-1")
    await log.backfills.release("hourly", HOURS)
    assert await _claim(log, HOURS, T0, "i-2") == set(HOURS[1:])
    assert await log.backfills.fired("hourly", HOURS) == {HOURS[0]}
