"""`Operations`: every operation a front end (the API, the console through it, the NATS verbs)
is given, in one bundle. The daemon wires it (`scheduler.daemon.operations`); the operator
half composes nothing itself."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.clock import Clock
from scheduler.operations.activity import ActivityOperations
from scheduler.operations.backlog import WriteBacklog
from scheduler.operations.cron_jobs import ScheduleOperations
from scheduler.operations.dead_letters import DeadLetterOperations
from scheduler.operations.stats import StatsOperations
from scheduler.operations.stores import IdempotencyKeys
from scheduler.operations.tasks import TaskOperations


@dataclass(frozen=True, slots=True)
class Operations:
    tasks: TaskOperations
    schedules: ScheduleOperations
    dead_letters: DeadLetterOperations
    stats: StatsOperations
    idempotency: IdempotencyKeys  # the API's stored answers (`scheduler.api.idempotency`)
    backlog: WriteBacklog  # writes retried in the background; the daemon runs its loop
    clock: Clock
    activity: ActivityOperations  # the operator actions' log (`scheduler.api.activity`)
