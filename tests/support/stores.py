"""The task repository driven as the tests drive it, through its port only
(`scheduler.engine.ports.TaskRepository`): a batch stored, tasks claimed with every payload.

Both work on the PostgreSQL store and the in-memory twin alike; neither store has a method of
its own for them (the engine stores through `insert_batch` and claims within a byte budget)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from scheduler.engine.ports import TaskRepository
from scheduler.records import ClaimedTask, NewTask, TaskRef

# no byte budget: every claimed task comes back with its payload
UNBUDGETED = 2**62


async def insert(tasks: TaskRepository, batch: Sequence[NewTask]) -> list[TaskRef]:
    """Store a batch: the refs of the tasks stored to fire (an id seen before is stored once,
    no error). A row the store refuses fails the test."""
    inserted = await tasks.insert_batch(batch)
    assert not inserted.refused, inserted.refused
    return inserted.stored


async def claim(
    tasks: TaskRepository, epoch: int, ids: Sequence[str], until: datetime
) -> list[ClaimedTask]:
    """`claim_within` without a byte budget: every claimed task with its payload."""
    return (await tasks.claim_within(epoch, ids, until, UNBUDGETED)).ready
