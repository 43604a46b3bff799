"""The firing loop: from the horizon heap to JetStream, exactly on time, once.

One batch at a time: pop what is due within `CLAIM_AHEAD_MS`, claim it in PostgreSQL (a cancel
that commits first wins), wait until each task's due millisecond, publish it pipelined with
`Nats-Msg-Id` = task id, then record the outcome. The bookkeeping of one batch (mark fired, fire
log, retries, dead letters) runs while the next batch publishes. Never early: a task is published
only once the wall clock has reached its due time, re-checked after every wake.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Sequence
from datetime import timedelta

from scheduler.bus.publisher import PubAck, Publisher, PublishError
from scheduler.clock import Clock, to_rfc3339
from scheduler.engine.heap import HorizonHeap, TaskRef
from scheduler.engine.office import Office
from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.tasks import ClaimedTask, Fired, TaskStore, ceil_ms, from_ms, to_ms
from scheduler.subjects import check_target, dlq_subject

log = logging.getLogger("scheduler.firing")

CLAIM_AHEAD_MS = 20
MAX_BACKOFF = 60.0


class Firing:
    """Publishes due tasks; owned by the engine while this instance holds office."""

    def __init__(
        self,
        settings: Settings,
        heap: HorizonHeap,
        tasks: TaskStore,
        publisher: Publisher,
        office: Office,
        clock: Clock,
        metrics: Metrics,
        wake: asyncio.Event,
        heap_lock: asyncio.Lock,
    ) -> None:
        self.settings = settings
        self.heap_lock = heap_lock
        self.heap = heap
        self.tasks = tasks
        self.publisher = publisher
        self.office = office
        self.clock = clock
        self.metrics = metrics
        self.wake = wake
        self._books: asyncio.Task[None] | None = None

    def now_ms(self) -> int:
        return to_ms(self.clock.now())

    async def run(self, epoch: int, stop: asyncio.Event) -> None:
        """Fire due tasks until `stop` is set or office is lost."""
        try:
            while not stop.is_set() and self.office.may_act():
                if not await self.step(epoch):
                    await self._wait(self._idle_seconds())
        finally:
            await self.drain()

    async def step(self, epoch: int) -> bool:
        """Fire one batch if anything is due; return whether there was one."""
        horizon = self.now_ms() + CLAIM_AHEAD_MS
        entries = self.heap.pop_due(horizon, self.settings.batch)
        self.metrics.heap_size.set(len(self.heap))
        if not entries:
            return False
        claimed = await self.tasks.claim(epoch, [e[3] for e in entries], from_ms(horizon))
        await self.fire(epoch, claimed)
        return True

    def _idle_seconds(self) -> float:
        nxt = self.heap.next_due_ms()
        if nxt is None:
            return 1.0
        return min(1.0, max(0.0, (nxt - CLAIM_AHEAD_MS - self.now_ms()) / 1000))

    async def _wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking early when intake or the loader adds tasks."""
        self.wake.clear()
        if seconds <= 0:
            return
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        waker = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def fire(self, epoch: int, claimed: Sequence[ClaimedTask]) -> None:
        """Publish claimed tasks at their due times, then hand the outcome to bookkeeping."""
        now = self.clock.now()
        expired = [t for t in claimed if t.expires_at is not None and t.expires_at <= now]
        live = [t for t in claimed if t not in expired]
        futures: list[tuple[ClaimedTask, asyncio.Future[PubAck]]] = []
        for due_ms, group in itertools.groupby(live, key=lambda t: t.due_ms):
            await self._until(due_ms)
            fired_at = to_rfc3339(self.clock.now())
            for task in group:
                futures.append((task, await self._send(task, fired_at)))
        outcomes = []
        for task, fut in futures:
            try:
                outcomes.append((task, await fut, self.clock.now()))
            except PublishError as exc:
                outcomes.append((task, exc, self.clock.now()))
        await self._book(epoch, outcomes, expired)

    async def _until(self, due_ms: int) -> None:
        """Wait until the wall clock reaches `due_ms` (re-checked: robust to clock steps)."""
        while (left := due_ms - self.now_ms()) > 0:
            await self.clock.sleep(left / 1000)

    async def _send(self, task: ClaimedTask, fired_at: str) -> asyncio.Future[PubAck]:
        try:
            check_target(task.target, self.settings.target_allow)  # re-checked at fire time
        except ValueError as exc:
            fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
            fut.set_exception(PublishError(task.target, str(exc), permanent=True))
            return fut
        headers = {
            **task.headers,
            "Nats-Msg-Id": task.id,
            "Mq-Scheduled-For": to_rfc3339(task.scheduled_for),
            "Mq-Fired-At": fired_at,
            "Mq-Attempt": str(task.attempts),
        }
        return await self.publisher.publish(task.target, task.payload, headers)

    async def _book(self, epoch: int, outcomes: list, expired: list[ClaimedTask]) -> None:
        """Run the bookkeeping of this batch in the background; at most one batch behind."""
        if self._books is not None:
            await self._books
        self._books = asyncio.create_task(self._record(epoch, outcomes, expired), name="books")

    async def drain(self) -> None:
        """Wait for the last batch's bookkeeping."""
        if self._books is not None:
            books, self._books = self._books, None
            await books

    async def _record(self, epoch: int, outcomes: list, expired: list[ClaimedTask]) -> None:
        fired = [Fired(t, at, r.stream, r.seq) for t, r, at in outcomes if isinstance(r, PubAck)]
        failed = [(t, r) for t, r, _ in outcomes if isinstance(r, PublishError)]
        try:
            await self.tasks.mark_fired(epoch, fired, self.settings.instance_id)
            await self._expire(epoch, expired)
            await self._failed(epoch, failed)
        except FencedError:
            log.error("engine.fenced epoch=%d: a newer leader exists; stepping down", epoch)
            depose = getattr(self.office, "depose", None)
            if depose is not None:
                depose()
            return
        for f in fired:
            lateness = (f.fired_at - f.task.scheduled_for).total_seconds()
            self.metrics.lateness.labels("delayed").observe(max(lateness, 0.0))
        self.metrics.fired.labels("delayed").inc(len(fired))

    async def _expire(self, epoch: int, expired: list[ClaimedTask]) -> None:
        if not expired:
            return
        await self.tasks.expire(epoch, [t.id for t in expired])
        self.metrics.expired.inc(len(expired))
        for t in expired:
            log.info("task.expired id=%s target=%s expired_at=%s", t.id, t.target, t.expires_at)

    async def _failed(self, epoch: int, failed: list[tuple[ClaimedTask, PublishError]]) -> None:
        if not failed:
            return
        now = self.clock.now()
        dead = [
            (t, str(e), "publish_failed")
            for t, e in failed
            if e.permanent or t.attempts >= self.settings.max_attempts
        ]
        dead_ids = {t.id for t, _, _ in dead}
        retry = [
            (t, ceil_ms(now + self.backoff(t.attempts)), str(e))
            for t, e in failed
            if t.id not in dead_ids
        ]
        async with self.heap_lock:  # the loader must not move its cursor past a retry unseen
            await self.tasks.retry_later(epoch, retry)
            for task, due, _ in retry:
                self.heap.offer(TaskRef(task.id, to_ms(due), task.priority, task.seq))
        for task, _, error in retry:
            log.warning(
                "publish.retry id=%s target=%s attempt=%d error=%s",
                task.id,
                task.target,
                task.attempts,
                error,
            )
        self.metrics.publish_retries.inc(len(retry))
        if dead:
            await self.tasks.kill(epoch, dead)
            await self._publish_dead(dead)
        self.wake.set()

    def backoff(self, attempt: int) -> timedelta:
        """First backoff doubling per attempt up to 60 s, with +-20 % jitter."""
        base = min(self.settings.backoff.total_seconds() * 2 ** max(attempt - 1, 0), MAX_BACKOFF)
        return timedelta(seconds=base * random.uniform(0.8, 1.2))

    async def _publish_dead(self, dead: list[tuple[ClaimedTask, str, str]]) -> None:
        for task, error, reason in dead:
            self.metrics.dead_letters.labels(reason).inc()
            log.error(
                "task.dead id=%s target=%s attempts=%d error=%s",
                task.id,
                task.target,
                task.attempts,
                error,
            )
            headers = {
                **task.headers,
                "Nats-Msg-Id": f"dlq:{task.id}",
                "Mq-Error": error,
                "Mq-Error-Reason": reason,
                "Mq-Target": task.target,
                "Mq-Attempt": str(task.attempts),
            }
            subject = dlq_subject(task.target, self.settings.dlq_subject_prefix)
            try:
                await (await self.publisher.publish(subject, task.payload, headers))
            except (
                PublishError
            ) as exc:  # the dead_letters row is the record; the stream copy is a convenience
                log.warning("dlq.publish_failed id=%s error=%s", task.id, exc)
