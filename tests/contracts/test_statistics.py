"""The operator half's statistics (`scheduler.operations.stores.Statistics`), over the
in-memory twin and PostgreSQL alike: pending tasks by subject and per forecast window (claimed
ones left out), the lateness of recent deliveries, and who holds the fencing epoch."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.metrics import Metrics
from scheduler.operations.stores import Statistics
from scheduler.records import Fired, NewTask
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.memory_statistics import MemoryStatistics
from tests.contracts.admin import StoredTasks
from tests.support.stores import claim

NOW = datetime.now(UTC).replace(microsecond=0)
S = timedelta(seconds=1)


@dataclass
class Figures:
    tasks: StoredTasks
    stats: Statistics
    take_office: Callable[[], Awaitable[int]]


@pytest.fixture
async def figures(database: str | None) -> AsyncIterator[Figures]:
    if database is None:
        tasks = MemoryTaskStore()
        yield Figures(tasks, MemoryStatistics(tasks), lambda: tasks.take_office("t"))
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.overview import OverviewStore
    from scheduler.store.postgres.tasks import TaskStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        db = PostgresStore(pool, Metrics())
        yield Figures(TaskStore(db), OverviewStore(db), lambda: take_office(pool, "t"))
    finally:
        await pool.close()


def _task(target: str, due: timedelta) -> NewTask:
    at = NOW + due
    return NewTask(f"s_{uuid.uuid4().hex[:12]}", target, b"{}", {}, 5, at, at, None)


async def test_pending_tasks_by_subject_and_window_leave_claimed_ones_out(
    figures: Figures,
) -> None:
    """Pending tasks count per subject (most first, then by name; the total over all), and per
    forecast window by their due time, an overdue one in every window and one due past the
    widest in none; a claimed task counts nowhere."""
    batch = [
        _task("mq.t.a", -10 * S),
        _task("mq.t.a", 30 * S),
        _task("mq.t.b", 180 * S),
        _task("mq.t.c", 1200 * S),
        _task("mq.t.c", 7200 * S),
        _task("mq.t.b", -5 * S),
    ]
    await figures.tasks.insert_batch(batch)
    epoch = await figures.take_office()
    assert len(await claim(figures.tasks, epoch, [batch[-1].id], NOW + S)) == 1
    assert await figures.stats.pending_by_subject(10) == (
        5,
        [("mq.t.a", 2), ("mq.t.c", 2), ("mq.t.b", 1)],
    )
    assert await figures.stats.pending_by_subject(1) == (5, [("mq.t.a", 2)])
    assert await figures.stats.forecast(NOW) == {
        "mq.t.a": [2, 2, 2, 2],
        "mq.t.b": [0, 1, 1, 1],
        "mq.t.c": [0, 0, 0, 1],
    }


async def test_lateness_of_deliveries_since_an_instant(figures: Figures) -> None:
    """Deliveries since an instant count with their lateness p50 and p99 in milliseconds
    (interpolated; an early delivery is 0 late); none since: a count of 0 and no quantiles."""
    due = [-30 * S, -20 * S, -10 * S]
    late = [timedelta(milliseconds=-2), timedelta(milliseconds=1), timedelta(milliseconds=5)]
    batch = [_task("mq.t.a", d) for d in due]
    await figures.tasks.insert_batch(batch)
    epoch = await figures.take_office()
    claimed = {c.id: c for c in await claim(figures.tasks, epoch, [t.id for t in batch], NOW)}
    fired = [
        Fired(claimed[t.id], t.scheduled_for + lag, "S", n)
        for n, (t, lag) in enumerate(zip(batch, late, strict=True), 1)
    ]
    await figures.tasks.mark_fired(epoch, fired, "i-1")
    n, p50, p99 = await figures.stats.lateness(NOW - 60 * S)
    assert (n, p50) == (3, 1.0) and p99 == pytest.approx(4.92)
    assert await figures.stats.lateness(NOW - 15 * S) == (1, 5.0, 5.0)
    assert await figures.stats.lateness(NOW) == (0, None, None)


async def test_leadership_names_the_epoch_who_took_it_and_when(figures: Figures) -> None:
    """Before any leader the epoch is 0 with nobody; each taking of office raises it and names
    the instance and the instant."""
    assert await figures.stats.leadership() == {"epoch": 0, "instance": None, "since": None}
    await figures.take_office()
    assert await figures.take_office() == 2
    office = await figures.stats.leadership()
    assert (office["epoch"], office["instance"]) == (2, "t") and office["since"] is not None
