"""Leadership: a JetStream KV lease for liveness, a PostgreSQL epoch for safety (design section 5).

A standby campaigns with `kv.create("leader")` every `campaign_interval` and at once when its
watcher sees the key deleted or purged. The winner increments `leadership.epoch` in PostgreSQL
(the fencing token; never the KV revision, which a rolled-back store can reissue), writes the epoch
into the lease and renews it with a revision-checked `update` every TTL/3. It acts only until a
local deadline on the monotonic clock (time the last successful renew was *sent* + TTL - margin):
a failed renew, a passed deadline or a fenced write (`depose`) ends the term at once. Only a
successful create or update decides leadership, never a read. See docs/leadership.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from scheduler.aio import first_of
from scheduler.clock import Clock, to_rfc3339
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.leadership import take_office

LEASE_KEY = "leader"
HEARTBEAT_EVERY = 5.0

T = TypeVar("T")
TakeOffice = Callable[[asyncpg.Pool, str], Awaitable[int]]


class Leadership:
    """The `Office` of one instance among several, decided by a KV lease and fenced by PostgreSQL.

    `lost` is set whenever this instance is not in office (so also before the first term).
    """

    def __init__(
        self,
        kv: KeyValue,
        pool: asyncpg.Pool,
        settings: Settings,
        clock: Clock,
        metrics: Metrics,
        log: logging.Logger | None = None,
        take_office: TakeOffice = take_office,
        clock_ok: Callable[[], bool] | None = None,
        clock_check: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._kv, self._pool, self._clock, self._metrics = kv, pool, clock, metrics
        # this host's wall clock against PostgreSQL's (engine.skew): the last verdict, and a
        # fresh measurement taken before taking office
        self._clock_ok = clock_ok or (lambda: True)
        self._clock_check = clock_check
        self._log = log or logging.getLogger("scheduler.leader")
        self._take_office = take_office
        self.instance = settings.instance_id
        self._ttl = settings.lease_ttl
        self._margin = settings.effective_fence_margin
        self._campaign_every = settings.campaign_interval.total_seconds()
        self._renew_every = min(self._ttl / 3, (self._ttl - self._margin) / 2)
        self._epoch: int | None = None
        self._since: datetime | None = None
        self._revision: int | None = None  # of the lease we last wrote, in or out of office
        self._deadline = 0.0
        self._holder: str | None = None  # last holder the watcher saw; for display only
        self._resigned = False
        self._lost = asyncio.Event()
        self._lost.set()
        self._office = asyncio.Event()
        self._vacant = asyncio.Event()
        self._kv_lock = asyncio.Lock()

    # -- the Office protocol ----------------------------------------------------------------------
    @property
    def epoch(self) -> int | None:
        return self._epoch if self._in_office() else None

    def may_act(self) -> bool:
        return self._in_office()

    async def wait_for_office(self) -> int:
        while (epoch := self.epoch) is None:
            await self._office.wait()
        return epoch

    @property
    def lost(self) -> asyncio.Event:
        return self._lost

    def depose(self) -> None:
        """Leave office at once: a fenced write showed that a newer epoch exists."""
        self._lose("deposed")

    # -- display ----------------------------------------------------------------------------------
    @property
    def role(self) -> str:
        return "leader" if self._in_office() else "standby"

    @property
    def since(self) -> datetime | None:
        return self._since if self._in_office() else None

    def info(self) -> dict[str, Any]:
        """This instance's view for `GET /v1/leader`."""
        since = self.since
        return {
            "instance": self.instance,
            "epoch": self.epoch,
            "since": to_rfc3339(since) if since else None,
            "role": self.role,
            "leader": self.instance if self._in_office() else self._holder,
        }

    async def holder(self) -> dict[str, Any]:
        """The lease's current value ({instance, epoch, since}), read for display only."""
        try:
            entry = await asyncio.wait_for(self._kv.get(LEASE_KEY), timeout=1.0)
            doc = json.loads(entry.value or b"{}")
        except Exception:  # no key (no leader), not our JSON, or NATS away
            return {}
        return doc if isinstance(doc, dict) else {}

    # -- the loop ---------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, hold and renew office until `stop` is set (or `resign` is called)."""
        try:
            async with asyncio.TaskGroup() as tg:
                watch = tg.create_task(self._watch(), name="leader-watch")
                while not stop.is_set() and not self._resigned:
                    await (self._hold(stop) if self._in_office() else self._stand(stop))
                watch.cancel()
        finally:
            self._lose("stopped")

    async def _hold(self, stop: asyncio.Event) -> None:
        await first_of(self._clock.sleep(self._renew_every), stop.wait(), self._lost.wait())
        if not stop.is_set() and self._in_office():
            await self._renew()

    async def _stand(self, stop: asyncio.Event) -> None:
        if not self._clock_ok():  # a leader with a wrong clock fires early: do not campaign
            if self._revision is not None:
                await self._release()
            await first_of(self._clock.sleep(self._campaign_every), stop.wait())
            return
        held_by_another = await self._campaign()
        if self._in_office():
            return
        waits = [self._clock.sleep(self._campaign_every), stop.wait()]
        if held_by_another:  # not after our own hand-back, whose delete the watcher also sees
            waits.append(self._vacant.wait())
        await first_of(*waits)

    async def _campaign(self) -> bool:
        """One attempt to take office; True when the lease is held by someone else."""
        if self._revision is not None:
            await self._release()  # a lease we still hold after losing office: give it back
        self._vacant.clear()
        sent = self._clock.monotonic()
        try:
            revision = await self._kv.create(LEASE_KEY, self._value(None, self._clock.now()))
        except Exception as exc:  # any create error means "not leader" (nats-server#5162)
            self._log.debug("leader.campaign_lost instance=%s error=%r", self.instance, exc)
            return True
        async with self._kv_lock:
            self._revision, self._deadline = revision, sent + self._ttl - self._margin
            if self._resigned:
                await self._delete(revision)
            else:
                await self._take(revision)
        return False

    async def _take(self, revision: int) -> None:
        if self._clock_check is not None and not await self._bounded(self._clock_check()):
            await self._delete(revision)  # logged by the check; a standby may take it
            return
        try:
            epoch = await self._bounded(self._take_office(self._pool, self.instance))
        except Exception as exc:  # PostgreSQL down or slow: hand the lease back, stay standby
            self._log.warning("leader.take_office_failed instance=%s error=%r", self.instance, exc)
            await self._delete(revision)
            return
        since, sent = self._clock.now(), self._clock.monotonic()
        try:
            update = self._kv.update(LEASE_KEY, self._value(epoch, since), last=revision)
            self._revision = await self._bounded(update)
        except Exception as exc:  # lease gone before we acted; the unused epoch is harmless
            self._log.info("leader.lease_lost_on_take epoch=%d error=%r", epoch, exc)
            return
        if self._resigned:
            return
        self._deadline = sent + self._ttl - self._margin
        self._epoch, self._since = epoch, since
        self._metrics.is_leader.set(1)
        self._metrics.leader_epoch.set(epoch)
        self._lost.clear()
        self._office.set()
        self._log.info("leader.acquired instance=%s epoch=%d", self.instance, epoch)

    async def _renew(self) -> None:
        async with self._kv_lock:
            if self._epoch is None or self._revision is None:
                return
            sent = self._clock.monotonic()
            value = self._value(self._epoch, self._since)
            update = self._kv.update(LEASE_KEY, value, last=self._revision)
            try:
                self._revision = await self._bounded(update)
            except Exception as exc:  # TimeoutError: the self-fence deadline; any error: step down
                self._lose("renew_failed", exc)
                return
            self._metrics.lease_renew_seconds.observe(self._clock.monotonic() - sent)
            if self._epoch is not None:
                self._deadline = sent + self._ttl - self._margin

    async def _watch(self) -> None:
        """Set `_vacant` when the key is deleted or purged, so a standby campaigns at once."""
        while True:
            try:
                watcher = await self._kv.watch(LEASE_KEY)
            except Exception as exc:  # periodic campaigns still run; try watching again later
                self._log.debug("leader.watch_failed error=%r", exc)
            else:
                try:
                    await self._follow(watcher)
                finally:
                    await _stop_watcher(watcher, self._log)
            await self._clock.sleep(self._campaign_every * 4)

    async def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                continue  # the "caught up" marker
            if entry.operation in (KV_DEL, KV_PURGE):
                self._holder = None
                self._vacant.set()
            else:
                self._holder = _holder_of(entry.value)

    # -- leaving office ---------------------------------------------------------------------------
    async def resign(self) -> None:
        """Stop acting, stop campaigning and delete our lease so a standby takes over at once."""
        self._resigned = True
        self._lose("resigned")
        async with self._kv_lock:
            if self._revision is not None:
                await self._delete(self._revision)

    async def _release(self) -> None:
        async with self._kv_lock:
            if self._revision is not None and self._epoch is None:
                await self._delete(self._revision)

    async def _delete(self, revision: int) -> None:
        """Revision-checked delete: it removes the lease only if nobody wrote it since."""
        self._revision = None
        try:
            await self._bounded(self._kv.delete(LEASE_KEY, last=revision), self._ttl / 3)
        except Exception as exc:  # taken over or unreachable: the lease expires on its own
            self._log.info("leader.release_failed revision=%d error=%r", revision, exc)
        else:
            self._log.info("leader.released instance=%s revision=%d", self.instance, revision)

    def _in_office(self) -> bool:
        if self._epoch is not None:
            if self._clock.monotonic() >= self._deadline:
                self._lose("deadline")
            elif not self._clock_ok():  # would fire early or late: stop acting at once
                self._lose("clock_skew")
        return self._epoch is not None

    def _lose(self, reason: str, error: BaseException | None = None) -> None:
        if self._epoch is None:
            return
        epoch, self._epoch, self._since = self._epoch, None, None
        self._lost.set()
        self._office.clear()
        self._metrics.is_leader.set(0)
        self._metrics.leader_epoch.set(0)
        quiet = reason in ("resigned", "stopped")
        level = logging.INFO if quiet else logging.WARNING
        message = "leader.lost instance=%s epoch=%d reason=%s error=%r"
        self._log.log(level, message, self.instance, epoch, reason, error)

    # -- helpers ----------------------------------------------------------------------------------
    async def _bounded(self, aw: Awaitable[T], within: float | None = None) -> T:
        """Await `aw`; cancel it and raise TimeoutError at the deadline (or after `within` s)."""
        until = self._deadline if within is None else self._clock.monotonic() + within
        task = asyncio.ensure_future(aw)
        timer = asyncio.ensure_future(self._clock.sleep(until - self._clock.monotonic()))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not task.done():
                task.cancel()
        if not task.done():
            await asyncio.wait({task}, timeout=1.0)  # let the cancelled call clean up
            raise TimeoutError("deadline passed before the call finished")
        return task.result()

    def _value(self, epoch: int | None, since: datetime | None) -> bytes:
        since_text = to_rfc3339(since) if since else None
        return json.dumps({"instance": self.instance, "epoch": epoch, "since": since_text}).encode()

    async def heartbeat(self, state_kv: KeyValue, stop: asyncio.Event) -> None:
        """Write `instances.<instance_id>` = {instance, role, epoch, since, at} to the state bucket
        until `stop`, every few seconds and at once when the role changes (`since`: when this
        instance took the role; `GET /v1/instances` reads them); delete it at `stop`."""
        key = "instances." + re.sub(r"[^-/_=a-zA-Z0-9]", "_", self.instance)
        role, since = "", self._clock.now()
        while not stop.is_set():
            now = self._clock.now()
            if self.role != role:
                role, since = self.role, self.since or now
            record = {
                "instance": self.instance,
                "role": role,
                "epoch": self.epoch,
                "since": to_rfc3339(since),
                "at": to_rfc3339(now),
            }
            try:
                await state_kv.put(key, json.dumps(record).encode())
            except Exception as exc:  # informational only; the next beat tries again
                self._log.debug("leader.heartbeat_failed error=%r", exc)
            change = self._lost.wait() if record["role"] == "leader" else self._office.wait()
            await first_of(self._clock.sleep(HEARTBEAT_EVERY), stop.wait(), change)
        try:  # a stopped instance leaves the list; one that crashed ages out as stale
            await asyncio.wait_for(state_kv.delete(key), timeout=1.0)
        except Exception as exc:  # NATS away: readers show the record as stale instead
            self._log.debug("leader.heartbeat_delete_failed error=%r", exc)


def _holder_of(value: bytes | None) -> str | None:
    try:
        holder = json.loads(value or b"{}").get("instance")
    except (ValueError, AttributeError):  # not our JSON: show no holder rather than fail
        return None
    return str(holder) if holder else None


async def _stop_watcher(watcher: KeyValue.KeyWatcher, log: logging.Logger) -> None:
    try:
        await watcher.stop()
    except Exception as exc:  # a closed connection has no subscription left to remove
        log.debug("leader.watch_stop_failed error=%r", exc)
