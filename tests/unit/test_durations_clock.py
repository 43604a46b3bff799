"""Duration parsing and the fake clock the engine tests rely on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest

from scheduler.clock import FakeClock, to_rfc3339, to_rfc3339_us
from scheduler.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0s", 0),
        ("500ms", 0.5),
        ("0.5s", 0.5),
        ("10s", 10),
        ("5m", 300),
        ("1h30m", 5400),
        ("2d", 172800),
        ("1w", 604800),
        (15, 15),
        ("7", 7),
        ("2.5", 2.5),
    ],
)
def test_durations_parse(text: str | int, seconds: float) -> None:
    """Durations in the usual spellings, and bare numbers as seconds."""
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "5x", "m5", "1h 30m", "-1s", "1.2.3s", "s"])
def test_bad_durations_are_refused(text: str) -> None:
    """Malformed or negative durations raise ValueError."""
    with pytest.raises(ValueError):
        parse_duration(text)


async def test_fake_clock_wakes_sleepers_in_order() -> None:
    """Sleepers wake only when `advance` passes their deadline; wall jumps wake nobody."""
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("a", 1)), asyncio.create_task(sleeper("b", 3))]
    await asyncio.sleep(0)
    clock.jump_wall(10)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(1.5)
    await asyncio.sleep(0)
    assert woke == ["a"]
    clock.advance(2)
    await asyncio.gather(*tasks)
    assert woke == ["a", "b"]
    assert clock.now() == datetime(2026, 1, 1, 0, 0, 13, 500000, tzinfo=UTC)


def test_rfc3339_is_utc_with_z() -> None:
    """RFC 3339 output is UTC with milliseconds and a Z; naive input is refused."""
    assert to_rfc3339(datetime(2026, 1, 1, 1, tzinfo=UTC)) == "2026-01-01T01:00:00.000Z"
    with pytest.raises(ValueError):
        to_rfc3339(datetime(2026, 1, 1))


async def test_wait_event_wakes_on_set_or_on_the_fake_clock() -> None:
    import asyncio

    from scheduler.clock import FakeClock, wait_event

    clock = FakeClock()
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_event(clock, event, 5.0))
    await asyncio.sleep(0)
    clock.advance(4.9)
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(0.2)
    await asyncio.wait_for(waiter, 1)
    event.clear()
    waiter = asyncio.create_task(wait_event(clock, event, 5.0))
    await asyncio.sleep(0)
    event.set()
    await asyncio.wait_for(waiter, 1)
    assert clock._sleepers == [] or all(f.done() for _, f in clock._sleepers)


def test_to_rfc3339_cache_agrees_with_isoformat_in_any_zone() -> None:
    """The per-second cache gives exactly what isoformat gives, for any offset and instant."""
    import random
    from datetime import UTC, datetime, timedelta, timezone

    from scheduler.clock import to_rfc3339

    rng = random.Random(7)
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-3))]
    for _ in range(5000):
        dt = datetime(1990, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(2 * 10**15))
        local = dt.astimezone(rng.choice(zones))
        expected = dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert to_rfc3339(local) == expected


def test_to_rfc3339_repeated_instants_and_naive_after_cached() -> None:
    """Cached instants come back the same from any zone; a naive twin is still refused."""
    from datetime import UTC, datetime, timedelta, timezone

    from scheduler.clock import to_rfc3339

    at = datetime(2026, 3, 29, 1, 30, 0, 999999, tzinfo=UTC)
    first = to_rfc3339(at)
    assert first == "2026-03-29T01:30:00.999Z"
    assert to_rfc3339(at.astimezone(timezone(timedelta(hours=2)))) == first
    assert to_rfc3339(at) == first  # the cached path
    with pytest.raises(ValueError):
        to_rfc3339(at.replace(tzinfo=None))


def test_backoff_doubles_from_the_first_wait_up_to_the_cap_with_jitter() -> None:
    """Retry waits double per attempt from the first one, stop growing at the cap, and vary
    by +-20 % so that retries of many jobs do not line up; a job failing for days (attempt
    5,000) still waits the cap, no overflow."""
    from scheduler.backoff import backoff_seconds

    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (8, 60.0), (40, 60.0), (5000, 60.0)]:
        waits = [backoff_seconds(0.5, attempt, cap=60.0) for _ in range(200)]
        assert all(base * 0.8 <= w <= base * 1.2 for w in waits)
        assert max(waits) - min(waits) > base * 0.1


def test_to_rfc3339_us_has_one_width_and_sorts_as_the_instants_do() -> None:
    """The API's form of an instant: UTC, six fraction digits and a Z whatever the instant
    (a whole second, one microsecond, another zone, a naive value taken as UTC), so the texts
    of any instants sort as the instants do and read back exactly."""
    zone = timezone(timedelta(hours=-5, minutes=-30))
    whole = datetime(2026, 12, 7, 1, 2, 35, tzinfo=UTC)
    instants = [
        whole + timedelta(milliseconds=50),
        whole,
        whole + timedelta(microseconds=1),
        (whole + timedelta(seconds=1)).astimezone(zone),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ]
    texts = [to_rfc3339_us(i) for i in instants]
    assert texts[1] == "2026-12-07T01:02:35.000000Z"
    assert texts[3] == "2026-12-07T01:02:36.000000Z"
    assert {len(t) for t in texts} == {len("2026-12-07T01:02:35.000000Z")}
    assert sorted(texts) == [to_rfc3339_us(i) for i in sorted(instants)]
    assert [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in texts] == instants
    assert to_rfc3339_us(whole.replace(tzinfo=None)) == texts[1]
