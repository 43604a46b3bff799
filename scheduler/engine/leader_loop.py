"""What the leader runs while in office: delayed delivery (intake, loader, firing) and cron.

Taking office: re-publish tasks an earlier leader claimed but never marked fired (the target
stream's duplicate window drops the repeats), then run the loader, intake, firing and cron loops
together until the daemon stops or office is lost. The heap is rebuilt from PostgreSQL each time;
a term that gains partitions in place (P > 1, `Shares.resized`) reads theirs back onto it (`_grow`),
one that gives some back stops firing theirs and goes quiet on them without ending (`_shrink`).
Everything goes through the ports (`scheduler.engine.ports`); the daemon hands in the real
adapters, the engine's unit tests the in-memory twins.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from scheduler.aio import first_of, wait_or_stop
from scheduler.clock import Clock
from scheduler.engine.cron.firing import CronEngine
from scheduler.engine.delayed import rescheduled, stored
from scheduler.engine.delayed.dead_letters import DeadLetterCopies
from scheduler.engine.delayed.dispatch import Dispatcher
from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.delayed.fairness import horizon_heap
from scheduler.engine.delayed.horizon import Catchup, Horizon
from scheduler.engine.delayed.intake import Intake
from scheduler.engine.delayed.quota import OrgLedger
from scheduler.engine.delayed.stored import StoredNotices
from scheduler.engine.office import Office, Shares, TermOffice
from scheduler.engine.ports import Broker, Bus, Source, Subscription, TaskRepository
from scheduler.messages.envelope import Limits
from scheduler.partitions import partition_of
from scheduler.records import from_ms, to_ms
from scheduler.settings import Settings

log = logging.getLogger(__name__)

PAGE = 20_000  # tasks per loader page at most (the heap's room decides: `Horizon.page_size`)
SWEEP_EVERY = 5.0
COUNT_EVERY = 15.0
ANALYZE_EVERY = 5.0  # at most; see TaskStore.analyze_if_stale
STALE_CLAIM = timedelta(seconds=30)
PUBLISH_TIMEOUT = 5.0
DLQ_DRAIN = 1.0
SHRINK_WAIT = 3.0  # s at most for a shrinking term to go quiet (the office waits HANDOVER_GRACE)


class OfficeLost(Exception):
    """Raised inside the engine's task group to stop every loop at once."""


