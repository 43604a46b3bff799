"""The daemon's housekeeping loops, on every instance: fire-log partitions and old rows, dead
letters and activity-log rows past their retention, and the event loop's lag (CPU starvation
shows there first)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from scheduler.aio import wait_or_stop
from scheduler.clock import Clock
from scheduler.daemon.events import DaemonEvents
from scheduler.operations.activity import ActivityOperations
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.dead_letters import DeadLetterStore
from scheduler.store.postgres.task_admin import TaskAdmin

log = logging.getLogger(__name__)

UPKEEP_INTERVAL = 3600.0
LAG_PROBE_EVERY = 0.1
SLOW_LOOP = 0.05  # s of lag a DEBUG line reports
# Dead letters are deleted this many at a time, each batch its own short statement, and at most
# PRUNE_BATCHES batches an hour (a backlog, say after an upgrade, goes over a few hours).
PRUNE_BATCH = 5000
PRUNE_BATCHES = 200


async def fire_log_upkeep(
    store: PostgresStore,
    tasks: TaskAdmin | None,
    settings: Settings,
    stop: asyncio.Event,
) -> None:
    """Hourly: fire-log partitions two days ahead, expired ones dropped, old tasks purged."""
    while not stop.is_set():
        try:
            for change in await store.fire_log_upkeep(settings.fire_log_retention):
                log.info("fire_log.partition %s", change)
            if tasks is not None:
                purged = await tasks.purge_finished(settings.fire_log_retention)
                log.info("delayed_messages.purged rows=%d", purged)
        except Exception as exc:  # upkeep must never take the daemon down; retried next hour
            log.warning("fire_log.upkeep_failed error=%r", exc)
        await wait_or_stop(stop, UPKEEP_INTERVAL)


async def prune_dead_letters(
    dead: DeadLetterStore,
    settings: Settings,
    clock: Clock,
    events: DaemonEvents,
    stop: asyncio.Event,
) -> int:
    """One pass: delete the dead letters that last failed more than SCHEDULER_DLQ_MAX_AGE ago
    (the DLQ stream's retention), in batches of PRUNE_BATCH. Returns how many went."""
    before = clock.now() - settings.dlq_max_age
    total = 0
    for _ in range(PRUNE_BATCHES):
        deleted = await dead.prune(before, PRUNE_BATCH)
        total += deleted
        events.dead_letters_deleted(deleted)
        if deleted < PRUNE_BATCH or stop.is_set():
            break
    return total


async def dead_letter_upkeep(
    dead: DeadLetterStore,
    settings: Settings,
    clock: Clock,
    events: DaemonEvents,
    stop: asyncio.Event,
) -> None:
    """Hourly: dead letters past their retention pruned (instances skip each other's rows)."""
    while not stop.is_set():
        try:
            pruned = await prune_dead_letters(dead, settings, clock, events, stop)
            log.info("dead_letters.pruned rows=%d", pruned)
        except Exception as exc:  # upkeep must never take the daemon down; retried next hour
            log.warning("dead_letters.upkeep_failed error=%r", exc)
        await wait_or_stop(stop, UPKEEP_INTERVAL)


async def activity_upkeep(
    activity: ActivityOperations, settings: Settings, events: DaemonEvents, stop: asyncio.Event
) -> None:
    """Hourly: activity-log rows older than SCHEDULER_ACTIVITY_RETENTION, then the oldest past
    SCHEDULER_ACTIVITY_MAX_ROWS, deleted (on the API's pool; instances skip each other's
    rows)."""
    while not stop.is_set():
        try:
            pruned = await activity.prune(settings.activity_retention)
            events.activity_deleted(pruned)
            log.info("activity_log.pruned rows=%d", pruned)
        except Exception as exc:  # upkeep must never take the daemon down; retried next hour
            log.warning("activity_log.upkeep_failed error=%r", exc)
        await wait_or_stop(stop, UPKEEP_INTERVAL)


async def idempotency_upkeep(
    expired_keys: Callable[[], Awaitable[int]], stop: asyncio.Event
) -> None:
    """Hourly: expired idempotency keys, and the oldest past SCHEDULER_IDEMPOTENCY_MAX_KEYS,
    deleted (the API's stored answers; on the edge)."""
    while not stop.is_set():
        try:
            log.info("api_idempotency.pruned rows=%d", await expired_keys())
        except Exception as exc:  # upkeep must never take the daemon down; retried next hour
            log.warning("api_idempotency.upkeep_failed error=%r", exc)
        await wait_or_stop(stop, UPKEEP_INTERVAL)


async def loop_lag_probe(events: DaemonEvents, stop: asyncio.Event) -> None:
    """Measure how late the event loop runs a 100 ms timer; ten wakes a second cost nothing
    measurable, unlike a 10 ms timer (~1.5 % CPU)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(LAG_PROBE_EVERY)
        lag = max(0.0, loop.time() - start - LAG_PROBE_EVERY)
        events.loop_lag_measured(lag)
        if lag > SLOW_LOOP:  # a diagnostic at DEBUG (docs/deploy.md, frozen nodes)
            log.debug("loop.lag ms=%d", lag * 1000)
