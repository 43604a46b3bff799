"""Leadership: a JetStream KV lease for liveness, a PostgreSQL epoch for safety
(docs/leadership.md).

A standby campaigns with a create of the lease key (`bus.lease.KvLease`) every
`campaign_interval` and at once when its watcher sees the key deleted or purged. The winner
raises the epochs of the partitions it takes (all of them, in one term) in PostgreSQL's
`partition_offices` (the fencing tokens; never the KV revision, which a rolled-back store can
reissue; `take_office` is given them), writes the epoch into the lease and renews it with a
revision-checked update every TTL/3. Its term (`tenure.Tenure`) lasts only until a local
deadline on the monotonic clock (time the last successful renew was *sent* + TTL - margin): a
failed renew, a passed deadline or a fenced write (`depose`) ends it at once. Only a successful
create or update decides leadership, never a read. See docs/leadership.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from scheduler.aio import first_of
from scheduler.clock import Clock
from scheduler.leadership.bounded import bounded
from scheduler.leadership.events import LeadershipEvents
from scheduler.leadership.heartbeat import Heartbeat
from scheduler.leadership.lease import KvLease
from scheduler.leadership.tenure import Tenure, TenureOffice
from scheduler.settings import Settings
from scheduler.store.postgres.epoch import take_office

T = TypeVar("T")
TakeOffice = Callable[..., Awaitable[int]]  # take_office(pool, instance, floor, count=1)


class Leadership(TenureOffice):
    """The `Office` of one instance among several: campaigns for the `lease`, takes office with
    a fresh epoch, renews, and steps down; the term itself is `tenure`."""

    def __init__(
        self,
        kv: KeyValue,
        pool: asyncpg.Pool,
        settings: Settings,
        clock: Clock,
        events: LeadershipEvents,
        log: logging.Logger | None = None,
        take_office: TakeOffice = take_office,
        clock_ok: Callable[[], bool] | None = None,
        clock_check: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._pool, self._clock = pool, clock
        self.events = events  # the listener of its events (the daemon's Metrics)
        # this host's wall clock against PostgreSQL's (engine.skew): the last verdict, and a
        # fresh measurement taken before taking office
        self._clock_check = clock_check
        self._log = log or logging.getLogger(__name__)
        self._take_office = take_office
        self.instance = settings.instance_id
        self._count = settings.partitions  # 1: a take of office checks it is still recorded
        self._ttl = settings.lease_ttl
        self._margin = settings.effective_fence_margin
        self._campaign_every = settings.campaign_interval.total_seconds()
        self._renew_every = min(self._ttl / 3, (self._ttl - self._margin) / 2)
        self._clock_ok = clock_ok or (lambda: True)
        self.tenure = Tenure(self.instance, clock, events, self._log, self._clock_ok)
        self.lease = KvLease(kv, self.instance, clock, self._log, self._campaign_every * 4)
        self._resigned = False

    # -- the Office protocol (the term is the tenure's; epoch, wait and lost: TenureOffice) -------
    def may_act(self) -> bool:
        return self.tenure.held()

    def depose(self, epoch: int | None = None) -> None:
        """Leave office at once: a fenced write showed that a newer epoch exists (of the term
        `epoch`, when given: a later term of this instance is not the one fenced)."""
        self._end_deposed(epoch)

    # -- display ----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """This instance's view for `GET /v1/leader`."""
        return self.view(self.instance if self.tenure.held() else self.lease.seen)

    async def holder(self) -> dict[str, Any]:
        """The lease's current value ({instance, epoch, since}), read for display only."""
        return await self.lease.holder()

    def on_link(self, up: bool) -> None:
        """The bus's link listener: a lease write in flight on a link that went is sent again."""
        self.lease.on_link(up)

    def heartbeat(self, state_kv: KeyValue, stop: asyncio.Event) -> Coroutine[Any, Any, None]:
        """This instance's heartbeat in the state bucket until `stop` (`heartbeat.Heartbeat`)."""
        return Heartbeat(self.tenure, state_kv, self._clock, self._log).run(stop)

    # -- the loop ---------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, hold and renew office until `stop` is set (or `resign` is called)."""
        try:
            async with asyncio.TaskGroup() as tg:
                watch = tg.create_task(self.lease.watch(), name="leader-watch")
                while not stop.is_set() and not self._resigned:
                    await (self._hold(stop) if self.tenure.held() else self._stand(stop))
                watch.cancel()
        finally:
            self.tenure.end("stopped")

    async def _hold(self, stop: asyncio.Event) -> None:
        await first_of(self._clock.sleep(self._renew_every), stop.wait(), self.lost.wait())
        if not stop.is_set() and self.tenure.held():
            await self._renew()

    async def _stand(self, stop: asyncio.Event) -> None:
        if not self._clock_ok():  # a leader with a wrong clock fires early: do not campaign
            if self.lease.revision is not None:
                await self._release()
            await first_of(self._clock.sleep(self._campaign_every), stop.wait())
            return
        held_by_another = await self._campaign()
        if self.tenure.held():
            return
        waits = [self._clock.sleep(self._campaign_every), stop.wait()]
        if held_by_another:  # not after our own hand-back, whose delete the watcher also sees
            waits.append(self.lease.vacant.wait())
        await first_of(*waits)

    # -- taking office ----------------------------------------------------------------------------
    async def _campaign(self) -> bool:
        """One attempt to take office; True when the lease is held by someone else."""
        lease = self.lease
        if lease.revision is not None:
            await self._release()  # a lease we still hold after losing office: give it back
        lease.vacant.clear()
        sent = self._clock.monotonic()
        try:
            # bounded: a create sent to a bucket leader that froze would hold the campaign for
            # nats-py's whole timeout (5 s) past the bucket's new leader; given up, it is sent
            # again next tick, and if it is stored late the key is ours to adopt then
            revision = await self._bounded(
                lease.create(lease.value(None, self._clock.now())), self._ttl / 3
            )
        except KeyWrongLastSequenceError as exc:  # the key exists: another's, or ours left over
            adopted = await self._adopt()
            if adopted is None:
                self._log.debug("leader.campaign_lost instance=%s error=%r", self.instance, exc)
                return True
            revision = adopted
        except Exception as exc:  # any create error means "not leader" (nats-server#5162)
            self._log.debug("leader.campaign_lost instance=%s error=%r", self.instance, exc)
            return True
        async with lease.lock:
            lease.revision, self.tenure.deadline = revision, sent + self._ttl - self._margin
            if self._resigned:
                await self._delete(revision)
            else:
                await self._take(revision)
        return False

    async def _adopt(self) -> int | None:
        """The revision of our own left-over lease taken back (`KvLease.adopt`), or None."""
        try:
            revision = await self._bounded(
                self.lease.adopt(self.lease.value(None, self._clock.now())), self._ttl / 3
            )
        except Exception as exc:  # written since, or unreachable: not ours to take
            self._log.debug("leader.adopt_failed instance=%s error=%r", self.instance, exc)
            return None
        if revision is not None:
            self._log.info("leader.adopted instance=%s revision=%d", self.instance, revision)
        return revision

    async def _take(self, revision: int) -> None:
        """Holding a fresh lease: check the clock, take an epoch in PostgreSQL, write it into
        the lease, and begin the term; any failure hands the lease back."""
        try:
            clock_fine = self._clock_check is None or await self._bounded(self._clock_check())
        except Exception as exc:  # the check timed out (a loop starved of CPU) or failed
            self._log.warning("leader.clock_check_failed instance=%s error=%r", self.instance, exc)
            clock_fine = False
        if not clock_fine:
            await self._delete(revision)  # a standby may take it
            return
        try:
            floor = self.lease.highest_epoch  # never below an epoch seen in use (a restore)
            epoch = await self._bounded(
                self._take_office(self._pool, self.instance, floor, count=self._count)
            )
        except Exception as exc:  # PostgreSQL down or slow: hand the lease back, stay standby
            self._log.warning("leader.take_office_failed instance=%s error=%r", self.instance, exc)
            await self._delete(revision)
            return
        since, sent = self._clock.now(), self._clock.monotonic()
        try:
            await self._bounded(self.lease.update(self.lease.value(epoch, since), revision))
        except Exception as exc:  # lease gone before we acted; the unused epoch is harmless
            self._log.info("leader.lease_lost_on_take epoch=%d error=%r", epoch, exc)
            return
        self.lease.saw_epoch(epoch)
        if self._resigned:
            return
        self.tenure.begin(epoch, since, sent + self._ttl - self._margin)

    async def _renew(self) -> None:
        lease, tenure = self.lease, self.tenure
        async with lease.lock:
            epoch, since = tenure.recorded()
            if epoch is None or lease.revision is None:
                return
            sent = self._clock.monotonic()
            try:
                await self._bounded(lease.update(lease.value(epoch, since), lease.revision))
            except Exception as exc:  # TimeoutError: the self-fence deadline; any error: step down
                tenure.end("renew_failed", exc)
                return
            self.events.renewed(self._clock.monotonic() - sent)
            if tenure.recorded()[0] is not None:
                tenure.deadline = sent + self._ttl - self._margin

    # -- stepping down ----------------------------------------------------------------------------
    async def resign(self) -> None:
        """Stop acting, stop campaigning and delete our lease so a standby takes over at once."""
        self._resigned = True
        self.tenure.end("resigned")
        async with self.lease.lock:
            if self.lease.revision is not None:
                await self._delete(self.lease.revision)

    async def _release(self) -> None:
        async with self.lease.lock:
            if self.lease.revision is not None and self.tenure.recorded()[0] is None:
                await self._delete(self.lease.revision)

    async def _delete(self, revision: int) -> None:
        """Revision-checked delete: it removes the lease only if nobody wrote it since."""
        self.lease.revision = None
        try:
            await self._bounded(self.lease.delete(revision), self._ttl / 3)
        except Exception as exc:  # taken over or unreachable: the lease expires on its own
            self._log.info("leader.release_failed revision=%d error=%r", revision, exc)
        else:
            self._log.info("leader.released instance=%s revision=%d", self.instance, revision)

    async def _bounded(self, aw: Awaitable[T], within: float | None = None) -> T:
        """Await `aw`; cancel it and raise TimeoutError at the deadline (or after `within` s)."""
        deadline = self.tenure.deadline
        until = deadline if within is None else self._clock.monotonic() + within
        return await bounded(self._clock, aw, until)
