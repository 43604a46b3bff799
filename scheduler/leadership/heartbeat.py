"""Each instance's heartbeat in the state bucket: who runs, in which role, since when.

`GET /v1/instances` reads them (`scheduler.operations.instances`); a record not renewed for a
few beats is shown stale. Informational only: leadership never reads it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from datetime import timedelta

from nats.js.kv import KeyValue

from scheduler.aio import first_of
from scheduler.clock import Clock, to_rfc3339
from scheduler.leadership.tenure import Tenure

HEARTBEAT_EVERY = 5.0
STALE_AFTER = timedelta(seconds=3 * HEARTBEAT_EVERY)  # a record not renewed this long is stale


class Heartbeat:
    """Writes `instances.<instance_id>` = {instance, role, epoch, since, at} for one tenure."""

    def __init__(
        self,
        tenure: Tenure,
        state_kv: KeyValue,
        clock: Clock,
        log: logging.Logger,
        every: float = HEARTBEAT_EVERY,
    ) -> None:
        self._tenure, self._kv, self._clock, self._log = tenure, state_kv, clock, log
        # seconds between beats: partitioned engines count each other from these records
        # (leadership.partitioned), so theirs beat at every lease renewal pass
        self._every = every
        self.key = "instances." + re.sub(r"[^-/_=a-zA-Z0-9]", "_", tenure.instance)

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until `stop`, every few seconds and at once when the role changes (`since`:
        when this instance took the role); delete the record at `stop`."""
        tenure = self._tenure
        role, since = "", self._clock.now()
        while not stop.is_set():
            now = self._clock.now()
            if tenure.role != role:
                role, since = tenure.role, tenure.since or now
            record = {
                "instance": tenure.instance,
                "role": role,
                "epoch": tenure.epoch,
                "since": to_rfc3339(since),
                "at": to_rfc3339(now),
            }
            try:
                await self._kv.put(self.key, json.dumps(record).encode())
            except Exception as exc:  # informational only; the next beat tries again
                self._log.debug("leader.heartbeat_failed error=%r", exc)
            change = tenure.lost.wait() if record["role"] == "leader" else tenure.gained.wait()
            await first_of(self._clock.sleep(self._every), stop.wait(), change)
        try:  # a stopped instance leaves the list; one that crashed ages out as stale
            await asyncio.wait_for(self._kv.delete(self.key), timeout=1.0)
        except Exception as exc:  # NATS away: readers show the record as stale instead
            self._log.debug("leader.heartbeat_delete_failed error=%r", exc)
