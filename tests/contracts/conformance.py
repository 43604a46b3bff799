"""Every adapter and in-memory twin held to its port by the type checker, not at run time.

The contract suites beside this module test what each implementation does; this module makes a
signature that drifts from its port (`scheduler.engine.ports`, `scheduler.engine.office`) an
error before any test runs; the operator half's stores are held to theirs
(`scheduler.operations.stores`) the same way. mypy reads it with the package and the other
tests (`files` in `[tool.mypy]`, pyproject.toml; `scripts/test` runs it). Nothing imports it and
pytest collects nothing here.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

import asyncpg
from nats.aio.msg import Msg

from scheduler.bus.memory import (
    MemoryBroker,
    MemoryBus,
    MemoryDelivery,
    MemorySource,
    MemoryWriter,
)
from scheduler.bus.nats.connection import NatsBus
from scheduler.bus.nats.plain import PlainPublisher
from scheduler.bus.nats.publisher import Publisher
from scheduler.bus.nats.puller import Puller
from scheduler.bus.nats.wire import RawMsg
from scheduler.bus.nats.writer import NatsWriter
from scheduler.engine.office import FixedOffice, Office
from scheduler.engine.ports import (
    Broker,
    Bus,
    Delivery,
    ScheduleRepository,
    Source,
    TaskRepository,
)
from scheduler.leadership.election import Leadership
from scheduler.operations.ports import BusWriter
from scheduler.operations.stores import (
    ActivityLog,
    BackfillLog,
    DatabaseTime,
    DeadLetters,
    FireHistory,
    IdempotencyKeys,
    ScheduleControl,
    ScheduleReads,
    Statistics,
    TaskControl,
    TaskReads,
)
from scheduler.store.memory import MemoryScheduleStore, MemoryTaskStore
from scheduler.store.memory_activity import MemoryActivityStore
from scheduler.store.memory_clock import MemoryDatabaseTime
from scheduler.store.memory_dead_letters import MemoryDeadLetterStore
from scheduler.store.memory_history import MemoryFireHistory
from scheduler.store.memory_idempotency import MemoryIdempotencyStore
from scheduler.store.memory_schedules import MemoryBackfills, MemorySchedules
from scheduler.store.memory_statistics import MemoryStatistics
from scheduler.store.memory_task_reads import MemoryTaskReads
from scheduler.store.postgres.activity import ActivityStore
from scheduler.store.postgres.backfill import BackfillStore
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.dead_letters import DeadLetterStore
from scheduler.store.postgres.epoch import database_time
from scheduler.store.postgres.history import HistoryStore
from scheduler.store.postgres.idempotency import IdempotencyStore
from scheduler.store.postgres.overview import OverviewStore
from scheduler.store.postgres.task_admin import TaskAdmin
from scheduler.store.postgres.tasks import TaskStore


def brokers(wire: Publisher, plain: PlainPublisher, twin: MemoryBroker) -> list[Broker]:
    return [wire, plain, twin]


def buses(real: NatsBus, twin: MemoryBus) -> list[Bus]:
    return [real, twin]


def bus_writers(real: NatsWriter, twin: MemoryWriter) -> list[BusWriter]:
    return [real, twin]


def sources(real: Puller, twin: MemorySource) -> list[Source]:
    return [real, twin]


def deliveries(parsed: Msg, raw: RawMsg, twin: MemoryDelivery) -> list[Delivery]:
    return [parsed, raw, twin]


def task_repositories(real: TaskStore, twin: MemoryTaskStore) -> list[TaskRepository]:
    return [real, twin]


def schedule_repositories(
    real: ScheduleStore, twin: MemoryScheduleStore
) -> list[ScheduleRepository]:
    return [real, twin]


def offices(real: Leadership, twin: FixedOffice) -> list[Office]:
    return [real, twin]


# -- the operator half's stores (scheduler.operations.stores) ----------------------------------
def task_controls(real: TaskAdmin, twin: MemoryTaskStore) -> list[TaskControl]:
    return [real, twin]


def overviews(real: OverviewStore) -> tuple[TaskReads, ScheduleReads, Statistics]:
    return real, real, real


def task_reads(real: OverviewStore, twin: MemoryTaskReads) -> list[TaskReads]:
    return [real, twin]


def statistics(real: OverviewStore, twin: MemoryStatistics) -> list[Statistics]:
    return [real, twin]


def fire_histories(real: HistoryStore, twin: MemoryFireHistory) -> list[FireHistory]:
    return [real, twin]


def database_times(real: asyncpg.Pool, twin: MemoryDatabaseTime) -> list[DatabaseTime]:
    return [functools.partial(database_time, real, lambda: datetime.now(UTC)), twin]


def schedule_controls(real: ScheduleStore, twin: MemorySchedules) -> list[ScheduleControl]:
    return [real, twin]


def schedule_reads(real: OverviewStore, twin: MemorySchedules) -> list[ScheduleReads]:
    return [real, twin]


def backfill_logs(real: BackfillStore, twin: MemoryBackfills) -> list[BackfillLog]:
    return [real, twin]


def dead_letter_stores(real: DeadLetterStore, twin: MemoryDeadLetterStore) -> list[DeadLetters]:
    return [real, twin]


def activity_logs(real: ActivityStore, twin: MemoryActivityStore) -> list[ActivityLog]:
    return [real, twin]


def idempotency_keys(real: IdempotencyStore, twin: MemoryIdempotencyStore) -> list[IdempotencyKeys]:
    return [real, twin]
