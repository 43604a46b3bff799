"""The fire log's history (`scheduler.operations.stores.FireHistory`), over the in-memory twin
and PostgreSQL alike: a window's deliveries (manual ones left out) per bucket with their
lateness, each epoch's first and last delivery, the worst late ones, the dead letters per
bucket, one cron job's window, and a window busier than its cap read for its newest part."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.cron.jobs import load_text
from scheduler.metrics import Metrics
from scheduler.operations.stores import FireHistory, ScheduleControl, Window
from scheduler.records import Advance, Fired, NewTask
from scheduler.store.memory import MemoryScheduleStore, MemoryTaskStore
from scheduler.store.memory_dead_letters import MemoryDeadLetterStore
from scheduler.store.memory_history import MemoryFireHistory
from scheduler.store.memory_schedules import MemorySchedules
from tests.contracts.admin import StoredSchedules, StoredTasks
from tests.support.stores import claim

NOW = datetime.now(UTC).replace(microsecond=0)
W = NOW - timedelta(hours=2)  # the window's start: every delivery here is in the past
MIN, MS = timedelta(minutes=1), timedelta(milliseconds=1)
HOUR = Window(W, W + timedelta(hours=1), MIN, 100, 1000.0)
JOBS = """
scheduled_jobs:
  - name: a
    subject: mq.scheduled.a
    cron: "0 * * * *"
