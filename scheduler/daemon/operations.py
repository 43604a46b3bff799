"""The operator half wired to PostgreSQL: one daemon's `Operations` over its bus writer
(`scheduler.operations.ports`) and a PostgreSQL pool. The edge builds two (the API's pool and
the NATS verbs'); the operator half itself never names a concrete store."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from scheduler.clock import Clock
from scheduler.operations.activity import ActivityOperations
from scheduler.operations.backlog import WriteBacklog
from scheduler.operations.bundle import Operations
from scheduler.operations.cron_jobs import ScheduleOperations
from scheduler.operations.dead_letters import DeadLetterOperations
from scheduler.operations.ports import BusWriter
from scheduler.operations.stats import StatsOperations
from scheduler.operations.tasks import TaskOperations
from scheduler.settings import Settings
from scheduler.store.postgres.activity import ActivityStore
from scheduler.store.postgres.backfill import BackfillStore
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.dead_letters import DeadLetterStore
from scheduler.store.postgres.epoch import database_time
from scheduler.store.postgres.history import HistoryStore
from scheduler.store.postgres.idempotency import IdempotencyStore
from scheduler.store.postgres.overview import OverviewStore
from scheduler.store.postgres.task_admin import TaskAdmin


def build_operations(
    bus: BusWriter,
    settings: Settings,
    db: PostgresStore,
    tasks: TaskAdmin,
    clock: Clock,
    lease: Callable[[], Awaitable[dict[str, Any]]],
) -> Operations:
    overview, dead, backlog = OverviewStore(db), DeadLetterStore(db), WriteBacklog()
    task_ops = TaskOperations(bus, settings, tasks, overview, clock)
    schedules = ScheduleStore(db, settings.partitions)
    ping = functools.partial(database_time, db.pool, clock.now)
    return Operations(
        tasks=task_ops,
        schedules=ScheduleOperations(
            bus, settings, schedules, overview, BackfillStore(db), clock, backlog
        ),
        dead_letters=DeadLetterOperations(bus, settings, dead, task_ops, clock),
        stats=StatsOperations(
            overview,
            dead,
            HistoryStore(db),
            ping,
            clock,
            lease,
            settings.forecast_interval.total_seconds(),
        ),
        idempotency=IdempotencyStore(db, settings.idempotency_max_keys),
        backlog=backlog,
        clock=clock,
        activity=ActivityOperations(ActivityStore(db), clock, settings.activity_max_rows),
    )
