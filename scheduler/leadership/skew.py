"""This host's wall clock against PostgreSQL's: a leader whose clock runs ahead fires early.

Every instance reads `clock_timestamp()` from PostgreSQL (the one clock all instances share)
when it is about to take office and every `CHECK_EVERY` seconds, and compares it with its own
wall clock at the midpoint of the round trip. Half the round trip is the measurement's
uncertainty and is given the benefit of the doubt. Beyond `SCHEDULER_MAX_CLOCK_SKEW` the
instance refuses office (a leader steps down, a standby stops campaigning) until the clock is
back within the bound, and says so: a log line `clock.skew_exceeded`, a warning in `/readyz`,
and the gauges `mq_scheduler_clock_skew_seconds` / `mq_scheduler_clock_skew_exceeded`.

Between two measurements a step of the wall clock (an NTP step, a VM resumed) is caught at
once, without asking PostgreSQL: the wall clock minus the monotonic clock moves by the step.
Beyond the bound the verdict is withheld (`ok()` is false, so a leader stops acting on the
spot) until a fresh measurement, taken right away, says where the clock now stands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from scheduler.aio import first_of
from scheduler.clock import Clock
from scheduler.leadership.events import LeadershipEvents

log = logging.getLogger(__name__)

# Given a wall clock, returns (local time sent, PostgreSQL's clock_timestamp(), local time back):
# `scheduler.store.postgres.epoch.database_time`, or a stand-in. Raises OSError when it cannot ask.
AskDatabase = Callable[[Callable[[], datetime]], Awaitable[tuple[datetime, datetime, datetime]]]

CHECK_EVERY = 10.0


class ClockCheck:
    """The latest verdict on this host's clock; `ok()` is what leadership consults."""

    def __init__(
        self, ask: AskDatabase, clock: Clock, bound: float, events: LeadershipEvents
    ) -> None:
        self.ask = ask
        self.clock = clock
        self.bound = bound  # seconds; 0 turns the check off
        self._events = events
        self.skew: float | None = None  # local minus PostgreSQL, seconds, last measured
        self._exceeded = False
        self._anchor: float | None = None  # wall minus monotonic clock at the last measurement
        self._stepped = False
        self._wake = asyncio.Event()  # measure now (a step was seen)

    def ok(self) -> bool:
        """False while the last measurement was beyond the bound, or while the wall clock has
        stepped by more than the bound since then (until measured again, at once)."""
        if self.bound <= 0 or self._anchor is None:
            return not self._exceeded
        drift = self._offset() - self._anchor
        if abs(drift) > self.bound and not self._stepped:
            self._stepped = True
            log.warning(
                "clock.stepped drift_ms=%+.0f: not acting until measured again", drift * 1e3
            )
            self._wake.set()
        return not (self._exceeded or self._stepped)

    def _offset(self) -> float:
        return self.clock.now().timestamp() - self.clock.monotonic()

    @property
    def warning(self) -> str | None:
        """What `/readyz` says while this instance refuses office because of its clock."""
        if not self._exceeded or self.skew is None:
            return None
        return (
            f"clock: this host's clock is {self.skew * 1000:+.0f} ms off PostgreSQL's, beyond "
            f"SCHEDULER_MAX_CLOCK_SKEW ({self.bound * 1000:.0f} ms): not taking office; fix "
            "the host's time synchronisation (NTP)"
        )

    async def measure(self) -> bool:
        """Measure now; return whether the clock is within the bound (the last verdict if
        PostgreSQL cannot be asked: the epoch fencing stops a leader cut off from it anyway)."""
        if self.bound <= 0:
            return True
        try:
            sent, theirs, back = await self.ask(self.clock.now)
        except (OSError, TimeoutError) as exc:
            log.debug("clock.check_failed error=%r", exc)
            return self.ok()
        half_trip = (back - sent).total_seconds() / 2
        self.skew = (sent - theirs).total_seconds() + half_trip
        self._anchor, self._stepped = self._offset(), False
        self._judge(max(0.0, abs(self.skew) - half_trip))
        self._events.clock_checked(self.skew, self._exceeded)
        return self.ok()

    def _judge(self, beyond_doubt: float) -> None:
        exceeded = beyond_doubt > self.bound
        if exceeded and not self._exceeded:
            log.error(
                "clock.skew_exceeded skew_ms=%.0f bound_ms=%.0f: refusing office until the "
                "clock is back within the bound",
                (self.skew or 0.0) * 1000,
                self.bound * 1000,
            )
        elif self._exceeded and not exceeded:
            log.warning("clock.skew_recovered skew_ms=%.0f", (self.skew or 0.0) * 1000)
        self._exceeded = exceeded

    async def run(self, stop: asyncio.Event) -> None:
        """Measure every `CHECK_EVERY` seconds until `stop` is set."""
        while not stop.is_set():
            self._wake.clear()
            await self.measure()
            await first_of(self._wake.wait(), stop.wait(), asyncio.sleep(CHECK_EVERY))
