"""Cron jobs from YAML, fired by the leader through the same publisher as delayed tasks.

Each term: sync `schedules/*.yaml` into PostgreSQL (`CronCatalog`), read the cursors, then loop:
plan every job (`OccurrencePlanner`, downtime policies in `scheduler.cron.misfire`), publish
what is due as a fresh `hanzo.mq.v1` envelope with `Nats-Msg-Id` `<job>@<occurrence>`
(`message.envelope`; built ahead and prepared by the term's broker when it is on time), and only
after the acks advance the cursors in one fenced statement,
plus `fire_log` rows (`CursorBook`). A restart or failover in the middle of an occurrence
re-publishes it with the same id, which the target stream drops: never twice, never skipped.
Reload on SIGHUP or when a YAML file changes; a job removed from YAML stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from scheduler.aio import first_of
from scheduler.clock import Clock
from scheduler.cron.jobs import Concurrency, Job
from scheduler.engine.cron.catalog import CronCatalog
from scheduler.engine.cron.cursors import CursorBook, Result
from scheduler.engine.cron.events import CronEvents
from scheduler.engine.cron.message import envelope
from scheduler.engine.cron.plan import Firing, OccurrencePlanner
from scheduler.engine.office import Office, TermOffice
from scheduler.engine.ports import Broker, Bus, ScheduleRepository
from scheduler.errors import FencedError
from scheduler.records import PubAck, PublishError
from scheduler.settings import Settings

log = logging.getLogger(__name__)

RELOAD_CHECK = 2.0
# After a long idle sleep the first wake-up here often comes 10-30 ms late (the loop and the
# host are cold); waking this much before an occurrence and sleeping the short rest measured
# 10-15 ms closer to the instant with 1,000 jobs (bench/cron.py, per-second first arrivals).
PRE_WAKE = 0.03

Sent = tuple[Job, datetime, asyncio.Future[PubAck] | None]  # None: skipped (forbid)


class CronEngine:
    """Fires the YAML's cron jobs while this instance holds office.

    With a `bus`, `forbid` jobs ask it whether their subject still holds a message, and the
    cursors are mirrored to KV; without one (tests of the bookkeeping alone) neither happens."""

    def __init__(
        self,
        settings: Settings,
        store: ScheduleRepository,
        office: Office,
        clock: Clock,
        events: CronEvents,
        bus: Bus | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.office = office
        self.clock = clock
        self._events = events
        self.bus = bus
        self.catalog = CronCatalog(settings.schedules_dir, store, clock)
        self.planner = OccurrencePlanner()
        self.book = CursorBook(settings, store, clock, events, mirror=bus is not None)
        self._publisher: Broker | None = None  # this term's, for messages framed ahead
        # the jobs this term fires, by name (None: all): under P > 1 a term holds some of the
        # partitions, and a job's cursor is fenced by its own (set per term by LeaderEngine)
        self.owns: Callable[[str], bool] | None = None
        self._owned: tuple[tuple[Job, ...], Callable[[str], bool] | None, tuple[Job, ...]] = (
            (),
            None,
            (),
        )
        # a term grown in place: the jobs it fires from the next tick on, their cursors read
        # again first (`grow`)
        self._grown: Callable[[str], bool] | None = None
        self._grew = asyncio.Event()
        self._regrouped = asyncio.Event()  # set once the loop ticks with the last `regroup`
        self._regrouped.set()

    # -- the catalog, as the daemon and the management API see it ---------------------------------
    @property
    def jobs(self) -> tuple[Job, ...]:
        return self.catalog.jobs

    @property
    def errors(self) -> list[str]:
        return self.catalog.errors

    @property
    def paused_by_operator(self) -> frozenset[str]:
        return self.catalog.paused_by_operator

    @property
    def failed(self) -> frozenset[str]:
        """Jobs stopped by a permanent publish error (see `CursorBook`)."""
        return self.catalog.failed

    @property
    def term_jobs(self) -> tuple[Job, ...]:
        """The jobs of this term's partitions (every job unless `owns` says otherwise)."""
        jobs, owns = self.catalog.jobs, self.owns
        if owns is None:
            return jobs
        seen_jobs, seen_owns, mine = self._owned
        if seen_jobs is not jobs or seen_owns is not owns:
            mine = tuple(j for j in jobs if owns(j.name))
            self._owned = (jobs, owns, mine)
        return mine

    def own(self, owns: Callable[[str], bool]) -> None:
        """A new term fires the jobs `owns` names (a change left from the last term is void)."""
        self.owns, self._grown = owns, None
        self._grew.clear()
        self._regrouped.set()

    def regroup(self, owns: Callable[[str], bool]) -> None:
        """The term's partitions change in place: from its next tick it fires the jobs `owns`
        names, with every cursor read again first (a gained job's former owner may have moved
        its cursor since this term read them; its writes are fenced now, so the read is
        final). Until then it fires the jobs it had (a shrink waits for that: `regrouped`)."""
        self._grown = owns
        self._regrouped = asyncio.Event()
        self._grew.set()

    async def regrouped(self) -> None:
        """Return once the loop ticks with the jobs of the last `regroup` (at once if none is
        pending): no tick of the jobs it left out is in flight or will start."""
        await self._regrouped.wait()

    async def _regrown(self, cursors: dict[str, datetime]) -> dict[str, datetime]:
        """The cursors to tick with: read again, and the jobs owned anew, after a `regroup`."""
        owns = self._grown
        if owns is None:
            return cursors
        self._grew.clear()
        fresh = await self.store.cursors()
        self.owns, self._grown = owns, None
        self.planner.forget()  # (planned and prepared for the jobs as they were)
        self._regrouped.set()
        log.info("cron.grown jobs=%d", len(self.term_jobs))
        return fresh

    def request_reload(self) -> None:
        """Ask for a YAML reload (SIGHUP)."""
        self.catalog.request_reload()

    async def sync(self) -> None:
        """Load the YAML (keeping the valid jobs, logging the errors) and sync it to PostgreSQL."""
        await self.catalog.sync()
        self.planner.forget()  # computed from the jobs as they were
        self._events.cron_failed_count(len(self.catalog.failed))

    # -- the term ---------------------------------------------------------------------------------
    async def run(self, epoch: int, publisher: Broker, stop: asyncio.Event) -> None:
        """Fire due occurrences until `stop` is set or office is lost."""
        self._publisher = publisher
        self.planner.forget()
        try:
            await self._loop(epoch, publisher, stop)
        finally:
            await self.book.close()
            self._events.cron_failed_count(0)  # the next leader reports them

    async def _loop(self, epoch: int, publisher: Broker, stop: asyncio.Event) -> None:
        await self.sync()
        cursors = await self.store.cursors()
        office = TermOffice(self.office, epoch)  # this term's: not a newer one of this instance
        while not stop.is_set() and office.may_act():
            if self.catalog.stale():
                self.catalog.reload_requested.clear()
                await self.sync()
            if not publisher.may_send():  # the link came back but is not revalidated yet
                await first_of(self.clock.sleep(0.05), stop.wait())
                continue
            try:
                cursors = await self._regrown(cursors)
                await self.tick(epoch, publisher, cursors)
            except FencedError:
                self.office.depose(epoch)
                return
            except Exception as exc:  # PostgreSQL or NATS trouble: cursors unchanged, retry soon
                log.warning("cron.tick_failed error=%r", exc)
                await self.clock.sleep(1.0)
                cursors = await self.store.cursors()
                continue
            await self._sleep_until_next(cursors, stop)

    async def tick(self, epoch: int, publisher: Broker, cursors: dict[str, datetime]) -> None:
        """Plan every job, publish what is due, then advance cursors in one statement.

        Jobs whose message was prepared while idle and whose occurrence is due on time are
        published first, straight from the prepared bytes; everything else is planned after."""
        now = self.clock.now()
        early = await self._publish_prepared(publisher, cursors, now)
        start = min(self.catalog.synced_at or now, now)
        done = {job.name for job, _, _ in early}
        moves, firing = self.planner.plan_tick(
            self.term_jobs, cursors, now, start, done, self.book.backing_off
        )
        results = await self._settle(early) + await self._fire(publisher, firing, now)
        self.book.fold(results, moves)
        if stopped := await self.book.record(epoch, moves, cursors, publisher):
            self.catalog.halt(stopped)
            self.planner.forget()
            self._events.cron_failed_count(len(self.catalog.failed))

    async def _publish_prepared(
        self, publisher: Broker, cursors: dict[str, datetime], now: datetime
    ) -> list[Sent]:
        """Hand the broker the messages prepared for the occurrences due now, all at once."""
        due = self.planner.take_prepared(self.term_jobs, cursors, now)
        if not due:
            return []
        futures = await publisher.publish_prepared([ready.outgoing for _, ready in due], now)
        return [(job, ready.at, fut) for (job, ready), fut in zip(due, futures, strict=True)]

    async def _fire(self, publisher: Broker, firing: Firing, now: datetime) -> list[Result]:
        sent: list[Sent] = []
        for job, occurrence in firing:
            if job.concurrency is Concurrency.FORBID and await self._busy(job):
                log.info("cron.skipped_busy job=%s occurrence=%s", job.name, occurrence.isoformat())
                self._events.cron_occurrence_skipped("busy")
                sent.append((job, occurrence, None))
                continue
            body, headers = envelope(job, occurrence, now)
            sent.append((job, occurrence, await publisher.publish(job.subject, body, headers)))
        return await self._settle(sent)

    async def _settle(self, sent: Sequence[Sent]) -> list[Result]:
        """Await each publish: its PubAck, its PublishError, or None for a skipped occurrence."""
        out: list[Result] = []
        for job, occurrence, fut in sent:
            result: PubAck | PublishError | None = None
            if fut is not None:
                try:
                    result = await fut
                    late = (self.clock.now() - occurrence).total_seconds()
                    self._events.cron_occurrence_fired(late)
                except PublishError as exc:  # logged with its backoff in `CursorBook`
                    result = exc
            out.append((job, occurrence, result))
        return out

    async def _busy(self, job: Job) -> bool:
        """True while the job's subject still holds an unacknowledged message in its stream."""
        if self.bus is None:
            return False
        try:
            held = await self.bus.messages_held(job.subject)
        except Exception as exc:  # no stream or NATS trouble: do not block the job on a guess
            log.warning("cron.busy_check_failed job=%s error=%r", job.name, exc)
            return False
        return held > 0

    async def _sleep_until_next(self, cursors: dict[str, datetime], stop: asyncio.Event) -> None:
        now = self.clock.now()
        retry_at = self.book.retry_times(now)
        nexts = self.planner.ahead(self.term_jobs, cursors, now, retry_at, self._publisher)
        now = self.clock.now()  # again: computing the next occurrences of many jobs takes time
        wait = min([RELOAD_CHECK, *[(n - now).total_seconds() for n in nexts]])
        if wait <= 0:
            return
        reload = self.catalog.reload_requested
        if wait > 2 * PRE_WAKE:  # wake a little early, then sleep the short rest
            grew = self._grew.wait()
            await first_of(self.clock.sleep(wait - PRE_WAKE), reload.wait(), grew, stop.wait())
            wait = min([RELOAD_CHECK, *[(n - self.clock.now()).total_seconds() for n in nexts]])
        await first_of(self.clock.sleep(wait), reload.wait(), self._grew.wait(), stop.wait())
