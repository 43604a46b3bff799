"""The intake loop: the delay lane into PostgreSQL, acked only after the commit.

Fetch a batch from the durable pull consumer, judge each message alone (decodable subject and
headers, target, header rules, size, envelope, TTL, max delay), store the good ones in one round
trip, put those inside the loaded horizon straight onto the heap, then ack. A task id already
stored is a no-op when the message repeats that task exactly (same target, same bytes: a
redelivery or a resend) and `duplicate_id` otherwise. Bad input is dead-lettered (table
`dead_letters`, then a copy on stream `MQ_DLQ` with an `Mq-Error` header naming the field and
the problem) and termed, so it never blocks the lane nor fails its batch neighbours.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from scheduler.clock import Clock
from scheduler.engine.delayed import task_path
from scheduler.engine.delayed.dead_budget import DeadLetterBudget
from scheduler.engine.delayed.dead_letters import DeadLetterCopies
from scheduler.engine.delayed.horizon import Horizon, HorizonHeap
from scheduler.engine.delayed.quota import OrgLedger
from scheduler.engine.ports import Broker, Source, TaskRepository
from scheduler.messages.envelope import Limits
from scheduler.messages.subjects import delay_lane_prefix
from scheduler.metrics import Metrics
from scheduler.settings import Settings

log = logging.getLogger("scheduler.intake")

# A small batch waits this long for more: one insert per 10 ms instead of one per message or
# two at low rates (each statement costs a round trip); tasks are due later than that anyway.
INTAKE_LINGER = 0.01


class Intake:
    """Moves tasks from the delay lane into PostgreSQL and the heap: the lane loop (`run`)
    around the accept step of `engine.task_path`."""

    classify_all = task_path.validate_all  # validate a batch
    commit = task_path.accept  # store, dead-letter, then ack

    def __init__(
        self,
        settings: Settings,
        heap: HorizonHeap | Horizon,
        tasks: TaskRepository,
        publisher: Broker,
        clock: Clock,
        metrics: Metrics,
        wake: asyncio.Event,
        heap_lock: asyncio.Lock,
        limits: Limits,
        dead: DeadLetterCopies | None = None,
    ) -> None:
        self.settings = settings
        self.dead = dead or DeadLetterCopies(publisher, settings.dlq_subject_prefix, metrics)
        self.horizon = heap if isinstance(heap, Horizon) else Horizon(heap, wake, heap_lock)
        self.tasks = tasks
        self.publisher = publisher
        self.clock = clock
        self.metrics = metrics
        self.limits = limits
        self.lane = delay_lane_prefix(settings.intake_subject)
        self._may_act: Callable[[], bool] = lambda: True
        self.ledger: OrgLedger | None = None  # per-org quotas (engine/delayed/quota.py), when on
        # refusals stored per organisation or subject and minute (engine/delayed/dead_budget.py)
        self.budget = DeadLetterBudget.of(settings, clock, metrics)

    async def run(self, puller: Source, stop: asyncio.Event, may_act: Callable[[], bool]) -> None:
        """Handle batches as they arrive until `stop` is set or `may_act()` turns false.

        Two stages: while one batch commits, the next is fetched and validated. Commits stay
        one at a time, in order, so intake order (the tie-break among tasks due together) holds.
        """
        self._may_act = may_act
        await puller.start()
        committing: tuple[asyncio.Task[None], int] | None = None
        stopping = asyncio.create_task(stop.wait(), name="intake-stop")
        stopping.add_done_callback(lambda _: puller.interrupt())
        try:
            while not stop.is_set() and may_act():
                msgs = await puller.take(timeout=0.5, linger=INTAKE_LINGER)
                if not msgs:
                    continue
                results = await self.classify_all(msgs)
                if committing is not None:
                    await self._settle(*committing)
                task = asyncio.create_task(self.commit(msgs, results), name="intake-commit")
                committing = (task, len(msgs))
        finally:
            stopping.cancel()
            if committing is not None:
                await self._settle(*committing)
            await puller.close()

    async def _settle(self, committing: asyncio.Task[None], count: int) -> None:
        try:
            await committing
        except Exception as exc:  # unacked messages come back after the ack wait
            log.warning("intake.failed count=%d error=%r", count, exc)
            await self.clock.sleep(1.0)
