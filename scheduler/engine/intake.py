"""The intake loop: the delay lane into PostgreSQL, acked only after the commit.

Fetch a batch from the durable pull consumer, validate each message (envelope, target, size,
TTL, max delay), store the good ones in one round trip (`ON CONFLICT DO NOTHING`: a redelivered
or re-published task is stored once), put those inside the loaded horizon straight onto the heap,
then ack. Bad input is dead-lettered (stream `MQ_DLQ` and table `dead_letters`) with an `Mq-Error`
header naming the field and the problem, and termed so it never blocks the lane.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.aio.msg import Msg

from scheduler.bus.publisher import Publisher, PublishError
from scheduler.bus.puller import Puller
from scheduler.clock import Clock
from scheduler.engine.heap import HorizonHeap
from scheduler.envelope import Limits, parse_envelope
from scheduler.errors import EnvelopeError, TargetRefusedError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.tasks import NewTask, TaskStore, ceil_ms
from scheduler.subjects import check_target, delay_lane_prefix, dlq_subject

log = logging.getLogger("scheduler.intake")

YIELD_EVERY = 100
# A small batch waits this long for more: one insert per 10 ms instead of one per message or
# two at low rates (each statement costs a round trip); tasks are due later than that anyway.
INTAKE_LINGER = 0.01


@dataclass(frozen=True, slots=True)
class Rejected:
    """An intake message that is not a valid task, with why."""

    msg: Msg
    target: str
    reason: str
    error: str


def forwarded_headers(msg: Msg) -> dict[str, str]:
    """Producer headers to deliver with the task: all but `Nats-*` (the server's own)."""
    return {k: v for k, v in (msg.headers or {}).items() if not k.lower().startswith("nats-")}


class Intake:
    """Moves tasks from the delay lane into PostgreSQL and the heap."""

    def __init__(
        self,
        settings: Settings,
        heap: HorizonHeap,
        tasks: TaskStore,
        publisher: Publisher,
        clock: Clock,
        metrics: Metrics,
        wake: asyncio.Event,
        heap_lock: asyncio.Lock,
        limits: Limits,
    ) -> None:
        self.settings = settings
        self.heap = heap
        self.tasks = tasks
        self.publisher = publisher
        self.clock = clock
        self.metrics = metrics
        self.wake = wake
        self.heap_lock = heap_lock
        self.limits = limits
        self.lane = delay_lane_prefix(settings.intake_subject)
        self._may_act: Callable[[], bool] = lambda: True

    def classify(self, msg: Msg, now: datetime) -> NewTask | Rejected:
        """Validate one message into a NewTask, or say precisely why it is rejected."""
        rest = msg.subject[len(self.lane) :] if msg.subject.startswith(self.lane) else msg.subject
        target = "mq." + rest
        try:
            check_target(target, self.settings.target_allow)
            env = parse_envelope(msg.data, now, self.limits)
        except TargetRefusedError as exc:
            return Rejected(msg, target, "target_refused", str(exc))
        except EnvelopeError as exc:
            return Rejected(msg, target, exc.reason, str(exc))
        due = ceil_ms(env.due_at(now))
        return NewTask(
            id=env.id,
            target=target,
            payload=msg.data,
            headers=forwarded_headers(msg),
            priority=env.priority,
            due_at=due,
            scheduled_for=due if env.delay_until is not None else ceil_ms(now),
            expires_at=env.expires_at,
        )

    async def handle(self, msgs: list[Msg]) -> None:
        """Store, dead-letter and ack one fetched batch."""
        await self.commit(msgs, await self.classify_all(msgs))

    async def classify_all(self, msgs: list[Msg]) -> list[NewTask | Rejected]:
        now = self.clock.now()
        results: list[NewTask | Rejected] = []
        for i, msg in enumerate(msgs):
            results.append(self.classify(msg, now))
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let the dispatcher publish on time during a big batch
        return results

    async def commit(self, msgs: list[Msg], results: list[NewTask | Rejected]) -> None:
        """Insert the good tasks, dead-letter the bad ones, then ack: never ack before commit."""
        if not self._may_act():  # self-fenced: leave the batch unacked for the next leader
            raise RuntimeError("office lost before the commit")
        good = [(m, r) for m, r in zip(msgs, results, strict=True) if isinstance(r, NewTask)]
        bad = [r for r in results if isinstance(r, Rejected)]
        if good:
            await self._store([m for m, _ in good], [t for _, t in good])
        if bad:
            await self._reject(bad)
        # One frame per ack, all handed to the connection at once (see scheduler.bus.wire).
        await self.publisher.wire.empty_to(m.reply for m, _ in good if m.reply)

    async def _store(self, msgs: list[Msg], tasks: list[NewTask]) -> None:
        async with self.heap_lock:
            refs = await self._with_progress(self.tasks.insert(tasks), msgs)
            pushed = sum(self.heap.offer(ref) for ref in refs)
        self.metrics.intake.labels("accepted").inc(len(refs))
        if len(refs) < len(tasks):
            self.metrics.intake.labels("duplicate").inc(len(tasks) - len(refs))
        if pushed:
            self.wake.set()

    async def _with_progress(self, work: Any, msgs: list[Msg]) -> Any:
        """Await `work`, telling JetStream the batch is in progress while a slow commit runs."""
        task = asyncio.ensure_future(work)
        interval = max(self.settings.intake_ack_wait.total_seconds() / 3, 0.5)
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            for msg in msgs:
                await msg.in_progress()

    async def _reject(self, bad: list[Rejected]) -> None:
        rows = [self._dead_row(r) for r in bad]
        await self.tasks.record_bad_intake(rows)
        for r, row in zip(bad, rows, strict=True):
            self.metrics.intake.labels(r.reason).inc()
            self.metrics.dead_letters.labels(r.reason).inc()
            log.warning(
                "intake.rejected subject=%s reason=%s error=%s", r.msg.subject, r.reason, r.error
            )
            await self._publish_dead(r, row["original_id"])
            await r.msg.term()

    def _dead_row(self, r: Rejected) -> dict[str, Any]:
        try:
            payload: Any = json.loads(r.msg.data)
        except ValueError:
            payload = {"_raw_base64": base64.b64encode(r.msg.data).decode()}
        return {
            "original_id": _original_id(r.msg, payload),
            "subject": r.msg.subject,
            "payload": payload,
            "error": r.error,
            "reason": r.reason,
            "target": r.target,
            "raw": r.msg.data,
            "headers": dict(r.msg.headers or {}),
        }

    async def _publish_dead(self, r: Rejected, original_id: str) -> None:
        headers = {
            **forwarded_headers(r.msg),
            "Nats-Msg-Id": f"dlq-intake:{_stream_seq(r.msg)}",
            "Mq-Error": r.error[:1000],
            "Mq-Error-Reason": r.reason,
            "Mq-Original-Subject": r.msg.subject,
            "Mq-Original-Id": original_id,
        }
        subject = dlq_subject(r.target, self.settings.dlq_subject_prefix)
        try:
            await (await self.publisher.publish(subject, r.msg.data, headers))
        except (
            PublishError
        ) as exc:  # the dead_letters row is the record; the stream copy is a convenience
            log.warning("dlq.publish_failed subject=%s error=%s", subject, exc)

    async def run(
        self, nc: Any, stream: str, stop: asyncio.Event, may_act: Callable[[], bool]
    ) -> None:
        """Handle batches as they arrive until `stop` is set or `may_act()` turns false.

        Two stages: while one batch commits, the next is fetched and validated. Commits stay
        one at a time, in order, so intake order (the tie-break among tasks due together) holds.
        """
        self._may_act = may_act
        puller = Puller(nc, stream, self.settings.intake_consumer, self.settings.batch)
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


def _stream_seq(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:  # not a JetStream message (tests feeding core messages)
        return 0


def _original_id(msg: Msg, payload: Any) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("id"), str) and payload["id"]:
        return str(payload["id"])[:200]
    header = (msg.headers or {}).get("Nats-Msg-Id")
    return header or f"intake:{_stream_seq(msg)}"
