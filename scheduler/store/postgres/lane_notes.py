"""Lane notes: the target of each task this deployment's API put on the delay lane.

A cancel (or reschedule) that names no target finds a stored task by its id, but a task still
on the delay lane has no row yet, and the instance that answers the cancel need not be the one
that scheduled it (a load balancer in front of several). So `TaskOperations.schedule` writes a
note (id -> target, migration 0020) and commits it *before* publishing to the lane: any
instance's cancel that comes after the `scheduled` answer finds the target here and records
its intent like a cancel that named the target (scheduler.store.postgres.intents), so its
`cancelled` holds whichever of intake and the cancel reaches PostgreSQL first.

A note lives as long as an intent (SCHEDULER_INTENT_TTL) and is deleted past it by the hourly
upkeep (`TaskAdmin.purge_finished`); once intake stores the task its row answers first. A
note for an id scheduled again replaces the earlier one (the last schedule's target).
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg


async def write(conn: asyncpg.Connection, task_id: str, target: str, ttl: timedelta) -> None:
    """Note that `task_id` goes to `target`, for `ttl`."""
    await conn.execute(
        "INSERT INTO lane_notes (id, target, expires_at) VALUES ($1, $2, now() + $3::interval) "
        "ON CONFLICT (id) DO UPDATE SET target = excluded.target, expires_at = excluded.expires_at",
        task_id,
        target,
        ttl,
    )


async def target_of(conn: asyncpg.Connection, task_id: str) -> str | None:
    """The target noted for `task_id`, None without a live note."""
    target: str | None = await conn.fetchval(
        "SELECT target FROM lane_notes WHERE id = $1 AND expires_at > now()", task_id
    )
    return target


async def purge(conn: asyncpg.Connection) -> int:
    """Delete the notes past their time; how many."""
    done = await conn.execute("DELETE FROM lane_notes WHERE expires_at <= now()")
    return int(done.split()[-1])
