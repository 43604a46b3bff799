"""Leadership over P > 1 partitions: a lease per partition, a fair share of them per engine, and
one term of office over the partitions held (docs/leadership.md, "Partitions";
docs/decisions/2026-12-06-partition-ownership.md, steps 3 and 4).

Each partition `n` has its own key `p.<n>` in the leader bucket (`KvLease` on that key: the
same create, revision-checked update and delete as the single key `leader`) and its own
deadline (time its last successful renew was *sent* + TTL - margin, monotonic). One pass every
renew interval (TTL/3) renews every key held, in a loop of its own (nothing the rebalancing
awaits can make it late); a key whose renew fails, or whose deadline passes, is dropped alone
(`may_act(p)` is false for it from then on).

The engine acts in terms, as under P = 1: a term is one epoch (`take_office` over the term's
partitions) over a fixed set of partitions, `may_act()` true while every one of them may act.
A term that only gains partitions (nothing released or lost, no fenced write to recheck)
grows in place, at its own number (`_grow`: `grow_office`, then the engine joins them,
`engine.office.Shares.resized`): term numbers are unique, so every former owner of a gained
partition held another number and is fenced. Whenever the set changes otherwise (or a growth
fails) the term ends and the next one takes office over the new set: a release ends it
gracefully (`handover`: the engine stops claiming and finishes its batch in flight, as on
SIGTERM, then says `term_ended`), a lost lease at once (its deadline already passed). The next
term's number is above every number issued, so a former owner's late write is fenced, and so
is the previous term's own. Why one number per term, grown in place, rather than a term whose
partitions carry different epochs: the decision record.

The fair share is ceil(P / live engines), the live engines counted from the heartbeats in the
state bucket (each engine beats after every renew pass, stamped with the pass's time; one
older than TTL - margin is not counted). An engine campaigns (`create` of vacant keys, all it
needs at once) while it holds fewer than its share, releases its surplus (graceful end of the
term, then a revision-checked delete of the keys) when it holds more. A dead engine leaves the
count at its keys' self-fence deadline, before they expire (TTL after its last renew), so the
others take its partitions at their full share, each in one term change. A resigning engine
deletes its heartbeat, then its keys; the others watch the keys and campaign once the deletes
stop coming (`_settle`). A joining engine's first heartbeat wakes the others
(`heartbeat.watch_arrivals`), so they give back their surplus together, at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from scheduler.aio import first_of
from scheduler.clock import Clock
from scheduler.leadership.bounded import bounded
from scheduler.leadership.events import LeadershipEvents
from scheduler.leadership.heartbeat import (
    HEARTBEAT_EVERY,
    Heartbeat,
    heartbeat_key,
    watch_arrivals,
)
from scheduler.leadership.lease import KvLease, watch_deletes
from scheduler.leadership.tenure import Tenure, TenureOffice
from scheduler.operations.instances import read_instances
from scheduler.settings import Settings
from scheduler.store.postgres.epoch import grow_office, take_office

T = TypeVar("T")
TakeOffice = Callable[..., Awaitable[int]]  # take_office(pool, instance, floor, parts, count=P)
GrowOffice = Callable[..., Awaitable[bool]]  # grow_office(pool, instance, epoch, kept, gained)
KEY_PREFIX = "p."
HANDOVER_GRACE = 6.0  # s at most for a term to wind down gracefully (a publish times out in 5)
VACANCY_SETTLE = 0.025  # s without a key's delete before the campaign (the others arrive)
VACANCY_SETTLE_MAX = 0.25  # s at most from the first delete to the campaign


def lease_key(partition: int) -> str:
    """The lease key of `partition` in the leader bucket (P = 1 keeps the key `leader`)."""
    return f"{KEY_PREFIX}{partition}"


class PartitionedLeadership(TenureOffice):
    """The `Office` (and `engine.office.Shares`) of one engine among several over P partitions."""

    def __init__(
        self,
        kv: KeyValue,
        pool: asyncpg.Pool,
        settings: Settings,
        clock: Clock,
        events: LeadershipEvents,
        state_kv: KeyValue | None = None,
        log: logging.Logger | None = None,
        take_office: TakeOffice = take_office,
        clock_ok: Callable[[], bool] | None = None,
        on_term: Callable[[Sequence[int]], None] | None = None,
        live: Callable[[], Awaitable[int]] | None = None,
        grow_office: GrowOffice = grow_office,
    ) -> None:
        self._kv, self._pool, self._clock = kv, pool, clock
        self.events = events
        self._log = log or logging.getLogger(__name__)
        self._take_office = take_office
        self._grow_office = grow_office
        self._on_term = on_term or (lambda parts: None)
        self._state_kv = state_kv
        self._live_of = live
        self.instance = settings.instance_id
        self.partitions = settings.partitions
        self._ttl = settings.lease_ttl
        self._margin = settings.effective_fence_margin
        self._campaign_every = settings.campaign_interval.total_seconds()
        self.renew_every = min(self._ttl / 3, (self._ttl - self._margin) / 2)
        self._clock_ok = clock_ok or (lambda: True)
        self.tenure = Tenure(self.instance, clock, events, self._log, self._clock_ok)
        self.held: dict[int, KvLease] = {}  # partition -> its lease (with its revision)
        self.deadlines: dict[int, float] = {}  # partition -> its self-fence deadline
        self.term: frozenset[int] = frozenset()  # the partitions of the current term
        self.handover = asyncio.Event()  # set: the current term is to end gracefully
        self._running: int | None = None  # the epoch of the term the engine runs
        self._ended = asyncio.Event()
        self._wake = asyncio.Event()  # set: rebalance now (a key deleted, a term lost)
        self._renew_now = asyncio.Event()  # set: renew now (a term took office)
        self._recheck = False  # a fenced write: renew every key before the next term
        self._next_renew = 0.0
        self._renewed_at: datetime | None = None  # wall time the last renew pass was sent
        self._beat = asyncio.Event()  # set after each renew pass: the heartbeat beats
        self._heart: Heartbeat | None = None
        self._live = 1
        self._highest_epoch = 0
        self._resigned = False
        # the engine waiting for its running term to change in place (`resized`): the term's
        # epoch and the future that hands it the new set; then its answer (`resize_applied`)
        self._growth: tuple[int, asyncio.Future[frozenset[int]]] | None = None
        self._applied = asyncio.Event()
        self._applied_ok = False

    # -- the Office protocol (epoch, wait and lost: TenureOffice) ---------------------------------
    def may_act(self, partition: int | None = None) -> bool:
        """The term may act (every partition of it before its deadline); with `partition`,
        this engine may act on that partition (its lease held, before its own deadline)."""
        if partition is None:
            return self.tenure.held()
        deadline = self.deadlines.get(partition)
        return deadline is not None and self._clock.monotonic() < deadline and self._clock_ok()

    def depose(self, epoch: int | None = None) -> None:
        """A fenced write: the term of `epoch` ends at once; every key is renewed before the
        next term, so a partition another engine took (its key ours no more) is left out."""
        if not self._end_deposed(epoch):
            return
        self._recheck = True
        self._wake.set()

    # -- the Shares protocol (engine.office): the engine's side of a term's partitions -----------
    def partitions_of(self, epoch: int) -> frozenset[int] | None:
        """The partitions of term `epoch` as the engine starts it (None: not the current term)."""
        if self.tenure.recorded()[0] != epoch:
            return None
        self._running = epoch
        self._ended.clear()
        return self.term

    def term_ended(self, epoch: int) -> None:
        """The engine's term of `epoch` has wound down (its batch in flight recorded)."""
        if self._running == epoch:
            self._running = None
            self._ended.set()
            self._applied.set()  # (a growth it was applying: not applied)

    async def resized(self, epoch: int) -> frozenset[int]:
        """Wait until the running term of `epoch` grows or shrinks in place; its new set."""
        waiter: asyncio.Future[frozenset[int]] = asyncio.get_running_loop().create_future()
        self._growth = (epoch, waiter)
        try:
            return await waiter
        finally:
            if self._growth is not None and self._growth[1] is waiter:
                self._growth = None

    def resize_applied(self, epoch: int, ok: bool) -> None:
        """The engine's answer to the new set `resized` handed it (a growth or a shrink)."""
        if self._running == epoch:
            self._applied_ok = ok
            self._applied.set()

    # -- display (role and since: TenureOffice) ---------------------------------------------------
    def info(self) -> dict[str, Any]:
        """This instance's view for `GET /v1/leader`, with the partitions of its term."""
        held = self.tenure.held()
        view = self.view(self.instance if held else None)
        return view | {"partitions": sorted(self.term) if held else []}

    async def holder(self) -> dict[str, Any]:
        """No single holder under P > 1: this instance's view (display only)."""
        return self.info()

    def on_link(self, up: bool) -> None:
        """The bus's link listener: writes in flight on a link that went are sent again."""
        for lease in list(self.held.values()):
            lease.on_link(up)

    def heartbeat(self, state_kv: KeyValue, stop: asyncio.Event) -> Coroutine[Any, Any, None]:
        """This engine's heartbeat after every renew pass, stamped with the pass's time: the
        others count it as live while that is younger than TTL - margin (`_count_live`)."""
        self._heart = Heartbeat(
            self.tenure,
            state_kv,
            self._clock,
            self._log,
            HEARTBEAT_EVERY,
            kick=self._beat,
            stamp=lambda: self._renewed_at,
        )
        return self._heart.run(stop)

    # -- the loop ---------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Renew, rebalance and hold terms until `stop` is set (or `resign` is called). The
        renewals run in a loop of their own, so nothing the rebalancing waits for (reads of the
        bucket, a wind-down, `take_office`) can make a renew pass late; the rebalancing runs
        every campaign interval, and at once when a key is deleted (`watch_deletes`:
        the periodic campaign is what guarantees the takeover, the watch only speeds it)."""
        try:
            async with asyncio.TaskGroup() as tg:
                renewing = tg.create_task(self._renewing(stop), name="partition-renew")
                vacated = asyncio.Event()
                vacancies = watch_deletes(
                    self._kv, KEY_PREFIX + ">", vacated, self._clock, self._log, self._rewatch
                )
                watching = tg.create_task(vacancies, name="partition-watch")
                arrived = asyncio.Event()
                arrivals = None
                if self._state_kv is not None and self._live_of is None:
                    own = heartbeat_key(self.instance)
                    follow = watch_arrivals(
                        self._state_kv, own, arrived, self._clock, self._log, self._rewatch
                    )
                    arrivals = tg.create_task(follow, name="partition-arrivals")
                while not stop.is_set() and not self._resigned:
                    self._wake.clear()
                    vacated.clear()
                    arrived.clear()
                    await self.step()
                    waits = [self._clock.sleep(self._campaign_every), stop.wait()]
                    await first_of(*waits, self._wake.wait(), vacated.wait(), arrived.wait())
                    if vacated.is_set() and not self._wake.is_set():
                        await self._settle(vacated, stop)
                renewing.cancel()
                watching.cancel()
                if arrivals is not None:
                    arrivals.cancel()
        finally:
            self.tenure.end("stopped")

    async def _settle(self, vacated: asyncio.Event, stop: asyncio.Event) -> None:
        """After a key's delete, wait until none has come for VACANCY_SETTLE (at most
        VACANCY_SETTLE_MAX in all), so that keys given back together are taken in one
        campaign (one term change), not the first alone: an engine giving its keys back
        deletes them all at once, and engines giving back their surplus to one that joined
        do so each after its own wind-down, tens of milliseconds apart."""
        give_up = self._clock.monotonic() + VACANCY_SETTLE_MAX
        while not stop.is_set() and not self._wake.is_set():
            vacated.clear()
            left = give_up - self._clock.monotonic()
            await first_of(self._clock.sleep(max(0.0, min(VACANCY_SETTLE, left))), stop.wait())
            if not vacated.is_set() or left <= VACANCY_SETTLE:
                return

    async def _renewing(self, stop: asyncio.Event) -> None:
        """A renew pass every renew interval, and at once when asked (`_renew_now`)."""
        while not stop.is_set() and not self._resigned:
            self._renew_now.clear()
            self._next_renew = self._clock.monotonic() + self.renew_every
            await self.renew_pass()
            pause = self._next_renew - self._clock.monotonic()
            waits = [self._clock.sleep(max(pause, 0.0)), stop.wait()]
            await first_of(*waits, self._renew_now.wait())

    async def renew_pass(self) -> None:
        """Renew every key held, drop the lapsed, and let the heartbeat say this pass ran."""
        self._renewed_at = self._clock.now()
        await self._renew_all()
        self._drop_lapsed()
        self._beat.set()

    async def step(self) -> None:
        """One pass: drop lapsed keys, count the live, rebalance."""
        self._drop_lapsed()
        if self._resigned:
            return
        if not self._clock_ok():  # a wrong clock fires early: hold nothing, take nothing
            self.tenure.end("clock_skew")
            await self._release_all()
            self.term = frozenset()
            return
        self._live = await self._count_live()
        share = self.share()
        held = set(self.held)
        surplus = sorted(held, reverse=True)[: max(0, len(held) - share)]
        if len(held) < share:
            held |= await self._campaign(share - len(held))
        wanted = frozenset(held - set(surplus))
        if wanted != self.term or (wanted and not self.tenure.held()):
            if not await self._grow(wanted, surplus) and not await self._shrink(wanted, surplus):
                await self._change(wanted, surplus)

    def share(self) -> int:
        """ceil(P / live engines): the most partitions this engine holds."""
        return math.ceil(self.partitions / max(1, self._live))

    # -- the leases -------------------------------------------------------------------------------
    @property
    def _rewatch(self) -> float:
        return self._campaign_every * 4  # s before watching again after a watch failed

    def _lease(self, partition: int) -> KvLease:
        lease = lease_key(partition)
        return KvLease(self._kv, self.instance, self._clock, self._log, self._rewatch, key=lease)

    async def _renew_all(self) -> None:
        """One renew of every key held, all at once; a key whose renew fails is dropped."""
        epoch, since = self.tenure.recorded()
        held = list(self.held.items())
        results = await asyncio.gather(
            *(self._renew(p, lease, epoch if p in self.term else None, since) for p, lease in held)
        )
        for (p, lease), ok in zip(held, results, strict=True):
            if not ok and self.held.get(p) is lease:  # (not one released, or taken again)
                self._drop(p, "renew_failed")
        self._fence_term("renew_failed")

    async def _renew(
        self, partition: int, lease: KvLease, epoch: int | None, since: datetime | None
    ) -> bool:
        async with lease.lock:  # (a release in flight deletes the key: not renewed meanwhile)
            revision = lease.revision
            if revision is None or partition not in self.deadlines:
                return False
            sent = self._clock.monotonic()
            try:
                until = self.deadlines[partition]
                await self._bounded(lease.update(lease.value(epoch, since), revision), until)
            except Exception as exc:  # any error: this partition's lease is not ours any more
                self._log.warning("leader.partition_renew_failed p=%d error=%r", partition, exc)
                return False
        self.events.renewed(self._clock.monotonic() - sent)
        if partition in self.held:
            self.deadlines[partition] = sent + self._ttl - self._margin
        return True

    def _drop(self, partition: int, reason: str) -> None:
        """Stop acting on `partition` at once (its lease may be another's by now)."""
        if self.held.pop(partition, None) is not None:
            self._log.warning("leader.partition_lost p=%d reason=%s", partition, reason)
        self.deadlines.pop(partition, None)

    def _drop_lapsed(self) -> None:
        now = self._clock.monotonic()
        for p, deadline in list(self.deadlines.items()):
            if now >= deadline:
                self._drop(p, "deadline")
        self._fence_term("deadline")

    def _fence_term(self, reason: str) -> None:
        """A term that lost one of its partitions ends at once; else its deadline is theirs."""
        if self.tenure.recorded()[0] is None:
            return
        if not self.term <= set(self.held):
            self.tenure.end(reason)
            self._wake.set()  # the next term, over the others, at once
        else:
            self.tenure.deadline = min(self.deadlines[p] for p in self.term)

    async def _count_live(self) -> int:
        """Engines whose last renew pass (their heartbeat's `at`) is younger than TTL - margin,
        this one included; the last count when they cannot be read. An engine silent that long
        has passed the self-fence deadline of every key it renewed then, and those keys expire
        at the server no sooner than TTL after it: a dead engine leaves the count before its
        partitions fall vacant, so the others take them in one term at their full share."""
        try:
            if self._live_of is not None:
                return max(1, await self._live_of())
            if self._state_kv is None:
                return 1
            now = self._clock.now()
            fresh = timedelta(seconds=self._ttl - self._margin)
            found = await read_instances(self._state_kv, now, fresh)
            others = {i.instance for i in found if not i.stale} - {self.instance}
            return 1 + len(others)
        except Exception as exc:  # NATS away: keep the share as it was
            self._log.debug("leader.live_count_failed error=%r", exc)
            return self._live

    async def _vacant(self) -> list[int]:
        """Partitions whose key is absent, shuffled (a read: only a create decides)."""
        try:
            present = set(await self._kv.keys())  # (filters only log a warning per call)
        except Exception:  # no keys at all (NoKeysError), or unreadable: try any
            present = set()
        vacant = [p for p in range(self.partitions) if lease_key(p) not in present]
        random.shuffle(vacant)
        return [p for p in vacant if p not in self.held]

    async def _campaign(self, wanted: int) -> set[int]:
        """Create up to `wanted` vacant keys, that many at once; the partitions gained."""
        gained: set[int] = set()
        vacant = await self._vacant()
        while vacant and len(gained) < wanted:
            need = wanted - len(gained)
            tried, vacant = vacant[:need], vacant[need:]
            won = await asyncio.gather(*(self._take_key(p) for p in tried))
            gained |= {p for p, ok in zip(tried, won, strict=True) if ok}
        return gained

    async def _take_key(self, p: int) -> bool:
        """One `create` of `p`'s key (or the adoption of our own left-over write of it)."""
        lease = self._lease(p)
        sent = self._clock.monotonic()
        try:
            value = lease.value(None, self._clock.now())
            revision = await self._within(lease.create(value), self._ttl / 3)
        except KeyWrongLastSequenceError:  # held by another (or ours left over: adopt)
            try:
                adopted = await self._within(lease.adopt(value), self._ttl / 3)
            except Exception:  # written since: not ours to take
                adopted = None
            if adopted is None:
                return False
            revision = adopted
        except Exception as exc:  # any create error means "not ours" (nats-server#5162)
            self._log.debug("leader.partition_campaign_lost p=%d error=%r", p, exc)
            return False
        if self._resigned:  # (resigned meanwhile: give it straight back)
            await self._delete(p, lease, revision)
            return False
        lease.revision = revision
        self.held[p], self.deadlines[p] = lease, sent + self._ttl - self._margin
        return True

    # -- terms ------------------------------------------------------------------------------------
    async def _change(self, wanted: frozenset[int], release: Collection[int]) -> None:
        """End the current term (gracefully while it may act), give back `release`, and take
        office over `wanted` for the next one, with whatever else fell vacant meanwhile."""
        if self.tenure.held():
            self._log.info("leader.handing_over epoch=%s", self.tenure.recorded()[0])
            self.handover.set()
            await self._wind_down()
            self.tenure.end("handover")
        self.handover.clear()
        await self._release_all(release)
        self.term = frozenset()
        if self._resigned:
            return
        short = self.share() - len(self.held)
        if short > 0:
            # keys that expired or were given back during the wind-down join this term, not
            # the next (a term change stalls every partition of the engine)
            wanted |= await self._campaign(short)
        if self._recheck:  # a fenced write: a partition another engine took is left out
            self._recheck = False
            await self._renew_all()
        wanted = frozenset(p for p in wanted if p in self.held)
        if not wanted:
            return
        until = min(self.deadlines[p] for p in wanted)
        try:
            floor = self._highest_epoch
            epoch = await self._bounded(
                self._take_office(
                    self._pool, self.instance, floor, sorted(wanted), count=self.partitions
                ),
                until,
            )
        except Exception as exc:  # PostgreSQL down or slow: try again at the next pass
            self._log.warning("leader.take_office_failed instance=%s error=%r", self.instance, exc)
            return
        self._highest_epoch = max(self._highest_epoch, epoch)
        wanted = frozenset(p for p in wanted if p in self.held)  # (a key lost meanwhile)
        if not wanted or self._resigned:
            return
        self.term = wanted
        self._on_term(sorted(wanted))
        self.tenure.begin(epoch, self._clock.now(), min(self.deadlines[p] for p in wanted))
        self._renew_now.set()  # the term's epoch into its keys now, not at the next pass
        self._log.info("leader.partitions epoch=%d partitions=%s", epoch, sorted(wanted))

    async def _grow(self, wanted: frozenset[int], release: Collection[int]) -> bool:
        """Join the partitions of `wanted` the running term does not hold to it, at its own
        number (docs/leadership.md, "A term that grows"): only a gain alone (nothing released
        or lost, no fenced write to recheck) of a term the engine runs and waits to grow
        (`resized`). False when it cannot, or when anything fails on the way: the caller then
        changes terms as before (a new number over them all fences whatever this wrote)."""
        epoch, kept, waiting = self._waiting_to_resize()
        if release or not kept or not kept < wanted or epoch is None or waiting is None:
            return False
        gained = wanted - kept
        try:
            grow = self._grow_office(self._pool, self.instance, epoch, sorted(kept), sorted(gained))
            grew = await self._bounded(grow, min(self.deadlines[p] for p in wanted))
        except Exception as exc:  # PostgreSQL down or slow: the restart tries
            self._log.warning("leader.grow_failed epoch=%d error=%r", epoch, exc)
            return False
        if not grew or not self.tenure.held() or not wanted <= set(self.held):
            self._log.warning("leader.grow_refused epoch=%d gained=%s", epoch, sorted(gained))
            return False
        if waiting[1].done() or self.tenure.recorded()[0] != epoch:
            return False  # (the engine's term ended meanwhile)
        self.term = wanted
        self._on_term(sorted(wanted))
        self.tenure.deadline = min(self.deadlines[p] for p in wanted)
        self._renew_now.set()  # the term's epoch into the gained keys now
        self._log.info("leader.partitions_grown epoch=%d gained=%s", epoch, sorted(gained))
        return await self._resize(epoch, waiting[1], wanted)

    async def _shrink(self, wanted: frozenset[int], release: Collection[int]) -> bool:
        """Give back the partitions of the running term that `wanted` leaves out without
        ending it (docs/leadership.md, "A term that shrinks"): only a loss alone (the term's
        set shrinks to `wanted`, nothing gained, no fenced write to recheck) of a term the
        engine runs and waits to resize (`resized`). The engine stops taking new work of the
        partitions left out and answers once nothing of theirs is armed, in flight or
        unrecorded; then the stores' office narrows to `wanted` (a write naming one of the
        others is refused before it is sent from then on) and only then are their keys given
        back (the taker's term, above every number issued, fences them in PostgreSQL too).
        False when it cannot, or when the engine does not answer yes: the caller then
        changes terms as before (the handover publishes and records whatever is left)."""
        epoch, kept, waiting = self._waiting_to_resize()
        if not wanted or not wanted < kept or not wanted <= set(self.held):
            return False
        if epoch is None or waiting is None:
            return False
        left = sorted(kept - wanted)
        self._log.info("leader.partitions_shrinking epoch=%d released=%s", epoch, left)
        if not await self._resize(epoch, waiting[1], wanted):
            return False
        if self.tenure.recorded()[0] != epoch or not self.tenure.held():
            return False  # (the term ended meanwhile: the restart gives them back)
        if not wanted <= set(self.held):
            return False  # (a kept key lost meanwhile: the term ends at once anyway)
        self.term = wanted
        self._on_term(sorted(wanted))
        self.tenure.deadline = min(self.deadlines[p] for p in wanted)
        await self._release_all([*release, *(p for p in left if p not in release)])
        self._log.info("leader.partitions_shrunk epoch=%d released=%s", epoch, left)
        return True

    def _waiting_to_resize(
        self,
    ) -> tuple[int | None, frozenset[int], tuple[int, asyncio.Future[frozenset[int]]] | None]:
        """The running term's epoch, its set and the engine's wait for a resize (`resized`);
        the epoch None unless the term may act, no fenced write waits to be rechecked, and
        the engine runs that term and waits to resize it."""
        epoch, kept, waiting = self.tenure.recorded()[0], self.term, self._growth
        if (
            self._recheck
            or epoch is None
            or self._running != epoch
            or waiting is None
            or waiting[0] != epoch
            or waiting[1].done()
            or not self.tenure.held()
        ):
            return None, kept, None
        return epoch, kept, waiting

    async def _resize(
        self, epoch: int, waiter: asyncio.Future[frozenset[int]], wanted: frozenset[int]
    ) -> bool:
        """Hand the engine the term's new set and wait for its answer (`_resize_applied`)."""
        self._applied.clear()
        self._applied_ok = False
        waiter.set_result(wanted)
        return await self._resize_applied(epoch)

    async def _resize_applied(self, epoch: int) -> bool:
        """The engine's answer to a resize (at most HANDOVER_GRACE; none: not applied)."""
        await self._wait_for_engine(self._applied.is_set, self._applied)
        if self._applied.is_set() and self._applied_ok:
            return True
        self._log.warning("leader.resize_not_applied epoch=%d", epoch)
        return False

    async def _wind_down(self) -> None:
        """Wait (at most HANDOVER_GRACE) for the engine to end the term; the renewals go on
        meanwhile (their own loop), so a slow wind-down (publishes waiting out their timeout)
        does not cost the partitions this engine keeps."""
        await self._wait_for_engine(lambda: self._running is None, self._ended)

    async def _wait_for_engine(self, done: Callable[[], bool], said: asyncio.Event) -> None:
        """Wait until `done()` (`said` is set when it may have become true), at most
        HANDOVER_GRACE and only while the tenure holds."""
        give_up = self._clock.monotonic() + HANDOVER_GRACE
        while not done() and self.tenure.held():
            now = self._clock.monotonic()
            if now >= give_up:
                return
            await first_of(said.wait(), self._clock.sleep(min(give_up - now, 0.1)))

    async def _release_all(self, partitions: Collection[int] | None = None) -> None:
        """Give back `partitions` (every key held when None), all at once."""
        chosen = list(self.held) if partitions is None else list(partitions)
        await asyncio.gather(*(self._release(p) for p in chosen))

    async def _release(self, partition: int) -> None:
        """Give a partition's key back (revision-checked delete): the next owner's take raises
        its epoch, fencing anything this engine still sent."""
        lease = self.held.pop(partition, None)
        self.deadlines.pop(partition, None)
        if lease is None:
            return
        async with lease.lock:  # (after a renew in flight: its revision is the one to delete)
            revision, lease.revision = lease.revision, None
            if revision is not None:
                await self._delete(partition, lease, revision)

    async def _delete(self, partition: int, lease: KvLease, revision: int) -> None:
        try:
            await self._within(lease.delete(revision), self._ttl / 3)
        except Exception as exc:  # taken over or unreachable: the key expires on its own
            self._log.info("leader.release_failed p=%d error=%r", partition, exc)
        else:
            self._log.info("leader.released p=%d revision=%d", partition, revision)

    @property
    def resigned(self) -> bool:
        return self._resigned

    async def resign(self) -> None:
        """Stop acting and give every key back, so the others take them at once: first the
        heartbeat goes (the others, finding the keys vacant, count one engine fewer and take
        them at their full share in one term), then every key, all at once."""
        self._resigned = True
        self.tenure.end("resigned")
        self._wake.set()
        self._renew_now.set()
        if self._heart is not None:
            await self._heart.leave()
        await self._release_all()

    # -- bounded calls ----------------------------------------------------------------------------
    async def _within(self, aw: Awaitable[T], seconds: float) -> T:
        return await self._bounded(aw, self._clock.monotonic() + seconds)

    async def _bounded(self, aw: Awaitable[T], until: float) -> T:
        """Await `aw`; cancel it and raise TimeoutError at the monotonic instant `until`."""
        return await bounded(self._clock, aw, until)
