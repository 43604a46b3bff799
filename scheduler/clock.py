"""Time as the engine sees it. The engine reads time only through a `Clock` it is given."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Wall-clock time (aware UTC) for due times, monotonic time for leases and deadlines."""

    def now(self) -> datetime:
        """The current wall-clock time as an aware UTC datetime."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time (returns at once for seconds <= 0)."""
        ...

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Cancellable:
        """Run `callback` after `seconds` of this clock's time; cancel() stops it."""
        ...


class Cancellable(Protocol):
    def cancel(self) -> object: ...  # a TimerHandle's gives None, a Future's a bool


async def wait_event(clock: Clock, event: asyncio.Event, seconds: float) -> None:
    """Wait until `event` is set or `seconds` pass, whichever is first.

    One timer and the event's own future: no task is created, unlike `asyncio.wait_for` or
    racing two tasks, which matters in loops that wake a thousand times a second. On timeout
    the event is set (and so stays set): for events the waiter clears before it waits."""
    if event.is_set() or seconds <= 0:
        return
    handle = clock.call_later(seconds, event.set)
    try:
        await event.wait()
    finally:
        handle.cancel()


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Cancellable:
        return asyncio.get_running_loop().call_later(max(0.0, seconds), callback)


class FakeClock:
    """A clock tests move by hand; sleepers wake when `advance` passes their deadline."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs an aware start time")
        self._mono = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._mono + seconds, fut))
        await fut

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Cancellable:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: None if f.cancelled() else callback())
        self._sleepers.append((self._mono + max(0.0, seconds), fut))
        return fut

    def advance(self, seconds: float) -> None:
        """Move both clocks forward and wake every sleeper whose deadline has passed."""
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        due = [f for t, f in self._sleepers if t <= self._mono]
        self._sleepers = [(t, f) for t, f in self._sleepers if t > self._mono]
        for fut in due:
            if not fut.done():
                fut.set_result(None)

    def jump_wall(self, seconds: float) -> None:
        """Move only the wall clock (an NTP step); the monotonic clock is unaffected."""
        self._now += timedelta(seconds=seconds)


# The three RFC 3339 texts of an instant, all UTC with a Z. They differ on purpose and each is
# part of the wire contract: `rfc3339` (no fixed precision: `2026-11-22T06:00:00Z`) names cron
# occurrences (their `Nats-Msg-Id`, `job@<instant>`), `to_rfc3339` (milliseconds always) stamps
# headers and envelopes, `to_rfc3339_us` (microseconds always) writes the API's answers.
# Changing any changes what consumers see.


def rfc3339(instant: datetime) -> str:
    """`2026-11-22T06:00:00Z`: an aware instant in UTC with a Z suffix."""
    if instant.tzinfo is None:
        raise ValueError(f"instant must be timezone-aware, got {instant.isoformat()}")
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def to_rfc3339_us(dt: datetime) -> str:
    """RFC 3339 UTC with microseconds and a Z, always six digits: 2026-11-22T06:00:00.000000Z.

    The API's instants (HTTP answers and the NATS verbs' records): fixed width, so their
    text sorts as the instants do (pydantic's own text drops a zero fraction, so `...:35Z`
    sorted after `...:35.050000Z`), and lossless, so an instant read from one answer can be
    sent back as a filter (`due_after=`) and mean exactly that instant. A naive datetime is
    taken as UTC (the database's `timestamptz` values never are)."""
    utc = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    return f"{utc.isoformat(timespec='microseconds')[:26]}Z"


_SECOND_TEXT: dict[datetime, str] = {}
_TEXT: dict[datetime, str] = {}


def to_rfc3339(dt: datetime) -> str:
    """RFC 3339 UTC with milliseconds and a Z: 2026-11-22T06:00:00.000Z.

    On the delivery path for every task: the text of each recent instant and of each whole UTC
    second is cached (a few thousand entries at most before a cache is cleared), so most calls
    are one lookup (a burst shares one instant; a steady stream a few per millisecond)."""
    text = _TEXT.get(dt)  # a naive datetime never equals an aware one: it misses and raises
    if text is not None:
        return text
    if dt.tzinfo is None:
        raise ValueError("naive datetime")
    utc = dt if dt.tzinfo is UTC else dt.astimezone(UTC)
    second = utc.replace(microsecond=0)
    head = _SECOND_TEXT.get(second)
    if head is None:
        if len(_SECOND_TEXT) > 4096:
            _SECOND_TEXT.clear()
        head = _SECOND_TEXT[second] = second.isoformat()[:19]
    if len(_TEXT) > 8192:
        _TEXT.clear()
    text = _TEXT[dt] = f"{head}.{utc.microsecond // 1000:03d}Z"
    return text