class LeaderEngine:
    """Owns the horizon and the loops of a term of office: delayed delivery, and cron when
    given a `CronEngine`."""

    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        tasks: TaskRepository,
        office: Office,
        clock: Clock,
        events: DelayedEvents,
        intake_stream: str | None = None,
        cron: CronEngine | None = None,
    ) -> None:
        self.cron = cron
        self.settings = settings
        self.bus = bus
        self.tasks = tasks
        self.office = office
        self.clock = clock
        self._events = events
        self.intake_stream = intake_stream or settings.intake_stream
        self.horizon = Horizon(horizon_heap(settings), PAGE, Catchup.of(settings))
        self.ledger: OrgLedger | None = None  # per-org quotas of this term, when on
        self.warnings: dict[str, str] = {}  # stream -> why its duplicate window is too short
        self._checked_streams: set[str] = set()
        self._checks: set[asyncio.Task[None]] = set()
        self._partitions: frozenset[int] | None = None  # the term's (P > 1), else None: all
        self.notices: StoredNotices | None = None  # the term's sender of stored notices (P > 1)

    async def run_term(self, stop: asyncio.Event) -> None:
        """One term of office: until `stop` is set or office is lost (returns at once on stop).
        Over partitions (`Shares`, P > 1), also until the office hands the term over (its set
        of partitions is to change): it then ends as on `stop`, and says so."""
        taking = asyncio.ensure_future(self.office.wait_for_office())
        await first_of(taking, stop.wait())
        if not taking.done() or taking.cancelled():
            return  # stopped while standing by
        epoch = taking.result()
        shares = self.office if isinstance(self.office, Shares) else None
        if shares is None:
            await self._term(epoch, stop)
            return
        partitions = shares.partitions_of(epoch)
        if partitions is None:
            return  # that term is over already
        self._own(partitions)
        ending = asyncio.Event()
        ender = asyncio.create_task(
            first_of(stop.wait(), shares.handover.wait()), name="term-ender"
        )
        ender.add_done_callback(lambda _: ending.set())
        try:
            await self._term(epoch, ending, shares)
        finally:
            ender.cancel()
            shares.term_ended(epoch)

    def _own(self, partitions: frozenset[int], in_place: bool = False) -> None:
        """Fire only the tasks and cron jobs of `partitions` this term (the loader and the
        sweep read only those: `TaskStore.office`, which the office sets); `in_place`: the
        running term's set changed (cron takes it at its next tick)."""
        count = self.settings.partitions
        self._partitions = partitions
        self.horizon.owns = owns = lambda task_id: partition_of(task_id, count) in partitions
        if self.notices is not None and in_place:
            self.notices.owns = owns
        if self.cron is not None:
            jobs = lambda name: partition_of(name, count) in partitions  # noqa: E731
            if in_place:
                self.cron.regroup(jobs)
            else:
                self.cron.own(jobs)
        log.info("engine.partitions count=%d of=%d", len(partitions), count)

    async def _growing(
        self,
        shares: Shares,
        epoch: int,
        stop: asyncio.Event,
        heard: dict[int, Subscription],
        dispatcher: Dispatcher,
        source: Source,
    ) -> None:
        """Grow or shrink this term in place each time the office says its set changed
        (`Shares.resized`), and answer whether it did (`resize_applied`)."""
        while not stop.is_set():
            resize = asyncio.ensure_future(shares.resized(epoch))
            await first_of(resize, stop.wait())
            if not resize.done() or resize.cancelled():
                return
            partitions = resize.result()
            held = self._partitions
            try:
                if held is not None and partitions < held:
                    ok = await self._shrink(partitions, heard, dispatcher, stop)
                else:
                    ok = await self._grow(partitions, heard, dispatcher)
                    if ok:
                        source.reread()  # a dead engine's intake batch in flight: read it back
            except Exception as exc:  # the office then hands the term over, as before
                log.warning("engine.resize_failed epoch=%d error=%r", epoch, exc)
                ok = False
            shares.resize_applied(epoch, ok)

    async def _shrink(
        self,
        partitions: frozenset[int],
        heard: dict[int, Subscription],
        dispatcher: Dispatcher,
        stop: asyncio.Event,
    ) -> bool:
        """Fire only `partitions`, a subset of this term's, without stopping what it fires of
        them: own only them (the released partitions' tasks leave the heap as they come up,
        no claim, offer, page or orphan of theirs is armed any more, cron leaves their jobs at
        its next tick),
        then wait until nothing of theirs is armed, in flight or unrecorded
        (`Dispatcher.quiet`) and cron ticks without them. True then: the office narrows the
        stores' office and gives their keys back. Tasks of theirs a claim took but that
        were not armed stay claimed at this term's number: the next owner takes them over as
        orphans (never published here, so published once). False when the wait runs out or
        the term stops: the office then changes terms (the handover records the rest)."""
        held = self._partitions
        if held is None or not partitions or not partitions < held:
            return False
        released = sorted(held - partitions)
        count = self.settings.partitions
        gone = frozenset(released)
        self._own(partitions, in_place=True)
        self.horizon.forget_unowned()
        dispatcher.forget_unowned(partitions)
        quiet = dispatcher.quiet(lambda task_id: partition_of(task_id, count) in gone)
        waits = [quiet]
        if self.cron is not None:
            waits.append(self.cron.regrouped())
        done = asyncio.ensure_future(asyncio.gather(*waits))
        try:
            await first_of(done, stop.wait(), self.clock.sleep(SHRINK_WAIT))
        finally:
            if not done.done():
                done.cancel()
        if not done.done() or done.cancelled() or done.exception() is not None:
            return False
        for p in released:
            sub = heard.pop(p, None)
            try:
                if sub is not None:
                    await sub.unsubscribe()  # (a notice still heard is refused by `owns`)
            except Exception as exc:
                log.debug("engine.unsubscribe_failed partition=%d error=%r", p, exc)
        log.info("engine.partitions_shrunk released=%s", released)
        return True

    async def _grow(
        self, partitions: frozenset[int], heard: dict[int, Subscription], dispatcher: Dispatcher
    ) -> bool:
        """Fire `partitions`, a superset of this term's, without stopping what it fires: hear
        the gained partitions' stored notices, own them, put their ready tasks up to the
        loader's cursor on the heap (above it the loader reads them: its pages read the
        office, which holds them), those already due split off as a backlog that goes out
        beside what this term fires, not before it (`Catchup.for_growth`), and take over their
        orphans. False, before anything is changed, unless `partitions` adds to this term's."""
        held = self._partitions
        if held is None or not held < partitions:
            return False
        count = self.settings.partitions
        left = {partition_of(i, count) for i in dispatcher.claims.left_claimed}
        if left & partitions:
            # it gave some back with its own claims left there: they carry this term's
            # number, so they would be orphans for no one here; a new term's number makes
            # them orphans for it (the office hands the term over on this answer)
            log.info("engine.grow_refused regained=%s", sorted(left & partitions))
            return False
        gained = sorted(partitions - held)
        dispatcher.claims.reclaim_in = None  # (the stores' office holds the grown set)
        # heard before the tasks are read back: a task stored after the read has its notice
        for p in gained:
            heard[p] = await self.bus.listen(stored.subject(p), self._on_stored)
        self._own(partitions, in_place=True)
        read = await self.horizon.read_back(
            lambda after, until, limit: self.tasks.load_page(after, from_ms(until), limit, gained),
            to_ms(self.clock.now()),
            Catchup.for_growth(self.settings),
        )
        dispatcher.reclaim_orphans()
        log.info("engine.partitions_grown gained=%s read_back=%d", gained, read)
        return True

    async def _term(self, epoch: int, stop: asyncio.Event, shares: Shares | None = None) -> None:
        office = TermOffice(self.office, epoch)  # this term's: not the next one's
        publisher = await self.bus.open_publisher(PUBLISH_TIMEOUT, office.may_act)
        relinked = asyncio.Event()

        def on_link(up: bool) -> None:
            if up:
                relinked.set()
            else:
                publisher.on_link_lost()

        self.bus.link_listeners.append(on_link)
        sub = await self.bus.listen(rescheduled.SUBJECT, self._on_rescheduled)
        # before the loader's first page: a notice heard earlier than that is refused by the
        # cursor, and the page reads its task
        notices, heard = await self._hear_stored()
        self.notices = notices
        dead = DeadLetterCopies(publisher, self.settings.dlq_subject_prefix, self._events)
        self.ledger = await self._count_orgs()
        dispatcher = Dispatcher(
            settings=self.settings,
            horizon=self.horizon,
            tasks=self.tasks,
            publisher=publisher,
            office=office,
            clock=self.clock,
            events=self._events,
            on_stream=self.check_stream,
            dead=dead,
            ledger=self.ledger,
        )
        intake = Intake(
            settings=self.settings,
            horizon=self.horizon,
            tasks=self.tasks,
            publisher=publisher,
            clock=self.clock,
            events=self._events,
            limits=Limits(max_payload=self.bus.max_payload, max_delay=self.settings.max_delay),
            dead=dead,
            ledger=self.ledger,
            notices=notices,
        )
        log.info("engine.term_started epoch=%d", epoch)
        try:
            dispatcher.reclaim_orphans()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(dispatcher.run(epoch, stop), name="firing")
                source = self.bus.intake_source(
                    self.intake_stream, self.settings.intake_consumer, self.settings.batch
                )
                tg.create_task(intake.run(source, stop, office.may_act), name="intake")
                tg.create_task(self._loader(stop, dispatcher, epoch), name="loader")
                tg.create_task(self._watch_office(office, stop, publisher), name="office-watch")
                tg.create_task(
                    self._revalidate(epoch, publisher, dispatcher, relinked, stop), name="relink"
                )
                if self.cron is not None:
                    tg.create_task(self.cron.run(epoch, publisher, stop), name="cron")
                if shares is not None:
                    grow = self._growing(shares, epoch, stop, heard, dispatcher, source)
                    tg.create_task(grow, name="grow")
        except* OfficeLost:
            log.warning("engine.office_lost epoch=%d", epoch)
        finally:
            self.bus.link_listeners.remove(on_link)
            for check in list(self._checks):
                check.cancel()
            await sub.unsubscribe()
            for each in heard.values():
                await each.unsubscribe()
            await dead.drain(DLQ_DRAIN)  # copies in flight: their acks, not a failure log each
            await publisher.close()
            self.horizon.disarm()
            self._events.horizon_sized(0)
            log.info("engine.term_ended epoch=%d", epoch)

    async def _count_orgs(self) -> OrgLedger | None:
        """The per-org quota ledger of a new term, counted from the store (None: quotas off).
        PostgreSQL away: counted at the loader's next count, unlimited until then."""
        ledger = OrgLedger.of(self.settings, self._events)
        if ledger is not None:
            try:
                ledger.reset(await self.tasks.pending_by_org())
            except Exception as exc:
                log.warning("quota.count_failed error=%r", exc)
        return ledger

    def failover_span(self) -> float:
        """Seconds within which a task can be published twice: a failover plus every retry."""
        s = self.settings
        backoffs: float = sum(
            min(s.backoff.total_seconds() * 2**i, 60.0) * 1.2 for i in range(s.max_attempts - 1)
        )
        return s.lease_ttl * 2 + backoffs + s.max_attempts * PUBLISH_TIMEOUT

    def check_stream(self, stream: str) -> None:
        """On first use of a target stream, warn when its duplicate window is too short."""
        if stream and stream not in self._checked_streams:
            self._checked_streams.add(stream)
            check = asyncio.create_task(self._check_window(stream), name=f"check-{stream}")
            self._checks.add(check)  # owned here until done; cancelled with the term
            check.add_done_callback(self._checks.discard)

    async def _check_window(self, stream: str) -> None:
        try:
            window = await self.bus.duplicate_window(stream)
        except Exception as exc:  # a later delivery to this stream checks again
            self._checked_streams.discard(stream)
            log.warning("stream.check_failed stream=%s error=%r", stream, exc)
            return
        span = self.failover_span()
        short = window < span
        self._events.duplicate_window_checked(stream, short)
        if short:
            why = (
                f"stream {stream}: duplicate window {window:g}s is shorter than the "
                f"failover plus retry span {span:.0f}s; a task may be delivered twice"
            )
            self.warnings[stream] = why
            log.warning("stream.duplicate_window_short %s", why)

    async def _watch_office(
        self, office: TermOffice, stop: asyncio.Event, publisher: Broker
    ) -> None:
        await first_of(office.lost.wait(), stop.wait())
        if not office.may_act():  # (`lost` may be cleared again: this instance began a new term)
            publisher.on_office_lost()  # nothing queued may go out after the lease
            if not stop.is_set():
                raise OfficeLost()

    async def _revalidate(
        self,
        epoch: int,
        publisher: Broker,
        dispatcher: Dispatcher,
        relinked: asyncio.Event,
        stop: asyncio.Event,
    ) -> None:
        """After each reconnect, publish nothing until PostgreSQL confirms this leader's
        epoch: while the link was down a newer leader may have taken office."""
        while not stop.is_set():
            await first_of(relinked.wait(), stop.wait())
            relinked.clear()
            while not stop.is_set():
                try:
                    current = await self.tasks.current_epoch()
                    break
                except Exception as exc:  # PostgreSQL away: stay held, ask again shortly
                    log.warning("engine.revalidate_failed error=%r", exc)
                    await wait_or_stop(stop, 0.5)
            else:
                return
            if current != epoch:
                log.error("engine.fenced epoch=%d current=%d after reconnect", epoch, current)
                self.office.depose(epoch)
                return
            publisher.release()
            dispatcher.armed_event.set()
            log.info("engine.link_revalidated epoch=%d", epoch)

    async def _loader(self, stop: asyncio.Event, dispatcher: Dispatcher, epoch: int) -> None:
        """Keep the heap filled up to now + horizon, within its bounds; sweep for stragglers;
        count pending. Between pages it waits up to a second, or until the claimer has made
        room for a page (`Horizon.hungry`): a heap at its bound refills as it drains."""
        # The first count of pending tasks waits a few seconds: over millions of rows it costs
        # PostgreSQL a fraction of a second, which the first claims after taking office need.
        last_sweep, last_count = 0.0, self.clock.monotonic() - COUNT_EVERY + 3.0
        last_analyze = 0.0
        hungry = self.horizon.hungry
        while not stop.is_set() and dispatcher.office.may_act():  # this term's office
            hungry.clear()
            try:
                full = await self.load_once()
                now = self.clock.monotonic()
                if now - last_sweep >= SWEEP_EVERY:
                    await self.sweep()
                    dispatcher.reclaim_orphans(STALE_CLAIM)
                    last_sweep = now
                if now - last_analyze >= ANALYZE_EVERY and await self.tasks.analyze_if_stale():
                    last_analyze = now
                if now - last_count >= COUNT_EVERY:
                    self._events.pending_counted(await self.tasks.pending_count())
                    if self.ledger is not None:
                        self.ledger.reset(await self.tasks.pending_by_org())
                    last_count = now
            except Exception as exc:  # PostgreSQL away: the heap keeps what it has; retry
                log.warning("loader.failed error=%r", exc)
                full = False
            if not full:
                await first_of(hungry.wait(), wait_or_stop(stop, 1.0))

    async def load_once(self) -> bool:
        """Load one page past the cursor, as large as the heap has room for (at most `PAGE`;
        while a backlog is split off, one for each range); return True when a page was full
        (there may be more to load now)."""
        now = self.clock.now()
        until_ms = to_ms(now + self.settings.horizon)
        got, more = await self.horizon.load(
            lambda cursor, until, limit: self.tasks.load_page(cursor, from_ms(until), limit),
            until_ms,
            to_ms(now),
        )
        if got:
            self._events.horizon_sized(len(self.horizon))
        return more

    async def sweep(self) -> None:
        """Re-offer pending tasks overdue by over a second: a lost reschedule notice, say.
        Offered like intake's (under the lock, only within the loaded range): a task past the
        cursor is the loader's to read, in order."""
        nxt = self.horizon.next_due()
        now_ms = to_ms(self.clock.now())
        if nxt is not None and nxt < now_ms - 1000:
            return  # firing is behind; overdue tasks are on the heap already
        overdue = await self.tasks.overdue(self.clock.now() - timedelta(seconds=2), 1000)
        await self.horizon.offer_all(overdue)

    async def _hear_stored(self) -> tuple[StoredNotices | None, dict[int, Subscription]]:
        """Over partitions (P > 1): the term's sender of stored notices, and its subscriptions
        to the notices of its own partitions (`engine.delayed.stored`); under P = 1 neither."""
        owns, partitions = self.horizon.owns, self._partitions
        if owns is None or partitions is None or self.settings.partitions == 1:
            return None, {}
        heard = {
            p: await self.bus.listen(stored.subject(p), self._on_stored) for p in sorted(partitions)
        }
        return StoredNotices(self.bus.notify, self.settings.partitions, owns), heard

    async def _on_stored(self, data: bytes) -> None:
        """Offer the tasks another engine stored in this term's partitions (only inside the
        loaded range, only its own: `Horizon.offer_all`)."""
        try:
            _, refs = stored.decode(data)
        except ValueError as exc:
            log.warning("engine.bad_stored_notice error=%s data=%r", exc, data[:200])
            return
        await self.horizon.offer_all(refs)

    async def _on_rescheduled(self, data: bytes) -> None:
        try:
            ref = rescheduled.decode(data)
        except ValueError as exc:
            log.warning("engine.bad_reschedule_notice error=%s data=%r", exc, data[:200])
            return
        await self.horizon.offer(ref)  # under its lock: never race the loader's cursor
