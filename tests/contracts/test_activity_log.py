"""The activity log's contract (`scheduler.operations.stores.ActivityLog`), over the in-memory
twin and PostgreSQL alike: rows as recorded, newest first, filters, keyset pages, and pruning by
age (by the operations' clock) and by count."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from scheduler.clock import FakeClock
from scheduler.metrics import Metrics
from scheduler.operations.activity import ActivityOperations
from scheduler.operations.stores import Activity, ActivityFilter, ActivityLog
from scheduler.store.memory_activity import MemoryActivityStore

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
EVERYTHING = ActivityFilter()


def _row(
    at: datetime, target: str = "nightly", action: str = "pause", who: str = "admin@127.0.0.1"
) -> Activity:
    return Activity(
        at=at, who=who, via="api", session=None, action=action,
        route="POST /v1/schedules/{name}/pause", target=target, detail={"note": "why"},
        http_status=200, outcome="paused", request_id="r1", idempotency_key=None,
    )  # fmt: skip


@pytest.fixture
async def store(database: str | None) -> AsyncIterator[ActivityLog]:
    if database is None:
        yield MemoryActivityStore()
        return
    from scheduler.store.postgres.activity import ActivityStore
    from scheduler.store.postgres.connect import PostgresStore, create_pool

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        yield ActivityStore(PostgresStore(pool, Metrics()))
    finally:
        await pool.close()


async def _targets(store: ActivityLog, where: ActivityFilter = EVERYTHING) -> list[str]:
    return [r["target"] for r in await store.list(where, None, 100)]


async def test_a_row_is_listed_as_recorded_with_an_id(store: ActivityLog) -> None:
    """Every field comes back as recorded (the instant in UTC, the detail as JSON reads it),
    with an `id` that grows with each row."""
    berlin = timezone(timedelta(hours=1))
    detail = {"note": "why", "n": 3, "ok": True, "gone": None, "ratio": 0.5}
    row = Activity(
        at=T0.astimezone(berlin), who="admin@10.0.0.7", via="console", session="s-1",
        action="cancel", route="DELETE /v1/delayed/{id}", target="t-1", detail=detail,
        http_status=404, outcome="not_found", request_id="req-9", idempotency_key="k-1",
    )  # fmt: skip
    await store.record(row)
    await store.record(_row(T0))
    first, second = sorted(await store.list(EVERYTHING, None, 10), key=lambda r: r["id"])
    assert first["id"] < second["id"]
    assert first == {
        "id": first["id"], "at": T0, "who": "admin@10.0.0.7", "via": "console",
        "session": "s-1", "action": "cancel", "route": "DELETE /v1/delayed/{id}",
        "target": "t-1", "detail": detail, "http_status": 404, "outcome": "not_found",
        "request_id": "req-9", "idempotency_key": "k-1",
    }  # fmt: skip
    assert first["at"].utcoffset() == timedelta(0)


async def test_newest_first_by_instant_then_id_and_filtered(store: ActivityLog) -> None:
    """Rows list newest first, rows of one instant newest recorded first; action and target
    match exactly, `who` as a prefix, `since` at or after and `until` strictly before."""
    await store.record(_row(T0, "a", "pause", "admin@1"))
    await store.record(_row(T0 + timedelta(seconds=2), "b", "trigger", "ops@2"))
    await store.record(_row(T0 + timedelta(seconds=1), "c", "pause", "admin@3"))
    await store.record(_row(T0 + timedelta(seconds=1), "d", "resume", "adminx@4"))
    assert await _targets(store) == ["b", "d", "c", "a"]
    assert await _targets(store, ActivityFilter(action="pause")) == ["c", "a"]
    assert await _targets(store, ActivityFilter(target="d")) == ["d"]
    assert await _targets(store, ActivityFilter(who="admin@")) == ["c", "a"]
    assert await _targets(store, ActivityFilter(who="admin")) == ["d", "c", "a"]
    assert await _targets(store, ActivityFilter(who="dmin")) == []
    second = T0 + timedelta(seconds=1)
    assert await _targets(store, ActivityFilter(since=second)) == ["b", "d", "c"]
    assert await _targets(store, ActivityFilter(until=second)) == ["a"]
    both = ActivityFilter(action="pause", since=second, until=second + timedelta(seconds=1))
    assert await _targets(store, both) == ["c"]


async def test_pages_continue_strictly_after_the_key(store: ActivityLog) -> None:
    """A page of `limit` rows ends at a key (instant, id); the next page starts strictly after
    it, also among rows of the same instant, until none are left."""
    for n, seconds in enumerate((0, 1, 1, 1, 2)):
        await store.record(_row(T0 + timedelta(seconds=seconds), f"t{n}"))
    seen: list[str] = []
    after = None
    while page := await store.list(EVERYTHING, after, 2):
        seen += [r["target"] for r in page]
        after = (page[-1]["at"], page[-1]["id"])
    assert seen == ["t4", "t3", "t2", "t1", "t0"]
    assert await store.list(ActivityFilter(target="t0"), after, 2) == []


async def test_rows_past_the_retention_are_pruned_by_the_clock(store: ActivityLog) -> None:
    """A pass deletes exactly the rows recorded before now minus the retention (the
    operations' clock, moved by the test), in batches, and keeps the rest."""
    clock = FakeClock(T0)
    ops = ActivityOperations(store, clock)
    for days in (100, 91, 90, 10, 0):
        await store.record(_row(T0 - timedelta(days=days), f"job-{days}"))
    await store.record(_row(T0 - timedelta(days=90, seconds=1), "job-90s"))
    assert await ops.prune(timedelta(days=90), batch=1) == 3
    kept = await store.list(ActivityFilter(), None, 10)
    assert [r["target"] for r in kept] == ["job-0", "job-10", "job-90"]
    clock.jump_wall(timedelta(days=80, seconds=1).total_seconds())
    assert await ops.prune(timedelta(days=90)) == 2
    assert [r["target"] for r in await store.list(ActivityFilter(), None, 10)] == ["job-0"]
    assert await ops.prune(timedelta(days=90)) == 0


async def test_prune_by_age_takes_the_oldest_first_in_batches(store: ActivityLog) -> None:
    """`prune(before, batch)` deletes at most `batch` rows, the oldest (then first recorded)
    first, and none at or after `before`."""
    for n, seconds in enumerate((3, 1, 1, 0, 5)):
        await store.record(_row(T0 + timedelta(seconds=seconds), f"t{n}"))
    assert await store.prune(T0 + timedelta(seconds=5), 2) == 2
    assert await _targets(store) == ["t4", "t0", "t2"]
    assert await store.prune(T0 + timedelta(seconds=5), 10) == 2
    assert await store.prune(T0 + timedelta(seconds=5), 10) == 0
    assert await _targets(store) == ["t4"]


async def test_prune_over_keeps_the_newest_and_deletes_the_oldest_first(
    store: ActivityLog,
) -> None:
    """`prune_over(keep, batch)` deletes at most `batch` of the rows behind the newest `keep`
    (by instant, then id), oldest first; with `keep` rows or fewer nothing goes; the
    operations' count bound deletes them all, batch after batch."""
    for n, seconds in enumerate((0, 2, 1, 2, 3, 4)):
        await store.record(_row(T0 + timedelta(seconds=seconds), f"t{n}"))
    assert await store.prune_over(6, 10) == 0
    assert await store.prune_over(3, 2) == 2
    assert await _targets(store) == ["t5", "t4", "t3", "t1"]
    ops = ActivityOperations(store, FakeClock(T0), max_rows=2)
    assert await ops.prune(timedelta(days=90), batch=1) == 2
    assert await _targets(store) == ["t5", "t4"]
    assert await store.prune_over(0, 10) == 2
