"""Each instance's heartbeat in the state bucket: who runs, in which role, since when.

`GET /v1/instances` reads them (`scheduler.operations.instances`); a record not renewed for a
few beats is shown stale. Under P = 1 informational only; under P > 1 the engines count each
other's from them for their fair shares (`scheduler.leadership.partitioned`), never deciding who
holds a lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from datetime import datetime, timedelta

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from scheduler.aio import first_of
from scheduler.clock import Clock, to_rfc3339
from scheduler.leadership.lease import follow_keys
from scheduler.leadership.tenure import Tenure

HEARTBEAT_EVERY = 5.0
STALE_AFTER = timedelta(seconds=3 * HEARTBEAT_EVERY)  # a record not renewed this long is stale
KEY_PREFIX = "instances."


def heartbeat_key(instance: str) -> str:
    """The key of `instance`'s heartbeat in the state bucket."""
    return KEY_PREFIX + re.sub(r"[^-/_=a-zA-Z0-9]", "_", instance)


class Heartbeat:
    """Writes `instances.<instance_id>` = {instance, role, epoch, since, at} for one tenure."""

    def __init__(
        self,
        tenure: Tenure,
        state_kv: KeyValue,
        clock: Clock,
        log: logging.Logger,
        every: float = HEARTBEAT_EVERY,
        kick: asyncio.Event | None = None,
        stamp: Callable[[], datetime | None] | None = None,
    ) -> None:
        self._tenure, self._kv, self._clock, self._log = tenure, state_kv, clock, log
        self._every = every  # seconds between beats (at most, with `kick`)
        # Partitioned engines count each other from these records (leadership.partitioned):
        # theirs beat whenever `kick` is set (after each lease renewal pass), and `at` is
        # `stamp()`, the time that pass was sent, so a record is as fresh as its engine's
        # leases, never fresher (a beat on a change of role does not make a dead engine live).
        self._kick = kick
        self._stamp = stamp
        self._leaving = False
        self._writing = asyncio.Lock()  # a put in flight finishes before `leave` deletes
        self.key = heartbeat_key(tenure.instance)

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until `stop`, every few seconds and at once when the role changes (`since`:
        when this instance took the role); delete the record at `stop`."""
        tenure = self._tenure
        role, since = "", self._clock.now()
        while not stop.is_set() and not self._leaving:
            now = self._clock.now()
            if tenure.role != role:
                role, since = tenure.role, tenure.since or now
            at = (self._stamp() if self._stamp is not None else None) or now
            record = {
                "instance": tenure.instance,
                "role": role,
                "epoch": tenure.epoch,
                "since": to_rfc3339(since),
                "at": to_rfc3339(at),
            }
            if self._kick is not None:
                self._kick.clear()
            async with self._writing:
                if self._leaving:
                    break
                try:
                    await self._kv.put(self.key, json.dumps(record).encode())
                except Exception as exc:  # informational only; the next beat tries again
                    self._log.debug("leader.heartbeat_failed error=%r", exc)
            change = tenure.lost.wait() if record["role"] == "leader" else tenure.gained.wait()
            waits = [self._clock.sleep(self._every), stop.wait(), change]
            if self._kick is not None:
                waits.append(self._kick.wait())
            await first_of(*waits)
        if not self._leaving:  # (else `leave` deleted it already)
            await self.leave()

    async def leave(self) -> None:
        """Beat no more and delete the record (a stopped instance leaves the list; one that
        crashed ages out as stale). A partitioned engine leaves before giving its leases back,
        so the others, finding them vacant, no longer count it."""
        self._leaving = True
        async with self._writing:
            try:
                await asyncio.wait_for(self._kv.delete(self.key), timeout=1.0)
            except Exception as exc:  # NATS away: readers show the record as stale instead
                self._log.debug("leader.heartbeat_delete_failed error=%r", exc)


async def watch_arrivals(
    kv: KeyValue,
    own: str,
    arrived: asyncio.Event,
    clock: Clock,
    log: logging.Logger,
    rewatch: float,
) -> None:
    """Follow the heartbeats in the state bucket `kv` forever, headers only: `arrived` is set
    when an instance's record appears that this watch has not seen (or saw deleted since: an
    engine that left on SIGTERM and starts again), other than `own`'s key. Partitioned
    engines count each other at every pass anyway; this only makes the engines that hold a
    surplus give it back as soon as an engine joins, all at about the same moment, instead of
    each at its own next pass (the joiner then takes its share in one campaign, not piece by
    piece). Nothing is decided from it. The first records the watch reads may set `arrived`
    once: a pass more, no harm."""
    seen: set[str] = set()

    def on_entry(entry: KeyValue.Entry) -> None:
        if entry.key == own:
            return
        if entry.operation in (KV_DEL, KV_PURGE):
            seen.discard(entry.key)
        elif entry.key not in seen:
            seen.add(entry.key)
            arrived.set()

    await follow_keys(kv, KEY_PREFIX + ">", on_entry, clock, log, rewatch)
