"""The firing loops: from the horizon heap to JetStream, exactly on time, once.

Three cooperating loops, run by the `Dispatcher` for a term (the story of one task, top-down,
is in `engine.delayed`'s docstring). The claim loop has the `Claimer`
(`engine.delayed.claims`) claim in PostgreSQL what falls due in the next few tens of
milliseconds, into the bounded armed set (`engine.delayed.armed`). The dispatch loop
publishes each armed task the moment the wall clock reaches its due millisecond (never before:
re-checked after every wake; with `SCHEDULER_DISPATCH_COALESCE`, tasks falling due within that
time after a publish wait and go out together with the next one, which saves nats-server a
wake-up and a flush per publish under load), pipelined, only while the publisher may send (in
office, link revalidated); the broker gives each its delivery headers (`Broker.publish_tasks`). The
bookkeeping loop hands the acknowledged outcomes every few milliseconds to the `Books`
(`engine.delayed.books`), which record them in one transaction (mark fired, fire log, retries,
in-doubt tasks, dead letters, expiries).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from scheduler.clock import Clock, wait_event
from scheduler.engine.delayed import trace
from scheduler.engine.delayed.armed import Armed
from scheduler.engine.delayed.books import Books
from scheduler.engine.delayed.claims import Claimer
from scheduler.engine.delayed.dead_letters import DeadLetterCopies
from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.delayed.fairness import UNNAMED, FairArmed, armed_set
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.delayed.quota import OrgLedger
from scheduler.engine.office import Office
from scheduler.engine.ports import Broker, TaskRepository
from scheduler.messages.subjects import check_target
from scheduler.records import ClaimedTask, Done, PubAck, PublishError, to_ms
from scheduler.settings import Settings

log = logging.getLogger(__name__)

# Deliveries are booked this often; a failed publish at once, so its retry's backoff starts
# without this delay. (100 ms saved a few µs of CPU per task, but each flush's arrays, four
# times larger, are encoded in one step of the event loop: beside a busy loop the p99 of
# `bench/contended.py` went from 7.8 to 17.8 ms.)
BOOK_EVERY = 0.025
PRE_WAKE_MS = 20
BOOK_BATCH = 500
# While a backlog of due tasks drains (a burst), outcomes are held back, up to this many, and
# recorded after it: PostgreSQL's CPU goes to the claims that feed the deliveries first.
BOOK_DEFER_MAX = 20_000
# Outcomes not yet recorded (held back, or being booked) above which no more is claimed: a
# drain that outruns its bookkeeping waits for it instead of holding every outcome in memory
# (a million due at one instant reached a gigabyte that way). One booking takes at most
# BOOK_DEFER_MAX outcomes, so no statement grows with the backlog either.
UNBOOKED_MAX = 2 * BOOK_DEFER_MAX
# While a split backlog's armed share is used and nothing else is due, the claim loop sleeps
# until the dispatcher publishes (which wakes it), at most this long: it used to look again
# every millisecond until the armed tasks went out.
CAPPED_WAIT = 0.025
QUIET_POLL = 0.002  # s between looks while a term that gives partitions back goes quiet


class Dispatcher:
    """Publishes due tasks; owned by the engine while this instance holds office. The loops
    (claim, dispatch, bookkeeping) and the state between their steps live here; the claim
    step is the `Claimer`'s (`claims`), the publish step is `publish_due`, and the booking is
    the `Books`' (`books`)."""

    def __init__(
        self,
        *,
        settings: Settings,
        horizon: Horizon,
        tasks: TaskRepository,
        publisher: Broker,
        office: Office,
        clock: Clock,
        events: DelayedEvents,
        on_stream: Callable[[str], None] | None = None,
        dead: DeadLetterCopies | None = None,
        ledger: OrgLedger | None = None,
    ) -> None:
        self.settings = settings
        self.horizon = horizon
        self.publisher = publisher
        self.office = office
        self.clock = clock
        self._events = events
        self.wake = horizon.wake  # set it to have the claim loop look again at once
        self.armed: Armed = armed_set(settings)  # fair by org unless fair_firing is off
        self.armed_event = asyncio.Event()
        self.room_event = asyncio.Event()  # set when the dispatcher takes tasks off `armed`
        self.claims = Claimer(
            settings=settings,
            horizon=horizon,
            tasks=tasks,
            armed=self.armed,
            clock=clock,
            events=events,
            arm=self.arm,
            on_fenced=self._deposed,
        )
        self.books = Books(
            settings=settings,
            horizon=horizon,
            tasks=tasks,
            clock=clock,
            events=events,
            dead=dead or DeadLetterCopies(publisher, settings.dlq_subject_prefix, events),
            on_fenced=self._deposed,
            on_stream=on_stream,
            ledger=ledger,
        )
        self.throttles = self.claims.throttles  # fair limits while two or more orgs compete
        self.acked_event = asyncio.Event()  # set when an ack brings the unacknowledged
        # publishes under the throttles' caps
        self.outcome_event = asyncio.Event()
        self.booked_event = asyncio.Event()  # set when a booking made room under UNBOOKED_MAX
        self._booking = 0  # outcomes in the booking under way
        self._failed_waiting = False  # a failed publish waits for the books: book at once
        self._wake_on_room = False  # the claim loop waits for a publish to make room
        self._outcomes: list[tuple[ClaimedTask, PubAck | PublishError, datetime]] = []
        self._expired: list[ClaimedTask] = []
        self._inflight = 0
        self._inflight_bytes = 0
        self._flying: set[str] = set()  # the ids of the tasks published and not answered
        # outcomes (and expiries) gathered and booked so far, each list booked in order
        self._outcomes_in = self._outcomes_booked = 0
        self._expired_in = self._expired_booked = 0
        self._book_now = False  # `quiet` waits for bookings: no burst holds them back
        # unacknowledged publishes per org, when fair (see `Throttles.allowance`)
        self._org_inflight: dict[str, int] | None = {} if self.throttles.fair else None
        self._closing = False
        self._books_closing = False
        self._target_checks: dict[str, str | None] = {}
        # SCHEDULER_DISPATCH_COALESCE: two publishes of due tasks at least this far apart
        self._coalesce_ms = round(settings.dispatch_coalesce.total_seconds() * 1000)
        self._last_publish_ms = 0

    def now_ms(self) -> int:
        return to_ms(self.clock.now())

    async def run(self, epoch: int, stop: asyncio.Event) -> None:
        """Claim, publish and record until `stop` is set or office is lost."""
        dispatcher = asyncio.create_task(self._dispatch(), name="dispatch")
        books = asyncio.create_task(self._keep_books(epoch), name="books")
        stopped = asyncio.ensure_future(stop.wait())  # a stop ends the loop's wait at once
        stopped.add_done_callback(self._wake_all)
        try:
            claims = self.claims
            while not stop.is_set() and self.office.may_act():
                if claims.room() <= 0:  # full: wait until the dispatcher takes some out
                    await self._wait(self.room_event, 0.05)
                    continue
                if self.unbooked() >= UNBOOKED_MAX:  # the books are behind: let them catch up
                    await self._wait(self.booked_event, 0.05)
                    continue
                if claims.backlog:
                    await claims.refill(epoch)
                    continue
                wait = claims.idle_seconds()
                if wait > 0 or not await claims.claim_due(epoch):
                    # a capped backlog waits until the dispatcher publishes (it then wakes
                    # the loop) or the present is due
                    self._wake_on_room = claims.backlog_capped()
                    if self._wake_on_room:
                        wait = min(claims.idle_seconds(present_only=True), CAPPED_WAIT)
                    await self._wait(self.horizon.wake, max(wait, 0.001))
                    self._wake_on_room = False
        finally:
            stopped.cancel()
            await self._finish(dispatcher, books)

    def _wake_all(self, stopped: asyncio.Future[Any]) -> None:
        """Wake the claim loop from whichever wait it is in (it then sees the stop)."""
        if stopped.cancelled():
            return
        for event in (self.horizon.wake, self.room_event, self.booked_event):
            event.set()

    def forget_unowned(self, partitions: Collection[int]) -> None:
        """The term gave partitions back and keeps `partitions`: their parked tasks stay
        claimed for their next owner (`Claimer.forget_unowned`), orphans are reclaimed in
        the kept ones only; what is armed of theirs still goes out on time."""
        self.claims.forget_unowned()
        self.claims.reclaim_in = sorted(partitions)

    async def quiet(self, released: Callable[[str], bool]) -> None:
        """Return once nothing of the tasks `released` names is being claimed, armed, in
        flight or unrecorded (a term that gives their partitions back: after this, the term
        writes nothing of theirs). The claims in flight finish first (they drop what they
        took of them, as the heap holds none of them any more); what is armed of them goes
        out at its due millisecond (within the claim lookahead), its answer arrives, and every
        outcome gathered until then is booked."""
        await self.claims.settle()
        claims = self.claims
        while (
            claims.refilling
            or any(map(released, self.armed.ids()))
            or any(map(released, self._flying))
        ):
            await self.clock.sleep(QUIET_POLL)
        outcomes, expired = self._outcomes_in, self._expired_in
        self._book_now = True  # (a burst's bookings are held back: not these)
        try:
            while self._outcomes_booked < outcomes or self._expired_booked < expired:
                self.outcome_event.set()  # (a bookkeeper gathering more: book what is there)
                await self.clock.sleep(QUIET_POLL)
        finally:
            self._book_now = False

    def reclaim_orphans(self, stale: timedelta | None = None) -> None:
        """See `Claimer.reclaim_orphans`."""
        self.claims.reclaim_orphans(stale)

    def unbooked(self) -> int:
        """Outcomes not recorded yet: gathered, expired, or in the booking under way."""
        return len(self._outcomes) + len(self._expired) + self._booking

    def _deposed(self, epoch: int) -> None:  # the claimer's and the books' `on_fenced`
        log.error("engine.fenced epoch=%d: a newer leader exists; stepping down", epoch)
        self.office.depose(epoch)

    def arm(self, claimed: Sequence[ClaimedTask]) -> None:
        """Hand claimed tasks to the dispatcher, which publishes each at its due millisecond
        (a task already armed is kept once; see `engine.delayed.armed`)."""
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
                # first wake after idling often comes late (see engine.cron.firing.PRE_WAKE).
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
            await self.publish_due()

    async def publish_due(self, allow: dict[str, int] | None = None) -> None:
        """Publish every armed task that is due, all in one hand-over to the connection
        (with `allow`: only those of the orgs it names, see `_dispatch_allowance`)."""
        now = self.clock.now()
        now_ms = to_ms(now)
        batch: list[ClaimedTask] = []
        done: list[Done] = []
        size = 0
        lateness: dict[int, int] = {}  # due ms -> tasks, observed per group
        armed = self.armed
        if allow is not None and isinstance(armed, FairArmed):
            due = armed.pop_due(now_ms, allow)
        else:
            due = armed.pop_due(now_ms)
        counts = self._org_inflight
        if due:
            self.room_event.set()
            if self._wake_on_room:  # a split backlog waits for this room (`run`)
                self.horizon.wake.set()
        for due_ms, *_, task in due:
            lateness[due_ms] = lateness.get(due_ms, 0) + 1
            if task.expires_at is not None and task.expires_at <= now and not task.doubted:
                self._expired.append(task)
                self._expired_in += 1
                self.outcome_event.set()
                continue
            refused = self._refused(task.target)  # re-checked at fire time
            if refused is not None:
                error = PublishError(task.target, refused, True, "target_refused")
                self._outcomes.append((task, error, now))
                self._outcomes_in += 1
                self.outcome_event.set()
                continue
            size += len(task.payload)
            if counts is not None:
                org = task.org_id or UNNAMED
                counts[org] = counts.get(org, 0) + 1
            batch.append(task)
            done.append(functools.partial(self._done, task))
        if lateness:
            self._events.tasks_dispatched(now_ms, lateness)
        if batch:
            if trace.on():
                trace.step("sent", (t.id for t in batch))
            self._inflight += len(batch)
            self._flying.update(t.id for t in batch)
            self._inflight_bytes += size
            await self.publisher.publish_tasks(batch, done, now)

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
                    await self.publish_due(allow)
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
        self._flying.discard(task.id)
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
        self._outcomes_in += 1
        if isinstance(outcome, PubAck):  # delivered: the books need neither bytes nor headers
            task.payload, task.headers = b"", {}
            if len(self._outcomes) in (1, BOOK_BATCH):  # the first wakes an idle bookkeeper
                self.outcome_event.set()
        else:  # a failure is booked at once: its retry is due after its backoff, not later
            self._failed_waiting = True
            self.outcome_event.set()

    async def _keep_books(self, epoch: int) -> None:
        """Record outcomes every few milliseconds, one transaction per flush, in order."""
        while True:
            if not self._outcomes and not self._expired and not self._books_closing:
                await self._wait(self.outcome_event, 1.0)  # idle: sleep until the first outcome
                continue
            if len(self._outcomes) < BOOK_BATCH and not self._books_closing:
                if not self._failed_waiting:  # gather deliveries (a failure cuts it short)
                    await self._wait(self.outcome_event, BOOK_EVERY)
            self._failed_waiting = False
            defer_max = self.throttles.book_defer_max(BOOK_DEFER_MAX)
            while self._draining() and len(self._outcomes) < defer_max:
                await self._wait(self.outcome_event, BOOK_EVERY)
            # at most BOOK_DEFER_MAX a booking: one statement never grows with a backlog
            outcomes = self._outcomes[:BOOK_DEFER_MAX]
            del self._outcomes[:BOOK_DEFER_MAX]
            expired, self._expired = self._expired, []
            if outcomes or expired:
                if trace.on():
                    trace.step("acked", _ack_marks(outcomes))
                self._booking = len(outcomes) + len(expired)
                try:
                    await self.books.book(epoch, outcomes, expired)
                    self._outcomes_booked += len(outcomes)
                    self._expired_booked += len(expired)
                except Exception as exc:  # PostgreSQL away: keep the outcomes, retry shortly
                    log.warning("books.failed count=%d error=%r", len(outcomes), exc)
                    if self._books_closing and not self.office.may_act():
                        # Out of office with the database away: the tasks stay claimed and the
                        # next leader re-publishes them (the duplicate window drops repeats).
                        log.warning("books.abandoned count=%d", len(outcomes) + len(expired))
                        return
                    self._outcomes[:0], self._expired[:0] = outcomes, expired
                    await self.clock.sleep(0.5)
                finally:
                    self._booking = 0
                    if self.unbooked() < UNBOOKED_MAX:
                        self.booked_event.set()
            elif self._books_closing:
                return

    def _draining(self) -> bool:
        """True while tasks already due wait to be claimed or published (a burst drains)."""
        if self._books_closing or self._book_now or not self.office.may_act():
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


def _ack_marks(
    outcomes: Sequence[tuple[ClaimedTask, PubAck | PublishError, datetime]],
) -> list[str]:
    """`id@answer ms` of each outcome, `!` after a failure's (see `engine.delayed.trace`)."""
    return [f"{t.id}@{to_ms(at)}{'' if isinstance(o, PubAck) else '!'}" for t, o, at in outcomes]
