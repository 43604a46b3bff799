"""The firing loops: from the horizon heap to JetStream, exactly on time, once.

Three cooperating loops, which keep the state between the steps they run (the steps themselves,
top-down, are in `engine.task_path`: `claim_due`, `publish_due`, `book`). The claimer
(`engine.claims`) claims in PostgreSQL what falls due in the next few tens of milliseconds,
into the bounded armed set (`engine.armed`). The dispatcher
publishes each armed task the moment the wall clock reaches its due millisecond (never before:
re-checked after every wake; with `SCHEDULER_DISPATCH_COALESCE`, tasks falling due within that
time after a publish wait and go out together with the next one, which saves nats-server a
wake-up and a flush per publish under load), pipelined, only while the publisher may send (in
office, link revalidated); the broker gives each its delivery headers (`Broker.publish_tasks`). The
bookkeeper records acknowledged outcomes every few milliseconds in one transaction (mark fired,
fire log, retries, in-doubt tasks, dead letters, expiries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from scheduler.clock import Clock, wait_event
from scheduler.engine.delayed import task_path
from scheduler.engine.delayed.armed import Armed
from scheduler.engine.delayed.claims import Claimer
from scheduler.engine.delayed.dead_letters import DeadLetterCopies
from scheduler.engine.delayed.fairness import UNNAMED, FairArmed, armed_set
from scheduler.engine.delayed.horizon import Horizon, HorizonHeap
from scheduler.engine.delayed.quota import OrgLedger
from scheduler.engine.office import Office
from scheduler.engine.ports import Broker, TaskRepository
from scheduler.messages.subjects import check_target
from scheduler.metrics import Metrics
from scheduler.records import (
    ClaimedTask,
    PubAck,
    PublishError,
    to_ms,
)
from scheduler.settings import Settings

log = logging.getLogger("scheduler.firing")

BOOK_EVERY = 0.025
PRE_WAKE_MS = 20
BOOK_BATCH = 500
# While a backlog of due tasks drains (a burst), outcomes are held back, up to this many, and
# recorded after it: PostgreSQL's CPU goes to the claims that feed the deliveries first.
BOOK_DEFER_MAX = 50_000


class Firing:
    """Publishes due tasks; owned by the engine while this instance holds office. The loops
    (claim, dispatch, bookkeeping) and their state live here; the steps they run are in
    `engine.task_path`."""

    _publish_due = task_path.publish_due
    _record = task_path.book

    def __init__(
        self,
        settings: Settings,
        heap: HorizonHeap | Horizon,
        tasks: TaskRepository,
        publisher: Broker,
        office: Office,
        clock: Clock,
        metrics: Metrics,
        wake: asyncio.Event,
        heap_lock: asyncio.Lock,
        on_stream: Callable[[str], None] | None = None,
        dead: DeadLetterCopies | None = None,
    ) -> None:
        self.on_stream = on_stream
        self.dead = dead or DeadLetterCopies(publisher, settings.dlq_subject_prefix, metrics)
        self.settings = settings
        self.horizon = heap if isinstance(heap, Horizon) else Horizon(heap, wake, heap_lock)
        self.tasks = tasks
        self.publisher = publisher
        self.office = office
        self.clock = clock
        self.metrics = metrics
        self.wake = self.horizon.wake
        self.armed: Armed = armed_set(settings)  # fair by org unless fair_firing is off
        self.armed_event = asyncio.Event()
        self.room_event = asyncio.Event()  # set when the dispatcher takes tasks off `armed`
        self.claims = Claimer(settings, self.horizon, tasks, self.armed, clock, metrics, self.arm)
        self.claims.on_fenced = self._deposed
        self.throttles = self.claims.throttles  # fair limits while two or more orgs compete
        self.acked_event = asyncio.Event()  # set when an ack brings the unacknowledged
        # publishes under the throttles' caps
        self.outcome_event = asyncio.Event()
        self._outcomes: list[tuple[ClaimedTask, PubAck | PublishError, datetime]] = []
        self._expired: list[ClaimedTask] = []
        self._inflight = 0
        self._inflight_bytes = 0
        # unacknowledged publishes per org, when fair (see `Throttles.allowance`)
        self._org_inflight: dict[str, int] | None = {} if self.throttles.fair else None
        self._closing = False
        self._books_closing = False
        self._target_checks: dict[str, str | None] = {}
        self.ledger: OrgLedger | None = None  # per-org quotas (engine/delayed/quota.py), when on
        # SCHEDULER_DISPATCH_COALESCE: two publishes of due tasks at least this far apart
        self._coalesce_ms = round(settings.dispatch_coalesce.total_seconds() * 1000)
        self._last_publish_ms = 0

    def now_ms(self) -> int:
        return to_ms(self.clock.now())

    async def run(self, epoch: int, stop: asyncio.Event) -> None:
        """Claim, publish and record until `stop` is set or office is lost."""
        dispatcher = asyncio.create_task(self._dispatch(), name="dispatch")
        books = asyncio.create_task(self._keep_books(epoch), name="books")
        try:
            claims = self.claims
            while not stop.is_set() and self.office.may_act():
                if claims.room() <= 0:  # full: wait until the dispatcher takes some out
                    await self._wait(self.room_event, 0.05)
                    continue
                if claims.backlog:
                    await claims.refill(epoch)
                    continue
                wait = claims.idle_seconds()
                if wait > 0 or not await claims.step(epoch):
                    await self._wait(self.horizon.wake, max(wait, 0.001))
        finally:
            await self._finish(dispatcher, books)

    def reclaim_orphans(self, stale: timedelta | None = None) -> None:
        """See `Claimer.reclaim_orphans`."""
        self.claims.reclaim_orphans(stale)

    def _deposed(self, epoch: int) -> None:  # also the claimer's `on_fenced`
        log.error("engine.fenced epoch=%d: a newer leader exists; stepping down", epoch)
        self.office.depose()

    def arm(self, claimed: Sequence[ClaimedTask]) -> None:
        """Hand claimed tasks to the dispatcher, which publishes each at its due millisecond
        (a task already armed is kept once; see `engine.armed`)."""
        if self.armed.add(claimed):
            self.armed_event.set()

    async def _wait(self, event: asyncio.Event, seconds: float) -> None:
        """Sleep up to `seconds` of the clock's time, waking early when `event` is set."""
        event.clear()
        await wait_event(self.clock, event, seconds)

    async def _dispatch(self) -> None:
        """Publish armed tasks the moment the wall clock reaches their due time, never before."""
        while self.armed or not self._closing:
            if not self.armed:
                await self._wait(self.armed_event, 1.0)
                continue
            if not self.publisher.may_send():  # self-fenced (say, woken from SIGSTOP), or the
                if self._closing:  # link not revalidated: publish nothing; when stopping,
                    return  # the tasks stay claimed and the next leader publishes them
                await self._wait(self.armed_event, 0.05)
                continue
            throttles = self.throttles
            throttles.update(self.now_ms())
            if (  # two or more orgs compete: keep the publisher's queue short
                self._inflight >= throttles.inflight_cap
                or self._inflight_bytes >= throttles.inflight_bytes_cap
            ):
                await self._dispatch_allowance()
                continue
            left = self.armed.next_due_ms() - self.now_ms()  # type: ignore[operator]
            if left > 0:  # re-checked after every wake: robust to wall-clock steps
                # A long sleep is cut short by PRE_WAKE_MS and finished with a short one: the
                # first wake after idling often comes late (see engine.cron_firing.PRE_WAKE).
                early = PRE_WAKE_MS if left > 2 * PRE_WAKE_MS else 0
                await self._wait(self.armed_event, (left - early) / 1000)
                continue
            if self._coalesce_ms:  # tasks due since the last publish go out together
                now_ms = self.now_ms()
                hold = self._last_publish_ms + self._coalesce_ms - now_ms
                if hold > 0:
                    await self.clock.sleep(hold / 1000)
                    continue
                self._last_publish_ms = now_ms
            await self._publish_due()

    async def _dispatch_allowance(self) -> None:
        """The caps are reached: hand over the due tasks of orgs within their allowance (a
        task of an org with little in flight goes out on time), else wait for acks."""
        armed, counts = self.armed, self._org_inflight
        allow = None
        if isinstance(armed, FairArmed) and counts is not None:
            allow = self.throttles.allowance(armed, counts)
            nxt = armed.next_due_ms(allow) if allow else None
            if nxt is not None:
                left = nxt - self.now_ms()
                if left <= 0:
                    await self._publish_due(allow)
                    return
                await self._wait(self.acked_event, min(left / 1000, 0.05))
                return
        await self._wait(self.acked_event, 0.05)

    def _refused(self, target: str) -> str | None:
        """Why `target` may not be published to now, or None (cached per subject)."""
        cache = self._target_checks
        if target not in cache:
            if len(cache) > 10_000:
                cache.clear()
            try:
                check_target(target, self.settings.target_allow)
                cache[target] = None
            except ValueError as exc:
                cache[target] = str(exc)
        return cache[target]

    def _done(self, task: ClaimedTask, outcome: PubAck | PublishError) -> None:
        self._inflight -= 1
        self._inflight_bytes -= len(task.payload)
        counts = self._org_inflight
        if counts is not None:
            org = task.org_id or UNNAMED
            n = counts[org] - 1
            if n:
                counts[org] = n
            else:
                del counts[org]
        throttles = self.throttles
        if (
            self._inflight < throttles.inflight_cap
            and self._inflight_bytes < throttles.inflight_bytes_cap
        ):
            self.acked_event.set()
        self._outcomes.append((task, outcome, self.clock.now()))
        if len(self._outcomes) in (1, BOOK_BATCH):  # the first wakes an idle bookkeeper
            self.outcome_event.set()

    async def _keep_books(self, epoch: int) -> None:
        """Record outcomes every few milliseconds, one transaction per flush, in order."""
        while True:
            if not self._outcomes and not self._expired and not self._books_closing:
                await self._wait(self.outcome_event, 1.0)  # idle: sleep until the first outcome
                continue
            if len(self._outcomes) < BOOK_BATCH and not self._books_closing:
                await self._wait(self.outcome_event, BOOK_EVERY)  # gather for a few ms
            defer_max = self.throttles.book_defer_max(BOOK_DEFER_MAX)
            while self._draining() and len(self._outcomes) < defer_max:
                await self._wait(self.outcome_event, BOOK_EVERY)
            outcomes, self._outcomes = self._outcomes, []
            expired, self._expired = self._expired, []
            if outcomes or expired:
                try:
                    await self._record(epoch, outcomes, expired)
                except Exception as exc:  # PostgreSQL away: keep the outcomes, retry shortly
                    log.warning("books.failed count=%d error=%r", len(outcomes), exc)
                    if self._books_closing and not self.office.may_act():
                        # Out of office with the database away: the tasks stay claimed and the
                        # next leader re-publishes them (the duplicate window drops repeats).
                        log.warning("books.abandoned count=%d", len(outcomes) + len(expired))
                        return
                    self._outcomes[:0], self._expired[:0] = outcomes, expired
                    await self.clock.sleep(0.5)
            elif self._books_closing:
                return

    def _draining(self) -> bool:
        """True while tasks already due wait to be claimed or published (a burst drains)."""
        if self._books_closing or not self.office.may_act():
            return False
        now = self.now_ms()
        nxt = self.horizon.next_due()
        armed = self.armed.next_due_ms()
        return (nxt is not None and nxt <= now) or (armed is not None and armed <= now)

    async def _finish(self, dispatcher: asyncio.Task[None], books: asyncio.Task[None]) -> None:
        """Graceful stop: publish what is armed (due within the lookahead) and record it all.

        After losing office nothing more is published; armed tasks stay claimed and the next
        leader re-publishes them (the duplicate window drops a repeat)."""
        await self.claims.settle()
        self._closing = True
        self.armed_event.set()
        if self.office.may_act():
            await dispatcher
        else:
            dispatcher.cancel()
            await asyncio.gather(dispatcher, return_exceptions=True)
            self.armed.clear()
            self.claims.forget()
        async with asyncio.timeout(self.publisher.timeout + 1):
            while self._inflight:  # noqa: ASYNC110 (futures resolve via callbacks)
                await asyncio.sleep(0.005)
        self._books_closing = True
        self.outcome_event.set()
        await books
