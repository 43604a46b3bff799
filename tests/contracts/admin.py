"""What the repository contract suites test beyond the engine's ports: the operators'
statements both stores answer (the operator half's own ports, `scheduler.operations.stores`,
name what it calls; these Protocols name the part the engine's in-memory twins share, so a
contract test calls nothing that one of the two lacks)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from scheduler.engine.ports import ScheduleRepository, TaskRepository
from scheduler.records import TaskRef
from scheduler.store.postgres.intents import IntentLimits


class TaskAdminStatements(Protocol):
    """`scheduler.store.postgres.task_admin.TaskAdmin`'s statements the twin answers too."""

    intent_limits: IntentLimits

    async def cancel(self, task_id: str, target: str) -> str: ...

    async def reschedule(
        self, task_id: str, target: str, due: datetime
    ) -> tuple[str, TaskRef | None]: ...

    async def get(self, task_id: str, target: str | None = None) -> dict[str, Any] | None: ...

    async def note_lane(self, task_id: str, target: str) -> None: ...

    async def lane_target(self, task_id: str) -> str | None: ...


class StoredTasks(TaskRepository, TaskAdminStatements, Protocol):
    """`TaskStore` or `MemoryTaskStore`: the engine's port and the operators' statements."""


class StoredSchedules(ScheduleRepository, Protocol):
    """`ScheduleStore` or `MemoryScheduleStore`: the engine's port and the operator's pause."""

    async def set_paused(self, name: str, who: str | None) -> bool: ...
