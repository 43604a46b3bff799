"""A term of office as the engine sees it (`scheduler.engine.office.Office`), and stepping down.

`Leadership` begins a term once it holds the lease and a fresh epoch, and moves its deadline at
every renew. The term ends at once, and says why, when the deadline passes (time the last
successful renew was *sent* + TTL - margin, on the monotonic clock), when this host's clock is
found skewed against PostgreSQL's, or when `end` is called (a failed renew, a fenced write,
resigning, stopping).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from scheduler.clock import Clock, to_rfc3339
from scheduler.leadership.events import LeadershipEvents


class Tenure:
    """`epoch` and `since` while in office; `lost` is set whenever this instance is not in
    office (so also before the first term), `gained` while it is."""

    def __init__(
        self,
        instance: str,
        clock: Clock,
        events: LeadershipEvents,
        log: logging.Logger,
        clock_ok: Callable[[], bool],
    ) -> None:
        self.instance = instance
        self._clock, self._events, self._log, self._clock_ok = clock, events, log, clock_ok
        self._epoch: int | None = None
        self._since: datetime | None = None
        self.deadline = 0.0  # monotonic; also bounds the calls that take office
        self.lost = asyncio.Event()
        self.lost.set()
        self.gained = asyncio.Event()

    @property
    def epoch(self) -> int | None:
        return self._epoch if self.held() else None

    @property
    def since(self) -> datetime | None:
        return self._since if self.held() else None

    @property
    def role(self) -> str:
        return "leader" if self.held() else "standby"

    def recorded(self) -> tuple[int | None, datetime | None]:
        """The term's epoch and since as recorded, the deadline not checked ((None, None) out
        of office): for the renew that is to move the deadline."""
        return self._epoch, self._since

    async def wait_for_office(self) -> int:
        while (epoch := self.epoch) is None:
            await self.gained.wait()
        return epoch

    def held(self) -> bool:
        """In office and before the deadline, with a clock in agreement (else the term ends)."""
        if self._epoch is not None:
            if self._clock.monotonic() >= self.deadline:
                self.end("deadline")
            elif not self._clock_ok():  # would fire early or late: stop acting at once
                self.end("clock_skew")
        return self._epoch is not None

    def begin(self, epoch: int, since: datetime, deadline: float) -> None:
        """Take office with `epoch` (taken in PostgreSQL) until `deadline`."""
        self.deadline = deadline
        self._epoch, self._since = epoch, since
        self._events.took_office(epoch)
        self.lost.clear()
        self.gained.set()
        self._log.info("leader.acquired instance=%s epoch=%d", self.instance, epoch)

    def end(self, reason: str, error: BaseException | None = None) -> None:
        """Leave office at once (nothing to do when out of office)."""
        if self._epoch is None:
            return
        epoch, self._epoch, self._since = self._epoch, None, None
        self.lost.set()
        self.gained.clear()
        self._events.left_office()
        quiet = reason in ("resigned", "stopped")
        level = logging.INFO if quiet else logging.WARNING
        message = "leader.lost instance=%s epoch=%d reason=%s error=%r"
        self._log.log(level, message, self.instance, epoch, reason, error)


class TenureOffice:
    """What both offices (`election.Leadership` under P = 1, `partitioned.PartitionedLeadership`
    under P > 1) answer from their `tenure` alone: the `Office` protocol's epoch, wait and
    `lost`, the display's role and since, and the check that a fenced write ends the term it
    was written in, not a later one."""

    instance: str
    tenure: Tenure
    _log: logging.Logger

    @property
    def epoch(self) -> int | None:
        return self.tenure.epoch

    async def wait_for_office(self) -> int:
        return await self.tenure.wait_for_office()

    @property
    def lost(self) -> asyncio.Event:
        return self.tenure.lost

    @property
    def role(self) -> str:
        return self.tenure.role

    @property
    def since(self) -> datetime | None:
        return self.tenure.since

    def view(self, leader: str | None) -> dict[str, Any]:
        """This instance's view for `GET /v1/leader`, naming `leader` as the one leading."""
        since = self.since
        return {
            "instance": self.instance,
            "epoch": self.epoch,
            "since": to_rfc3339(since) if since else None,
            "role": self.role,
            "leader": leader,
        }

    def _end_deposed(self, epoch: int | None) -> bool:
        """End the term on a fenced write of term `epoch` (any term when None); False, and the
        term left alone, when this instance holds another term by now."""
        current = self.tenure.recorded()[0]
        if epoch is not None and current is not None and current != epoch:
            self._log.info("leader.depose_ignored epoch=%d current=%d", epoch, current)
            return False
        self.tenure.end("deposed")
        return True