"""


@dataclass
class Log:
    tasks: StoredTasks
    schedules: StoredSchedules
    manual: ScheduleControl
    history: FireHistory
    take_office: Callable[[], Awaitable[int]]


@pytest.fixture
async def log(database: str | None) -> AsyncIterator[Log]:
    if database is None:
        tasks = MemoryTaskStore()
        engine, manual = MemoryScheduleStore(office=tasks), MemorySchedules()
        history = MemoryFireHistory(
            tasks, MemoryDeadLetterStore(tasks), [engine.fire_log, manual.fire_log]
        )
        yield Log(tasks, engine, manual, history, lambda: tasks.take_office("t"))
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.cron_jobs import ScheduleStore
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.history import HistoryStore
    from scheduler.store.postgres.tasks import TaskStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        db = PostgresStore(pool, Metrics())
        cron = ScheduleStore(db, 1)
        yield Log(TaskStore(db), cron, cron, HistoryStore(db), lambda: take_office(pool, "t"))
    finally:
        await pool.close()


async def _fire(log: Log, instance: str, *fires: tuple[str, datetime, timedelta]) -> int:
    """Tasks (id, due, lateness) stored, claimed by a new epoch and fired by `instance`."""
    tasks = [NewTask(i, "mq.t.a", b"{}", {}, 5, due, due, None) for i, due, _ in fires]
    await log.tasks.insert_batch(tasks)
    epoch = await log.take_office()
    claimed = {c.id: c for c in await claim(log.tasks, epoch, [t.id for t in tasks], NOW)}
    done = [Fired(claimed[i], due + late, "TASKS", n) for n, (i, due, late) in enumerate(fires, 1)]
    await log.tasks.mark_fired(epoch, done, instance)
    return epoch


async def _story(log: Log) -> None:
    """Two epochs' deliveries, two cron ones and a manual one around the window `HOUR`."""
    await log.schedules.sync(load_text(JOBS).jobs, NOW)
    await _fire(
        log,
        "i-old",
        ("d1", W + MIN, 4 * MS),
        ("d2", W + MIN + 10 * 1000 * MS, -2 * MS),  # early: 0 late
        ("d0", W - 2 * MIN, MIN),  # before the window
    )
    epoch = await _fire(
        log,
        "i-new",
        ("d3", W + 5 * MIN, 7341 * MS),
        ("d5", W + 59 * MIN, MIN),  # at the window's end: after it
    )
    old = W - timedelta(days=2)  # due two days before the window, fired in it
    moves = [
        Advance("a", "mq.scheduled.a", old, W + 20 * MIN, "SCHEDULED", 1),
        Advance("a", "mq.scheduled.a", W + 10 * MIN, W + 10 * MIN + 1500 * MS, "SCHEDULED", 2),
    ]
    for move in moves:  # one job's moves go one per call (as the engine books them)
        await log.schedules.advance(epoch, [move], "i-cron")
    await log.manual.log_manual_intent("a", "mq.scheduled.a", W + 30 * MIN, "i-hand")


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _times(rows: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    """`rows` with the instants PostgreSQL wrote as JSON text read back (their offset is the
    session's time zone, so the text is compared by the instant it names)."""
    return [r | {n: _at(r[n]) for n in names} for r in rows]


async def test_a_window_charts_its_deliveries_epochs_and_worst(log: Log) -> None:
    """A window counts the deliveries fired in it (manual ones left out), per bucket with their
    lateness p50/p99/max (an early one 0 late), the same over the window, each epoch's least
    instance (by name) and first and last delivery, and the worst at or above the threshold, latest
    first."""
    await _story(log)
    h = await log.history.read(HOUR)
    two_days = 2 * 24 * 3600 * 1000 + 20 * 60 * 1000
    late = [0, 4, 1500, 7341, two_days]
    assert (h["deliveries"], h["oldest"], h["p50"], h["max"]) == (
        5,
        W + MIN + 4 * MS,
        1500,
        two_days,
    )
    assert h["p99"] == pytest.approx(7341 + (two_days - 7341) * 0.96) and len(late) == 5
    assert sorted(h["buckets"], key=lambda b: b["i"]) == [
        {"i": 1, "n": 2, "q": [2, pytest.approx(3.96)], "mx": 4},
        {"i": 5, "n": 1, "q": [7341, 7341], "mx": 7341},
        {"i": 10, "n": 1, "q": [1500, 1500], "mx": 1500},
        {"i": 20, "n": 1, "q": [two_days, two_days], "mx": two_days},
    ]
    # as PostgreSQL writes a float8 in JSON: a whole number reads back as an int
    assert [type(b["mx"]) for b in h["buckets"]] == [int] * 4
    assert {type(q) for b in h["buckets"] for q in b["q"]} == {int, float}
    assert _times(h["epochs"], "first_at", "last_at") == [
        {"epoch": 1, "instance": "i-old", "first_at": W + MIN + 4 * MS}
        | {"last_at": W + MIN + 10 * 1000 * MS - 2 * MS},
        {"epoch": 2, "instance": "i-cron", "first_at": W + 5 * MIN + 7341 * MS}
        | {"last_at": W + 20 * MIN},
    ]
    worst = _times(h["worst"], "scheduled_for", "fired_at")
    assert [(w["kind"], w["key"], w["late_ms"]) for w in worst] == [
        ("cron", "a", two_days),
        ("delayed", "d3", 7341),
        ("cron", "a", 1500),
    ]
    assert worst[1] == {
        "kind": "delayed",
        "key": "d3",
        "subject": "mq.t.a",
        "scheduled_for": W + 5 * MIN,
        "fired_at": W + 5 * MIN + 7341 * MS,
        "attempt": 1,
        "epoch": 2,
        "instance": "i-new",
        "late_ms": 7341,
    }
    assert list(h["worst"][1]) == list(worst[1])
    assert (await log.history.read(replace(HOUR, abnormal_ms=10_000)))["worst"][0]["key"] == "a"
    assert len((await log.history.read(replace(HOUR, abnormal_ms=10_000)))["worst"]) == 1


async def test_one_jobs_window_reads_only_its_cron_deliveries(log: Log) -> None:
    """A cron job's window counts its own deliveries only, those due at most a day before the
    window, and charts no dead letters."""
    await _story(log)
    await _fire(log, "i-new", ("a", W + 15 * MIN, 5 * MS))  # a delayed task named as the job
    h = await log.history.read(replace(HOUR, job="a"))
    assert (h["deliveries"], h["p50"], h["max"], h["dead"]) == (1, 1500, 1500, None)
    assert [b["i"] for b in h["buckets"]] == [10]
    assert [e["epoch"] for e in h["epochs"]] == [2]
    assert (await log.history.read(HOUR))["deliveries"] == 6
    assert (await log.history.read(replace(HOUR, job="b")))["deliveries"] == 0


async def test_a_window_busier_than_its_cap_is_read_for_its_newest_part(log: Log) -> None:
    """Past `cap` deliveries a window is its newest `cap` (`oldest` says where that starts);
    the dead letters that last failed in it count per bucket, also capped; an empty window has
    no figures."""
    await _story(log)
    capped = await log.history.read(replace(HOUR, cap=2))
    assert (capped["deliveries"], capped["oldest"]) == (2, W + 10 * MIN + 1500 * MS)
    bad: dict[str, Any] = {"subject": "mq.delay.x", "error": "bad", "reason": "invalid_envelope"}
    bad |= {"target": "mq.t.a", "raw": b"{", "raw_size": 1, "headers": {}}
    await log.tasks.record_bad_intake(
        [bad | {"original_id": "b1", "key": "k1"}, bad | {"original_id": "b2", "key": "k2"}]
    )
    now = datetime.now(UTC)
    day = Window(now - timedelta(hours=1), now + timedelta(hours=1), timedelta(days=1), 100, 1e3)
    assert (await log.history.read(day))["dead"] == {0: 2}
    assert (await log.history.read(replace(day, cap=1)))["dead"] == {0: 1}
    empty = await log.history.read(Window(W - 3 * MIN, W - 2 * MIN, MIN, 100, 1e3))
    assert empty == {
        "deliveries": 0,
        "oldest": None,
        "p50": None,
        "p99": None,
        "max": None,
        "buckets": [],
        "epochs": [],
        "worst": [],
        "dead": {},
    }
